"""One-shot sanitized embeddings: read the private data once, release noisy sums, never read it again.

Used by DP-MERF and PEARL. The module supplies the feature map and its norm bound; this callback is
the only code that touches the private rows, and it records each release on the ledger before the
noisy value exists.
"""

from __future__ import annotations

import logging
import math
import secrets
from typing import Any, Protocol

import torch
import torch.distributed as dist
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import Tensor

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.privacy.sensitivity import count_sensitivity, embedding_sum_sensitivity, moment_sensitivity
from lightning_dp.privacy.statistics import class_feature_sums, mean_squared_distance, moment_sums

log = logging.getLogger(__name__)

BUDGET_SPLITS = ("epsilon", "rdp")


class EmbeddingModule(Protocol):
    """What a module must offer to be trained from a one-shot sanitized embedding."""

    embedding_name: str
    num_classes: int
    feature_norm_bound: float

    def features(self, x: Tensor) -> Tensor: ...
    def bandwidth_inputs(self, x: Tensor) -> Tensor: ...
    def needs_bandwidth(self) -> bool: ...
    def set_bandwidth_from_msd(self, msd: float) -> None: ...
    def is_released(self) -> bool: ...
    def set_release(self, sums: Tensor, counts: Tensor) -> None: ...


class PrivateBatches(Protocol):
    def private_batches(self, *, chunk_size: int, rank: int, world_size: int): ...


class SanitizedEmbedding(Callback):
    """Release a module's class-wise feature sums and class counts once, with the Gaussian mechanism.

    Releases (all on the run's ledger, in this order):
    1. if the module has no bandwidth: ``(Σx/√d, Σ||x||²/d, n)`` of its kernel inputs (sensitivity
       from ``moment_sensitivity``), with ``bandwidth_epsilon_fraction`` of the budget (see
       ``budget_split``);
    2. ``S = Σ_i h(x_i) e_{y_i}ᵀ`` with Δ = ``embedding_sum_sensitivity(||h||)`` and the class counts with
       Δ = ``count_sensitivity``, both with one noise multiplier calibrated so that the ledger's total
       reaches the target ε exactly.

    Under DDP every rank sums its own disjoint shard, the sums are all-reduced once, and every rank
    adds the *same* noise (a seed broadcast from rank 0), so noise is added once per release.

    Args:
        ledger: the run's ledger.
        datamodule: the private data (``private_batches``).
        bandwidth_epsilon_fraction: share of the budget for the bandwidth release.
        budget_split: what the share is of. ``"epsilon"`` (default): the bandwidth release alone spends
            that fraction of ε (DP-MERF). ``"rdp"``: it gets that fraction of the Rényi-DP cost of the
            releases still to come, the embedding (sums and counts together) the rest, at every order;
            0.5 gives both the same noise multiplier, the "equal share" of PEARL (two equal Gaussian
            releases: σ = 5.72 at ε = 1, δ = 1e-5). Under RDP composition an ε share of 0.5 is not
            equal: the second release fills the rest and gets less noise.
        chunk_size: rows per streamed chunk (memory is O(chunk·D), not O(n·D)).
        noise_seed: fix the noise (tests only); default draws from OS entropy.
    """

    def __init__(self, *, ledger: PrivacyLedger, datamodule: PrivateBatches, bandwidth_epsilon_fraction: float = 0.05,
                 budget_split: str = "epsilon", chunk_size: int = 4096, noise_seed: int | None = None) -> None:
        if not 0 < bandwidth_epsilon_fraction < 1:
            raise ValueError("bandwidth_epsilon_fraction must be in (0, 1).")
        if budget_split not in BUDGET_SPLITS:
            raise ValueError(f"Unknown budget_split {budget_split!r}; valid: {', '.join(BUDGET_SPLITS)}.")
        self.ledger, self.datamodule = ledger, datamodule
        self.bandwidth_epsilon_fraction, self.budget_split = bandwidth_epsilon_fraction, budget_split
        self.chunk_size, self.noise_seed = chunk_size, noise_seed

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        name = pl_module.embedding_name
        if pl_module.is_released():
            if not self.ledger.has(name):
                raise RuntimeError(f"The checkpoint holds a released {name!r} that its ledger does not list: the "
                                   "checkpoint is inconsistent and cannot be trusted. Start a new run.")
            log.info("%s was released before this resume; it is not released again.", name)
            return
        if self.ledger.has(name):
            raise CheckpointError(f"The ledger lists {name!r} as released but this checkpoint has no embedding: it is "
                                  "older than the release. Resume from the run's checkpoints/last.ckpt, or start a new "
                                  "run.")
        with self.ledger.durable():  # the checkpoint with the noisy values and the ledger are saved before use
            self._release(trainer, pl_module, name)

    def _release(self, trainer: Trainer, pl_module: LightningModule, name: str) -> None:
        rank, world = trainer.global_rank, trainer.world_size
        gen = mech.noise_generator(self._shared_seed(trainer))
        device = pl_module.device
        if pl_module.needs_bandwidth():
            self._release_bandwidth(pl_module, rank, world, gen, device)
        batches = ((x.to(device), y.to(device)) for x, y in self._batches(rank, world))
        with torch.no_grad():
            sums, counts = class_feature_sums(batches, pl_module.features, pl_module.num_classes)
        sums, counts = _all_reduce(sums, world), _all_reduce(counts, world)
        adj = self.ledger.adjacency
        d_sum = embedding_sum_sensitivity(feature_norm=pl_module.feature_norm_bound, adjacency=adj)
        d_cnt = count_sensitivity(adjacency=adj)

        def planned(sigma: float) -> list[Release]:
            return _embedding_releases(pl_module, sigma, adjacency=adj)

        sigma = self.ledger.calibrate(planned)
        for release in planned(sigma):
            self.ledger.record(release)
        noisy_sums = mech.gaussian_noise(sums.cpu(), sensitivity=d_sum, noise_multiplier=sigma, generator=gen)
        noisy_counts = mech.gaussian_noise(counts.cpu(), sensitivity=d_cnt, noise_multiplier=sigma, generator=gen)
        pl_module.set_release(noisy_sums.to(device), noisy_counts.to(device))
        log.info("Released %s once: σ = %.4g, Δ_sum = %.4g, Δ_count = %.4g; %s",
                 name, sigma, d_sum, d_cnt, self.ledger.summary())

    def _batches(self, rank: int, world: int):
        return self.datamodule.private_batches(chunk_size=self.chunk_size, rank=rank, world_size=world)

    def _release_bandwidth(self, pl_module: Any, rank: int, world: int, gen: torch.Generator,
                           device: torch.device) -> None:
        name = f"{pl_module.embedding_name}/bandwidth_moments"
        with torch.no_grad():
            acc = moment_sums(pl_module.bandwidth_inputs(x.to(device)) for x, _ in self._batches(rank, world))
        acc = _all_reduce(acc, world).cpu()
        d = acc.shape[0] - 2
        scaled = torch.cat([acc[:d] / d**0.5, acc[d : d + 1] / d, acc[d + 1 :]])  # each part Δ <= 1
        sens = moment_sensitivity(dim=d, adjacency=self.ledger.adjacency)

        def planned(sigma: float) -> list[Release]:
            return [Release(name=name, mechanism="gaussian", sensitivity=sens, noise_multiplier=sigma,
                            note="(Σx/√d, Σ||x||²/d, n) of [0,1]-scaled kernel inputs, for the bandwidth")]

        frac = self.bandwidth_epsilon_fraction
        if self.budget_split == "epsilon":
            share = frac * self.ledger.target_epsilon
            sigma = PrivacyLedger(target_epsilon=share, delta=self.ledger.delta).calibrate(planned)
        else:  # Gaussian RDP is α/(2σ²) per release: σ = τ/√f here and τ·√(m/(1−f)) for each of the m others
            def joint(tau: float) -> list[Release]:
                rest = tau * math.sqrt(2 / (1 - frac))  # the embedding is m = 2 releases (sums, counts)
                return [*planned(tau / math.sqrt(frac)),
                        *_embedding_releases(pl_module, rest, adjacency=self.ledger.adjacency)]

            sigma = self.ledger.calibrate(joint) / math.sqrt(frac)
        self.ledger.record(planned(sigma)[0])
        noisy = mech.gaussian_noise(scaled, sensitivity=sens, noise_multiplier=sigma, generator=gen)
        n = noisy[d + 1] if self.ledger.adjacency == "add_remove" else acc[d + 1]  # n is public under replace-one
        msd = mean_squared_distance(noisy[:d] * d**0.5, float(noisy[d] * d), float(n))
        pl_module.set_bandwidth_from_msd(msd)

    def _shared_seed(self, trainer: Trainer) -> int:
        seed = self.noise_seed if self.noise_seed is not None else secrets.randbits(62)
        return int(trainer.strategy.broadcast(seed, src=0)) if trainer.world_size > 1 else seed


def _embedding_releases(pl_module: Any, sigma: float, *, adjacency: str) -> list[Release]:
    """The two releases of the embedding at noise multiplier ``sigma``: class-wise sums and class counts."""
    name, norm = pl_module.embedding_name, pl_module.feature_norm_bound
    return [
        Release(name=name, mechanism="gaussian", sensitivity=embedding_sum_sensitivity(feature_norm=norm, adjacency=adjacency),
                noise_multiplier=sigma, note=f"class-wise feature sums, ||h|| <= {norm:.4g}"),
        Release(name=f"{name}/class_counts", mechanism="gaussian", sensitivity=count_sensitivity(adjacency=adjacency),
                noise_multiplier=sigma, note="class counts (label proportions)"),
    ]


def _all_reduce(t: Tensor, world: int) -> Tensor:
    if world > 1 and dist.is_available() and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
