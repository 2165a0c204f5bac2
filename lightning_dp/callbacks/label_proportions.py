"""One-shot release of the class counts, for conditional generators trained with DP-SGD."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning import Callback, LightningModule, Trainer

from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.privacy.sensitivity import count_sensitivity

log = logging.getLogger(__name__)


class LabelProportions(Callback):
    """Release noisy class counts once (Gaussian, Δ = 1 add/remove, √2 replace-one) and set the module's
    ``class_probs`` from them, spending ``epsilon_fraction`` of the run's ε on its own.

    DP-CGAN's original code sampled synthetic labels from the *real* class counts without noise
    (DP-MERF spec §4.2, pitfall 18); here they are paid for.
    """

    name = "label_proportions/class_counts"

    def __init__(self, *, ledger: PrivacyLedger, datamodule: Any, epsilon_fraction: float = 0.05,
                 noise_seed: int | None = None) -> None:
        if not 0 < epsilon_fraction < 1:
            raise ValueError("epsilon_fraction must be in (0, 1).")
        self.ledger, self.datamodule = ledger, datamodule
        self.epsilon_fraction, self.noise_seed = epsilon_fraction, noise_seed

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.ledger.has(self.name):
            return  # released before this resume; class_probs came back with the module's state
        rank, world = trainer.global_rank, trainer.world_size
        # counted on the module's device: NCCL (multi-GPU DDP) reduces CUDA tensors only
        counts = torch.zeros(pl_module.num_classes, dtype=torch.float64, device=pl_module.device)
        for _, y in self.datamodule.private_batches(rank=rank, world_size=world):
            counts += torch.bincount(y.to(counts.device), minlength=pl_module.num_classes).double()
        if world > 1 and dist.is_initialized():
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        counts = counts.cpu()
        sens = count_sensitivity(adjacency=self.ledger.adjacency)

        def planned(s: float) -> list[Release]:
            return [Release(name=self.name, mechanism="gaussian", sensitivity=sens, noise_multiplier=s,
                            note="class counts for label sampling")]

        sigma = PrivacyLedger(target_epsilon=self.epsilon_fraction * self.ledger.target_epsilon,
                              delta=self.ledger.delta).calibrate(planned)
        seed = self.noise_seed if self.noise_seed is not None else secrets.randbits(62)
        seed = int(trainer.strategy.broadcast(seed, src=0)) if world > 1 else seed
        with self.ledger.durable():  # the checkpoint with the proportions and the ledger are saved before use
            self.ledger.record(planned(sigma)[0])
            noisy = mech.gaussian_noise(counts, sensitivity=sens, noise_multiplier=sigma,
                                        generator=mech.noise_generator(seed)).clamp_min(0)
            probs = noisy / noisy.sum() if noisy.sum() > 0 else torch.full_like(noisy, 1 / len(noisy))
            pl_module.class_probs.copy_(probs.to(pl_module.class_probs))
            log.info("Released class counts (σ = %.3g): proportions %s", sigma, [round(float(p), 3) for p in probs])
