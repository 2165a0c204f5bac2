"""Checkpoints that carry a run's ledger and public facts, written atomically and loaded with checks.

Every checkpoint holds, under ``checkpoint["lightning_dp"]``: the resolved config, the ledger state,
the public data state (released schema or image shape), library versions and a format version.
That is all ``python -m lightning_dp.sample`` needs, months later, in a new process.
"""

from __future__ import annotations

import importlib.metadata
import io
import logging
import os
import platform
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from lightning_dp.io import atomic_write

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PACKAGES = ("lightning-dp", "torch", "pytorch-lightning", "opacus", "torchmetrics", "numpy", "pandas",
            "scikit-learn", "scipy", "omegaconf", "hydra-core")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or not a lightning-dp checkpoint."""


def versions() -> dict[str, str]:
    """Versions of Python and the libraries a run depends on."""
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


class AtomicCheckpointIO(TorchCheckpointIO):
    """Serialises to memory, then writes a temporary file and renames it: a crash never leaves a
    truncated ``last.ckpt`` behind."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a lightning-dp checkpoint with ``weights_only=True`` (no code runs from the file).

    Raises:
        CheckpointError: the file is absent, unreadable, corrupt, or lacks the lightning-dp record.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist. Pass the path of a run's "
                              "checkpoints/last.ckpt.")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"Checkpoint {str(path)!r} is corrupt or not a PyTorch checkpoint ({type(err).__name__}: "
                              f"{str(err)[:200]}). Use another checkpoint of the run (e.g. an epoch checkpoint), "
                              "or retrain.") from err
    record = ckpt.get("lightning_dp") if isinstance(ckpt, dict) else None
    if not record or "ledger" not in record or "state_dict" not in ckpt:
        raise CheckpointError(f"{str(path)!r} is a PyTorch file but not a lightning-dp checkpoint (no privacy "
                              "ledger in it). Only checkpoints written by train.py can be sampled or resumed.")
    if record.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{str(path)!r} was written by a newer lightning-dp (format "
                              f"{record['format_version']}); upgrade to read it.")
    return ckpt
