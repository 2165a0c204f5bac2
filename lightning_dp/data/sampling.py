"""Poisson sampling of private rows for DP-SGD (the sampling its accountant assumes)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class PoissonBatchSampler(Sampler[list[int]]):
    """Each step keeps every row independently with probability ``sample_rate`` (Mironov et al. 2019).

    Batches have random size, possibly 0. Under DDP each rank samples its own disjoint shard with the
    same rate, so the union over ranks is one Poisson sample of the whole data set.

    Args:
        indices: the rows this rank may sample (its shard).
        sample_rate: q, the probability of keeping a row.
        steps: batches per epoch.
        generator: the sampling randomness; it must stay secret (the amplification argument needs it),
            so it is seeded from OS entropy, not from the run's public seed.
    """

    def __init__(self, indices: torch.Tensor, *, sample_rate: float, steps: int, generator: torch.Generator) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}.")
        self.indices, self.sample_rate, self.steps, self.generator = indices, sample_rate, steps, generator

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            keep = torch.rand(len(self.indices), generator=self.generator) < self.sample_rate
            yield self.indices[keep].tolist()


class DPCountBatchSampler(Sampler[list[int]]):
    """Every row of a shard once per epoch, shuffled, in ``num_batches`` batches of near-equal size.

    The loader of models that walk the private rows without Poisson sampling: ``num_batches`` is ⌈ñ / B⌉ for the
    run's DP (or public) count ñ, so the number of batches, and every counter, progress bar or log line that
    follows it (Lightning's loop state in checkpoints, "number of training batches"), is a function of ñ and
    public settings, never of the exact number of rows. Batch sizes vary around B (and are 0 when there are fewer
    rows than batches); they stay inside the run.

    Args:
        indices: the rows this rank walks (its shard).
        num_batches: batches per epoch, from the DP count.
        generator: the shuffle's randomness.
    """

    def __init__(self, indices: torch.Tensor, *, num_batches: int, generator: torch.Generator) -> None:
        if num_batches < 1:
            raise ValueError(f"num_batches must be >= 1, got {num_batches}.")
        self.indices, self.num_batches, self.generator = indices, int(num_batches), generator

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        order = self.indices[torch.randperm(len(self.indices), generator=self.generator)]  # (n,)
        for part in torch.tensor_split(order, self.num_batches):
            yield part.tolist()
