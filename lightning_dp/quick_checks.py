"""Checks of the command line that need nothing but the config: run before torch is imported.

On a loaded machine importing torch and Lightning takes 30 s or more; a mistake that the config alone shows
(a seed that is not a whole number, a list given as a string, ε, δ or a batch size out of range) is refused here
in a second, with the one-line message of :mod:`lightning_dp.errors`. :func:`lightning_dp.preflight.check_config` calls these again, so a run
composed in Python (``lightning_dp.api``) gets the same refusals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_dp.errors import ConfigError

MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range
LIST_KEYS = ("sensitive",)  # model.<key>: column lists, whose string form would be read letter by letter


def check_whole(value: Any, name: str, *, low: int = 0, high: int = MAX_SEED) -> None:
    """``value`` is a whole number in [low, high] (an integral float such as ``3.0`` passes).

    Raises:
        ConfigError: naming the setting and a valid value.
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and float(value).is_integer() and low <= value <= high
    if not ok:
        raise ConfigError(f"{name} must be a whole number in [{low}, {high}], got {value!r}. Set {name}=0 (or "
                          "another whole number).")


def check_number(value: Any, name: str, *, low: float, high: float = math.inf, integer: bool = False,
                 low_open: bool = False) -> None:
    """``value`` is a finite number in the range (a whole number when ``integer``).

    Raises:
        ConfigError: naming the setting and its valid range.
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high and (not integer or float(value).is_integer())
    if not ok:
        kind = "a whole number" if integer else "a number"
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ConfigError(f"{name} must be {kind} {bound}{'' if high == math.inf else f' and <= {high:g}'}, got {value!r}.")


def check_column_list(value: Any, name: str) -> None:
    """``value`` is a list of column names (``model.sensitive=[age,hours-per-week]``), not a string.

    Raises:
        ConfigError: a string (``model.sensitive=age``) or another non-list, with the bracketed form to use.
    """
    if isinstance(value, str) or not isinstance(value, Sequence) or isinstance(value, bytes):
        shown = value if isinstance(value, str) else repr(value)
        raise ConfigError(f"{name} must be a list of column names, got {shown!r}. Write it in brackets: "
                          f"{name}=[{shown}] (several: {name}=[age,hours-per-week]).")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"{name} must list column names (strings), got {list(value)!r}.")


def check_quick(cfg: Mapping[str, Any]) -> None:
    """The checks above on a composed run config (an OmegaConf ``DictConfig`` or a plain mapping).

    Raises:
        ConfigError: the first problem found.
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    def plain(node: Any) -> Any:
        return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig | ListConfig) else node

    check_whole(plain(cfg.get("seed", 0)), "seed")
    privacy = cfg.get("privacy") or {}
    if privacy.get("noise_seed") is not None:
        check_whole(plain(privacy.get("noise_seed")), "privacy.noise_seed")
    check_ranges(cfg, plain)
    model = cfg.get("model") or {}
    for key in LIST_KEYS:
        if key in model and model.get(key) is not None:
            check_column_list(plain(model.get(key)), f"model.{key}")


def check_ranges(cfg: Mapping[str, Any], plain: Any = lambda v: v) -> None:
    """ε, δ and the other numbers a run reads before its first release, each in its range.

    Raises:
        ConfigError: the first setting out of range.
    """
    privacy = cfg.get("privacy") or {}
    for key in ("epsilon", "delta"):
        value = plain(privacy.get(key))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"privacy.{key} must be a number, got {value!r}.")
    check_number(plain(privacy.get("epsilon")), "privacy.epsilon", low=0, high=1e3, low_open=True)
    check_number(plain(privacy.get("delta")), "privacy.delta", low=0, high=0.5, low_open=True)
    if privacy.get("dataset_budget") is not None:
        check_number(plain(privacy.get("dataset_budget")), "privacy.dataset_budget", low=0, high=1e4, low_open=True)
    if privacy.get("dataset_delta") is not None:
        check_number(plain(privacy.get("dataset_delta")), "privacy.dataset_delta", low=0, high=0.5, low_open=True)
    name = plain(privacy.get("dataset_name"))
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= 200):
        raise ConfigError(f"privacy.dataset_name must be a name of 1 to 200 characters, got {name!r}.")
    check_number(plain(privacy.get("count_budget_fraction", 0.02)), "privacy.count_budget_fraction", low=0, high=0.5,
                 low_open=True)
    if cfg.get("num_samples") is not None:
        check_number(plain(cfg.get("num_samples")), "num_samples", low=1, high=1e9, integer=True)
    data = cfg.get("data") or {}
    check_number(plain(data.get("batch_size", 256)), "data.batch_size", low=1, integer=True)
    check_number(plain(data.get("holdout_fraction", 0.2)), "data.holdout_fraction", low=0, high=0.95)
    for key in ("max_rows", "public_num_rows"):
        if data.get(key) is not None:
            check_number(plain(data.get(key)), f"data.{key}", low=1, integer=True)
    trainer = cfg.get("trainer") or {}
    if trainer.get("max_epochs") is not None:
        check_number(plain(trainer.get("max_epochs")), "trainer.max_epochs", low=1, integer=True)


def check_output_file(out: str | Path, *, option: str = "--out") -> None:
    """``out`` can be a file to write: not an existing folder, and its folder exists.

    Raises:
        ConfigError: with the fix (a file name inside the folder, or the folder to create).
    """
    path = Path(out).expanduser()
    if path.is_dir():
        raise ConfigError(f"{option} {str(out)!r} is a folder; give a file name in it, e.g. {option} "
                          f"{str(path / 'synthetic.csv')!r}.")
    if not path.parent.is_dir():
        raise ConfigError(f"{option} {str(out)!r}: the folder {str(path.parent)!r} does not exist. Create it, or "
                          "choose another path.")
