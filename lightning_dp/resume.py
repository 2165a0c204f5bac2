"""Resuming a run: its own saved config, and the most advanced of its records, never less.

A run leaves three records of its ledger: ``checkpoints/last.ckpt`` (ledger, model, data state), the
pre-training record ``.prefit.json`` (ledger and data state after the row count and schema releases)
and ``ledger.json`` (written before every DP-SGD step's noise is used). They are written in an order
that keeps each one a prefix of the next (``PrivacyLedger.durable``), so a kill at any moment leaves
them consistent, with one of them the most advanced. A resumed run takes that one for its ledger, so
its ε never goes back, and the data state (count, schema) of the checkpoint or the pre-training
record, so nothing is released twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from lightning_dp.checkpoint import CheckpointError, load_checkpoint, validate_record
from lightning_dp.errors import UserError
from lightning_dp.launch import read_prefit
from lightning_dp.privacy.ledger import PrivacyLedger

log = logging.getLogger(__name__)

# What a resumed run may change: how long and where it trains, how it checkpoints, what it writes at the
# end. Everything else (privacy, data, model, mechanisms, the split) is the saved run's.
RESUMABLE = ("trainer.max_epochs", "trainer.max_steps", "trainer.enable_progress_bar", "trainer.log_every_n_steps",
             "trainer.enable_model_summary", "trainer.accelerator", "trainer.devices", "trainer.num_nodes",
             "callbacks", "num_samples", "audit", "data.root", "output_dir", "resume", "seed",
             "privacy.noise_seed")  # fixed noise is for tests; it does not change what is accounted
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class ResumeError(UserError, ValueError):
    """The run cannot be resumed as asked; the message says why and what to do."""


def _allowed(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE)


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: obj}


def resume_config(cfg: DictConfig, *, overrides: Sequence[str] | None = None,
                  checkpoint: Path | None = None) -> DictConfig:
    """The config of a resumed run: the run's saved ``config.yaml`` with the allowed changes.

    Args:
        cfg: the composed config of this invocation (it names ``output_dir`` and ``resume``).
        checkpoint: the checkpoint to resume; its record's config stands in for a missing ``config.yaml``
            (a checkpoint copied away from its run folder).
        overrides: the command line's overrides (``train.py`` passes Hydra's); each must be allowed
            (``RESUMABLE``) and is applied to the saved config, so the user need not repeat the run's own.
            ``None`` (a call from Python): ``cfg`` must equal the saved config except in allowed keys.

    Raises:
        ResumeError: no saved config, or a change that would alter the run's privacy meaning.
    """
    saved_path = Path(cfg.output_dir) / "config.yaml"
    if saved_path.is_file():
        saved = OmegaConf.create(yaml.safe_load(saved_path.read_text()))
    elif checkpoint is not None and checkpoint.is_file():
        record = load_checkpoint(checkpoint)["lightning_dp"]
        validate_record(record, path=checkpoint)
        saved = OmegaConf.create(record["config"])
        saved.output_dir = cfg.output_dir
    elif checkpoint is not None and checkpoint.name != "last.ckpt":
        raise CheckpointError(f"Checkpoint {str(checkpoint)!r} does not exist. Pass a run's checkpoint, or resume=last.")
    else:
        raise ResumeError(f"resume needs the run's saved config, {str(saved_path)!r}, which does not exist. Point "
                          "output_dir=PATH at the folder of the run to continue.")
    if overrides is not None:
        return _apply(saved, cfg, overrides)
    mine, theirs = _flatten(OmegaConf.to_container(cfg, resolve=True)), _flatten(OmegaConf.to_container(saved))
    changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k) and not _allowed(k))
    if changed:
        raise ResumeError(f"A resumed run keeps its saved config; these would change: {', '.join(changed[:8])}. "
                          f"Resume with only these changes allowed: {', '.join(RESUMABLE)}.")
    for key in {k for k in set(mine) | set(theirs) if _allowed(k) and k in mine}:
        OmegaConf.update(saved, key, mine[key], force_add=True)
    return saved


def _apply(saved: DictConfig, cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    refused = []
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if key.startswith("hydra."):
            continue
        if not _allowed(key):
            refused.append(key)
        elif key == "audit" and OmegaConf.select(cfg, "audit") is not None:
            OmegaConf.update(saved, "audit", OmegaConf.to_container(cfg.audit, resolve=True), force_add=True)
        else:
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), force_add=True)
    if refused:
        raise ResumeError(f"resume continues the run saved in {cfg.output_dir}/config.yaml, so {', '.join(refused)} "
                          f"cannot change (it would change what the run's privacy guarantee covers). Allowed: "
                          f"{', '.join(RESUMABLE)}; or start a new run in another output_dir.")
    return saved


@dataclass
class ResumeState:
    """What a resumed run continues from.

    Attributes:
        ledger: the most advanced consistent ledger state.
        data: the data state (count, schema) to reuse, or ``None`` when nothing was released yet.
        checkpoint: the checkpoint to restore the model and loops from, or ``None`` (training had not started).
        where: which record the ledger came from.
    """

    ledger: dict[str, Any]
    data: dict[str, Any] | None
    checkpoint: Path | None
    where: str


def resume_state(output_dir: str | Path, checkpoint: Path | None) -> ResumeState:
    """Read the run's records and pick the most advanced; check that they tell one story.

    Args:
        output_dir: the run's folder.
        checkpoint: the checkpoint asked for (``resume=last``: ``checkpoints/last.ckpt``), if it exists.

    Raises:
        ResumeError: nothing to resume, or records that disagree.
        CheckpointError: an unreadable checkpoint.
    """
    out = Path(output_dir)
    records: list[tuple[str, dict[str, Any]]] = []
    data, ckpt_path = None, None
    prefit = read_prefit(out)
    if prefit is not None:
        records.append((".prefit.json", prefit["ledger"]))
        data = prefit["data"]
    if checkpoint is not None and checkpoint.is_file():
        ckpt = load_checkpoint(checkpoint)
        record = ckpt["lightning_dp"]
        validate_record(record, path=checkpoint)  # plain data and registered classes only: nothing runs from it
        old_copy = (ckpt.get("callbacks") or {}).get("RunRecord", {}).get("ledger")  # checkpoints before format 2
        if old_copy is not None and old_copy != record["ledger"]:
            raise ResumeError(f"{str(checkpoint)!r} holds two different copies of its ledger: it was changed after it "
                              "was written and cannot be trusted. Resume from another checkpoint or start a new run.")
        records.append((str(checkpoint), record["ledger"]))
        data, ckpt_path = record["data"], checkpoint
    elif checkpoint is not None and checkpoint.name != "last.ckpt":
        raise CheckpointError(f"Checkpoint {str(checkpoint)!r} does not exist. Pass a run's checkpoint, or resume=last.")
    ledger_json = out / "ledger.json"
    if ledger_json.is_file():
        try:
            records.append(("ledger.json", PrivacyLedger.state_from_json(json.loads(ledger_json.read_text()))))
        except (json.JSONDecodeError, KeyError) as err:
            raise ResumeError(f"{str(ledger_json)!r} is damaged ({err}); the run's other records cannot be checked "
                              "against it. Restore it from a backup or start a new run.") from err
    if not records:
        raise ResumeError(f"{str(out)!r} holds no run to resume (no checkpoint, .prefit.json or ledger.json). Start "
                          "a new run without resume=.")
    try:
        where, ledger = PrivacyLedger.most_advanced(records)
    except ValueError as err:
        raise ResumeError(str(err)) from err
    return ResumeState(ledger=ledger, data=data, checkpoint=ckpt_path, where=where)
