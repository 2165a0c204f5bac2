"""Fit the estimated weighting function of an importance-weighted generator on labelled rows, and refit it as
the features it reads move.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019, §3.2 and §3.3.3): when the
thinning function T is unknown, a few rows are labelled with their weight 1/T and a network regressor, the
"estimated weighting function", maps *encoded* rows to weights, used (up to a constant) by SNIW. The thesis does
not say how the regressor follows the encoder as it trains; here it is refitted
every ``every_n_batches`` training batches (and once before training), warm-started from its current weights,
on (features(x_labelled), w_labelled).

The labelled rows are private rows read without noise: a model with ``weights.estimated`` lists its weighting
network in ``unprotected_networks``, so a DP run refuses it and a run without DP records the waiver.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer

from lightning_dp.models.importance import load_labelled

log = logging.getLogger(__name__)


class WeightRefresh(Callback):
    """Refits ``pl_module.weight_net`` (if the module has one) on the labelled rows of ``model.weights.estimated``.

    Args:
        ledger, datamodule: the run's (every mechanism is given them); the encoder reads the labelled file.
        every_n_batches: training batches between refits (100).
        steps: Adam steps per refit (200). lr: their learning rate (10⁻²).
    """

    def __init__(self, *, ledger: Any = None, datamodule: Any = None, every_n_batches: int = 100, steps: int = 200,
                 lr: float = 1e-2) -> None:
        if every_n_batches < 1 or steps < 1 or not lr > 0:
            raise ValueError(f"WeightRefresh needs every_n_batches ≥ 1, steps ≥ 1 and lr > 0; got {every_n_batches}, "
                             f"{steps}, {lr}.")
        self.datamodule, self.every_n_batches, self.steps, self.lr = datamodule, every_n_batches, steps, lr
        self._labelled: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._batches = 0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if getattr(pl_module, "weight_net", None) is None:
            return
        x, y, w = load_labelled(pl_module.weight_spec["estimated"], self.datamodule.encoder)
        self._labelled = (x.to(pl_module.device), y.to(pl_module.device), (w / w.mean()).to(pl_module.device))
        self.refit(pl_module)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._labelled is None:
            return
        self._batches += 1
        if self._batches % self.every_n_batches == 0:
            self.refit(pl_module)

    @torch.enable_grad()
    def refit(self, pl_module: Any) -> float:
        """``steps`` Adam steps of the squared error between ŵ(features(x)) and w/mean(w); returns the last MSE."""
        x, y, w = self._labelled
        with torch.no_grad():
            features = pl_module.weight_features(pl_module.standardizer(pl_module.join(x, y)))  # (L, F)
        net = pl_module.weight_net
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        was_training = net.training
        net.train()
        for _ in range(self.steps):
            opt.zero_grad()
            loss = (net(features) - w).square().mean()
            loss.backward()
            opt.step()
        net.train(was_training)
        log.info("Weighting network refitted on %d labelled rows (MSE %.4g of w/mean w).", len(w), float(loss.detach()))
        return float(loss.detach())
