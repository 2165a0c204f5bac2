"""Training's stages and steps for the progress lines (:mod:`lightning_dp.progress`), off a terminal."""

from __future__ import annotations

from typing import Any

from pytorch_lightning import Callback, LightningModule, Trainer

from lightning_dp.progress import tracker


class ProgressLines(Callback):
    """Reports ``release`` (one-shot mechanisms at the start of fit), ``train`` with steps done and planned, and
    ``end of training`` (releases made at the end, e.g. private support points) to :data:`tracker`.

    Planned steps are public: DP-SGD's are ``max_epochs · round(1/q)`` with q = L/ñ from the DP count (or
    ``max_steps``), counted in DP-SGD steps (one per noised gradient, whatever the optimizers); a model that
    trains on generated batches only has its configured ``steps_per_epoch · max_epochs``. A model that reads
    private batches without DP-SGD (no DP claim) shows its batches without a total, which would follow from n.

    Args:
        mechanisms: the run's mechanism callbacks (a ``DPSGD`` among them sets the step unit).
        label: names the stages of a fit run inside another command (``LABEL: train``, ``LABEL: done``).
    """

    def __init__(self, mechanisms: list[Any], label: str | None = None) -> None:
        self.dp_sgd = next((m for m in mechanisms if type(m).__name__ == "DPSGD"), None)
        self.one_shot = any(type(m).__name__ != "DPSGD" for m in mechanisms)
        self.label = label  # a fit inside another command (the sampler's private weights): "LABEL: train", "LABEL: done"

    def _planned(self, trainer: Trainer, pl_module: LightningModule) -> tuple[int | None, str]:
        if self.dp_sgd is not None and getattr(self.dp_sgd, "sample_rate", None):
            if trainer.max_steps and trainer.max_steps > 0:
                return int(trainer.max_steps), "DP-SGD steps"
            return int(trainer.max_epochs * max(round(1 / self.dp_sgd.sample_rate), 1)), "DP-SGD steps"
        if getattr(pl_module, "uses_private_batches", False):
            return None, "batches (no DP claim)"
        try:
            return int(trainer.estimated_stepping_batches), "steps"
        except Exception:  # noqa: BLE001 - an unbounded run has no total
            return None, "steps"

    def _done(self, trainer: Trainer) -> int:
        if self.dp_sgd is not None and getattr(self.dp_sgd, "ledger", None) is not None:
            return int(self.dp_sgd.steps_done)
        return int(trainer.fit_loop.epoch_loop.batch_progress.total.completed)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.one_shot:
            tracker.stage("release (one-shot mechanisms: elapsed only, the rows are streamed once)")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        total, unit = self._planned(trainer, pl_module)
        tracker.stage(f"{self.label}: train" if self.label else "train", total=total, unit=unit, done=self._done(trainer))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        tracker.update(self._done(trainer))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        tracker.stage(f"{self.label}: done" if self.label else "end of training (releases made at the end, checkpoint)")
