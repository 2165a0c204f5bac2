"""The classes a config may name, and ``build``: one object from one config node, checked first.

A ``_target_`` in a config (or in a checkpoint's saved config) is a name looked up here, never an import
path handed to Hydra: a file can only choose among the project's own generator modules, networks and
mechanisms, and give them plain-data arguments. Everything else a constructor needs (the ledger, the data
module, the networks, the data layout, noise seeds) comes from the caller as keyword arguments.

Importing this module imports no registered class; a class's module is imported (with ``importlib``) only
when its registered name is asked for.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from lightning_dp.checkpoint import UnsafeConfigError

__all__ = [
    "KINDS",
    "REGISTRY",
    "RUNTIME_KEYS",
    "UnsafeConfigError",
    "build",
    "check_node",
    "check_plain",
    "parameters",
    "resolve",
    "to_plain",
]

# kind -> the dotted ``_target_`` names the configs use; each is "package.module.Class", imported on demand
REGISTRY: dict[str, tuple[str, ...]] = {
    "module": (
        "lightning_dp.models.dp_merf.DPMERF",
        "lightning_dp.models.pearl.PEARL",
        "lightning_dp.models.dp_gan.DPGAN",
        "lightning_dp.models.ppem.PPEM",
        "lightning_dp.models.support_points.SupportPoints",
        "lightning_dp.models.perturbed_histogram.PerturbedHistogram",
        "lightning_dp.models.iw_mmd_gan.IWMMDGenerator",
        "lightning_dp.models.iw_mmd_gan.IWMMDGAN",
        "lightning_dp.models.mmd_gan_ae.MMDGANAE",
        "lightning_dp.models.gem.GEM",
    ),
    "network": (
        "lightning_dp.nets.generators.ConditionalGenerator",
        "lightning_dp.nets.discriminators.ConditionalDiscriminator",
        "lightning_dp.nets.mmd_nets.ResidualELUGenerator",
        "lightning_dp.nets.mmd_nets.AEDiscriminator",
        "lightning_dp.nets.marginal_nets.ProductGenerator",
    ),
    "mechanism": (
        "lightning_dp.callbacks.sanitized_embedding.SanitizedEmbedding",
        "lightning_dp.callbacks.dp_sgd.DPSGD",
        "lightning_dp.callbacks.label_proportions.LabelProportions",
        "lightning_dp.callbacks.ksd_penalty.KSDPenalty",
        "lightning_dp.callbacks.private_support_points.PrivateSupportPoints",
        "lightning_dp.callbacks.perturbed_histogram.LaplaceHistogram",
        "lightning_dp.callbacks.weight_refresh.WeightRefresh",
        "lightning_dp.callbacks.adaptive_marginals.AdaptiveMarginals",
    ),
}
KINDS = tuple(REGISTRY)
LAYOUT_KEYS = ("n_continuous", "block_sizes", "num_classes")
# layout facts passed only to the classes that take them (a network or module without the parameter is not given it)
OPTIONAL_LAYOUT_KEYS = ("continuous_names", "continuous_units", "continuous_cells")
NETWORKS = ("generator", "discriminator", "critic", "encoder", "decoder")
# arguments the run always supplies; a config that sets one is refused (a network may override the layout).
# A module also gets the networks the model config builds (check_node's ``runtime``).
RUNTIME_KEYS: dict[str, frozenset[str]] = {
    "module": frozenset((*LAYOUT_KEYS, *OPTIONAL_LAYOUT_KEYS)),
    "network": frozenset(),
    "mechanism": frozenset(("ledger", "datamodule", "noise_seed")),
}
SUPPLIED_BY = {
    "module": "the data layout and the networks",
    "network": "the data layout",
    "mechanism": "the run's ledger, data module and privacy.noise_seed",
}
PLAIN = "plain data (None, bool, int, float, str, and lists or str-keyed dicts of those)"
_SCALARS = (type(None), bool, int, float, str)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_plain(value: Any, where: str) -> None:
    """Refuse anything but plain data, and any dict key that starts with ``_`` (``_target_``, ``_partial_``...).

    Args:
        value: a config value.
        where: its config path, for the message (``model.module.lr``).

    Raises:
        UnsafeConfigError: the first offending position, named.
    """
    if type(value) in _SCALARS:
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise UnsafeConfigError(
                    f"{where} has a key {_short(key)} of type {type(key).__name__}; config "
                    f"keys must be strings ({PLAIN})."
                )
            if key == "_target_":
                raise UnsafeConfigError(
                    f"{where}._target_ = {_short(item)} is refused: only model.module, model.<network> and "
                    f"model.mechanisms[i] may name a (registered) class; everything else must be {PLAIN}."
                )
            if key.startswith("_"):
                raise UnsafeConfigError(
                    f"{where}.{key} is refused: keys starting with '_' (_partial_, _args_, "
                    f"...) are not allowed; values must be {PLAIN}."
                )
            check_plain(item, f"{where}.{key}")
        return
    raise UnsafeConfigError(
        f"{where} = {_short(value)} is a {type(value).__module__}.{type(value).__qualname__}; "
        f"config values must be {PLAIN}."
    )


def to_plain(node: Any) -> Any:
    """An OmegaConf container as plain Python (interpolations resolved); anything else unchanged."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _target(node: Any, *, expected: str, where: str) -> str:
    """The node's ``_target_``, checked against the registry of ``expected`` (nothing is imported)."""
    if expected not in REGISTRY:
        raise ValueError(f"Unknown kind {expected!r}; valid: {', '.join(KINDS)}.")
    if not isinstance(node, Mapping):
        raise UnsafeConfigError(
            f"{where} = {_short(node)} is not a mapping with a _target_; expected a {expected} "
            f"node, one of: {', '.join(REGISTRY[expected])}."
        )
    if "_target_" not in node:
        raise UnsafeConfigError(
            f"{where} has no _target_; name a {expected}, one of: {', '.join(REGISTRY[expected])}."
        )
    target = node["_target_"]
    allowed = REGISTRY[expected]
    if type(target) is str and target in allowed:
        return target
    other = next((kind for kind, names in REGISTRY.items() if type(target) is str and target in names), None)
    what = f"is a {other}, not a {expected}" if other else f"is not a registered lightning-dp {expected}"
    raise UnsafeConfigError(
        f"{where}._target_ = {_short(target)} {what}; allowed here: {', '.join(allowed)}."
    )


def resolve(target: str, *, expected: str, where: str = "config") -> type:
    """The registered class named ``target`` of kind ``expected`` (its module is imported only then).

    Raises:
        UnsafeConfigError: ``target`` is not a registered name of that kind (the message lists the valid ones).
    """
    name = _target({"_target_": target}, expected=expected, where=where)
    module_name, attribute = name.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), attribute)


def parameters(cls: type) -> tuple[list[str], bool]:
    """Keyword-passable ``__init__`` parameters of ``cls`` and whether it takes ``**kwargs``."""
    params = list(inspect.signature(cls).parameters.values())
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def check_node(
    node: Any, *, expected: str, where: str = "config", runtime: frozenset[str] | set[str] = frozenset()
) -> tuple[type, dict[str, Any]]:
    """Validate one config node without calling anything: registered ``_target_`` of the expected kind, plain
    values, and keys that are named parameters of the class's ``__init__`` other than run-supplied ones.

    Args:
        node: a mapping with ``_target_`` (a plain dict, or an OmegaConf node, converted with interpolations
            resolved).
        expected: ``"module"``, ``"network"`` or ``"mechanism"``.
        where: the node's config path, for messages (``model.generator``).
        runtime: further argument names the caller supplies (the kind's ``RUNTIME_KEYS`` always count).

    Returns:
        ``(class, keyword arguments from the node)``.

    Raises:
        UnsafeConfigError: the first violation, with its config path, what was found and what is allowed.
    """
    node = to_plain(node)
    target = _target(node, expected=expected, where=where)
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    for key, value in kwargs.items():
        if type(key) is not str:
            raise UnsafeConfigError(
                f"{where} has a key {_short(key)} of type {type(key).__name__}; keys are strings."
            )
        if key.startswith("_"):
            raise UnsafeConfigError(
                f"{where}.{key} is refused: only _target_ may start with '_' (no _partial_, "
                f"_args_, _convert_, _recursive_); other keys are {target}'s parameters."
            )
        check_plain(value, f"{where}.{key}")
    supplied = RUNTIME_KEYS[expected] | set(runtime)
    cls = resolve(target, expected=expected, where=where)  # a registered name: importing its module is safe
    names, _ = parameters(cls)
    settable = [n for n in names if n not in supplied]
    for key in kwargs:
        if key in supplied:
            raise UnsafeConfigError(
                f"{where}.{key} is refused: the run supplies it ({SUPPLIED_BY[expected]}), "
                f"not the config; remove it. Settable: {', '.join(settable)}."
            )
        if key not in names:
            raise UnsafeConfigError(
                f"{where}.{key} is not a parameter of {target}; valid: {', '.join(settable)}."
            )
    return cls, kwargs


def build(node: Any, *, expected: str, where: str = "config", **runtime: Any) -> Any:
    """Build one object from a config node after :func:`check_node` passed; nothing runs before that.

    Args:
        node: a plain dict with a registered ``_target_`` and plain-data parameters.
        expected: the kind the position requires (``"module"``, ``"network"``, ``"mechanism"``).
        where: the node's config path, for messages.
        **runtime: objects the caller supplies (ledger, data module, networks, layout, noise seed).

    Raises:
        UnsafeConfigError: the node breaks a rule (see :func:`check_node`).
        TypeError: the caller passed a runtime argument the class does not take.
    """
    cls, kwargs = check_node(node, expected=expected, where=where, runtime=set(runtime))
    names, var_keyword = parameters(cls)
    unknown = [k for k in runtime if k not in names]
    if unknown and not var_keyword:
        raise TypeError(f"{cls.__qualname__} takes no argument(s) {unknown}; it takes {', '.join(names)}.")
    return cls(**kwargs, **runtime)
