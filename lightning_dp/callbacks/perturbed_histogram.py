"""The release of a perturbed histogram: every cell count plus Laplace noise, once, at the start of fit.

The baseline of "Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019, §5.7). This
callback is the only code of a ``model=perturbed_histogram`` run that reads private rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import Tensor

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.errors import ConfigError
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.privacy.sensitivity import histogram_sensitivity

log = logging.getLogger(__name__)


class LaplaceHistogram(Callback):
    """Release the counts of the module's grid of cells with the Laplace mechanism (Dwork & Roth, Thm. 3.6).

    One release, ``perturbed_histogram/counts``, with the whole budget the ledger has left (its noise multiplier
    calibrated so that the run ends at its target ε). The grid is the module's (``PerturbedHistogram.grid``),
    a function of public facts and of the run's released row count, so choosing it spends nothing.

    Sensitivity (L1, of the vector of all counts): a row lies in exactly one cell, so adding or removing it
    changes one count by 1 (Δ = 1); replacing it moves one unit between two cells (Δ = 2, the thesis' 1/α
    scale is right only for add/remove). The ledger's adjacency picks it.

    Order: the exact counts are accumulated from streamed chunks of rows (memory O(occupied cells)), the
    release is recorded, then the noise is drawn cell block by cell block into the module's buffer, inside one
    durable block, so the ledger and the checkpoint holding the noisy counts are on disk before anything
    computed from them leaves. A resumed run finds the released counts in its checkpoint and does not release
    them again.

    Args:
        ledger: the run's ledger.
        datamodule: the private data (``private_batches``, ``released_num_rows``).
        chunk_size: rows per streamed chunk.
        cell_chunk: cells per block of noise (memory O(cell_chunk) beside the histogram itself).
        noise_seed: fix the noise (tests only); default OS entropy.
    """

    name = "perturbed_histogram/counts"

    def __init__(
        self,
        *,
        ledger: PrivacyLedger,
        datamodule: Any,
        chunk_size: int = 4096,
        cell_chunk: int = 2**22,
        noise_seed: int | None = None,
    ) -> None:
        self.check_settings({"chunk_size": chunk_size, "cell_chunk": cell_chunk})
        self.ledger, self.datamodule = ledger, datamodule
        self.chunk_size, self.cell_chunk, self.noise_seed = chunk_size, cell_chunk, noise_seed

    @staticmethod
    def check_settings(node: Mapping[str, Any]) -> None:
        """The mechanism's settings (a config node), checked before any release.

        Raises:
            ConfigError: the first setting out of range.
        """
        for key in ("chunk_size", "cell_chunk"):
            value = node.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"LaplaceHistogram (model.mechanisms): {key} must be a whole number >= 1, got {value!r}."
                )

    # ---------------------------------------------------------------- hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise ConfigError(
                "model=perturbed_histogram runs in one process; use trainer=cpu or trainer.devices=1."
            )

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if pl_module.is_released():
            if not self.ledger.has(self.name):
                raise RuntimeError(
                    f"The checkpoint holds a released {self.name!r} that its ledger does not list: "
                    "the checkpoint is inconsistent and cannot be trusted. Start a new run."
                )
            log.info("%s was released before this resume; it is not released again.", self.name)
            return
        if self.ledger.has(self.name):
            raise CheckpointError(
                f"The ledger lists {self.name!r} as released but this checkpoint has no histogram: "
                "it is older than the release. Resume from the run's checkpoints/last.ckpt, or "
                "start a new run."
            )
        axes = self.grid(pl_module)
        cells, counts = self._exact_counts(pl_module, axes)
        # the checkpoint with the noisy counts and the ledger are saved before anything computed from them is used
        with self.ledger.durable():
            self._release(pl_module, axes, cells, counts)

    # ---------------------------------------------------------------- the release
    def grid(self, module: Any) -> list[int]:
        """The module's grid at the run's released row count and target ε, checked against its ``max_cells``.

        Raises:
            ConfigError: the grid is larger than ``max_cells`` (nothing of the histogram is released).
        """
        num_rows = self.datamodule.released_num_rows
        axes = module.grid(num_rows=max(num_rows, 1.0), epsilon=self.ledger.target_epsilon)
        size = math.prod(axes)
        if size > module.hparams.max_cells:
            raise ConfigError(
                f"model=perturbed_histogram: the grid {' × '.join(map(str, axes))} has {size:.3g} cells (N ≈ "
                f"{num_rows:.0f} released rows, ε = {self.ledger.target_epsilon:g}), above model.module.max_cells = "
                f"{module.hparams.max_cells:.3g} (4 bytes a cell). Set model.module.bins_per_dim lower, or raise "
                "max_cells if the memory is there. Nothing of the histogram was released."
            )
        return axes

    def _exact_counts(self, module: Any, axes: list[int]) -> tuple[Tensor, Tensor]:
        """The occupied cells (sorted) and their exact counts, from streamed chunks of rows."""
        cells, counts = [], []
        for x, y in self.datamodule.private_batches(chunk_size=self.chunk_size):
            c, k = module.cell_index(x, y, axes).unique(return_counts=True)
            cells.append(c)
            counts.append(k)
        if not cells:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        cell, inverse = torch.cat(cells).unique(return_inverse=True)  # sorted
        total = torch.zeros(len(cell), dtype=torch.long).index_add_(0, inverse, torch.cat(counts))
        return cell, total

    def _release(self, module: Any, axes: list[int], cells: Tensor, counts: Tensor) -> None:
        sens = histogram_sensitivity(adjacency=self.ledger.adjacency)
        size = math.prod(axes)

        def planned(sigma: float) -> list[Release]:
            return [
                Release(
                    name=self.name,
                    mechanism="laplace",
                    sensitivity=sens,
                    noise_multiplier=sigma,
                    note=f"counts of a {' × '.join(map(str, axes))} grid ({size} cells), Lap(Δ·σ) on every "
                    f"cell; Δ = {sens:g} (L1, {self.ledger.adjacency}: a row is in one cell)",
                )
            ]

        sigma = self.ledger.calibrate(planned)
        self.ledger.record(planned(sigma)[0])
        gen = mech.noise_generator(self.noise_seed)
        noisy = torch.empty(size, dtype=torch.float32)
        for start in range(0, size, self.cell_chunk):
            stop = min(start + self.cell_chunk, size)
            block = torch.zeros(stop - start, dtype=torch.float64)
            lo, hi = torch.searchsorted(cells, torch.tensor([start, stop])).tolist()
            block[cells[lo:hi] - start] = counts[lo:hi].double()
            block = mech.laplace_noise(block, sensitivity=sens, noise_multiplier=sigma, generator=gen)
            noisy[start:stop] = block.clamp_min(0.0)  # negative counts to 0: post-processing
        module.set_release(noisy, axes)
        log.info(
            "Released a perturbed histogram of %d cells (%s): Laplace scale %.4g (Δ = %g, ε ≈ %.4g); %s",
            size,
            " × ".join(map(str, axes)),
            sigma * sens,
            sens,
            1.0 / sigma,
            self.ledger.summary(),
        )
