"""Sensitivities of the statistics that one-shot mechanisms release, under both adjacencies.

Add/remove (the default ledger adjacency) adds or deletes one row; replace-one swaps a row and keeps
n public. Each function states the argument for its bound.
"""

from __future__ import annotations

import math


def embedding_sum_sensitivity(*, feature_norm: float, adjacency: str) -> float:
    """L2 sensitivity of the class-wise feature sums ``S = Σ_i h(x_i) e_{y_i}ᵀ`` (shape (C, D)).

    Row i changes one row of S by ``h(x_i)``, with ``||h(x)|| ≤ feature_norm``:
    * add/remove: ``||ΔS||_F ≤ feature_norm``;
    * replace-one, same class: ``||h(x) − h(x')|| ≤ 2·feature_norm``; different classes: two rows change,
      ``sqrt(2)·feature_norm``. The worst case is ``2·feature_norm`` (DP-MERF App. 10).
    """
    return feature_norm if adjacency == "add_remove" else 2.0 * feature_norm


def mean_embedding_sensitivity(*, feature_norm: float, n: int) -> float:
    """DP-MERF's replace-one sensitivity of the mean embedding with public n: ``2·feature_norm / n``.

    ``2/m`` for unit-norm RFFs (Def. 3.2), ``2√2/m`` for the heterogeneous feature (eq. 17).
    """
    return embedding_sum_sensitivity(feature_norm=feature_norm, adjacency="replace_one") / n


def count_sensitivity(*, adjacency: str) -> float:
    """L2 sensitivity of the class counts: 1 (add/remove: one count ±1) or √2 (replace-one: one count
    −1, another +1; DP-MERF eq. 10 writes it as √2/m for the proportions)."""
    return 1.0 if adjacency == "add_remove" else math.sqrt(2.0)


def histogram_sensitivity(*, adjacency: str) -> float:
    """L1 sensitivity of a histogram's cell counts: 1 (add/remove: one cell ±1) or 2 (replace-one: one cell −1,
    another +1). The thesis' baseline scales its Laplace noise by 1/α, right only for add/remove
    ("Distribution Distance Measures in Generative and Privacy Models", Diesendruck 2019, §5.7)."""
    if adjacency not in ("add_remove", "replace_one"):
        raise ValueError(f"Unknown adjacency {adjacency!r}; valid: add_remove, replace_one.")
    return 1.0 if adjacency == "add_remove" else 2.0


def heterogeneous_feature_norm(*, n_blocks: int) -> float:
    """``||[φ(x_con); x_dis/√K]|| = sqrt(1 + Σ x_dis²/K) = √2`` when each of the K one-hot blocks has one 1
    (eq. 17). With no blocks it is the RFF norm, 1."""
    return math.sqrt(2.0) if n_blocks > 0 else 1.0


def moment_sensitivity(*, dim: int, adjacency: str) -> float:
    """L2 sensitivity of ``(Σx/√d, Σ||x||²/d, n)`` for rows in [0, 1]^d.

    Each scaled sum changes by at most 1 per row. Add/remove: all three change, ``√3``. Replace-one: n
    is public and not released; ``Σx/√d`` changes by ``||x − x'||/√d ≤ 1`` and ``Σ||x||²/d`` by ≤ 1: ``√2``.
    """
    del dim  # the scaling by d is what makes the bound dimension-free
    return math.sqrt(3.0) if adjacency == "add_remove" else math.sqrt(2.0)


def energy_sensitivity(*, n_ref: int, d: int, p: float) -> float:
    """``Δf = 2 d^{1/p} (2N − 1)/N²`` of the energy score ``−e(·, X)`` when one of the N reference points changes.

    "Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019), Eqs. 5.7–5.10:
    replacing one reference point moves the cross term by at most ``(2/(N n))·n·d^{1/p}`` and the reference's own
    term by at most ``2(N − 1)·d^{1/p}/N²`` (the ℓ_p diameter of [0, 1]^d is ``d^{1/p}``, triangle inequality);
    the candidate's own term cancels. With the support set as the reference (Algorithm 1, Remark 1) ``N = n``,
    the support-set size. Worked example (§5.3.3): N = 4, d = 1, p = 1 gives 7/8.
    """
    if n_ref < 1 or d < 1:
        raise ValueError(f"energy_sensitivity needs n_ref >= 1 and d >= 1, got n_ref={n_ref}, d={d}.")
    return 2.0 * d ** (1.0 / p) * (2 * n_ref - 1) / n_ref**2


def energy_range_sensitivity(*, d: int, p: float) -> float:
    """``2 d^{1/p}``: the range of ``e(Y, R)`` over sets R in [0, 1]^d for any fixed Y (p in [1, 2]).

    ``0 <= e(Y, R) <= 2·(1/(n m)) Σ ||y − r|| <= 2 d^{1/p}`` (the energy distance is non-negative for p in [1, 2]
    and its two own terms are non-negative), so the score changes by at most this however far the reference
    moves: a sound bound for a reference computed from the data by any procedure (the optimised support points).
    """
    if d < 1:
        raise ValueError(f"energy_range_sensitivity needs d >= 1, got {d}.")
    return 2.0 * d ** (1.0 / p)
