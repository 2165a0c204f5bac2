"""Pure math of adaptive marginal measurement (AIM, McKenna et al. 2022; GEM, Liu, Vietri & Wu 2021).

Everything here is stateless: marginal tables from discretised rows, the workload, AIM's selection score and
budget schedule, and the Rényi-DP curve of the exponential mechanism under its bounded-range analysis. The
mechanism (``callbacks/adaptive_marginals.py``) composes these and records each release on the ledger; the
generator (``models/gem.py``) fits the released tables.

A *clique* is a tuple of column indices, sorted; its marginal is the flat (row-major) vector of counts of
every combination of the columns' levels.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

Clique = tuple[int, ...]


def workload(num_columns: int, *, degree: int = 2, target: int | None = None, target_weight: float = 1.0,
             target_triples: bool = False) -> tuple[list[Clique], list[float]]:
    """All ``degree``-way cliques of ``num_columns`` columns, with weights (AIM §4, a target column weighted).

    Args:
        num_columns: columns (the label counts as one).
        degree: 2 or 3.
        target: the target column, whose cliques get ``target_weight``; ``None`` weights all alike.
        target_weight: weight of a clique holding the target (AIM's workload weights ``c_r``).
        target_triples: with ``degree = 2``, also every triple holding the target.

    Returns:
        ``(cliques, weights)`` in lexicographic order.
    """
    if degree not in (2, 3):
        raise ValueError(f"The workload degree must be 2 or 3, got {degree!r}.")
    degree = min(degree, num_columns)
    cliques = list(itertools.combinations(range(num_columns), degree))
    if target_triples and target is not None and degree == 2 and num_columns >= 3:
        cliques += [c for c in itertools.combinations(range(num_columns), 3) if target in c]
    weights = [target_weight if target is not None and target in c else 1.0 for c in cliques]
    return cliques, weights


def clique_size(clique: Clique, levels: Sequence[int]) -> int:
    """Number of cells of a clique's marginal: the product of its columns' levels."""
    return math.prod(int(levels[c]) for c in clique)


def flat_index(codes: Tensor, clique: Clique, levels: Sequence[int]) -> Tensor:
    """Row-major cell of each row's ``codes`` (B, C) in the marginal of ``clique``, shape (B,) int64."""
    index = torch.zeros(codes.shape[0], dtype=torch.long, device=codes.device)
    for c in clique:
        index = index * int(levels[c]) + codes[:, c]
    return index


def marginal_counts(codes: Tensor, cliques: Sequence[Clique], levels: Sequence[int]) -> list[Tensor]:
    """Exact counts of every clique's marginal over the rows ``codes`` (B, C) int64, each (cells,) float64."""
    return [torch.bincount(flat_index(codes, c, levels), minlength=clique_size(c, levels)).double() for c in cliques]


def pair_counts(codes: Tensor, levels: Sequence[int], *, block: int = 8192) -> Tensor:
    """Every 1-way and 2-way marginal of the rows ``codes`` (B, C) at once: the Gram matrix ``OᵀO`` (K, K) float64
    of their one-hot encoding over the concatenated levels (K = Σ levels). Block (a, b) is the marginal of
    clique (a, b) in :func:`flat_index`'s row-major order; the diagonal of block (c, c) is column c's 1-way one.

    One matrix product per ``block`` rows (float32 sums of at most ``block`` ones are exact) instead of one
    ``bincount`` per clique: C²/2 cliques cost one (B × K)ᵀ(B × K) product, on CPU or GPU.
    """
    offsets = torch.tensor([0, *itertools.accumulate(int(k) for k in levels)], device=codes.device)
    size = int(offsets[-1])
    gram = torch.zeros(size, size, dtype=torch.float64, device=codes.device)
    for lo in range(0, codes.shape[0], block):
        part = codes[lo : lo + block]
        onehot = torch.zeros(part.shape[0], size, dtype=torch.float32, device=codes.device)
        onehot.scatter_(1, part + offsets[:-1], 1.0)
        gram += (onehot.T @ onehot).double()
    return gram


def clique_from_pairs(gram: Tensor, clique: Clique, levels: Sequence[int]) -> Tensor:
    """The marginal of a 1- or 2-way ``clique``, flat, read from :func:`pair_counts`' Gram matrix."""
    o = [0, *itertools.accumulate(int(k) for k in levels)]
    if len(clique) == 1:
        (c,) = clique
        return gram[o[c] : o[c + 1], o[c] : o[c + 1]].diagonal().clone()
    a, b = clique
    return gram[o[a] : o[a + 1], o[b] : o[b + 1]].flatten().clone()


def product_marginal(probs: Sequence[Tensor], clique: Clique) -> Tensor:
    """The marginal of ``clique`` under a mixture of product distributions, flat, summing to 1.

    ``probs[c]`` (B, k_c) holds column c's level probabilities for each of B mixture components (a generator's
    outputs for B latent draws); the mixture's marginal is ``mean_b ⊗_{c ∈ clique} probs[c][b]`` (GEM, §4).
    """
    first = probs[clique[0]]  # (B, k)
    if len(clique) == 1:
        return first.mean(0)
    rest = probs[clique[1]]
    for c in clique[2:]:
        rest = (rest.unsqueeze(2) * probs[c].unsqueeze(1)).flatten(1)  # (B, K·k_c)
    return (first.T @ rest).flatten() / first.shape[0]  # (k·K,), one matrix product over the draws


def gaussian_l2_sensitivity(num_marginals: int, *, adjacency: str) -> float:
    """L2 sensitivity of ``num_marginals`` marginals released together.

    Add/remove: a row adds 1 to exactly one cell of each marginal, ``√m``. Replace-one: in each marginal one cell
    loses 1 and one gains 1 (or none changes), ``√(2m)``.
    """
    if adjacency not in ("add_remove", "replace_one"):
        raise ValueError(f"Unknown adjacency {adjacency!r}; valid: add_remove, replace_one.")
    return math.sqrt(num_marginals * (1.0 if adjacency == "add_remove" else 2.0))


def score_sensitivity(weights: Sequence[float], *, adjacency: str) -> float:
    """Sensitivity of AIM's selection score (:func:`selection_scores`) over the candidates.

    Candidate r's score is ``w_r (||M_r(D) − A_r||₁ − b_r)`` with ``A_r`` and ``b_r`` computed from earlier
    releases only; ``||M_r(D) − A_r||₁`` moves by at most ``||M_r(D) − M_r(D')||₁``: 1 under add/remove (one cell
    ±1), 2 under replace-one. So Δ = ``max_r w_r`` (add/remove) or ``2 max_r w_r``.
    """
    return max(weights) * (1.0 if adjacency == "add_remove" else 2.0)


def selection_scores(errors: Tensor, *, sigma: float, cells: Tensor, weights: Tensor) -> Tensor:
    """AIM's quality score (Alg. 1, line 8): ``w_r (||M_r(D) − M_r(p̂)||₁ − √(2/π) σ n_r)``.

    Args:
        errors: ``||M_r(D) − M_r(p̂)||₁`` per candidate, in counts, (R,).
        sigma: the noise scale the chosen marginal would be measured with (counts).
        cells: ``n_r``, cells per candidate (R,).
        weights: ``w_r`` (R,).
    """
    return weights * (errors - math.sqrt(2.0 / math.pi) * sigma * cells)


def exponential_rdp(orders: Sequence[float], *, epsilon: float) -> np.ndarray:
    """RDP of one exponential mechanism ``∝ exp(ε q / (2Δ))``: ``min(α ε²/8, ε)``.

    The mechanism is ε-bounded-range, hence ε²/8-zCDP ("Bounding, Concentrating, and Truncating: Unifying Privacy
    Loss Composition for Data Analytics", Cesar & Rogers 2021, Lemma 3.2 and Thm. 3), i.e. RDP α ε²/8 at every
    order α; it is also ε-DP, i.e. RDP ≤ ε. AIM accounts it the same way (§4, Thm. 2).
    """
    a = np.asarray(orders, dtype=float)
    return np.minimum(a * epsilon**2 / 8.0, epsilon)


def round_parameters(rho: float, rounds: int, *, selection_fraction: float = 0.1) -> tuple[float, float]:
    """AIM's starting per-round noise (Alg. 1, line 3): ``σ = √(T / (2 (1−f) ρ))`` and ``ε = √(8 f ρ / T)``.

    A round then costs ``1/(2σ²) + ε²/8 = ρ / T`` in zCDP, so at most T rounds fit in ρ.
    """
    if rho <= 0 or rounds < 1 or not 0 < selection_fraction < 1:
        raise ValueError("round_parameters needs rho > 0, rounds >= 1 and 0 < selection_fraction < 1.")
    return math.sqrt(rounds / (2 * (1 - selection_fraction) * rho)), math.sqrt(8 * selection_fraction * rho / rounds)


def round_cost(sigma: float, epsilon: float) -> float:
    """zCDP ρ of one round: a Gaussian measurement (Δ₂ = 1 units) ``1/(2σ²)`` plus a selection ``ε²/8``."""
    return 1.0 / (2.0 * sigma**2) + epsilon**2 / 8.0


def anneal(before: Tensor, after: Tensor, *, sigma: float, cells: int) -> bool:
    """AIM's annealing test (Alg. 1, line 13): the fitted model moved by at most the noise's expected L1 size
    on the measured marginal, ``||M_r(p̂_t) − M_r(p̂_{t−1})||₁ ≤ √(2/π) σ n_r``; then σ halves and ε doubles.

    With ``after`` the new measurement ``y_r`` instead of the refitted model this is the *gap* test: the model
    before the round was already within the noise of what was measured. AIM's estimator refits to convergence,
    so its ``M_r(p̂_t)`` moves to (about) ``y_r`` and both tests agree; a generator fitted by a bounded number of
    gradient steps moves less than it would at convergence, and only the gap test keeps AIM's meaning (a selected
    marginal the model already answers within the noise: measure more finely)."""
    return float((after - before).abs().sum()) <= math.sqrt(2.0 / math.pi) * sigma * cells


def cosine_fraction(step: int, total: int, *, floor: float) -> float:
    """Learning-rate multiplier of a cosine decay from 1 to ``floor`` over ``total`` steps ("SGDR: Stochastic
    Gradient Descent with Warm Restarts", Loshchilov & Hutter 2017, Eq. 5, one cycle)."""
    if total <= 0:
        return floor
    t = min(max(step, 0), total) / total
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
