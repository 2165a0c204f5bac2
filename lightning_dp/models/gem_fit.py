"""GEM's fit to its measured 2-way marginals and label triples: only the measured blocks of the draws' products.

A 2-way marginal (a, b) of the generator's mixture is the block ``P_aᵀ P_b / B`` of the Gram matrix of the
draws' concatenated level probabilities P (B, K); a triple (a, b, label) is the block of the label-weighted
products ``(P_a ⊗ P_label)ᵀ P_b / B``. A run measures a fraction of the pairs (~34 of Adult's 105), so a step
computes the measured blocks only: the plan (:func:`products_plan`) lists them by groups, one column's levels
against the levels of every column measured with it, one matrix product a group, with their targets and
weights in the same order. Its cost is O(B · Σ_measured k_a k_b) (times the label's levels for triples) instead
of O(B · K²); where nearly every pair is measured one dense product is cheaper than many small ones, and the plan
takes whichever a cost estimate (:func:`blocks_cost`) prefers.

The loss is GEM's Gaussian log-likelihood with the unbiased square (``models/gem.unbiased_square_loss``) per
measured cell ``q``: ``w [(B q̂² − q̂₂) / (B − 1) − 2 y q̂ + y²]`` with q̂ the draws' mean of the cell's products
and q̂₂ the mean of their squares. Restated as ``w [(q̂ − y)² + q̂² / (B − 1)] − w q̂₂ / (B − 1)``, the last
term summed over a block is ``w · mean_z S_a(z) S_b(z)`` (times ``S_label(z)`` for a triple), where
``S_c(z) = Σ_l p_c(z)[l]²``: the squares need no matrix product of their own (and ``S_c >= 1/k_c`` is never
tiny, while products of squared probabilities are often denormal floats, slow on CPUs).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_dp.privacy.marginals import Clique

# the layouts' costs in the dense product's multiply-adds a draw, fitted to one-thread CPU times of both layouts at
# B = 1,024 on tables of 40 to 600 levels with 10% to all of the pairs measured, probabilities away from 0
# (bench/gem_scaling.py prints both). A trained generator's nearly deterministic components hold denormal floats,
# whose products are many times slower: that favours the blocks (fewer products) further.
BLOCK_MAC_COST = 4  # a multiply-add of a group's product (small products use the CPU less well)
CALL_COST = 3072  # a group's calls, forward and backward (the partners' copy, the product, their gradients)
DENSE_COST = 16384  # the dense product's gather of the measured cells, forward and backward


@dataclass(frozen=True)
class Products:
    """The measured cells of one family of products: pairs (``label`` False) or label triples.

    ``groups`` are (left column, its partner columns); the cells are those of each group's product
    ``left(P_c)ᵀ [P_b for b in partners]`` (k_c·m, Σ k_b) flattened, m the label's levels for triples (1 for
    pairs), groups one after another. ``cells`` indexes them in the flattened dense product
    ``left(P)ᵀ P`` (K·m, K) when the plan computes that instead (None: by groups).
    """

    groups: tuple[tuple[int, tuple[int, ...]], ...]
    target: Tensor  # (n,) float32: each measured cell's proportion
    weight: Tensor  # (n,) float32: its weight n̂²·Σ 1/s²
    pair_weight: Tensor  # (C, C) float32: each measured pair's weight at [a, b], 0 elsewhere
    label: bool
    cells: Tensor | None = None


def group_pairs(pairs: Sequence[tuple[int, int]], levels: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
    """Cover the measured pairs by groups (column, partners): greedily the column in the most uncovered pairs (then
    the one with more levels, then the first), so the groups are few and the copied partners small."""
    left, groups = set(pairs), []
    while left:
        degree: dict[int, int] = {}
        for pair in left:
            for c in pair:
                degree[c] = degree.get(c, 0) + 1
        c = max(degree, key=lambda x: (degree[x], levels[x], -x))
        covered = {p for p in left if c in p}
        groups.append((c, tuple(sorted(b if a == c else a for a, b in covered))))
        left -= covered
    return groups


def blocks_cost(groups: Sequence[tuple[int, Sequence[int]]], levels: Sequence[int], m: int = 1) -> int:
    """The groups' estimated cost in the dense product's multiply-adds a draw (which costs ``m · K² + DENSE_COST``):
    each group's product, ``m · k_c · Σ_partners k_b`` multiply-adds, and its calls."""
    return sum(BLOCK_MAC_COST * m * levels[c] * sum(levels[b] for b in partners) + CALL_COST
               for c, partners in groups)


def products_plan(measured: Sequence[tuple[Clique, Tensor, float]], levels: Sequence[int], *, label: bool = False,
                  dense: bool | None = None, device: torch.device | str = "cpu") -> Products:
    """The plan of one family of measurements: pairs (a, b), or triples (a, b, label) with ``label``.

    Args:
        measured: ``(clique, proportions (flat, row-major), weight)`` of each pooled measurement of the family.
        levels: every column's levels (the label last).
        label: the family is label triples.
        dense: compute one dense product (True) or the groups (False); None: the cheaper by the estimate.
        device: where the step runs.
    """
    offsets = [0, *itertools.accumulate(levels)]
    size, m = offsets[-1], levels[-1] if label else 1
    tables = {clique[:2]: (y.reshape(*(levels[c] for c in clique)), w) for clique, y, w in measured}
    groups = group_pairs(list(tables), levels)
    if dense is None:
        dense = m * size * size + DENSE_COST < blocks_cost(groups, levels, m)
    targets, weights, cells = [], [], []
    pair_weight = torch.zeros(len(levels), len(levels), dtype=torch.float32)
    for c, partners in groups:
        rows = (torch.arange(offsets[c], offsets[c + 1])[:, None] * m + torch.arange(m)).flatten()  # (k_c·m,)
        blocks, block_weights = [], []
        for b in partners:
            table, w = tables[(c, b) if c < b else (b, c)]  # (k_a, k_b[, k_label])
            order = (0, 1) if c < b else (1, 0)
            block = table.permute(order[0], 2, order[1]) if label else table.permute(*order)  # (k_c[, m], k_b)
            blocks.append(block.reshape(levels[c] * m, levels[b]))
            block_weights.append(torch.full((levels[c] * m, levels[b]), w, dtype=torch.float64))
            pair_weight[min(b, c), max(b, c)] = w
        cols = torch.cat([torch.arange(offsets[b], offsets[b + 1]) for b in partners])  # (W,)
        targets.append(torch.cat(blocks, 1).flatten())  # (k_c·m · W,), the group's product flattened
        weights.append(torch.cat(block_weights, 1).flatten())
        cells.append((rows[:, None] * size + cols).flatten())
    return Products(groups=tuple(groups), target=torch.cat(targets).to(device, torch.float32),
                    weight=torch.cat(weights).to(device, torch.float32),
                    pair_weight=pair_weight.to(device), label=label,
                    cells=torch.cat(cells).to(device) if dense else None)


def column_square_sums(squares: Tensor, levels: Sequence[int]) -> Tensor:
    """``S_c(z) = Σ_l p_c(z)[l]²`` of every column c for each draw z, (B, C), from the squared probabilities
    ``squares`` (B, K)."""
    return torch.stack([part.sum(1) for part in squares.split(list(levels), 1)], 1)


def products_loss(plan: Products, probs: Sequence[Tensor], flat: Tensor, sums: Tensor) -> Tensor:
    """The family's part of the loss, ``½ Σ_cells w [(B q̂² − q̂₂) / (B − 1) − 2 y q̂ + y²]`` (module docstring).

    Args:
        plan: the family's measured cells.
        probs: each column's level probabilities of the B draws, [(B, k_c)], the label last.
        flat: the same side by side, (B, K).
        sums: :func:`column_square_sums` of the draws, (B, C).
    """
    b, label = flat.shape[0], probs[-1]

    def left(p: Tensor) -> Tensor:  # (B, k) → (B, k·m): the label-weighted levels for triples
        return (p[:, :, None] * label[:, None, :]).flatten(1) if plan.label else p

    if plan.cells is not None:
        mean = (left(flat).T @ flat).flatten()[plan.cells] / b  # (n,) of the dense (K·m, K) product
    else:
        mean = torch.cat([(left(probs[c]).T @ torch.cat([probs[p] for p in partners], 1)).flatten()
                          for c, partners in plan.groups]) / b  # (n,): each group's (k_c·m, W) block
    square = ((sums @ plan.pair_weight) * sums).sum(1)  # (B,): Σ_ab w_ab S_a S_b, the blocks' sums of q̂₂ terms
    if plan.label:
        square = square * sums[:, -1]
    return 0.5 * ((plan.weight * ((mean - plan.target).square() + mean.square() / (b - 1))).sum()
                  - square.mean() / (b - 1))
