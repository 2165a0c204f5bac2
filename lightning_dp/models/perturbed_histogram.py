"""The perturbed histogram: Laplace-noised cell counts, sampled uniformly within a cell.

The baseline of "Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019, §5.7), with
the total number of cells of Su et al. (2016), ``(N α / 10)^{2d/(2+d)}``. The release is a mechanism
(``callbacks/perturbed_histogram.py``); this module only holds the released histogram and samples from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.data.schema import Schema
from lightning_dp.errors import ConfigError
from lightning_dp.models.base import GeneratorModule

# cells per block of the two-level sampler (torch.multinomial stops at 2^24 categories)
SAMPLING_BLOCK = 2**16


def total_cells(num_rows: float, epsilon: float, d: int) -> float:
    """Su et al.'s total number of histogram cells, ``(N ε / 10)^{2d/(2+d)}`` for d continuous columns.

    Reference values: ``total_cells(404, 100, 14)`` ≈ 2.05e6 (3 bins a column) and ``total_cells(400, 1e4, 9)`` ≈
    1.47e9 (10 bins a column).
    """
    if num_rows <= 0 or epsilon <= 0 or d < 1:
        raise ValueError(
            f"total_cells needs num_rows > 0, epsilon > 0 and d >= 1, got {num_rows}, {epsilon}, {d}."
        )
    return (num_rows * epsilon / 10.0) ** (2.0 * d / (2.0 + d))


def bins_per_dimension(num_rows: float, epsilon: float, d: int) -> int:
    """Equal bins on each of d continuous axes: ``round(total_cells^{1/d})``, at least 1 (the author's code)."""
    log_total = 2.0 * d / (2.0 + d) * math.log(num_rows * epsilon / 10.0)  # log of total_cells, overflow-free
    return max(1, round(math.exp(log_total / d)))


def smallest_grid(schema: Schema, *, bins_per_dim: int | None = None) -> list[int]:
    """The fewest bins on each axis the grid can have, from the public schema alone (before any release).

    ``bins_per_dim`` (1 when Su et al.'s formula will choose it) on each continuous column, 2 on the missing-value
    indicator of a continuous column that allows missing values, each categorical column's declared categories (and
    its missing category; a list left to a DP release counts 1), and the label's classes: the axes of
    :meth:`PerturbedHistogram.grid` in the order of the encoder's layout, or fewer where a release decides.
    """
    k = bins_per_dim or 1
    continuous = [c for c in schema.features if c.type == "continuous"]
    axes = [k] * len(continuous) + [2 for c in continuous if c.missing]
    axes += [len(c.categories or ()) + int(c.missing) or 1 for c in schema.features if c.type == "categorical"]
    classes = len(schema[schema.label].categories or ()) if schema.label else 0
    return axes + ([classes] if classes > 1 else [])


class PerturbedHistogram(GeneratorModule):
    """A histogram of the training rows with Laplace-noised counts, released once; samples are uniform in a cell.

    Cells: each continuous column (in [0, 1] by its public bounds) is cut into k equal bins, with k from
    :func:`bins_per_dimension` at N = the run's *released* row count (a DP count, never the exact n, so k is
    post-processing of a release) and α = the run's target ε; each categorical column is one more axis whose
    bins are its categories (one-hot blocks are not smoothed: a category is a cell edge, not a width), and so is
    the label of a labelled data set. The number of cells is the product of the axes' sizes.

    The ``LaplaceHistogram`` mechanism releases the counts with ``Lap(Δ/ε)`` noise on *every* cell, empty or
    not (Δ = 1 under add/remove, 2 under replace-one), clips negative noisy counts to 0 and stores them here
    (post-processing), so the checkpoint holds the release and a resumed run reuses it. Sampling picks a cell
    with probability proportional to its clipped count (uniformly over all cells if every count is 0) and a
    point uniformly within its continuous bins. The noise of the empty cells dominates when the cells
    outnumber the rows (Nα/10 small against their count); that is the baseline's behaviour, not a defect.

    Memory: the released histogram is dense, 4 bytes a cell in memory and in each checkpoint. A grid larger
    than ``max_cells`` is refused before the counts are released (the thesis left the histogram out where it
    did not fit in memory).

    Args:
        n_continuous, block_sizes, num_classes: the data layout.
        bins_per_dim: k, public; ``None`` = the formula above.
        max_cells: the largest grid accepted.
    """

    tabular_only = True
    variable_buffers = ("counts",)  # sized by the release: resume does not compare it with a fresh module
    public_metrics: dict[str, str] = {}

    def __init__(
        self,
        *,
        n_continuous: int,
        block_sizes: Sequence[int] = (),
        num_classes: int = 1,
        bins_per_dim: int | None = None,
        max_cells: int = 2**26,
    ) -> None:
        super().__init__()
        check_settings(bins_per_dim=bins_per_dim, max_cells=max_cells)
        self.save_hyperparameters()
        self.n_continuous, self.block_sizes = n_continuous, list(block_sizes)
        self.init_label_buffer(num_classes)
        self.register_buffer("counts", torch.zeros(0))  # (C,) clipped noisy counts, row-major over the axes
        self.register_buffer("axes", torch.zeros(self.num_axes, dtype=torch.long))  # bins on each axis
        self.register_buffer("released", torch.tensor(False))
        self.automatic_optimization = False

    @staticmethod
    def check_schema(module_cfg: Mapping[str, Any], schema: Any, data: Mapping[str, Any] | None = None) -> None:
        """Refuse settings out of range, before any release (images: ``tabular_only``).

        Raises:
            ConfigError: a setting the model cannot use, with the fix.
        """
        check_settings(**{k: module_cfg[k] for k in ("bins_per_dim", "max_cells") if k in module_cfg})
        if isinstance(schema, Schema):
            bins, max_cells = module_cfg.get("bins_per_dim"), module_cfg.get("max_cells", 2**26)
            axes = smallest_grid(schema, bins_per_dim=bins)
            if math.prod(axes) > max_cells:
                shown = " × ".join(map(str, axes))
                raise ConfigError(
                    f"model=perturbed_histogram: the grid has at least {shown} = {math.prod(axes):.3g} cells "
                    f"({bins or 1} bin(s) on each continuous column), above model.module.max_cells = {max_cells:.3g} "
                    "(4 bytes a cell). Raise max_cells if the memory is there, or drop categorical columns. Nothing "
                    "was released."
                )

    @staticmethod
    def minmax_columns(module_cfg: Mapping[str, Any], schema: Any) -> list[str]:
        """Every continuous column stays one min-max number: the histogram's own bins are its cells."""
        return [c.name for c in schema.features if c.type == "continuous"]

    # ---------------------------------------------------------------- layout
    @property
    def blocks(self) -> list[int]:
        """Categorical axes: the one-hot blocks, then the label when the data set has one."""
        return self.block_sizes + ([self.num_classes] if self.num_classes > 1 else [])

    @property
    def num_axes(self) -> int:
        return self.n_continuous + len(self.blocks)

    def grid(self, *, num_rows: float, epsilon: float) -> list[int]:
        """Bins on each axis (continuous axes first, then the categorical ones) for a released N and the run's ε."""
        k = self.hparams.bins_per_dim
        if k is None and self.n_continuous:
            k = bins_per_dimension(num_rows, epsilon, self.n_continuous)
        return [int(k)] * self.n_continuous + list(self.blocks)

    def cell_index(self, x: Tensor, y: Tensor, axes: Sequence[int]) -> Tensor:
        """Row-major cell of each row ``(x, y)`` in model space on a grid ``axes``, shape (B,) int64."""
        k = axes[0] if self.n_continuous else 1
        # (B, d) bin of each continuous column; x = 1 falls in the last bin
        digits = [(x[:, : self.n_continuous] * k).floor().long().clamp(0, k - 1)]
        offset = self.n_continuous
        for size in self.block_sizes:
            digits.append(x[:, offset : offset + size].argmax(1, keepdim=True))
            offset += size
        if self.num_classes > 1:
            digits.append(y.long().view(-1, 1))
        digits_all = torch.cat(digits, 1)  # (B, A)
        index = torch.zeros(len(x), dtype=torch.long, device=x.device)
        for a, size in enumerate(axes):
            index = index * size + digits_all[:, a]
        return index

    # ---------------------------------------------------------------- mechanism interface
    def is_released(self) -> bool:
        return bool(self.released)

    def set_release(self, counts: Tensor, axes: Sequence[int]) -> None:
        """Store the released counts (C,) on the grid ``axes``, clipped at 0 (post-processing)."""
        if counts.numel() != math.prod(axes):
            raise ValueError(f"{counts.numel()} counts for a grid of {math.prod(axes)} cells.")
        self.counts = counts.detach().clamp_min(0.0).to(torch.float32, copy=True).to(self.released.device)
        self.axes.copy_(torch.as_tensor(list(axes), dtype=torch.long))
        self.released.fill_(True)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """The histogram's size is known only after the release: take the saved one before loading it."""
        saved = state_dict.get(prefix + "counts")
        if isinstance(saved, Tensor):
            self.counts = torch.empty_like(saved, device=self.released.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ---------------------------------------------------------------- training: none (the release is the model)
    def train_dataloader(self) -> DataLoader:
        """One empty step per epoch: the mechanism releases at the start of fit; nothing is trained."""
        return DataLoader(range(1), batch_size=None)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        if not self.is_released():
            raise RuntimeError(
                "The perturbed histogram has no released counts: add the LaplaceHistogram mechanism."
            )

    def configure_optimizers(self) -> None:
        return None

    # ---------------------------------------------------------------- sampling (post-processing)
    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        if labels is not None:
            raise ValueError(
                "model=perturbed_histogram generates the label with the row; it cannot condition on one."
            )
        if not self.is_released():
            raise CheckpointError(
                "This model holds no released histogram: there is nothing to sample; train a new run."
            )
        cells = sample_cells(self.counts, n)  # (n,)
        axes = [int(a) for a in self.axes]
        digits = torch.empty(n, len(axes), dtype=torch.long, device=cells.device)
        for a in reversed(range(len(axes))):
            digits[:, a] = cells % axes[a]
            cells = torch.div(cells, axes[a], rounding_mode="floor")
        d = self.n_continuous
        k = axes[0] if d else 1
        parts = [(digits[:, :d] + torch.rand(n, d, device=digits.device)) / k]  # uniform in the bin, (n, d)
        for a, size in enumerate(self.blocks):
            parts.append(F.one_hot(digits[:, d + a], size).to(parts[0].dtype))
        x = torch.cat(parts, 1)  # (n, D)
        if self.num_classes <= 1:
            return x, torch.zeros(n, dtype=torch.long, device=x.device)
        return x[:, : -self.num_classes], digits[:, -1]


def sample_cells(weights: Tensor, n: int, *, block: int = SAMPLING_BLOCK) -> Tensor:
    """``n`` cells drawn with probability ∝ ``weights`` (C,) ≥ 0, uniform when all are 0; shape (n,) int64.

    Two levels (a block by its total, then a cell within it), so no cumulative sum of all C cells is held.
    """
    size = weights.numel()
    full = size // block
    sums = weights[: full * block].view(full, block).double().sum(1)  # (full,)
    if size > full * block:
        sums = torch.cat([sums, weights[full * block :].double().sum().view(1)])
    total = float(sums.sum())
    if not total > 0:
        return torch.randint(size, (n,), device=weights.device)
    cdf = sums.cumsum(0)
    u = torch.rand(n, dtype=torch.float64, device=weights.device) * total
    chosen = torch.searchsorted(cdf, u, right=True).clamp_max(len(sums) - 1)  # (n,)
    cells = torch.empty(n, dtype=torch.long, device=weights.device)
    for b in chosen.unique().tolist():
        rows = (chosen == b).nonzero().squeeze(1)
        local = weights[b * block : (b + 1) * block].double().cumsum(0)
        v = torch.rand(len(rows), dtype=torch.float64, device=weights.device) * float(local[-1])
        cells[rows] = b * block + torch.searchsorted(local, v, right=True).clamp_max(len(local) - 1)
    return cells


def check_settings(*, bins_per_dim: Any = None, max_cells: Any = 2**26) -> None:
    """The module's settings, checked before any release.

    Raises:
        ConfigError: the first setting out of range, named with a valid value.
    """
    if bins_per_dim is not None and (
        isinstance(bins_per_dim, bool) or not isinstance(bins_per_dim, int) or bins_per_dim < 1
    ):
        raise ConfigError(
            f"model.module.bins_per_dim must be null (Su et al.'s formula) or a whole number >= 1, "
            f"got {bins_per_dim!r}."
        )
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or not 1 <= max_cells <= 2**40:
        raise ConfigError(
            f"model.module.max_cells must be a whole number in [1, 2^40] (4 bytes a cell in memory and "
            f"in each checkpoint), got {max_cells!r}."
        )
