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
