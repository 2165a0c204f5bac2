"""Everything that can be checked before the first release is checked first.

A run that would fail after spending its budget (an output folder it cannot write, a full disk, a
setting out of range, an audit it cannot run) loses that budget for nothing: the data it was spent on
cannot be used again without composing the two runs. So :func:`check_run` runs before the first
release, and :func:`check_space` again before training with the model's real size.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from lightning_dp.data.sources import LOADERS
from lightning_dp.errors import ConfigError
from lightning_dp.models import MODELS, check_model_config
from lightning_dp.privacy.coverage import check_coverage
from lightning_dp.quick_checks import check_quick

MIN_FREE_BYTES = 64 * 2**20  # ledger, config, logs and the pre-training record


def _number(value: object, name: str, *, low: float, high: float = math.inf, integer: bool = False,
            low_open: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high and (not integer or float(value).is_integer())
    if not ok:
        kind = "a whole number" if integer else "a number"
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ConfigError(f"{name} must be {kind} {bound}{'' if high == math.inf else f' and <= {high:g}'}, got {value!r}.")


PRIVACY_KEYS = ("epsilon", "delta", "accountant", "adjacency", "allow_large_delta", "count_budget_fraction",
                "noise_seed", "require_dp", "dp_sgd")
DP_SGD_KEYS = ("max_grad_norm", "noise_multiplier", "mode")
TOP_KEYS = ("data", "model", "privacy", "trainer", "callbacks", "audit", "experiment", "seed", "output_dir", "resume",
            "num_samples", "tuned", "weights", "tune")


def _known_keys(section: object, known: tuple[str, ...] | list[str], name: str) -> None:
    unknown = sorted(set(section) - set(known)) if section is not None else []
    if unknown:
        import difflib

        hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, n=1)) else u
                 for u in unknown]
        raise ConfigError(f"Unknown setting {name}{'.' if name else ''}{', '.join(hints)}; valid {name or 'top-level'} "
                          f"keys: {', '.join(known)}.")


def check_config(cfg: DictConfig) -> None:
    """Known keys and ranges of the settings a run reads before its first release.

    Raises:
        ConfigError: the first unknown key or setting out of range.
    """
    import inspect

    from lightning_dp.data.datamodule import PrivateDataModule

    check_quick(cfg)  # seeds and column lists (train.py ran these before importing torch)
    _known_keys(cfg, TOP_KEYS, "")
    _known_keys(cfg.privacy, PRIVACY_KEYS, "privacy")
    _known_keys(cfg.data, list(inspect.signature(PrivateDataModule.__init__).parameters)[1:], "data")
    from lightning_dp.privacy.ledger import ACCOUNTANTS, ADJACENCIES

    if cfg.privacy.get("accountant", "rdp") not in ACCOUNTANTS:
        raise ConfigError(f"privacy.accountant={cfg.privacy.accountant!r} is unknown; valid: {', '.join(ACCOUNTANTS)}.")
    if cfg.privacy.get("adjacency", "add_remove") not in ADJACENCIES:
        raise ConfigError(f"privacy.adjacency={cfg.privacy.adjacency!r} is unknown; valid: {', '.join(ADJACENCIES)}.")
    if cfg.privacy.get("dp_sgd") is not None:
        _known_keys(cfg.privacy.dp_sgd, DP_SGD_KEYS, "privacy.dp_sgd")
    sgd = cfg.privacy.get("dp_sgd") is not None or any(
        "DPSGD" in str(m.get("_target_", "")) for m in cfg.model.get("mechanisms") or [])
    if sgd and cfg.privacy.get("adjacency", "add_remove") != "add_remove":
        raise ConfigError(f"model={cfg.model.name} trains with DP-SGD, whose accounting (Poisson-subsampled Gaussian) "
                          "is for add/remove neighbours: set privacy.adjacency=add_remove.")
    for key in ("epsilon", "delta"):
        if isinstance(cfg.privacy.get(key), bool) or not isinstance(cfg.privacy.get(key), int | float):
            raise ConfigError(f"privacy.{key} must be a number, got {cfg.privacy.get(key)!r}.")
    _number(cfg.privacy.epsilon, "privacy.epsilon", low=0, high=1e3, low_open=True)
    _number(cfg.privacy.delta, "privacy.delta", low=0, high=0.5, low_open=True)
    _number(cfg.privacy.get("count_budget_fraction", 0.02), "privacy.count_budget_fraction", low=0, high=0.5,
            low_open=True)
    if cfg.get("num_samples") is not None:
        _number(cfg.num_samples, "num_samples", low=1, high=1e9, integer=True)
    data = cfg.data
    _number(data.get("batch_size", 256), "data.batch_size", low=1, integer=True)
    _number(data.get("holdout_fraction", 0.2), "data.holdout_fraction", low=0, high=0.95)
    if data.get("max_rows") is not None:
        _number(data.max_rows, "data.max_rows", low=1, integer=True)
    if data.get("public_num_rows") is not None:
        _number(data.public_num_rows, "data.public_num_rows", low=1, integer=True)
    if cfg.trainer.get("max_epochs") is not None:
        _number(cfg.trainer.max_epochs, "trainer.max_epochs", low=1, integer=True)
    if data.name not in LOADERS:
        raise ConfigError(f"Unknown data set {data.name!r}; valid: {', '.join(LOADERS)}. Pick one with data=NAME.")
    if cfg.model.get("name") not in MODELS:
        raise ConfigError(f"Unknown model {cfg.model.get('name')!r}; valid: {', '.join(MODELS)}. Pick one with model=NAME.")
    check_model_config(cfg.model)
    check_coverage(cfg)
    if cfg.get("audit") and data.name in ("mnist_test", "digits", "npz"):
        raise ConfigError(f"audit=... reports on tabular data; data={data.name} is images. Drop audit=, or score images "
                          "with bench/utility_images.py.")


def check_writable(out: Path) -> None:
    """The run folder and its ``checkpoints/`` take files: where they exist, a probe file is written and
    removed; where they do not, the nearest existing parent must allow creating them. Nothing is left behind.

    Raises:
        ConfigError: with the folder and the reason.
    """
    for folder in (out, out / "checkpoints"):
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"output_dir needs {str(folder)!r} to be a folder, but it is a file. Choose another "
                              "output_dir=PATH; nothing was spent.")
        if folder.is_dir():
            try:
                fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
                os.close(fd)
                os.unlink(probe)
            except OSError as err:
                raise ConfigError(f"Cannot write to {str(folder)!r} ({err.strerror or err}). Choose another "
                                  "output_dir=PATH or fix its permissions; nothing was spent.") from err
            continue
        parent = folder.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"Cannot create {str(folder)!r}: {str(parent)!r} is not a writable folder. Choose "
                              "another output_dir=PATH or fix its permissions; nothing was spent.")


def check_space(out: Path, need_bytes: int) -> None:
    """At least ``need_bytes`` free where the run writes.

    Raises:
        ConfigError: with the free and the needed space.
    """
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < need_bytes:
        raise ConfigError(f"Only {free / 2**20:.0f} MiB free in {str(out)!r}; the run needs about "
                          f"{need_bytes / 2**20:.0f} MiB for its checkpoints. Free space or choose another "
                          "output_dir=PATH; nothing was spent.")


def checkpoint_bytes(model: object) -> int:
    """A generous estimate of one checkpoint of ``model``: weights, two Adam moments, buffers; twice over
    for the temporary file of an atomic write."""
    import torch

    params = sum(p.numel() * p.element_size() for p in model.parameters())  # type: ignore[attr-defined]
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # type: ignore[attr-defined]
    return int(2 * (3 * params + buffers) + 16 * 2**20) if isinstance(model, torch.nn.Module) else MIN_FREE_BYTES


def check_run(cfg: DictConfig, out: Path) -> None:
    """All checks that need no data: settings, a writable folder, a minimum of free space."""
    check_config(cfg)
    check_writable(out)
    check_space(out, MIN_FREE_BYTES)
