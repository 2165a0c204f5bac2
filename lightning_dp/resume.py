"""Resuming a run: its own saved config, and the most advanced of its records, never less.

A run leaves three records of its ledger: ``checkpoints/last.ckpt`` (ledger, model, data state), the
pre-training record ``.prefit.json`` (ledger and data state after the row count and schema releases)
and ``ledger.json`` (written before every DP-SGD step's noise is used). They are written in an order
that keeps each one a prefix of the next (``PrivacyLedger.durable``), so a kill at any moment leaves
them consistent, with one of them the most advanced. A resumed run takes that one for its ledger, so
its ε never goes back, and the data state (count, schema) of the checkpoint or the pre-training
record, so nothing is released twice.

A run saved by an earlier release resumes under this one when its classes have since gained settings or state
that do what they did before: a setting added later (a class's ``settings_added_later``) that the saved config lacks
takes its default (:func:`upgrade_saved_config`), and weights that lack a group of state added later (a module's
``state_added_later``) load with the group's initial values. A setting the saved run had that this release no
longer takes is refused, as is any other difference.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from lightning_dp.checkpoint import CheckpointError, load_checkpoint, load_checkpoint_bytes, validate_record
from lightning_dp.errors import UserError
from lightning_dp.io import atomic_write_bytes
from lightning_dp.launch import HANDOFF, read_prefit
from lightning_dp.models import fill_settings_added_later, settings_removed
from lightning_dp.privacy.ledger import PrivacyLedger

log = logging.getLogger(__name__)

# What a resumed run may change: how long and where it trains, how it checkpoints, what it writes at the
# end. Everything else (privacy, data, model, mechanisms, the split) is the saved run's.
RESUMABLE = ("trainer.max_epochs", "trainer.max_steps", "trainer.enable_progress_bar", "trainer.log_every_n_steps",
             "trainer.enable_model_summary", "trainer.accelerator", "trainer.devices", "trainer.num_nodes",
             "callbacks", "num_samples", "audit", "data.root", "output_dir", "resume", "resume_external", "seed",
             "privacy.noise_seed")  # fixed noise is for tests; it does not change what is accounted


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
        saved = OmegaConf.create(upgrade_saved_config(read_saved_config(saved_path), str(saved_path)))
    elif checkpoint is not None and checkpoint.is_file():
        record = load_checkpoint(checkpoint)["lightning_dp"]
        validate_record(record, path=checkpoint)
        check_literal(record["config"], f"the config in {checkpoint}")
        saved = OmegaConf.create(upgrade_saved_config(record["config"], f"the config in {checkpoint}"))
        saved.output_dir = cfg.output_dir
    elif checkpoint is not None and checkpoint.name != "last.ckpt":
        raise CheckpointError(f"Checkpoint {str(checkpoint)!r} does not exist. Pass a run's checkpoint, or resume=last.")
    else:
        raise ResumeError(f"resume needs the run's saved config, {str(saved_path)!r}, which does not exist. Point "
                          "output_dir=PATH at the folder of the run to continue.")
    if overrides is not None:
        return _apply(saved, cfg, overrides)
    mine = _flatten(_with_added(OmegaConf.to_container(cfg, resolve=True)))  # today's defaults of what it lacks
    theirs = _flatten(OmegaConf.to_container(saved))
    changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k) and not _allowed(k))
    if changed:
        raise ResumeError(f"A resumed run keeps its saved config; these would change: {', '.join(changed[:8])}. "
                          f"Resume with only these changes allowed: {', '.join(RESUMABLE)}.")
    for key in {k for k in set(mine) | set(theirs) if _allowed(k) and k in mine}:
        OmegaConf.update(saved, key, mine[key], force_add=True)
    return saved


def upgrade_saved_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """A run's saved config (plain data) as this release continues it, in place: each setting its classes gained
    since (``settings_added_later``) at its default, which is what the run did before the setting existed
    (:func:`~lightning_dp.models.fill_settings_added_later`); the resumed run records them in its config.yaml and
    checkpoints.

    Raises:
        ResumeError: the saved config sets something its classes no longer take (removed or renamed since): this
            release cannot continue the run as it was trained.
    """
    model = config.get("model")
    if not isinstance(model, dict):
        return config  # validate_record and the model's checks refuse it, with their messages
    removed = settings_removed(model)
    if removed:
        raise ResumeError(f"{where} sets {', '.join(removed[:4])}, which this lightning-dp no longer has (removed or "
                          "renamed since the run was saved). Resume with the release that wrote the run (its "
                          "versions.json), or start a new run.")
    added = fill_settings_added_later(model)
    if added:
        log.info("The run was saved before %s existed; it continues with %s, what it did then.", ", ".join(added),
                 ", ".join(f"{k.rsplit('.', 1)[-1]}={json.dumps(v)}" for k, v in added.items()))
    return config


def _with_added(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the settings added later that it lacks at their defaults (a copy; nothing is refused)."""
    if not isinstance(config.get("model"), dict):
        return config
    config = {**config, "model": copy.deepcopy(config["model"])}
    fill_settings_added_later(config["model"])
    return config


def read_saved_config(path: Path) -> dict[str, Any]:
    """A run's saved ``config.yaml``: plain YAML (no tags), literal values (no ``${...}``, finite numbers).

    Raises:
        ResumeError: a YAML tag or syntax error, not a mapping, an interpolation or a non-finite number.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        first = str(err).strip().splitlines()[0][:160]
        raise ResumeError(f"{str(path)!r} is not plain YAML ({first}); a run's config is data only, with no tags like "
                          "!!python/. Restore the config.yaml the run wrote, or start a new run.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResumeError(f"{str(path)!r} cannot be read ({err}). Restore the config.yaml the run wrote.") from None
    if not isinstance(data, dict):
        raise ResumeError(f"{str(path)!r} is not a mapping of settings. Restore the config.yaml the run wrote.")
    check_literal(data, str(path))
    return data


def check_literal(value: Any, where: str, key: str = "") -> None:
    """Refuse what a run never writes into its saved config: an interpolation (``${...}``, which OmegaConf would
    resolve: ``${oc.env:HOME}`` reads the environment) or a non-finite number (``lr: .nan``).

    Raises:
        ResumeError: naming the setting.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            check_literal(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_literal(v, where, f"{key}[{i}]")
    elif isinstance(value, str) and "${" in value:
        raise ResumeError(f"{where}: {key} = {value[:80]!r} is an interpolation; a run's saved config holds resolved "
                          "values only, so it was edited. Restore it, or start a new run.")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ResumeError(f"{where}: {key} = {value} is not a finite number; the run never wrote it, so the config was "
                          "edited. Restore it, or start a new run.")


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
        records: every record of the ledger found (``(where, state)``), for the budget registry's checks.
        config: the checkpoint's own record of the run's config, or ``None``.
        weights: the checkpoint's ``state_dict``, or ``None``.
        epoch: the epoch the checkpoint was saved in, or ``None``.
    """

    ledger: dict[str, Any]
    data: dict[str, Any] | None
    checkpoint: Path | None
    where: str
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    epoch: int | None = None


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
    data, ckpt_path, config, weights, epoch = None, None, None, None, None
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
        check_literal(record["config"], f"the config in {checkpoint}")
        data, ckpt_path, config = record["data"], checkpoint, record["config"]
        weights, epoch = ckpt.get("state_dict"), ckpt.get("epoch")
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
    return ResumeState(ledger=ledger, data=data, checkpoint=ckpt_path, where=where, records=records, config=config,
                       weights=weights, epoch=epoch if type(epoch) is int else None)


def check_same_run(cfg: DictConfig, state: ResumeState) -> None:
    """The run's ``config.yaml`` and its checkpoint's own record of the config must agree on everything a resume
    may not change (privacy, data, model, mechanisms: a clip norm or an ε edited in one of them).

    Raises:
        ResumeError: naming the settings that differ.
    """
    if state.config is None:
        return
    mine = _flatten(_with_added(OmegaConf.to_container(cfg, resolve=True)))
    theirs = _flatten(_with_added(state.config))  # a checkpoint saved before a setting existed ran at its default
    changed = sorted(k for k in set(mine) | set(theirs)
                     if not _allowed(k) and mine.get(k) != theirs.get(k) and not (mine.get(k) is None is theirs.get(k)))
    if changed:
        raise ResumeError(f"{cfg.output_dir}/config.yaml and the checkpoint {state.checkpoint} disagree on "
                          f"{', '.join(changed[:6])}: one of them was edited. Restore the run's config.yaml, or start a "
                          "new run.")


def check_checkpoint_fits(cfg: DictConfig, state: ResumeState) -> None:
    """Before anything is read or released: the run's networks fit in memory, the checkpoint's weights fit them
    (names and shapes, the model built on the ``meta`` device), and the run is asked for at least the epochs it
    has done.

    Raises:
        ResumeError: another model's weights, or ``trainer.max_epochs`` below the epochs done.
        ResourceError, CheckpointError: networks that cannot be built or do not fit in memory.
    """
    if state.weights is None or state.data is None:
        return
    if not isinstance(state.weights, dict):
        raise ResumeError(f"{state.checkpoint} holds no weights (state_dict is {type(state.weights).__name__}).")
    import torch

    from lightning_dp.checkpoint import check_model_size, data_layout
    from lightning_dp.models import build_model

    layout = data_layout(state.data)
    check_model_size(cfg.model, layout, where=f"model={cfg.model.name}")
    with torch.device("meta"):
        model = build_model(cfg.model, layout)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(getattr(v, "shape", ())) for k, v in state.weights.items()}
    later = type(model).absent_later_state(found)  # state a later release added, which a run saved before lacks
    missing, unexpected = sorted(set(expected) - set(found) - later), sorted(set(found) - set(expected))
    growing = set(getattr(type(model), "variable_buffers", ()))  # sized by the releases (e.g. GEM's measurements)
    wrong = sorted(k for k in set(expected) & set(found) if expected[k] != found[k] and k not in growing)
    if missing or unexpected or wrong:
        detail = "; ".join(f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}" for what, keys in
                           (("missing", missing), ("unexpected", unexpected), ("other shapes", wrong)) if keys)
        raise ResumeError(f"The weights in {state.checkpoint} are not model={cfg.model.name}'s as configured ({detail}): "
                          "the checkpoint belongs to another model. Resume the run it belongs to.")
    max_epochs = cfg.trainer.get("max_epochs")
    if state.epoch is not None and max_epochs is not None and 0 <= max_epochs < state.epoch:
        raise ResumeError(f"trainer.max_epochs={max_epochs} is below the {state.epoch} epochs the run has done; "
                          f"resume with trainer.max_epochs={state.epoch} or more.")


@dataclass
class RegistryResume:
    """How a resumed run continues in the budget registry.

    Attributes:
        ledger: the ledger state to continue from (the registry's own record of the run, or an external
            checkpoint's ledger, charged again in full).
        run_id: the run's id in the registry; ``None`` for an external checkpoint (a new run).
        dataset_id: the registry's data set of the run; ``None`` for an external checkpoint.
        external_of: the checkpoint an external run starts from.
    """

    ledger: dict[str, Any]
    run_id: str | None
    dataset_id: int | None
    external_of: str | None


VALUE_FILES = ("checkpoints/last.ckpt", HANDOFF)  # the files a durable block's commit writes (its payload's path)


def restore_values(registry: Any, output_dir: str | Path, state: ResumeState) -> str | None:
    """Write the values the budget registry holds for the run (``Registry.payload``) where the run's file lacks them.

    A durable block's values are charged to the registry together with the bytes of their file, and written only after
    that transaction (``PrivacyLedger._persist``). A run killed in between left the registry holding values that no
    file holds: they are written now, atomically, to their path, so the run resumes from them as from any checkpoint
    or ``.prefit.json``: the same noisy values that were charged, no new draw, no new charge. A file that is as far as
    the stored values, or further, is never overwritten. The bytes are untrusted input like any checkpoint: the row's
    tag (the registry's key), the safe load (``weights_only``; :func:`validate_record`) and the ledger's seal are
    checked before anything is written.

    Args:
        registry: the budget registry.
        output_dir: the run's folder.
        state: the run's records as :func:`resume_state` read them (they name the run).

    Returns:
        The file written (relative to ``output_dir``), or ``None`` when the files were up to date.

    Raises:
        TamperedError: the stored values were changed in the database.
        ResumeError, CheckpointError: stored values that are not the run's, or that disagree with its file.
    """
    ids = {s.get("run_id") for _, s in state.records}
    if len(ids) != 1 or None in ids:
        return None  # registry_resume refuses these records, with its message
    run_id = ids.pop()
    stored = registry.payload(run_id)
    if stored is None:
        return None
    where = f"the budget registry's copy of {stored.path} (run {run_id})"
    if stored.path not in VALUE_FILES:
        raise ResumeError(f"{where} is not a file a run writes ({', '.join(VALUE_FILES)}): it cannot be restored.")
    theirs = _values_ledger(stored.path, stored.data, where)
    registry.check_seal(theirs, where)
    if theirs.get("run_id") != run_id:
        raise ResumeError(f"{where} holds the ledger of another run ({theirs.get('run_id')}): it cannot be restored.")
    target = Path(output_dir) / stored.path
    if target.is_file():
        mine = _values_ledger(stored.path, target.read_bytes(), str(target))
        try:
            PrivacyLedger.most_advanced([(str(target), mine), (where, theirs)])
        except ValueError as err:
            raise ResumeError(str(err)) from None
        if _total(theirs) <= _total(mine):
            return None  # the file holds these values, or later ones
    atomic_write_bytes(target, stored.data)
    log.warning("Run %s was stopped after the budget registry charged a block of releases and before %s was written: "
                "written now from the bytes the registry keeps with the charge (the same values; nothing is drawn "
                "again).", run_id, stored.path)
    return stored.path


def _values_ledger(path: str, data: bytes, where: str) -> dict[str, Any]:
    """The ledger state in a value file's bytes (a checkpoint, loaded safely, or ``.prefit.json``)."""
    if path == HANDOFF:
        try:
            record = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ResumeError(f"{where} is not a pre-fit record ({err}).") from None
        if type(record) is not dict or type(record.get("ledger")) is not dict or type(record.get("data")) is not dict:
            raise ResumeError(f"{where} is not a pre-fit record (no ledger and data).")
        return record["ledger"]
    record = load_checkpoint_bytes(data, where=where)["lightning_dp"]
    validate_record(record, path=where)
    return record["ledger"]


def registry_resume(registry: Any, state: ResumeState, *, external: bool = False) -> RegistryResume:
    """The spend a resumed run continues from: the budget registry's record of it, never the files alone.

    The run's records (checkpoint, ``.prefit.json``, ``ledger.json``) must name one run id the registry knows,
    carry the registry's integrity tag, and tell one story with the registry's record. The registry's record is
    the spend, except where a sealed checkpoint extends it by the block it saved just before a kill: that one is
    recorded when the run reopens (``Registry.open_run``), so the spend never goes back. With ``external`` (``resume_external=true``), a checkpoint from elsewhere
    (another registry, an older lightning-dp, an unknown run) starts a new run whose ledger is the checkpoint's,
    charged to the data set again in full.

    Raises:
        ResumeError: an unknown run, records that disagree with each other or with the registry, or an edited file.
    """
    from lightning_dp.budget.registry import TamperedError

    records = state.records
    if external:
        where = str(state.checkpoint) if state.checkpoint is not None else state.where
        log.warning("resume_external=true: %s starts a new run whose recorded releases (its ledger) are charged to the "
                    "data set again in full.", where)
        return RegistryResume(ledger=state.ledger, run_id=None, dataset_id=None, external_of=where)
    ids = {s.get("run_id") for _, s in records}
    if len(ids) > 1:
        raise ResumeError(f"The run's records name different runs ({', '.join(sorted(str(i) for i in ids))}): its files "
                          "were mixed up or changed. Resume another run, or start a new one.")
    run_id = ids.pop() if ids else None
    row = registry.run(run_id) if run_id else None
    if row is None:
        what = "carry no run id (written before the budget registry)" if not run_id else f"name run {run_id}, which"
        raise ResumeError(f"The records of {state.where} {what} {'is not ' if run_id else 'and are not '}in the budget "
                          f"registry at {registry.display}, so their spend cannot be checked. To continue from them, "
                          "pass resume_external=true: a new run starts from the checkpoint and its ledger is charged "
                          "to the data set again in full.")
    try:
        for where, record in records:
            registry.check_seal(record, where)
        where, _ = PrivacyLedger.most_advanced([*records, ("the budget registry", row.state)])
    except TamperedError as err:
        raise ResumeError(str(err)) from None
    except ValueError as err:
        raise ResumeError(f"{err} (compared with the budget registry's record of run {run_id}).") from None
    # a checkpoint one durable block ahead (the run was killed between saving a release's value and recording it):
    # sealed by this registry and extending its record, so the resumed run records it before anything else
    best = row.state if where == "the budget registry" else dict(records)[where]
    waived = {**row.state.get("no_dp_claim", {}), **state.ledger.get("no_dp_claim", {})}
    values = dict(records).get(str(state.checkpoint)) if state.checkpoint is not None else None
    lost = lost_uses(best, values if values is not None else dict(records).get(".prefit.json"))
    fresh = {k: v for k, v in lost.items() if v > int((best.get("lost") or {}).get(k, 0))}
    if fresh:
        log.warning("Run %s: the budget registry charged %s, whose values no saved record holds (not kept by the "
                    "registry either: a file removed, or DP-SGD steps after the last checkpoint). They stay charged, "
                    "and are drawn again if needed.", run_id,
                    ", ".join(f"{n} ×{c}" for n, c in sorted(fresh.items())))
    return RegistryResume(ledger={**best, "no_dp_claim": waived, "lost": lost}, run_id=run_id,
                          dataset_id=row.dataset_id, external_of=None)


def lost_uses(charged: dict[str, Any], saved: dict[str, Any] | None) -> dict[str, int]:
    """Per release name, the uses ``charged`` (the registry's record) holds beyond the record that holds the released
    values (``saved``: the checkpoint, else ``.prefit.json``; ``None`` when neither exists), plus those already lost.

    A durable block's values are charged with their bytes, which :func:`restore_values` writes before this is asked,
    so what is left are uses no file and no stored payload holds (DP-SGD steps after the last checkpoint, a
    checkpoint deleted after its run ended): they stay in ε (over-charging), and ``PrivacyLedger.has`` does not count
    them, so a one-shot release is drawn again instead of being looked for in a checkpoint that lacks it.
    """
    def counts(state: dict[str, Any] | None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in (state or {}).get("releases", []):
            out[r["name"]] = out.get(r["name"], 0) + int(r["count"])
        return out

    have, kept = counts(charged), counts(saved)
    before, saved_lost = charged.get("lost") or {}, (saved or {}).get("lost") or {}
    lost = {name: max(int(before.get(name, 0)), int(saved_lost.get(name, 0)) + n - kept.get(name, 0))
            for name, n in have.items()}
    return {name: n for name, n in lost.items() if n > 0}


def load_ledger(ledger: PrivacyLedger, state: dict[str, Any]) -> None:
    """Load a resumed run's ledger state; a target, δ, accountant or adjacency that differs from the run's config
    (a config.yaml edited to another ε) is refused with one line.

    Raises:
        ResumeError: the saved ledger and the config disagree.
    """
    try:
        ledger.load_state_dict(state)
    except (ValueError, KeyError, TypeError) as err:
        raise ResumeError(f"The run's saved ledger does not fit its config ({err}). The run's files were changed; "
                          "resume cannot continue it. Restore its config.yaml, or start a new run.") from None


def _total(state: dict[str, Any]) -> int:
    return sum(int(r["count"]) for r in state.get("releases", []))
