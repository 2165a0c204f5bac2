"""Generators by name. Each name has a config in ``configs/model/``; modules live one per file."""

from __future__ import annotations

from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

MODELS = {
    "dp_merf": "lightning_dp.models.dp_merf.DPMERF",
    "pearl": "lightning_dp.models.pearl.PEARL",
    "dp_gan": "lightning_dp.models.dp_gan.DPGAN",
    "dp_cgan": "lightning_dp.models.dp_gan.DPGAN",
}
NETWORKS = ("generator", "discriminator", "critic", "encoder", "decoder")


def build_model(model_cfg: DictConfig | dict[str, Any], layout: dict[str, Any]) -> Any:
    """Build the generator module of ``model_cfg`` for a data layout (public facts only).

    Networks (``generator``, ``discriminator``, ... entries with a ``_target_``) are built first, each
    with the layout (adapted by the module class's ``net_layout`` when it has one), and passed into
    the module, which gets its hyperparameters from ``model_cfg.module``.

    Raises:
        ValueError: an unknown model name (the message lists the valid ones).
    """
    cfg = OmegaConf.create(model_cfg) if isinstance(model_cfg, dict) else model_cfg
    if cfg.get("name") not in MODELS:
        raise ValueError(f"Unknown model {cfg.get('name')!r}; valid: {', '.join(MODELS)}. Pick one with model=NAME.")
    module_cls = get_class(cfg.module._target_)
    net_layout = module_cls.net_layout(layout, cfg.module) if hasattr(module_cls, "net_layout") else layout
    nets = {}
    for key in NETWORKS:
        if key in cfg and cfg[key] is not None and "_target_" in cfg[key]:
            extra = {k: v for k, v in net_layout.items() if k not in cfg[key]}
            nets[key] = instantiate(cfg[key], _convert_="all", **extra)
    return instantiate(cfg.module, _convert_="all", **nets, **layout)
