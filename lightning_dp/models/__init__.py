"""Generators by name. Each name has a config in ``configs/model/``; modules live one per file.

A model config (the ``model`` group from Hydra, or its copy saved in a checkpoint) is built only through
:func:`lightning_dp.registry.build`: registered classes, plain-data parameters, and the runtime objects
(networks, layout, ledger, data module) passed in by the caller.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lightning_dp.errors import ConfigError
from lightning_dp.registry import (
    NETWORKS,
    OPTIONAL_LAYOUT_KEYS,
    UnsafeConfigError,
    build,
    check_node,
    check_plain,
    parameters,
    resolve,
    to_plain,
)

MODELS = {
    "dp_merf": "lightning_dp.models.dp_merf.DPMERF",
    "pearl": "lightning_dp.models.pearl.PEARL",
    "dp_gan": "lightning_dp.models.dp_gan.DPGAN",
    "dp_cgan": "lightning_dp.models.dp_gan.DPGAN",
    "ppem": "lightning_dp.models.ppem.PPEM",
    "support_points": "lightning_dp.models.support_points.SupportPoints",
    "perturbed_histogram": "lightning_dp.models.perturbed_histogram.PerturbedHistogram",
    "iw_gmmn": "lightning_dp.models.iw_mmd_gan.IWMMDGenerator",
    "iw_mmd_gan": "lightning_dp.models.iw_mmd_gan.IWMMDGAN",
    "mmd_gan_ae": "lightning_dp.models.mmd_gan_ae.MMDGANAE",
    "gem": "lightning_dp.models.gem.GEM",
}
__all__ = ["MODELS", "NETWORKS", "build_mechanisms", "build_model", "check_data", "check_model_config",
           "fill_settings_added_later", "settings_removed"]


def _taken(cls: type, layout: dict[str, Any]) -> dict[str, Any]:
    """``layout`` less the optional keys ``cls`` does not take."""
    names, var_keyword = parameters(cls)
    return {k: v for k, v in layout.items() if k not in OPTIONAL_LAYOUT_KEYS or k in names or var_keyword}


def check_data(model_cfg: Any, schema: Any, data_cfg: Mapping[str, Any] | None = None) -> None:
    """The model's own checks of the (public) schema, before any release: image data is refused for a module class
    with ``tabular_only = True``; ``Module.check_schema(module_cfg, schema, data)`` where the class has one
    (``schema`` is None for images), and ``Mechanism.check_settings(node)`` and ``Mechanism.check_plan(node,
    module_cls, module_cfg, schema, data)`` for each mechanism class that has them (its settings, which are
    otherwise checked only when it is built, after the row count's release; its budget plan where the schema fixes
    it). ``data`` is the run's data settings ``data_cfg`` (e.g. its representation, which decides GEM's levels).

    Raises:
        ConfigError: the model cannot be trained on this data (the message names the setting and the fix).
    """
    cfg = check_model_config(model_cfg)
    module_cls = resolve(cfg["module"]["_target_"], expected="module", where="model.module")
    if schema is None and getattr(module_cls, "tabular_only", False):
        name = model_cfg.get("name") or module_cls.__name__
        raise ConfigError(f"model={name} models tabular rows; pick a tabular data set (e.g. data=diabetes or "
                          "data=adult).")
    check = getattr(module_cls, "check_schema", None)
    if check is not None:
        check(cfg["module"], schema, data_cfg)
    for i, node in enumerate(cfg.get("mechanisms") or []):
        mechanism_cls = resolve(node["_target_"], expected="mechanism", where=f"model.mechanisms[{i}]")
        settings = {k: v for k, v in node.items() if k != "_target_"}
        check_settings = getattr(mechanism_cls, "check_settings", None)
        if check_settings is not None:
            check_settings(settings)
        check_plan = getattr(mechanism_cls, "check_plan", None)
        if check_plan is not None and schema is not None:
            check_plan(settings, module_cls, cfg["module"], schema, data_cfg)


def minmax_columns(model_cfg: Any, schema: Any) -> list[str]:
    """Continuous columns the model needs as one min-max number under the ``cells`` representation:
    ``Module.minmax_columns(module_cfg, schema)`` where the class has it (PPEM's sensitive columns), else none."""
    cfg = check_model_config(model_cfg)
    module_cls = resolve(cfg["module"]["_target_"], expected="module", where="model.module")
    hook = getattr(module_cls, "minmax_columns", None)
    return list(hook(cfg["module"], schema)) if hook is not None and schema is not None else []


def check_model_config(model_cfg: Any, *, where: str = "model") -> dict[str, Any]:
    """Validate a whole model config without building anything; return it as a plain dict.

    ``module``, each network present (``generator``, ``discriminator``, ...) and each entry of ``mechanisms``
    must name a registered class of that kind with parameters the class takes; every other value is plain
    data without ``_target_`` (or any ``_``-key). Only the registered classes' modules are imported.

    Args:
        model_cfg: an OmegaConf ``DictConfig`` (the user's config) or a plain dict (a checkpoint's).
        where: the config path of ``model_cfg``, for messages (``config.model`` in a checkpoint record).

    Raises:
        UnsafeConfigError: the first violation, named by its config path (``model.generator._target_``).
    """
    cfg = to_plain(model_cfg)
    if not isinstance(cfg, Mapping):
        raise UnsafeConfigError(f"{where} is a {type(cfg).__name__}; it must be a mapping with module, networks "
                                "and mechanisms.")
    cfg = dict(cfg)
    if "module" not in cfg:
        raise UnsafeConfigError(f"{where} has no module; it needs module._target_ (a registered module).")
    networks = {key for key in NETWORKS if cfg.get(key) is not None}  # passed to the module by build_model
    for key, value in cfg.items():
        if key == "module":
            check_node(value, expected="module", where=f"{where}.module", runtime=networks)
        elif key in NETWORKS:
            if value is not None:
                check_node(value, expected="network", where=f"{where}.{key}")
        elif key == "mechanisms":
            if value is None:
                continue
            if type(value) not in (list, tuple):
                raise UnsafeConfigError(f"{where}.mechanisms is a {type(value).__name__}; it must be a list of "
                                        "mechanism nodes.")
            for i, node in enumerate(value):
                check_node(node, expected="mechanism", where=f"{where}.mechanisms[{i}]")
        else:
            check_plain({key: value}, where)
    return cfg


def class_nodes(model_cfg: Mapping[str, Any], where: str = "model") -> list[tuple[str, dict[str, Any], type]]:
    """The nodes of a plain model config that name a registered class (``module``, each network, each mechanism),
    as ``(config path, node, class)``. A node that is not a mapping or names no registered class is left out:
    :func:`check_model_config` refuses it."""
    kinds = {"module": "module", **dict.fromkeys(NETWORKS, "network")}
    found = [(f"{where}.{key}", model_cfg.get(key), kind) for key, kind in kinds.items()]
    mechanisms = model_cfg.get("mechanisms")
    if type(mechanisms) in (list, tuple):
        found += [(f"{where}.mechanisms[{i}]", node, "mechanism") for i, node in enumerate(mechanisms)]
    out = []
    for path, node, kind in found:
        if isinstance(node, dict):
            try:
                out.append((path, node, resolve(node.get("_target_"), expected=kind, where=path)))
            except UnsafeConfigError:
                continue
    return out


def fill_settings_added_later(model_cfg: dict[str, Any], where: str = "model") -> dict[str, Any]:
    """Give a run's plain model config, in place, each setting that a later release added to its classes (a class's
    ``settings_added_later``) and that the config lacks, at the class's default; return them by config path.

    A setting is added with the default that does what the class did before it existed (GEM: ``entropy_weight``
    0.0 adds no term to the loss, ``label_head`` false samples the generator's own label), so a run saved before it
    ran as that default: resumed, it continues with it, and today's config that holds the default is no edit.
    :func:`build_model` would take the same default for the missing key; this makes it the run's recorded value.
    """
    added = {}
    for path, node, cls in class_nodes(model_cfg, where):
        defaults = inspect.signature(cls).parameters
        for name in getattr(cls, "settings_added_later", ()):
            if name not in node:
                node[name] = added[f"{path}.{name}"] = defaults[name].default
    return added


def settings_removed(model_cfg: Mapping[str, Any], where: str = "model") -> list[str]:
    """Config paths of the settings a run's plain model config gives that its classes no longer take (removed or
    renamed by a later release)."""
    removed = []
    for path, node, cls in class_nodes(model_cfg, where):
        names, _ = parameters(cls)
        removed += [f"{path}.{k}" for k in node if type(k) is str and not k.startswith("_") and k not in names]
    return removed


def build_model(model_cfg: Any, layout: dict[str, Any]) -> Any:
    """Build the generator module of ``model_cfg`` for a data layout (public facts only).

    The whole config is validated first (:func:`check_model_config`), the same way for the user's Hydra
    config and a checkpoint's saved dict. Networks (``generator``, ``discriminator``, ...) are then built,
    each with the layout (adapted by the module class's ``net_layout`` when it has one), and passed into
    the module, which gets its hyperparameters from ``model_cfg.module`` and the layout.

    Raises:
        UnsafeConfigError: a class that is not registered for its position, or a value that is not plain data.
        ValueError: an unknown model name (the message lists the valid ones).
    """
    cfg = check_model_config(model_cfg)
    if cfg.get("name") not in MODELS:
        raise ValueError(f"Unknown model {cfg.get('name')!r}; valid: {', '.join(MODELS)}. Pick one with model=NAME.")
    module_cls = resolve(cfg["module"]["_target_"], expected="module", where="model.module")
    net_layout = module_cls.net_layout(layout, cfg["module"]) if hasattr(module_cls, "net_layout") else layout
    nets = {}
    for key in NETWORKS:
        node = cfg.get(key)
        if node is not None:
            extra = {k: v for k, v in net_layout.items() if k not in node}  # the config may override the layout
            net_cls = resolve(node["_target_"], expected="network", where=f"model.{key}")
            nets[key] = build(node, expected="network", where=f"model.{key}", **_taken(net_cls, extra))
    return build(cfg["module"], expected="module", where="model.module", **nets, **_taken(module_cls, layout))


def build_mechanisms(model_cfg: Any, *, ledger: Any, datamodule: Any, noise_seed: int | None = None) -> list[Any]:
    """The mechanism callbacks of ``model_cfg.mechanisms``, in order, built with the run's objects.

    Args:
        model_cfg: the model config (``DictConfig`` or plain dict), validated whole first.
        ledger: the run's ``PrivacyLedger``.
        datamodule: the run's prepared data module.
        noise_seed: fixed privacy noise (tests only); passed only to mechanisms whose ``__init__`` takes it.

    Returns:
        The ``pytorch_lightning.Callback`` instances (an empty list when there are none).

    Raises:
        UnsafeConfigError: as :func:`build_model`.
    """
    cfg = check_model_config(model_cfg)
    out = []
    for i, node in enumerate(cfg.get("mechanisms") or []):
        where = f"model.mechanisms[{i}]"
        runtime: dict[str, Any] = {"ledger": ledger, "datamodule": datamodule}
        cls, _ = check_node(node, expected="mechanism", where=where)
        if noise_seed is not None and "noise_seed" in parameters(cls)[0]:
            runtime["noise_seed"] = noise_seed
        out.append(build(node, expected="mechanism", where=where, **runtime))
    return out
