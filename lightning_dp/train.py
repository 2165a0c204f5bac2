"""``train(cfg)``: one private training run, from a composed config to checkpoint, ledger and samples."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

from lightning_dp.callbacks.run_record import RunRecord, write_run_files
from lightning_dp.checkpoint import AtomicCheckpointIO
from lightning_dp.data.datamodule import PrivateDataModule, write_table
from lightning_dp.data.dp_count import RowCount
from lightning_dp.errors import RunExistsError
from lightning_dp.launch import launch_rank, publish_prefit, wait_for_prefit
from lightning_dp.models import build_mechanisms, build_model
from lightning_dp.preflight import check_run, check_space, checkpoint_bytes
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger
from lightning_dp.privacy.metrics import GuardedCSVLogger, declared_metrics
from lightning_dp.resume import resume_config, resume_state

log = logging.getLogger(__name__)


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
            raise ValueError(msg)
        warnings.warn(msg, stacklevel=2)


def _resume_path(cfg: DictConfig) -> Path | None:
    if not cfg.get("resume"):
        return None
    return Path(cfg.output_dir) / "checkpoints" / "last.ckpt" if cfg.resume == "last" else Path(cfg.resume)


def train(cfg: DictConfig, *, overrides: Sequence[str] | None = None) -> dict[str, Any]:
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

    Returns:
        Paths of the artefacts and the ε spent.

    Raises:
        ValueError: bad settings (``ConfigError``), unknown model or data set, bad data (``DataError``), a
            resume that would change the run (``ResumeError``).
        BudgetExceededError: the budget is already spent (e.g. resuming a finished run).
    """
    resume = _resume_path(cfg)
    if resume is not None:
        cfg = resume_config(cfg, overrides=overrides, checkpoint=resume)
        cfg.resume = str(resume)
    out = Path(cfg.output_dir)
    check_run(cfg, out)
    rank = launch_rank()
    ledger = make_ledger(cfg.privacy)
    data_state, ckpt_path = None, None
    if resume is not None:
        state = resume_state(out, resume)
        ledger.load_state_dict(state.ledger)
        data_state, ckpt_path = state.data, state.checkpoint
        log.info("Resuming from %s (ledger from %s): %s", ckpt_path or ".prefit.json", state.where, ledger.summary())
    elif rank > 0:  # another process of a DDP run: rank 0 released the pre-fit facts (lightning_dp/launch.py)
        handoff = wait_for_prefit(out)
        ledger.load_state_dict(handoff["ledger"])
        data_state = handoff["data"]
    elif any((out / name).exists() for name in ("ledger.json", ".prefit.json", "checkpoints/last.ckpt")):
        raise RunExistsError(f"{str(out)!r} already holds a run. Continue it with resume=last, or choose another "
                              "output_dir=PATH.")
    if rank == 0:  # the run's files appear with its first release: a run refused before it leaves nothing
        config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        written: list[bool] = []

        def persist(led: PrivacyLedger) -> None:
            if not written:
                write_run_files(out, config_yaml=config_yaml)
                written.append(True)
            led.save_json(out / "ledger.json")

        ledger.persist = persist
    pl.seed_everything(cfg.seed, workers=True)
    noise_seed = cfg.privacy.get("noise_seed")
    dm = PrivateDataModule(**cfg.data)
    allow = cfg.privacy.get("allow_large_delta", False)
    if rank == 0:  # each pre-training release is saved with its value before use (a kill loses nothing)
        ledger.commit = lambda: publish_prefit(out, ledger=ledger.state_dict(), data=dm.state_dict(), complete=False)
    dm.prepare(ledger, generator=mech.noise_generator(noise_seed), state=data_state,
               check_rows=lambda count: check_delta(ledger.delta, count, allow_large_delta=allow),
               count_budget_fraction=cfg.privacy.get("count_budget_fraction", 0.02))
    ledger.commit = None
    if rank == 0:
        publish_prefit(out, ledger=ledger.state_dict(), data=dm.state_dict(), complete=True)
    model = build_model(cfg.model, dm.layout)
    check_space(out, checkpoint_bytes(model))
    if rank == 0:
        write_run_files(out, config_yaml=config_yaml)
    config = OmegaConf.to_container(cfg, resolve=True)
    checkpointing = cfg.get("callbacks", {}).get("checkpoint", {}) or {}
    record = RunRecord(ledger=ledger, config=config, data_state=dm.state_dict(), output_dir=out,
                       every_n_steps=checkpointing.get("every_n_steps", 100),
                       every_n_minutes=checkpointing.get("every_n_minutes", 5.0))
    mechanisms = build_mechanisms(cfg.model, ledger=ledger, datamodule=dm, noise_seed=noise_seed)
    logger = GuardedCSVLogger(str(out), name="logs", declared=lambda: declared_metrics(model))  # declared keys only
    trainer = pl.Trainer(**cfg.trainer, default_root_dir=str(out), callbacks=[record, *mechanisms],
                         enable_checkpointing=False, plugins=[AtomicCheckpointIO()], logger=logger)
    fit_kwargs: dict[str, Any] = {"ckpt_path": str(ckpt_path) if ckpt_path else None, "weights_only": True}
    if getattr(model, "uses_private_batches", False):
        fit_kwargs["datamodule"] = dm
    trainer.fit(model, **fit_kwargs)
    if ledger.spent > ledger.target_epsilon * (1 + 1e-9):  # the ledger refuses this; a last line of defence
        raise BudgetExceededError(f"ε = {ledger.spent} exceeds the target {ledger.target_epsilon}.")
    record.save(trainer)
    result: dict[str, Any] = {"output_dir": str(out), "checkpoint": str(record.last_path),
                              "ledger": str(record.ledger_path), "epsilon": ledger.spent, "delta": ledger.delta}
    if trainer.is_global_zero:
        n = cfg.get("num_samples") or max(round(dm.released_num_rows), 1)  # never the exact count
        result["synthetic"] = write_samples(model, dm.state_dict(), n, out / "synthetic", seed=cfg.seed)
    if cfg.get("audit") and result.get("synthetic"):  # audit=default: report.json + .html, audits/report.py
        from audits.report import audit_run

        result["report"] = audit_run(cfg.audit, datamodule=dm, result=result, ledger=ledger, config=config)
    return result


def write_samples(model: torch.nn.Module, data_state: dict[str, Any], n: int, stem: str | Path,
                  *, seed: int | None = None, suffix: str | None = None) -> str:
    """Sample ``n`` rows, decode them to the user's columns and write them atomically.

    Tabular data goes to ``<stem>.csv`` (or ``.parquet``); images to ``<stem>.npz`` plus a PNG grid.
    """
    from lightning_dp.data.datamodule import decode_samples
    from lightning_dp.io import atomic_write

    x, y = sample_in_chunks(model, n, seed=seed)
    decoded = decode_samples(data_state, x, y)
    stem = Path(stem)
    if data_state["kind"] == "image":
        path = stem.with_suffix(".npz")
        atomic_write(path, lambda tmp: _savez(tmp, decoded))
        save_image_grid(decoded["images"], decoded["labels"], stem.with_suffix(".png"))
        return str(path)
    path = stem.with_suffix(suffix or ".csv")
    write_table(decoded, path)
    return str(path)


def _savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to a temporary name
        np.savez_compressed(f, **arrays)


def sample_in_chunks(model: Any, n: int, *, seed: int | None = None, chunk: int = 50_000) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.sample`` in chunks, so that millions of rows fit in memory."""
    xs, ys = [], []
    for i in range(math.ceil(n / chunk)):
        m = min(chunk, n - i * chunk)
        x, y = model.sample(m, seed=None if seed is None else seed + i)
        xs.append(x.cpu())
        ys.append(y.cpu())
    return torch.cat(xs), torch.cat(ys)


def save_image_grid(images: np.ndarray, labels: np.ndarray, path: Path, per_class: int = 10) -> None:
    """A PNG grid with up to ``per_class`` samples of each label, one row per class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_dp.io import atomic_write

    classes = np.unique(labels)
    fig, axes = plt.subplots(len(classes), per_class, figsize=(per_class * 0.6, len(classes) * 0.6), squeeze=False)
    for r, c in enumerate(classes):
        idx = np.flatnonzero(labels == c)[:per_class]
        for k in range(per_class):
            ax = axes[r, k]
            ax.axis("off")
            if k < len(idx):
                ax.imshow(images[idx[k]], cmap="gray", vmin=0, vmax=1)
    fig.tight_layout(pad=0.1)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
