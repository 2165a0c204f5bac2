"""Energy distance between point sets (Székely & Rizzo; the V-statistic of "Distribution Distance Measures in
Generative and Privacy Models", Diesendruck 2019, Eqs. 2.4 and 5.5) with ℓ_p norms, p in [1, 2].

For p in [1, 2] the ℓ_p metric is of negative type, so the energy distance is a squared MMD with the kernel
``−||x − y||_p`` and is never negative; the sensitivity bounds of ``privacy/sensitivity.py`` rely on that.
"""

from __future__ import annotations

import math

from torch import Tensor


def check_norm(p: float) -> None:
    """Refuse a norm order outside [1, 2] (the energy distance is a metric only there).

    Raises:
        ValueError: ``p`` is not a finite number in [1, 2].
    """
    if not (isinstance(p, int | float) and math.isfinite(p) and 1 <= p <= 2):
        raise ValueError(f"The energy distance's norm order p must be in [1, 2] (1 = the thesis' regression runs, "
                         f"2 = Euclidean), got {p!r}.")


def lp_distances(a: Tensor, b: Tensor, p: float = 2.0, *, eps: float = 0.0) -> Tensor:
    """``||a_i − b_j||_p`` for all pairs, shape (..., n, m), from a (..., n, D) and b (..., m, D).

    ``eps > 0`` gives the safe norm ``(Σ|·|^p + eps)^{1/p}``-style floor for p > 1, whose gradient is finite at
    coincident points (the diagonal of a set against itself); p = 1 needs none (|·|' at 0 is taken as 0).
    """
    diff = a.unsqueeze(-2) - b.unsqueeze(-3)  # (..., n, m, D)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return diff.square().sum(-1).clamp_min(eps).sqrt()
    return diff.abs().pow(p).sum(-1).clamp_min(eps).pow(1.0 / p)


def energy_distance(x: Tensor, y: Tensor, p: float = 2.0) -> Tensor:
    """Squared energy distance ``e_{N,n}(X, Y)`` (Eq. 5.5), V-statistic normalisation (diagonals included).

    ``(2/(N n)) Σ_ij ||x_i − y_j|| − (1/N²) Σ_ij ||x_i − x_j|| − (1/n²) Σ_ij ||y_i − y_j||`` for x (..., N, D)
    and y (..., n, D); returns shape (...).
    """
    cross = lp_distances(x, y, p).mean((-2, -1))
    return 2 * cross - lp_distances(x, x, p).mean((-2, -1)) - lp_distances(y, y, p).mean((-2, -1))


def support_point_loss(x: Tensor, y: Tensor, p: float = 2.0, *, eps: float = 1e-12) -> Tensor:
    """``e(X, Y)`` less its X-only term, the objective of support points in Y (Eq. 5.6), differentiable in y.

    ``(2/(N n)) Σ ||x_i − y_j|| − (1/n²) Σ ||y_i − y_j||`` for x (N, D) and y (n, D), with the safe norm.
    """
    return 2 * lp_distances(x, y, p, eps=eps).mean() - lp_distances(y, y, p, eps=eps).mean()
