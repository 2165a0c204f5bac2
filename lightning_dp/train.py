"""``train(cfg)``: one private training run, from a composed config to checkpoint, ledger and samples."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_dp.budget import RunBudget, in_tuning
from lightning_dp.callbacks.progress_lines import ProgressLines
from lightning_dp.callbacks.run_record import RunRecord, write_run_files
from lightning_dp.checkpoint import AtomicCheckpointIO
from lightning_dp.data.datamodule import PrivateDataModule
from lightning_dp.data.dp_count import RowCount
from lightning_dp.errors import RunExistsError, StorageError, UserError, python_command
from lightning_dp.launch import launch_rank, prefit_payload, publish_prefit, wait_for_prefit
from lightning_dp.models import build_mechanisms, build_model, check_data, minmax_columns
from lightning_dp.preflight import (
    ConfigError,
    check_before_release,
    check_model,
    check_rows_memory,
    check_run,
    check_space,
    checkpoint_bytes,
)
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.coverage import complete_mechanisms
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger
from lightning_dp.privacy.metrics import GuardedCSVLogger, declared_metrics
from lightning_dp.progress import tracker
from lightning_dp.resume import (
    check_checkpoint_fits,
    check_same_run,
    load_ledger,
    registry_resume,
    restore_values,
    resume_config,
    resume_state,
)
from lightning_dp.run_log import RunLog
from lightning_dp.synthetic import write_samples
from lightning_dp.weighting.apply import Weighting, WeightsConfig, weighted_frame

log = logging.getLogger(__name__)


class _DropTips(logging.Filter):
    """Lines Lightning prints on every run that say nothing a user can act on: its advertisement for a cloud
    logger, "GPU/TPU/HPU available: False" on a CPU machine (a GPU that is there but unused is still shown),
    "`Trainer.fit` stopped: `max_epochs=3` reached" (the progress lines and the summary say it), and its two
    "Restoring/Restored states" lines on a resume."""

    NOISE = re.compile(r"💡 Tip|(GPU|TPU|HPU|IPU) available: False|`Trainer\.fit` stopped: `max_(epochs|steps)=|"
                       r"Restor(ing|ed all) states from the checkpoint")  # our "Resuming from ..." line says it

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.NOISE.match(str(record.msg))


def quiet_lightning() -> None:
    """Keep the run's log to what matters: no logger advertisement, no deprecation noise from Lightning's
    own internals (warnings about our code still show)."""
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if not any(isinstance(f, _DropTips) for f in logger.filters):
        logger.addFilter(_DropTips())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    # a resumed epoch is as valid as a new one here: DP-SGD's Poisson sampler draws every batch afresh (secret
    # randomness, accounted per step) and one-shot models train on generated batches; Lightning warns on every
    # resume of a model with two optimizers (its global step counts both)
    warnings.filterwarnings("ignore", message=r".*ended before the epoch ended and your dataloader is not resumable.*")
    # steps_per_epoch below log_every_n_steps (short runs, tests): metrics are still logged at the epoch's end
    warnings.filterwarnings("ignore", message=r".*is smaller than the logging interval.*")


def trainer_options(trainer_cfg: DictConfig) -> dict[str, Any]:
    """The ``trainer`` config for ``pl.Trainer``; ``enable_progress_bar: null`` means: only on a terminal
    (a progress bar in a log file is thousands of carriage returns)."""
    options = dict(OmegaConf.to_container(trainer_cfg, resolve=True))
    if options.get("enable_progress_bar") is None:
        options["enable_progress_bar"] = sys.stderr.isatty()
    return options


def advise(cfg: DictConfig, dm: PrivateDataModule) -> None:
    """Say so when a run's settings are known to give a poor model, with the figure and the fix."""
    if dm.kind == "image" and not cfg.get("tuned"):
        log.warning("model=%s with its default settings is tuned for tabular data; on images it gives poor samples. "
                    "Use a tuned experiment: experiment=dp_merf_mnist, pearl_mnist or dp_cgan_mnist.", cfg.model.name)
    steps = cfg.model.module.get("steps_per_epoch")
    if steps and cfg.trainer.get("max_epochs") and cfg.model.name != "gem":  # gem releases between its steps
        log.info("%s trains %d generator steps after its one-shot release (post-processing: no further budget).",
                 cfg.model.name, steps * cfg.trainer.max_epochs)


def make_ledger(privacy: DictConfig) -> PrivacyLedger:
    """The run's ledger from the ``privacy`` config group (validates ε and δ)."""
    return PrivacyLedger(target_epsilon=privacy.epsilon, delta=privacy.delta, accountant=privacy.accountant,
                         adjacency=privacy.adjacency)


def check_delta(delta: float, count: RowCount, *, allow_large_delta: bool) -> None:
    """Refuse δ ≥ 1/n: such a δ allows releasing a whole row ("name and shame") within the guarantee.

    ``count`` is the run's DP (or public) count, so the refusal is post-processing of a release.

    Raises:
        ValueError: δ ≥ 1/n and ``allow_large_delta`` is false.
    """
    n = count.value
    if delta >= 1.0 / n:
        msg = (f"privacy.delta={delta:g} is not below 1/n = {1.0 / n:.3g} for {count.describe()}: a mechanism "
               f"could then publish a whole record and still satisfy the guarantee. Use privacy.delta <= "
               f"{0.1 / n:.1g}, or set privacy.allow_large_delta=true to proceed anyway.")
        if not allow_large_delta:
            raise ConfigError(msg)
        warnings.warn(msg, stacklevel=2)


def _resume_path(cfg: DictConfig) -> Path | None:
    if not cfg.get("resume"):
        return None
    return Path(cfg.output_dir) / "checkpoints" / "last.ckpt" if cfg.resume == "last" else Path(cfg.resume)


def train(cfg: DictConfig, *, overrides: Sequence[str] | None = None,
          callbacks: Sequence[pl.Callback] = ()) -> dict[str, Any]:
    """Train one generator privately and write the run's artefacts to ``cfg.output_dir``.

    Writes ``config.yaml``, ``versions.json``, ``ledger.json``, ``checkpoints/last.ckpt`` and
    ``synthetic.csv`` (tabular) or ``synthetic.npz`` + ``synthetic.png`` (images).

    Order (so that a run that cannot finish spends nothing, and a kill loses no budget):
    settings and the output folder are checked; the run's records are read (resume) or the folder is
    checked to be new; the row count and schema facts are released in durable blocks (saved to
    ``.prefit.json`` and ``ledger.json`` before use); the model is built and the free space checked for its
    checkpoints; then training, whose releases are saved the same way (``RunRecord``).

    Args:
        cfg: the composed config.
        overrides: the command line's overrides (``train.py``); with ``resume``, they are applied to the
            run's saved config, and only those in ``resume.RESUMABLE`` are allowed.
        callbacks: extra Lightning callbacks, run after the mechanisms (the white-box one-run audit attaches its
            gradient canaries to DP-SGD this way; ``audits.white_box``). Not reachable from train.py's configs.

    Returns:
        Paths of the artefacts (``output_dir``, ``checkpoint``, ``ledger``, ``synthetic``), the ε and δ spent,
        and for an audit composed by the caller the run's ``datamodule``, ``privacy_ledger`` and resolved
        ``config``.

    Raises:
        ValueError: bad settings (``ConfigError``), unknown model or data set, bad data (``DataError``), a
            resume that would change the run (``ResumeError``).
        BudgetExceededError: the budget is already spent (e.g. resuming a finished run).
    """
    if cfg.get("tune"):  # private hyperparameter selection: candidates are train() runs with tune=null
        if callbacks:
            raise ValueError("train(callbacks=...) is for one run; a tuning run (tune=...) trains many.")
        from lightning_dp.tuning.tune import tune

        progress = (cfg.get("callbacks") or {}).get("progress") or {}
        with tracker.session(every=progress.get("every_seconds"), enabled=progress.get("enabled")):
            return tune(cfg, overrides=overrides)
    run_log = RunLog()
    progress = (cfg.get("callbacks") or {}).get("progress") or {}
    held: dict[str, Any] = {}
    try:
        with tracker.session(every=progress.get("every_seconds"), enabled=progress.get("enabled")), \
                contextlib.ExitStack() as stack:  # the budget registry's session and folder lock end with the run
            return _train(cfg, overrides=overrides, run_log=run_log, held=held, stack=stack, callbacks=callbacks)
    except UserError as err:
        say_spent(err, held.get("ledger"), Path(held.get("output_dir", cfg.output_dir)))
        raise
    finally:
        run_log.close()


def say_spent(err: UserError, ledger: PrivacyLedger | None, out: Path) -> None:
    """A refusal after a release says what was spent and how to go on (its message is extended in place).

    Every check that needs no private data runs before the first release (``preflight.py``); what is refused
    after one (a check on the DP count, a DP schema release that finds too little) leaves that release on the
    ledger, and the user must know it.
    """
    if ledger is None or ledger.spent <= 0 or not (out / "ledger.json").exists():
        return
    text = str(err.args[0]) if err.args else str(err)
    if "spent" in text.replace("nothing was spent", ""):
        return  # the message already says it
    text = re.sub(r"[;,]? ?[Nn]othing was spent\.?", ".", text).replace("..", ".").rstrip()
    err.args = (f"{text} This run already spent {ledger.summary()} (recorded in {out / 'ledger.json'}): fix the "
                f"setting and continue with output_dir={out} resume=last where resume allows that setting to change, "
                "or start a new run with another output_dir (its budget composes with this one's).", *err.args[1:])


def _weighting(cfg: DictConfig) -> Weighting | None:
    """The run's ``weights`` setting, checked (estimator, parameters, model) before any release."""
    if not cfg.get("weights"):
        return None
    from lightning_dp.data.sources import IMAGES

    config = WeightsConfig.from_node(OmegaConf.to_container(cfg.weights, resolve=True))
    return Weighting(config, layout=None, model_name=cfg.model.name, model_cfg=cfg.model,
                     data_kind="image" if cfg.data.name in IMAGES else "tabular")


def _reserve_weights(cfg: DictConfig, weighting: Weighting, dm: PrivateDataModule, ledger: PrivacyLedger) -> int:
    """Plan the weights for this run's synthetic rows and reserve their budget before the generator calibrates.

    Every rank reserves the same (a deterministic function of the released facts), so the generator's
    mechanisms calibrate alike everywhere. Returns the number of rows to weight.

    Raises:
        ConfigError: image data, or more rows than the estimator admits.
    """
    if dm.kind != "tabular":
        raise ConfigError(f"weights={weighting.config.estimator} weights tabular rows; {cfg.data.name} is image data. "
                          "Drop the weights setting.")
    weighting.layout = dm.layout
    num_real = dm.released_num_rows
    rows = cfg.get("num_samples") or weighting.default_rows(num_real=num_real, ledger=ledger)
    releases = weighting.plan(num_real=num_real, num_rows=rows, ledger=ledger)
    ledger.unreserve()
    if not any(ledger.has(r.name) for r in releases):  # not yet spent (a resumed run reserves again)
        ledger.reserve(releases)
        if releases:
            log.info("Reserved the weights' budget (%s) before training: %s", weighting.config.estimator, ledger.summary())
    return int(rows)


def _write_weighted(cfg: DictConfig, weighting: Weighting, model: Any, dm: PrivateDataModule, ledger: PrivacyLedger,
                    record: RunRecord, trainer: pl.Trainer, rows: int) -> dict[str, Any]:
    """Spend the reserved budget on the weights, save the checkpoint with the ledger, write the weighted rows."""
    from lightning_dp.data.datamodule import write_table
    from lightning_dp.io import atomic_write_text

    out = Path(cfg.output_dir)
    sample = weighting.run(model=model.cpu(), real=(dm.x, dm.y), num_rows=rows, num_real=dm.released_num_rows,
                           ledger=ledger, generator=mech.noise_generator(cfg.privacy.get("noise_seed")), seed=cfg.seed)
    record.save(trainer)  # the checkpoint's ledger now holds the weights' release too
    path = out / "synthetic.csv"
    try:
        write_table(weighted_frame(dm.state_dict(), sample), path)
        atomic_write_text(out / "weights.json", json.dumps(sample.summary, indent=2, default=float) + "\n")
    except OSError as err:
        raise StorageError(f"Writing the weighted synthetic data failed ({err.strerror or err}); the weights' budget is "
                           f"spent and on the ledger ({ledger.summary()}). Free space, then weight a new sample with "
                           f"{python_command()} -m lightning_dp.sample {record.last_path} --weights ... if budget remains.") from err
    log.info("Wrote %d weighted rows to %s: Kish ESS %.1f, PSIS k̂ %.2f (%s); %s", len(sample.weights), path,
             sample.summary["kish_ess"], sample.summary["psis_k"], sample.summary["psis_verdict"], ledger.summary())
    return {"synthetic": str(path), "weights": sample.summary, "epsilon": ledger.spent}


class _RunFiles:
    """``config.yaml``, ``versions.json`` and ``train.log``, written once, when first needed."""

    def __init__(self, out: Path, config_yaml: str, run_log: RunLog) -> None:
        self.out, self.config_yaml, self.run_log, self.written = out, config_yaml, run_log, False

    def ensure(self) -> None:
        if not self.written:
            write_run_files(self.out, config_yaml=self.config_yaml)
            self.run_log.open(self.out / "train.log")
            self.written = True


def _train(cfg: DictConfig, *, overrides: Sequence[str] | None, run_log: RunLog,
           held: dict[str, Any], stack: contextlib.ExitStack,
           callbacks: Sequence[pl.Callback] = ()) -> dict[str, Any]:
    resume = _resume_path(cfg)
    external = bool(cfg.get("resume_external"))
    if resume is not None:
        cfg = resume_config(cfg, overrides=overrides, checkpoint=resume)
        cfg.resume = str(resume)
    with open_dict(cfg):
        cfg.resume_external = False  # an explicit act for this invocation, not saved with the run
    out = Path(cfg.output_dir)
    check_run(cfg, out)
    rank = launch_rank()
    ledger = make_ledger(cfg.privacy)
    # rank 0 keeps the run's records in the budget registry (one budget per data set) and locks the run folder; a
    # tuning candidate has no session of its own (the tuning run is charged the selection's ε: tuning/tune.py)
    budget = stack.enter_context(RunBudget.open(cfg.privacy, out)) if rank == 0 and not in_tuning() else None
    held.update(ledger=ledger, output_dir=str(out))  # for the message of a refusal after a release
    tracker.set_epsilon(lambda: f"ε = {ledger.spent:.4g} of {ledger.target_epsilon:g}")
    if rank > 0:  # under DDP rank 0 alone writes progress lines
        tracker.enabled = False
    tracker.stage("prepare data (row count and schema releases)")
    data_state, ckpt_path = None, None
    if resume is not None:
        state = resume_state(out, resume)
        if budget is not None and not external and restore_values(budget.registry, out, state):
            state = resume_state(out, resume)  # with the values the registry charged and held (killed before the write)
        check_same_run(cfg, state)
        check_checkpoint_fits(cfg, state)  # another model's weights, fewer epochs than done: before anything else
        if budget is not None:  # the spend is the registry's record of the run, never the files alone
            cont = registry_resume(budget.registry, state, external=external)
            load_ledger(ledger, cont.ledger)
            budget.attach(ledger, run_id=cont.run_id, dataset_id=cont.dataset_id, external_of=cont.external_of)
        else:
            load_ledger(ledger, state.ledger)
        data_state, ckpt_path = state.data, state.checkpoint
        log.info("Resuming from %s (ledger from %s): %s", ckpt_path or ".prefit.json",
                 "the budget registry" if budget is not None and not external else state.where, ledger.summary())
    elif rank > 0:  # another process of a DDP run: rank 0 released the pre-fit facts (lightning_dp/launch.py)
        handoff = wait_for_prefit(out)
        ledger.load_state_dict(handoff["ledger"])
        data_state = handoff["data"]
    elif any((out / name).exists() for name in ("ledger.json", ".prefit.json", "checkpoints/last.ckpt")):
        raise RunExistsError(f"{str(out)!r} already holds a run. Continue it with resume=last, or choose another "
                              "output_dir=PATH.")
    elif budget is not None:
        budget.attach(ledger)
    run_files = _RunFiles(out, OmegaConf.to_yaml(cfg, resolve=True), run_log)
    if rank == 0:  # the run's files appear with its first release: a run refused before it leaves nothing

        def persist(led: PrivacyLedger) -> None:
            run_files.ensure()
            led.save_json(out / "ledger.json")

        ledger.persist = persist
    weighting = _weighting(cfg)  # its settings are checked before anything is released
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    noise_seed = cfg.privacy.get("noise_seed")
    dm = PrivateDataModule(**cfg.data)
    allow = cfg.privacy.get("allow_large_delta", False)
    public: dict[str, Any] = {}  # the public schema, for the memory check on the DP count
    if rank == 0:  # each pre-training release is saved with its value before use (a kill loses nothing)
        ledger.commit = lambda: prefit_payload(out, ledger=ledger.state_dict(), data=dm.state_dict(), complete=False)
    dm.prepare(ledger, generator=mech.noise_generator(noise_seed), state=data_state,
               check_rows=lambda count: (check_delta(ledger.delta, count, allow_large_delta=allow),
                                         check_rows_memory(count.value, public.get("schema"), cfg)),
               count_budget_fraction=cfg.privacy.get("count_budget_fraction", 0.02),
               check_schema=lambda schema: (check_data(cfg.model, schema, cfg.data), public.update(schema=schema),
                                            check_before_release(cfg, schema, weighting if resume is None else None)),
               minmax_columns=lambda schema: minmax_columns(cfg.model, schema),
               identify=budget.identify if budget is not None else None,
               check_layout=lambda layout: check_model(cfg, layout))  # images: the model's memory, before the count
    ledger.commit = None
    if rank == 0:
        publish_prefit(out, ledger=ledger.state_dict(), data=dm.state_dict(), complete=True)
    num_weighted = _reserve_weights(cfg, weighting, dm, ledger) if weighting is not None else 0
    check_model(cfg, dm.layout)  # the run's own layout (cells and categories a release may have decided)
    model = build_model(cfg.model, dm.layout)
    advise(cfg, dm)
    check_space(out, checkpoint_bytes(model))
    if rank == 0:
        run_files.ensure()  # a run that released nothing before training writes them here
    config = OmegaConf.to_container(cfg, resolve=True)
    checkpointing = cfg.get("callbacks", {}).get("checkpoint", {}) or {}
    record = RunRecord(ledger=ledger, config=config, data_state=dm.state_dict(), output_dir=out,
                       every_n_steps=checkpointing.get("every_n_steps", 100),
                       every_n_minutes=checkpointing.get("every_n_minutes", 5.0))
    mechanisms = build_mechanisms(cfg.model, ledger=ledger, datamodule=dm, noise_seed=noise_seed)
    mechanisms = complete_mechanisms(cfg, mechanisms, ledger=ledger, datamodule=dm, noise_seed=noise_seed)
    logger = GuardedCSVLogger(str(out), name="logs", declared=lambda: declared_metrics(model))  # declared keys only
    quiet_lightning()
    trainer = pl.Trainer(**trainer_options(cfg.trainer), default_root_dir=str(out), callbacks=[ProgressLines(mechanisms), record, *mechanisms, *callbacks],
                         enable_checkpointing=False, plugins=[AtomicCheckpointIO()], logger=logger)
    fit_kwargs: dict[str, Any] = {"ckpt_path": str(ckpt_path) if ckpt_path else None, "weights_only": True}
    if getattr(model, "uses_private_batches", False):
        fit_kwargs["datamodule"] = dm
    try:
        trainer.fit(model, **fit_kwargs)
    except OSError as err:
        if isinstance(err, UserError):
            raise
        raise StorageError(f"Training stopped: writing {err.filename or 'a file'} failed ({err.strerror or err}). Every "
                           f"release is already on disk in {out}; free space or fix permissions, then continue with "
                           "resume=last.") from err
    if ledger.spent > ledger.target_epsilon * (1 + 1e-9):  # the ledger refuses this; a last line of defence
        raise BudgetExceededError(f"ε = {ledger.spent} exceeds the target {ledger.target_epsilon}.")
    record.save(trainer)
    result: dict[str, Any] = {"output_dir": str(out), "checkpoint": str(record.last_path),
                              "ledger": str(record.ledger_path), "epsilon": ledger.spent, "delta": ledger.delta}
    if trainer.is_global_zero and weighting is not None:
        result.update(_write_weighted(cfg, weighting, model, dm, ledger, record, trainer, num_weighted))
    elif trainer.is_global_zero:
        n = cfg.get("num_samples") or max(round(dm.released_num_rows), 1)  # never the exact count
        tracker.stage("sample", total=n, unit="rows")
        try:
            result["synthetic"] = write_samples(model, dm.state_dict(), n, out / "synthetic", seed=cfg.seed)
        except OSError as err:
            raise StorageError(f"Writing the synthetic data failed ({err.strerror or err}). The trained run is saved in "
                               f"{record.last_path}: free space, then sample it with {python_command()} -m lightning_dp.sample "
                               f"{record.last_path} --num-rows {n} --out FILE.csv (no budget is spent).") from err
    # for an audit composed at the entry point (train.py): this package never imports audits
    result.update(datamodule=dm, privacy_ledger=ledger, config=config)
    return result
