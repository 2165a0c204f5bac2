"""Rényi-DP bounds for "run a random number K of DP candidates, release the best" (Papernot & Steinke, ICLR 2022).

Pure functions on numpy arrays over the RDP orders. Source: N. Papernot and T. Steinke, "Hyperparameter Tuning
with Renyi Differential Privacy", ICLR 2022 (arXiv:2110.03620).

Definition 1 (truncated negative binomial D_{η,γ}), η > −1, γ ∈ (0, 1), support K ∈ {1, 2, ...}:
    η ≠ 0: P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · ∏_{ℓ=0}^{k−1} (ℓ + η)/(ℓ + 1),
    η = 0: P[K = k] = (1 − γ)^k / (k · log(1/γ))          (the logarithmic distribution),
    E[K] = η(1 − γ) / (γ(1 − γ^η)) for η ≠ 0 and (1/γ − 1) / log(1/γ) for η = 0; η = 1 is the geometric.

Theorem 2: if the candidate Q is (λ, ε)-RDP and (λ̂, ε̂)-RDP, with λ ∈ (1, ∞) and λ̂ ∈ [1, ∞), then running Q
K ~ D_{η,γ} times and releasing the best output is (λ, ε')-RDP with
    ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ) / λ̂ + log E[K] / (λ − 1).
λ̂ is free, so :func:`tnb_rdp` minimises over the available orders.

Theorem 6: if Q is (λ, ε)-RDP and (ε̂, δ̂)-DP with e^{ε̂} ≤ 1 + 1/(λ − 1), and K ~ Poisson(μ), then the best of
K runs (⊥ when K = 0) is (λ, ε')-RDP with ε' = ε + μ δ̂ + log μ / (λ − 1).

The guarantee covers the *output* (the best candidate and its score). It says nothing about publishing K,
the unchosen candidates or their scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _check_tnb(eta: float, gamma: float) -> None:
    if not eta > -1:
        raise ValueError(f"The truncated negative binomial needs eta > -1, got {eta!r}; e.g. eta=0 (logarithmic).")
    if not 0 < gamma < 1:
        raise ValueError(f"The truncated negative binomial needs 0 < gamma < 1, got {gamma!r}; e.g. gamma=0.1.")


def tnb_mean(eta: float, gamma: float) -> float:
    """E[K] for K ~ D_{η,γ} (Papernot & Steinke 2022, Definition 1)."""
    _check_tnb(eta, gamma)
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def tnb_pmf(k: np.ndarray | int, eta: float, gamma: float) -> np.ndarray:
    """P[K = k] for K ~ D_{η,γ} (Definition 1); 0 for k < 1."""
    _check_tnb(eta, gamma)
    k = np.atleast_1d(np.asarray(k, dtype=np.int64))
    out = np.zeros(len(k))
    kmax = int(k.max(initial=0))
    if kmax < 1:
        return out
    ks = np.arange(1, kmax + 1)
    if eta == 0:
        pmf = (1 - gamma) ** ks / (ks * math.log(1 / gamma))
    else:
        log_prod = np.cumsum(np.log(np.abs((ks - 1 + eta) / ks)))  # log ∏_{ℓ<k} |ℓ+η|/(ℓ+1)
        sign = np.where(eta < 0, -1.0, 1.0)  # only the ℓ = 0 factor η is negative when -1 < η < 0
        pmf = sign * np.exp(log_prod + ks * math.log(1 - gamma)) / (gamma ** (-eta) - 1)
    valid = k >= 1
    out[valid] = pmf[k[valid] - 1]
    return out


def sample_tnb(eta: float, gamma: float, rng: np.random.Generator) -> int:
    """Draw K ~ D_{η,γ} (always ≥ 1).

    η > 0: a negative binomial NB(η, γ) (failures before η successes) conditioned on K ≥ 1, by rejection;
    η = 0: numpy's logarithmic series with p = 1 − γ; −1 < η < 0: inversion of the CDF.
    """
    _check_tnb(eta, gamma)
    if eta > 0:
        while True:
            k = int(rng.negative_binomial(eta, gamma))
            if k >= 1:
                return k
    if eta == 0:
        return int(rng.logseries(1 - gamma))
    u, k, cdf, block = rng.random(), 0, 0.0, 1024
    while True:  # inversion, a block of the pmf at a time
        pmf = tnb_pmf(np.arange(k + 1, k + block + 1), eta, gamma)
        cum = cdf + np.cumsum(pmf)
        hit = np.nonzero(cum >= u)[0]
        if len(hit):
            return k + int(hit[0]) + 1
        k, cdf = k + block, float(cum[-1])
        if cdf >= 1 - 1e-15:  # rounding: the tail is below float resolution
            return k


def tnb_rdp(orders: Sequence[float], candidate_rdp: np.ndarray, *, eta: float, gamma: float) -> np.ndarray:
    """RDP curve of the best of K ~ D_{η,γ} candidates (Theorem 2), with λ̂ minimised over ``orders``.

    Args:
        orders: RDP orders λ > 1.
        candidate_rdp: the candidate's RDP ε(λ) at ``orders`` (all it releases: training, score, ...).
        eta: η > −1.
        gamma: γ ∈ (0, 1).

    Returns:
        ε'(λ) at each order.
    """
    _check_tnb(eta, gamma)
    lam = np.asarray(orders, dtype=float)
    eps = np.asarray(candidate_rdp, dtype=float)
    if lam.shape != eps.shape or np.any(lam <= 1):
        raise ValueError("candidate_rdp must have one value per order, and every order must be > 1.")
    # the λ̂ part does not depend on λ: one minimum over the available orders
    hat = (1 + eta) * (1 - 1 / lam) * eps + (1 + eta) * math.log(1 / gamma) / lam
    return eps + float(np.min(hat)) + math.log(tnb_mean(eta, gamma)) / (lam - 1)


def rdp_to_dp_delta(orders: Sequence[float], rdp: np.ndarray, epsilon: float) -> float:
    """Smallest δ over ``orders`` with (ε, δ)-DP implied by the RDP curve (Canonne, Kamath, Steinke 2020, Prop. 12):
    δ = exp((λ − 1)(ε(λ) − ε)) / λ · (1 − 1/λ)^{λ−1}, capped at 1."""
    lam = np.asarray(orders, dtype=float)
    eps = np.asarray(rdp, dtype=float)
    log_delta = (lam - 1) * (eps - epsilon) - np.log(lam) + (lam - 1) * np.log1p(-1 / lam)
    return float(min(1.0, np.exp(np.min(log_delta))))


def poisson_rdp(orders: Sequence[float], candidate_rdp: np.ndarray, *, mu: float, eps_hat: float | None = None,
                delta_hat: float | None = None) -> np.ndarray:
    """RDP curve of the best of K ~ Poisson(μ) candidates (Theorem 6); ∞ at orders where its condition fails.

    Args:
        orders: RDP orders λ > 1.
        candidate_rdp: the candidate's RDP ε(λ) at ``orders``.
        mu: E[K] = μ > 0.
        eps_hat: the candidate's (ε̂, δ̂)-DP ε̂. ``None``: at each λ the largest ε̂ the theorem admits,
            log(1 + 1/(λ − 1)), with δ̂ from the candidate's own curve (:func:`rdp_to_dp_delta`).
        delta_hat: δ̂ for a given ``eps_hat`` (required with it).

    Returns:
        ε'(λ) = ε(λ) + μ δ̂ + log μ / (λ − 1) at each order.
    """
    if not mu > 0:
        raise ValueError(f"The Poisson number of candidates needs mu > 0, got {mu!r}.")
    lam = np.asarray(orders, dtype=float)
    eps = np.asarray(candidate_rdp, dtype=float)
    if lam.shape != eps.shape or np.any(lam <= 1):
        raise ValueError("candidate_rdp must have one value per order, and every order must be > 1.")
    if eps_hat is None:
        hats = np.log1p(1 / (lam - 1))
        deltas = np.array([rdp_to_dp_delta(lam, eps, h) for h in hats])
        return eps + mu * deltas + math.log(mu) / (lam - 1)
    if delta_hat is None or not 0 <= delta_hat <= 1:
        raise ValueError("poisson_rdp: give delta_hat in [0, 1] together with eps_hat.")
    ok = math.exp(eps_hat) <= 1 + 1 / (lam - 1)
    return np.where(ok, eps + mu * delta_hat + math.log(mu) / (lam - 1), np.inf)
