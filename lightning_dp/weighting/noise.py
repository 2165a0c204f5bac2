"""Moments of the multiplicative noise of private importance weights (pure math, no state).

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary Tale":
a private weight is ``w* = w · e^ζ``. Importance sampling stays unbiased when E[e^ζ] = 1 and ζ is drawn afresh
for every weight (Theorem 2; the theorem prints ``w* = w + ζ``, but its proof is multiplicative), and its
variance grows by Var[e^ζ] · E_{p_G}[(w h)²] (Eq. 4). The two output-perturbation families are

* log-Laplace (Corollary 1): ζ ~ Laplace(log(1 − ρ²), ρ), so E[e^ζ] = 1 for ρ < 1, and
  Var[e^ζ] = (1 − ρ²)²/(1 − 4ρ²) − 1 for ρ < 1/2 (infinite for ρ ≥ 1/2; the paper prints λ for ρ);
* lognormal (Corollary 2): ζ ~ N(−γ²/2, γ²), so E[e^ζ] = 1 and Var[e^ζ] = e^{γ²} − 1 (the paper states γ²,
  which is only its first-order approximation).

Coefficient perturbation (Ji & Elkan 2013) shares one ζ ∈ R^F between all rows: log w̄(x) = (β + ζ)ᵀx with
ζ_j ~ Laplace(0, b) iid, so E_ζ[w̄(x)] = w(x) · Π_j 1/(1 − b²x_j²) for b|x_j| < 1 (Proposition 1 of the paper;
the closed form follows from E[e^{tζ_j}] = 1/(1 − b²t²)). The factor depends on x, so self-normalisation
cannot remove it.
"""

from __future__ import annotations

import math

import numpy as np

LAPLACE_FINITE_MEAN = 1.0  # ρ below this: E[e^ζ] exists
LAPLACE_FINITE_VARIANCE = 0.5  # ρ below this: Var[e^ζ] exists


def laplace_location(rho: float) -> float:
    """log(1 − ρ²): the Laplace location that makes E[e^ζ] = 1 (Corollary 1); needs 0 ≤ ρ < 1.

    Raises:
        ValueError: ρ outside [0, 1).
    """
    if not 0 <= rho < 1:
        raise ValueError(f"The log-Laplace weight noise needs a scale ρ in [0, 1) for E[e^ζ] to exist, got ρ={rho}.")
    return math.log1p(-rho * rho)


def laplace_exp_moments(rho: float, *, loc: float | None = None) -> tuple[float, float]:
    """(E[e^ζ], Var[e^ζ]) for ζ ~ Laplace(loc, ρ); ``loc`` defaults to the unbiased log(1 − ρ²).

    E[e^{kζ}] = e^{k·loc}/(1 − k²ρ²) for kρ < 1 (the log-Laplace law, Kozubowski & Podgórski 2003), so the mean
    is infinite for ρ ≥ 1 and the variance for ρ ≥ 1/2; ``inf`` is returned there.

    >>> laplace_exp_moments(0.3)[0], round(laplace_exp_moments(0.3)[1], 3)
    (1.0, 0.294)
    """
    if rho < 0:
        raise ValueError(f"The Laplace scale must be >= 0, got ρ={rho}.")
    if loc is None:  # the unbiased case, in the paper's closed form
        if rho >= 1:
            return math.inf, math.inf
        return 1.0, ((1 - rho**2) ** 2 / (1 - 4 * rho**2) - 1) if rho < 0.5 else math.inf
    mean = math.exp(loc) / (1 - rho**2) if rho < 1 else math.inf
    if rho >= 0.5:
        return mean, math.inf
    return mean, math.exp(2 * loc) * (1 / (1 - 4 * rho**2) - 1 / (1 - rho**2) ** 2)


def gaussian_exp_moments(gamma: float, *, loc: float | None = None) -> tuple[float, float]:
    """(E[e^ζ], Var[e^ζ]) for ζ ~ N(loc, γ²); ``loc`` defaults to the unbiased −γ²/2 (Corollary 2).

    The lognormal law: E[e^ζ] = e^{loc + γ²/2} and Var[e^ζ] = e^{2 loc + γ²}(e^{γ²} − 1), i.e. e^{γ²} − 1 in the
    unbiased case (the paper states γ²).

    >>> round(gaussian_exp_moments(0.5)[1], 4)
    0.284
    """
    if gamma < 0:
        raise ValueError(f"The Gaussian scale must be >= 0, got γ={gamma}.")
    if loc is None:
        return 1.0, math.expm1(gamma**2)
    return math.exp(loc + gamma**2 / 2), math.exp(2 * loc + gamma**2) * math.expm1(gamma**2)


def ji_elkan_log_factor(x: np.ndarray, b: float) -> np.ndarray:
    """log E_ζ[exp(ζᵀx)] = −Σ_j log(1 − b²x_j²) per row of ``x`` (N, F), ζ_j ~ Laplace(0, b) iid.

    ``inf`` for rows with some b|x_j| ≥ 1, where the expectation does not exist.
    """
    t = (b * np.asarray(x, dtype=float)) ** 2  # (N, F)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.log1p(-np.minimum(t, 1.0)).sum(axis=-1)  # (N,)
    return np.where((t >= 1).any(axis=-1), np.inf, out)


def ji_elkan_factor(x: np.ndarray, b: float) -> np.ndarray:
    """E_ζ[exp(ζᵀx)] = Π_j 1/(1 − b²x_j²) per row (≥ 1): the bias of coefficient-perturbed weights (Ji & Elkan 2013).

    >>> float(ji_elkan_factor(np.array([[0.5, 0.0]]), 1.0)[0])
    1.3333333333333333
    """
    return np.exp(ji_elkan_log_factor(x, b))


def laplace_scale_limit(*, finite_variance: bool = True) -> float:
    """The largest admissible log-Laplace scale (exclusive): 1/2 for a finite Var[e^ζ], else 1 (a finite mean)."""
    return LAPLACE_FINITE_VARIANCE if finite_variance else LAPLACE_FINITE_MEAN


def laplace_scale_ok(rho: float, *, finite_variance: bool = True) -> bool:
    """True when ρ is below :func:`laplace_scale_limit` (so the weights are unbiased, with finite variance if asked)."""
    return 0 <= rho < laplace_scale_limit(finite_variance=finite_variance)
