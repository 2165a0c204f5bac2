"""Checkpoints that carry a run's ledger and public facts, written atomically and loaded with checks.

Every checkpoint holds, under ``checkpoint["lightning_dp"]``: the resolved config, the ledger state,
the public data state (released schema or image shape), library versions and a format version.
That is all ``python -m lightning_dp.sample`` needs, months later, in a new process.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import logging
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from lightning_dp.errors import UserError
from lightning_dp.io import atomic_write_bytes

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
PACKAGES = ("lightning-dp", "torch", "pytorch-lightning", "opacus", "torchmetrics", "numpy", "pandas",
            "scikit-learn", "scipy", "omegaconf", "hydra-core")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, corrupt, or not a lightning-dp checkpoint."""


class UnsafeConfigError(CheckpointError):
    """A config (a checkpoint's saved one or the user's own) names a class that is not a registered
    lightning-dp class of the kind its position needs, or holds something other than plain data
    (``lightning_dp/registry.py``); nothing was imported or called for it."""


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
    truncated ``last.ckpt`` behind.

    Inside :meth:`in_memory` it keeps the bytes instead of writing them: a durable block's checkpoint is charged to
    the budget registry together with its bytes before it is written (``PrivacyLedger._persist``).
    """

    _kept: dict[str, bytes] | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        if self._kept is not None:
            self._kept[str(path)] = buffer.getvalue()
            return
        atomic_write_bytes(path, buffer.getvalue())

    @contextlib.contextmanager
    def in_memory(self) -> Iterator[dict[str, bytes]]:
        """Checkpoints saved in the block are not written: their bytes are kept here, by path."""
        kept: dict[str, bytes] = {}
        self._kept = kept
        try:
            yield kept
        finally:
            self._kept = None


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a lightning-dp checkpoint with ``weights_only=True`` (no code runs from the file).

    Raises:
        CheckpointError: the file is absent, unreadable, corrupt, or lacks the lightning-dp record.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist. Pass the path of a run's "
                              "checkpoints/last.ckpt.")
    return _load(path, path)


def load_checkpoint_bytes(data: bytes, *, where: str) -> dict[str, Any]:
    """:func:`load_checkpoint` of a checkpoint's bytes (the budget registry's copy, ``Registry.payload``); ``where``
    names them in messages.

    Raises:
        CheckpointError: corrupt bytes, or no lightning-dp record.
    """
    return _load(io.BytesIO(data), where)


def _load(source: Any, path: str | os.PathLike) -> dict[str, Any]:
    try:
        ckpt = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"Checkpoint {str(path)!r} is corrupt or not a PyTorch checkpoint ({type(err).__name__}: "
                              f"{str(err)[:200]}). Use another checkpoint of the run (e.g. an epoch checkpoint), "
                              "or retrain.") from err
    record = ckpt.get("lightning_dp") if isinstance(ckpt, dict) else None
    if not isinstance(record, dict) or "ledger" not in record or "state_dict" not in ckpt:
        raise CheckpointError(f"{str(path)!r} is a PyTorch file but not a lightning-dp checkpoint (no privacy "
                              "ledger in it). Only checkpoints written by train.py can be sampled or resumed.")
    if type(record.get("format_version", 0)) is not int:
        raise CheckpointError(f"{str(path)!r} has a malformed lightning-dp record (format_version "
                              f"{record.get('format_version')!r} is not an integer).")
    if record.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{str(path)!r} was written by a newer lightning-dp (format "
                              f"{record['format_version']}); upgrade to read it.")
    return ckpt


def validate_record(record: Any, *, path: str | os.PathLike | None = None) -> None:
    """Check a checkpoint's ``lightning_dp`` record before anything is built from it (sampling, audits, resume).

    Every value of ``config``, ``data``, ``ledger`` (and the rest of the record) must be plain data; a
    ``_target_`` may stand only at ``config.model.module``, ``config.model.<network>`` and
    ``config.model.mechanisms[i]``, and must there be a registered class of that kind
    (``lightning_dp/registry.py``) whose parameters the node's other keys name. Registered modules are
    imported to read their signatures; nothing else is imported and nothing is called.

    Args:
        record: ``checkpoint["lightning_dp"]`` as :func:`load_checkpoint` returned it.
        path: the checkpoint, named in the messages.

    Raises:
        UnsafeConfigError: a planted ``_target_``, an unregistered or wrong-kind class, an unknown or run-supplied
            parameter, a value that is not plain data; the message names the position
            (``config.model.generator._target_``).
        CheckpointError: a missing or malformed section, or an unknown model name.
    """
    from lightning_dp.models import MODELS, check_model_config
    from lightning_dp.registry import check_plain

    head = f"Checkpoint {str(path)!r}" if path is not None else "The checkpoint"
    if type(record) is not dict:
        raise CheckpointError(f"{head} has no lightning-dp record (found {type(record).__name__}).")
    for key in ("config", "data", "ledger"):
        if type(record.get(key)) is not dict:
            raise CheckpointError(f"{head} has a malformed lightning-dp record: {key} is "
                                  f"{type(record.get(key)).__name__}, not a mapping. Use a checkpoint written "
                                  "by train.py.")
    config = record["config"]
    if type(config.get("model")) is not dict:
        raise CheckpointError(f"{head} has a malformed lightning-dp record: config.model is "
                              f"{type(config.get('model')).__name__}, not a mapping.")
    try:  # positions are named from the record: config.model.module._target_, data.schema, ledger.releases[0]
        for key, value in record.items():
            if type(key) is not str or key.startswith("_"):
                raise UnsafeConfigError(f"the record has a key {key!r}; only plain string keys are allowed.")
            if key != "config":
                check_plain(value, key)
        for key, value in config.items():
            if key != "model":
                check_plain({key: value}, "config")
        check_model_config(config["model"], where="config.model")
    except UnsafeConfigError as err:
        raise UnsafeConfigError(f"{head} refused, nothing was built from it: {err}") from None
    name = config["model"].get("name")
    if name not in MODELS:
        raise CheckpointError(f"{head}: config.model.name is an unknown model {name!r}; valid models: "
                              f"{', '.join(MODELS)}. Use a checkpoint written by train.py.")
    if record["data"].get("kind") not in ("tabular", "image"):
        raise CheckpointError(f"{head} has a malformed lightning-dp record: data.kind is "
                              f"{record['data'].get('kind')!r}, not 'tabular' or 'image'.")


def data_layout(data_state: dict[str, Any]) -> dict[str, Any]:
    """The model-space layout (``n_continuous``, ``block_sizes``, ``num_classes``) of a saved data state."""
    if data_state["kind"] == "image":
        import numpy as np

        return {"n_continuous": int(np.prod(data_state["image_shape"])), "block_sizes": [],
                "num_classes": len(data_state["classes"])}
    from lightning_dp.data.encoders import TabularEncoder

    return TabularEncoder.from_state_dict(data_state).layout


@dataclass
class LoadedRun:
    """A checkpoint loaded, checked and rebuilt by :func:`load_run`.

    Attributes:
        checkpoint: the whole checkpoint dict (``state_dict``, ``lightning_dp``, Lightning's own entries).
        record: ``checkpoint["lightning_dp"]``: config, ledger state, data state, versions.
        model: the generator module rebuilt from ``record["config"]["model"]``, weights loaded (strict).
        data_state: ``record["data"]``: the released schema (or image shape) and classes, to decode samples.
    """

    checkpoint: dict[str, Any]
    record: dict[str, Any]
    model: Any
    data_state: dict[str, Any]


def check_model_size(model_cfg: Any, layout: dict[str, Any], *, where: str, training: bool = True) -> None:
    """Build the model on PyTorch's ``meta`` device (no storage) and refuse it when its networks cannot be built or
    would not fit in memory (``hidden: [1e9, 1e9]`` in a checkpoint's config), before anything is allocated.

    Raises:
        CheckpointError: the networks' sizes cannot be built.
        ResourceError: the networks need more memory than the machine has.
    """
    from lightning_dp.models import build_model
    from lightning_dp.resources import check_memory, module_bytes

    try:
        need = module_bytes(lambda: build_model(model_cfg, layout))
    except UnsafeConfigError:
        raise
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise CheckpointError(f"{where}: its networks cannot be built from these settings ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]}). Check the network sizes (e.g. hidden).") from None
    copies = 4 if training else 1  # weights, gradients and two Adam moments; sampling holds the weights only
    check_memory(copies * need, what=f"{where}'s networks ({need / 2**20:,.0f} MiB of weights"
                 + (", with gradients and optimizer state)" if training else ")"),
                 fix="Use smaller networks (e.g. model.generator.hidden)")


def load_run(path: str | os.PathLike) -> LoadedRun:
    """Load a checkpoint, validate its whole record (:func:`validate_record`), then rebuild its model.

    The one loader of sampling, audits and benchmarks: no code named by the file runs, only registered
    lightning-dp classes with plain-data parameters are built.

    Raises:
        UnsafeConfigError: the record names a class or holds a value that is refused (see :func:`validate_record`).
        CheckpointError: absent, corrupt or foreign file; a malformed record; weights that do not fit the model.
    """
    from lightning_dp.models import build_model

    ckpt = load_checkpoint(path)
    record = ckpt["lightning_dp"]
    validate_record(record, path=path)
    layout = data_layout(record["data"])
    check_model_size(record["config"]["model"], layout, where=f"The model in {str(path)!r}", training=False)
    model = build_model(record["config"]["model"], layout)
    state = ckpt["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"Checkpoint {str(path)!r} has no weights (state_dict is {type(state).__name__}).")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"The weights in {str(path)!r} do not fit the model rebuilt from its config "
                              f"({str(err)[:300]}). Use a checkpoint written by train.py.") from err
    return LoadedRun(checkpoint=ckpt, record=record, model=model, data_state=record["data"])
