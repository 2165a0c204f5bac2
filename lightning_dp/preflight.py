"""Everything that can be checked before the first release is checked first.

A run that would fail after spending its budget (an output folder it cannot write, a full disk, a
setting out of range, an audit it cannot run) loses that budget for nothing: the data it was spent on
cannot be used again without composing the two runs. So :func:`check_run` runs before the first
release, and :func:`check_space` again before training with the model's real size.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from lightning_dp.data.sources import LOADERS
from lightning_dp.errors import ConfigError
from lightning_dp.models import MODELS, check_model_config, minmax_columns
from lightning_dp.privacy.coverage import check_coverage
from lightning_dp.privacy.ledger import BudgetExceededError
from lightning_dp.quick_checks import check_number, check_quick

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 64 * 2**20  # ledger, config, logs and the pre-training record


PRIVACY_KEYS = ("epsilon", "delta", "accountant", "adjacency", "allow_large_delta", "count_budget_fraction",
                "noise_seed", "require_dp", "dp_sgd", "registry", "dataset_name", "dataset_budget",
                "dataset_delta")
DP_SGD_KEYS = ("max_grad_norm", "noise_multiplier", "mode")
TOP_KEYS = ("data", "model", "privacy", "trainer", "callbacks", "audit", "experiment", "seed", "output_dir", "resume",
            "resume_external", "num_samples", "tuned", "weights", "tune")


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

    check_quick(cfg)  # seeds, column lists, ε, δ and other ranges (train.py ran these before importing torch)
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
    data = cfg.data  # ε, δ, batch size and the other ranges: check_quick (before torch loads)
    if data.name not in LOADERS:
        raise ConfigError(f"Unknown data set {data.name!r}; valid: {', '.join(LOADERS)}. Pick one with data=NAME.")
    if cfg.model.get("name") not in MODELS:
        raise ConfigError(f"Unknown model {cfg.model.get('name')!r}; valid: {', '.join(MODELS)}. Pick one with model=NAME.")
    check_model_config(cfg.model)
    check_coverage(cfg)
    if cfg.get("audit") and data.name in ("mnist_test", "digits", "npz"):
        raise ConfigError(f"audit=... reports on tabular data; data={data.name} is images. Drop audit=, or score images "
                          "with bench/utility_images.py.")
    check_callbacks(cfg)
    check_trainer(cfg, sgd=sgd)


def check_callbacks(cfg: DictConfig) -> None:
    """``callbacks.checkpoint``: the checkpoint intervals (``RunRecord``), whole steps and minutes >= 0.

    Raises:
        ConfigError: an interval out of range.
    """
    node = (cfg.get("callbacks") or {}).get("checkpoint") or {}
    _known_keys(node, ("every_n_steps", "every_n_minutes"), "callbacks.checkpoint")
    check_number(node.get("every_n_steps", 100), "callbacks.checkpoint.every_n_steps", low=0, integer=True)
    check_number(node.get("every_n_minutes", 5.0), "callbacks.checkpoint.every_n_minutes", low=0)


def check_trainer(cfg: DictConfig, *, sgd: bool) -> None:
    """The ``trainer`` settings as Lightning reads them: a ``Trainer`` is built from them (no process is started,
    nothing is read or written), so devices, accelerator, strategy and unknown keys are refused here, not at fit.

    Raises:
        ConfigError: Lightning refuses the settings, or ``accumulate_grad_batches`` is not 1 under DP-SGD (its
            accountant counts each Poisson batch as one noisy step).
    """
    import pytorch_lightning as pl
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    from lightning_dp.train import trainer_options

    options = trainer_options(cfg.trainer)
    if sgd and options.get("accumulate_grad_batches", 1) != 1:
        raise ConfigError(f"trainer.accumulate_grad_batches={options['accumulate_grad_batches']} with DP-SGD: its "
                          "accountant counts each Poisson-sampled batch as one noisy step, so batches cannot be "
                          "accumulated. Drop the setting and raise data.batch_size instead; nothing was spent.")
    quiet = [logging.getLogger(n) for n in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)  # the dry build's "GPU available" lines would print twice
    try:
        pl.Trainer(**options, logger=False, enable_checkpointing=False)
    except TypeError as err:
        raise ConfigError(f"Unknown trainer setting ({err}). Check the trainer.* keys against Lightning's Trainer "
                          "arguments; nothing was spent.") from None
    except (MisconfigurationException, ValueError, RuntimeError) as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"Lightning refuses the trainer settings: {msg} Fix them (e.g. trainer=cpu, trainer.devices=1); "
                          "nothing was spent.") from None
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def schema_layout(schema: object, representation: str = "minmax",
                  minmax_columns: Sequence[str] = ()) -> dict[str, object] | None:
    """The model-space layout of a public schema, or None when a DP release decides the bounds or categories.

    Under ``representation="cells"`` a continuous column whose spikes and bin edges the schema declares has its
    exact cells; one whose cells a later release decides (``dp_cells.py``) is counted as one min-max number (with
    its missing indicator), which is never wider than its cells, so sizes from this layout are lower bounds and a
    refusal on them is sound. ``minmax_columns``: the model's own min-max columns (``models.minmax_columns``).
    """
    from lightning_dp.data.dp_cells import needs_cells
    from lightning_dp.data.dp_preprocessing import needs_release
    from lightning_dp.data.encoders import TabularEncoder

    if schema is None or needs_release(schema):
        return None
    keep = tuple(minmax_columns)
    if representation == "cells":
        keep += tuple(c.name for c in needs_cells(schema, keep))
    return TabularEncoder(schema, representation=representation, minmax_columns=keep).layout


def run_layout(cfg: DictConfig, schema: object) -> dict[str, object] | None:
    """:func:`schema_layout` with the run's ``data.representation`` and the model's min-max columns."""
    if schema is None:
        return None
    return schema_layout(schema, cfg.data.get("representation", "minmax"), minmax_columns(cfg.model, schema))


# parameters, gradients and Adam's two moments
TRAINING_COPIES = 4


def check_before_release(cfg: DictConfig, schema: object, weighting: object | None = None) -> None:
    """The checks that need the public schema but no row, run by the data module before its first release.

    With the model-space layout known from the schema (``schema_layout``): the model is built on PyTorch's
    ``meta`` device (no storage) and its training memory (weights, gradients, two Adam moments) compared with the
    machine's (``resources.check_memory``); Lightning's gradient accumulation is refused for a module that
    optimises by hand; and the weights' releases are planned on a scratch ledger beside the run's row count, so a
    weights budget that cannot fit is refused before the count is spent.

    Raises:
        ConfigError, ResourceError, BudgetExceededError: with the setting to change; nothing was spent.
    """
    layout = run_layout(cfg, schema)
    if layout is None:
        return
    model = check_model(cfg, layout)
    accumulate = (cfg.trainer.get("accumulate_grad_batches") or 1)
    if accumulate != 1 and model is not None and not getattr(model, "automatic_optimization", True):
        raise ConfigError(f"trainer.accumulate_grad_batches={accumulate}: model={cfg.model.name} takes its optimiser "
                          "steps itself, which Lightning cannot accumulate. Drop the setting; nothing was spent.")
    if weighting is not None:
        _plan_weights(cfg, weighting, layout)


def check_model(cfg: DictConfig, layout: dict[str, object]) -> object | None:
    """Build the model on the ``meta`` device (no storage) for ``layout`` and check its training memory (weights,
    gradients, two Adam moments) against the machine's; returns the meta model, or None where the meta device
    cannot build it (no estimate, no refusal).

    Before the first release when the public schema fixes the layout (:func:`check_before_release`); after the
    schema release otherwise (the refusal then says what was spent, ``train.say_spent``).

    Raises:
        ConfigError: a setting of the wrong type or range; ResourceError: the model does not fit.
    """
    import torch

    from lightning_dp.models import build_model
    from lightning_dp.resources import check_memory, module_bytes

    try:
        with torch.device("meta"):
            model = build_model(cfg.model, layout)
    except (TypeError, ValueError) as err:  # a setting of the wrong type or range reaching a constructor
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"model={cfg.model.name} cannot be built with these settings ({err}). Fix model.module.*; "
                          "nothing was spent.") from None
    except (RuntimeError, NotImplementedError) as err:  # an operation the meta device lacks
        log.debug("model=%s could not be sized on the meta device (%s); its memory is not checked.", cfg.model.name, err)
        return None
    width = layout["n_continuous"] + sum(layout["block_sizes"])
    if "continuous_names" in layout:  # a table's schema (schema_layout)
        what, fix = ("the schema's continuous columns and categories",
                     "Declare fewer categories (merge rare ones), drop columns, or shrink the model's networks")
    else:  # images (datamodule.image_layout): one column per pixel
        what, fix = "one per pixel", "Shrink the model's networks (model.module.*) or use smaller images"
    check_memory(TRAINING_COPIES * module_bytes(lambda: model),
                 what=f"Training model={cfg.model.name} on {width:,} model-space columns ({what})", fix=fix)
    return model


def check_rows_memory(num_rows: float, schema: object, cfg: DictConfig | None = None) -> None:
    """The training rows in model space (float32, twice over while encoding) against the machine's memory.

    Needs the row count, so it runs on the DP count just after its release (the refusal then says what was spent,
    ``train.say_spent``); a schema whose layout a later release decides is not checked here. ``cfg``: the run's
    config, for its representation and the model's min-max columns (:func:`run_layout`); without it, the min-max
    layout (never wider).

    Raises:
        ResourceError: with the size and what to change.
    """
    from lightning_dp.resources import check_memory

    layout = run_layout(cfg, schema) if cfg is not None else schema_layout(schema)
    if layout is None:
        return
    width = layout["n_continuous"] + sum(layout["block_sizes"])
    check_memory(2 * 4 * float(num_rows) * width,
                 what=f"Encoding about {num_rows:,.0f} training rows (a DP count) × {width:,} model-space columns",
                 fix="Declare fewer categories (merge rare ones), drop columns, or train on a subsample (data.max_rows)")


PLANNING_ROWS = 10_000  # a stand-in for the DP count when planning the weights (their ε does not depend on it)


def _plan_weights(cfg: DictConfig, weighting: object, layout: dict[str, object]) -> None:
    """Plan the weights' releases on a scratch ledger holding the run's count release; refuse if they cannot fit."""
    import torch

    from lightning_dp.data.dp_count import release_row_count
    from lightning_dp.train import make_ledger

    scratch = make_ledger(cfg.privacy)
    release_row_count(PLANNING_ROWS, scratch, budget_fraction=cfg.privacy.get("count_budget_fraction", 0.02),
                      generator=torch.Generator().manual_seed(0),
                      public_num_rows=PLANNING_ROWS if cfg.data.get("public_num_rows") is not None else None)
    weighting.layout = layout  # type: ignore[attr-defined]
    rows = cfg.get("num_samples") or PLANNING_ROWS
    try:
        releases = weighting.plan(num_real=PLANNING_ROWS, num_rows=rows, ledger=scratch)  # type: ignore[attr-defined]
    except ConfigError:  # a condition on the number of rows: decided on the DP count, after it is released
        return
    weighting.layout = None  # type: ignore[attr-defined]
    after = scratch.epsilon_if(releases)
    if after > scratch.target_epsilon * (1 + 1e-9):
        name = weighting.config.estimator  # type: ignore[attr-defined]
        raise BudgetExceededError(f"weights={name} (weights.epsilon={cfg.weights.get('epsilon')}) with the row count's "
                                  f"share would take the run to ε = {after:.4g}, above privacy.epsilon="
                                  f"{scratch.target_epsilon:g}. Lower weights.epsilon or raise privacy.epsilon; nothing "
                                  "was spent.")


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
