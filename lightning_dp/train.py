"""``train(cfg)``: one private training run, from a composed config to checkpoint, ledger and samples."""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lightning_dp.callbacks.run_record import RunRecord, write_run_files
from lightning_dp.checkpoint import AtomicCheckpointIO, load_checkpoint
from lightning_dp.data.datamodule import PrivateDataModule, write_table
from lightning_dp.data.dp_count import RowCount
from lightning_dp.launch import launch_rank, publish_prefit, wait_for_prefit
from lightning_dp.models import build_model
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger
from lightning_dp.privacy.metrics import GuardedCSVLogger, declared_metrics

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
    path = Path(cfg.output_dir) / "checkpoints" / "last.ckpt" if cfg.resume == "last" else Path(cfg.resume)
    return path


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train one generator privately and write the run's artefacts to ``cfg.output_dir``.

    Writes ``config.yaml``, ``versions.json``, ``ledger.json``, ``checkpoints/last.ckpt`` and
    ``synthetic.csv`` (tabular) or ``synthetic.npz`` + ``synthetic.png`` (images).

    Returns:
        Paths of the artefacts and the ε spent.

    Raises:
        ValueError: bad privacy settings, unknown model or data set, bad data (a ``DataError``).
        BudgetExceededError: the budget is already spent (e.g. resuming a finished run).
    """
    out = Path(cfg.output_dir)
    ledger = make_ledger(cfg.privacy)
    resume = _resume_path(cfg)
    rank = launch_rank()
    state = None
    if resume is not None:
        ckpt = load_checkpoint(resume)
        state = ckpt["lightning_dp"]
        if state["config"]["model"]["name"] != cfg.model.name:
            raise ValueError(f"Checkpoint {str(resume)!r} is a {state['config']['model']['name']!r} run; this run asks "
                             f"for model={cfg.model.name!r}. Resume with the same model.")
        ledger.load_state_dict(state["ledger"])
        log.info("Resuming from %s with %s", resume, ledger.summary())
    elif rank > 0:  # another process of a DDP run: rank 0 released the pre-fit facts (lightning_dp/launch.py)
        handoff = wait_for_prefit(out)
        ledger.load_state_dict(handoff["ledger"])
        state = {"data": handoff["data"]}
    elif (out / "ledger.json").exists() and json.loads((out / "ledger.json").read_text()).get("releases"):
        raise FileExistsError(f"{str(out)!r} already holds a run that spent privacy budget. Resume it with "
                              "resume=last, or choose another output_dir=PATH.")
    pl.seed_everything(cfg.seed, workers=True)
    noise_seed = cfg.privacy.get("noise_seed")
    dm = PrivateDataModule(**cfg.data)
    allow = cfg.privacy.get("allow_large_delta", False)
    dm.prepare(ledger, generator=mech.noise_generator(noise_seed), state=None if state is None else state["data"],
               check_rows=lambda count: check_delta(ledger.delta, count, allow_large_delta=allow),
               count_budget_fraction=cfg.privacy.get("count_budget_fraction", 0.02))
    if rank == 0 and resume is None:
        publish_prefit(out, ledger=ledger.state_dict(), data=dm.state_dict())
    model = build_model(cfg.model, dm.layout)
    if resume is not None:
        model.load_state_dict(ckpt["state_dict"])
    config = OmegaConf.to_container(cfg, resolve=True)
    write_run_files(out, config_yaml=OmegaConf.to_yaml(cfg, resolve=True))
    record = RunRecord(ledger=ledger, config=config, data_state=dm.state_dict(), output_dir=out)
    mechanisms = [instantiate(m, ledger=ledger, datamodule=dm, **({"noise_seed": noise_seed} if noise_seed is not None else {}))
                  for m in cfg.model.get("mechanisms", [])]
    checkpointing = pl.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, **cfg.callbacks.checkpoint)
    logger = GuardedCSVLogger(str(out), name="logs", declared=lambda: declared_metrics(model))  # declared keys only
    trainer = pl.Trainer(**cfg.trainer, default_root_dir=str(out), callbacks=[record, *mechanisms, checkpointing],
                         plugins=[AtomicCheckpointIO()], logger=logger)
    record.write_ledger()
    fit_kwargs: dict[str, Any] = {"ckpt_path": str(resume) if resume else None, "weights_only": True}
    if getattr(model, "uses_private_batches", False):
        fit_kwargs["datamodule"] = dm
    trainer.fit(model, **fit_kwargs)
    if trainer.interrupted:
        log.warning("Training was interrupted; resume with resume=last.")
    if ledger.spent > ledger.target_epsilon * (1 + 1e-9):  # the ledger refuses this; a last line of defence
        raise BudgetExceededError(f"ε = {ledger.spent} exceeds the target {ledger.target_epsilon}.")
    trainer.save_checkpoint(record.last_path)
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
