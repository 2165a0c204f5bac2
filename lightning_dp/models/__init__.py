"""Generators by name. Each name has a config in ``configs/model/``; modules live one per file."""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

MODELS = {
    "dp_merf": "lightning_dp.models.dp_merf.DPMERF",
}


def build_model(model_cfg: DictConfig | dict[str, Any], layout: dict[str, Any]) -> Any:
    """Build the generator module of ``model_cfg`` for a data layout (public facts only).

    The network comes from ``model_cfg.generator`` and is passed into the module, which gets its
    hyperparameters from ``model_cfg.module``.

    Raises:
        ValueError: an unknown model name (the message lists the valid ones).
    """
    cfg = OmegaConf.create(model_cfg) if isinstance(model_cfg, dict) else model_cfg
    if cfg.name not in MODELS:
        raise ValueError(f"Unknown model {cfg.name!r}; valid: {', '.join(MODELS)}. Pick one with model=NAME.")
    net = instantiate(cfg.generator, _convert_="all", **layout)
    return instantiate(cfg.module, generator=net, _convert_="all", **layout)
