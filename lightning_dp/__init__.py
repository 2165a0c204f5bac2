"""lightning-dp: differentially private generative models on PyTorch Lightning.

``from lightning_dp import Synthesizer`` (:mod:`lightning_dp.api`) is the Python API; it is imported on first
use, so ``import lightning_dp`` alone stays light (no torch, no Lightning).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Synthesizer", "compose_config"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lightning_dp import api

        return getattr(api, name)
    raise AttributeError(f"module 'lightning_dp' has no attribute {name!r}")
