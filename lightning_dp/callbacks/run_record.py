"""The run's record in every checkpoint and beside it: ledger, config, public data facts, versions."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lightning_dp.checkpoint import FORMAT_VERSION, AtomicCheckpointIO, versions
from lightning_dp.io import atomic_write_text
from lightning_dp.privacy.durable import Payload
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.privacy.metrics import declare_metrics

log = logging.getLogger(__name__)


class RunRecord(Callback):
    """Carries the ledger and the run's public facts in every checkpoint, and checkpoints the run.

    * ``on_save_checkpoint``: adds the ``lightning_dp`` record (config, data state, ledger, versions), the
      one copy of the ledger in a checkpoint, and rewrites ``ledger.json`` after it;
    * makes the ledger's :meth:`~PrivacyLedger.durable` blocks commit ``last.ckpt`` (its bytes, which the ledger
      charges to the budget registry with them and then writes), so a one-shot release is on disk with its value
      before it is used;
    * writes ``last.ckpt`` (atomically, one file) when training starts, every ``every_n_steps`` steps or
      ``every_n_minutes`` minutes, and on SIGTERM or Ctrl-C, so a kill loses at most that interval;
    * logs ``privacy/epsilon`` and ``privacy/epsilon_remaining``.

    Args:
        every_n_steps: checkpoint every this many training steps (0: off).
        every_n_minutes: and at least this often (0: off).
    """

    public_metrics = {"privacy/epsilon": "the ledger's spend (a function of the releases' public parameters)",
                      "privacy/epsilon_remaining": "target minus spend"}

    def __init__(self, *, ledger: PrivacyLedger, config: dict[str, Any], data_state: dict[str, Any],
                 output_dir: str | os.PathLike, every_n_steps: int = 100, every_n_minutes: float = 5.0) -> None:
        if every_n_steps < 0 or every_n_minutes < 0:
            raise ValueError("callbacks.checkpoint.every_n_steps and every_n_minutes must be >= 0 (0 turns one off).")
        self.ledger, self.config, self.data_state = ledger, config, data_state
        self.output_dir = Path(output_dir)
        self.every_n_steps, self.every_n_minutes = int(every_n_steps), float(every_n_minutes)
        self._last_save = time.monotonic()

    @property
    def ledger_path(self) -> Path:
        return self.output_dir / "ledger.json"

    @property
    def last_path(self) -> Path:
        return self.output_dir / "checkpoints" / "last.ckpt"

    def record(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "config": self.config, "data": self.data_state,
                "ledger": self.ledger.state_dict(), "versions": versions()}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        declare_metrics(pl_module, self.public_metrics)
        self.ledger.commit = lambda: self.values(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.ledger.commit = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing: the run restores its ledger from the most advanced record on disk (``train.py``), never
        from a callback state, which older checkpoints kept as a second copy."""

    def write_ledger(self, trainer: Trainer | None = None) -> None:
        if trainer is None or trainer.is_global_zero:
            self.ledger.save_json(self.ledger_path)

    def save(self, trainer: Trainer) -> None:
        """Write ``last.ckpt`` now (atomically; then ``ledger.json``)."""
        trainer.save_checkpoint(self.last_path, weights_only=False)  # the full state (optimizer, loops) for resume
        self._last_save = time.monotonic()

    def values(self, trainer: Trainer) -> Payload | None:
        """``last.ckpt`` as the bytes :meth:`save` would write, not written (a durable block's commit); ``None`` on a
        rank that writes no checkpoint (DDP ranks > 0).

        Raises:
            TypeError: the trainer does not save through :class:`~lightning_dp.checkpoint.AtomicCheckpointIO`.
        """
        checkpoint_io = trainer.strategy.checkpoint_io
        if not isinstance(checkpoint_io, AtomicCheckpointIO):
            raise TypeError(f"RunRecord needs the trainer's checkpoints saved by AtomicCheckpointIO, not "
                            f"{type(checkpoint_io).__name__}: pass plugins=[AtomicCheckpointIO()].")
        with checkpoint_io.in_memory() as kept:
            trainer.save_checkpoint(self.last_path, weights_only=False)
        self._last_save = time.monotonic()
        data = kept.get(str(self.last_path))
        return None if data is None else Payload(self.output_dir, "checkpoints/last.ckpt", data)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint["lightning_dp"] = self.record()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.last_path.exists():
            self.save(trainer)  # a resumable state before the first step (DP-SGD's σ is in it)
        self.write_ledger(trainer)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._log(pl_module)
        due_steps = self.every_n_steps and trainer.global_step % self.every_n_steps == 0
        due_time = self.every_n_minutes and time.monotonic() - self._last_save >= 60 * self.every_n_minutes
        if due_steps or due_time:
            self.save(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """SIGTERM (Lightning raises at a batch boundary) or Ctrl-C: save, so the run resumes where it stopped."""
        if isinstance(exception, SIGTERMException | KeyboardInterrupt):
            self.save(trainer)
            sgd = sum(r.count for r in self.ledger.releases if r.mechanism == "subsampled_gaussian")
            done = (f"{sgd} DP-SGD steps" if sgd else
                    f"{trainer.fit_loop.epoch_loop.batch_progress.total.completed} training batches")
            log.warning("Stopped by %s after %s; saved %s. Continue with resume=last.",
                        "SIGTERM" if isinstance(exception, SIGTERMException) else "Ctrl-C", done, self.last_path)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.write_ledger(trainer)
        if trainer.world_size > 1:
            self._check_replicas(trainer, pl_module)

    def _check_replicas(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Under DDP every rank must hold the same parameters (noise added once, gradients synced);
        writes ``replicas.json`` and raises if they diverged."""
        flat = torch.cat([p.detach().double().reshape(-1) for p in pl_module.parameters()])
        weights = torch.linspace(1.0, 2.0, len(flat), dtype=torch.float64, device=flat.device)
        checksum = torch.stack([flat.sum(), flat.square().sum(), (flat * weights).sum()])  # (3,)
        gathered = trainer.strategy.all_gather(checksum).cpu()  # (W, 3)
        identical = bool(torch.allclose(gathered, gathered[0].expand_as(gathered), rtol=1e-12, atol=0))
        if trainer.is_global_zero:
            atomic_write_text(self.output_dir / "replicas.json", json.dumps(
                {"world_size": trainer.world_size, "identical": identical, "checksums": gathered.tolist()}, indent=2))
        if not identical:
            raise RuntimeError(f"DDP replicas diverged (parameter checksums {gathered.tolist()}): noise or gradients "
                               "were not synchronised. The run's samples are not trustworthy.")

    def _log(self, pl_module: LightningModule) -> None:
        eps = self.ledger.spent
        pl_module.log("privacy/epsilon", eps, prog_bar=True, on_step=True, on_epoch=False)
        pl_module.log("privacy/epsilon_remaining", max(self.ledger.target_epsilon - eps, 0.0), on_step=True,
                      on_epoch=False)


def write_run_files(output_dir: str | os.PathLike, *, config_yaml: str) -> None:
    """``config.yaml`` (resolved) and ``versions.json`` beside the checkpoints, atomically."""
    out = Path(output_dir)
    atomic_write_text(out / "config.yaml", config_yaml)
    atomic_write_text(out / "versions.json", json.dumps(versions(), indent=2) + "\n")
