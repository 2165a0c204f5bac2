"""Post-processing and diagnostics of importance weights: tempering, self-normalisation, PSIS, effective sizes.

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary Tale"
(Sec. 3.5 and A.6.1). Every function here is pure: it takes LOG weights ``log_w`` (N,) of the synthetic rows
(``log w = log p_D(x) − log p_G(x)`` up to a constant, as :class:`~lightning_dp.weighting.base.WeightFit`
returns them) and spends no privacy: post-processing of released weights is free.

* :func:`temper`: w^τ, τ ∈ [0, 1]; τ = 0 gives uniform weights, τ = 1 leaves them as they are. The paper uses
  tempering but never reports its τ.
* :func:`self_normalise`: weights of mean one (Σ w = N), from the log weights without overflow.
* :func:`psis`: Pareto-smoothed importance sampling (Vehtari et al., "Pareto Smoothed Importance Sampling",
  JMLR 2024) via ``arviz.psislw``, and its shape estimate k̂. Vehtari et al.'s reading of k̂: below 0.5 good,
  0.5 to 0.7 acceptable, above 0.7 unreliable (the weights' variance is infinite or nearly so, and estimates
  are dominated by a few rows). The paper gives no threshold; it only says that a large k̂ means the generator
  misses parts of the real distribution and that such a generator should not be released. We use
  :data:`PSIS_THRESHOLD` = 0.7.
* :func:`kish_ess`: Kish's effective sample size (Σ w)² / Σ w² (not in the paper).
* :func:`sandwich_ess`: the effective sample size of A.6.1 for a weighted logistic regression, in its
  corrected form (see there).
* :func:`summarise`: the diagnostics of one set of weights, for a report.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy.special import expit, logsumexp

from lightning_dp.errors import ConfigError

PSIS_GOOD = 0.5  # k̂ below this: good (Vehtari et al.)
PSIS_THRESHOLD = 0.7  # k̂ above this: unreliable weights (Vehtari et al.; the paper gives no threshold)


def _log_weights(log_w: Any) -> np.ndarray:
    """``log_w`` as a float64 copy, checked: 1-D, not empty, no NaN or +inf, at least one finite entry.

    −inf (a weight of zero) is allowed.
    """
    lw = np.array(log_w, dtype=np.float64)
    if lw.ndim != 1 or lw.size == 0:
        raise ValueError(f"log weights must be a non-empty 1-D array, got shape {lw.shape}")
    if np.isnan(lw).any() or np.isposinf(lw).any():
        raise ValueError("log weights must not hold NaN or +inf; check the weight estimator's output")
    if not np.isfinite(lw).any():
        raise ValueError("every weight is zero (all log weights are -inf): nothing to normalise")
    return lw


def temper(log_w: np.ndarray, tau: float) -> np.ndarray:
    """Tempered log weights: log(w^τ) = τ · log w (Sec. 3.5).

    Args:
        log_w: (N,) log weights.
        tau: the exponent τ in [0, 1]; 0 gives uniform weights, 1 the weights unchanged.

    Returns:
        (N,) tempered log weights (a weight of zero stays zero for τ > 0).

    Raises:
        ConfigError: τ outside [0, 1] or not a finite number.
    """
    if isinstance(tau, bool) or not isinstance(tau, (int, float, np.number)) or not 0.0 <= float(tau) <= 1.0:
        raise ConfigError(f"tau must be a number in [0, 1] (0: uniform weights, 1: unchanged), got {tau!r}.")
    lw = _log_weights(log_w)
    if float(tau) == 0.0:
        return np.zeros_like(lw)
    return float(tau) * lw


def self_normalise(log_w: np.ndarray) -> np.ndarray:
    """Weights of mean one, w_i = N · exp(log w_i − logsumexp(log w)), so that Σ w = N.

    Computed in log space: log weights of any offset (e.g. around 1000) give the same finite weights.

    Args:
        log_w: (N,) log weights (−inf for a weight of zero).

    Returns:
        (N,) non-negative weights with mean 1.
    """
    lw = _log_weights(log_w)
    return lw.size * np.exp(lw - logsumexp(lw))


def kish_ess(log_w: np.ndarray) -> float:
    """Kish's effective sample size (Σ w)² / Σ w², computed in log space.

    N for uniform weights, 1 when one row carries all the weight.

    Args:
        log_w: (N,) log weights.

    Returns:
        The effective sample size, in [1, N].
    """
    lw = _log_weights(log_w)
    return float(np.exp(2.0 * logsumexp(lw) - logsumexp(2.0 * lw)))


def psis(log_w: np.ndarray) -> tuple[np.ndarray, float]:
    """Pareto-smoothed log weights and the Pareto shape estimate k̂ (Sec. 3.5; Vehtari et al. 2024).

    ``arviz.psislw`` fits a generalised Pareto distribution to the largest min(N/5, 3√N) weights, replaces them by
    the fitted distribution's quantiles (in order) and truncates at the largest raw weight. The smoothed log
    weights are returned on the input's scale (not normalised), so they can be compared with ``log_w``: the order
    of the rows is kept and no weight exceeds the largest raw weight.

    k̂ < 0.5 is good, 0.5 ≤ k̂ ≤ 0.7 acceptable, k̂ > 0.7 unreliable (:data:`PSIS_THRESHOLD`; Vehtari et al.; the
    paper gives no threshold). Conventions: constant weights have no tail and get k̂ = 0 (arviz would return ∞);
    with too few distinct weights in the tail to fit (fewer than 5, e.g. N < 25) k̂ is ∞, arviz's convention, and
    the weights are left as they are. Zero weights (−inf) are left out of the fit and stay zero.

    Args:
        log_w: (N,) log weights.

    Returns:
        ``(smoothed_log_w, k_hat)``: (N,) smoothed log weights and k̂.
    """
    lw = _log_weights(log_w)
    finite = np.isfinite(lw)
    body = lw[finite]
    if np.ptp(body) == 0.0:  # constant weights: nothing to smooth
        return lw, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # arviz announces its 1.0 API on import
        from arviz import psislw
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # arviz warns when the tail is too short to fit
        smoothed, k_hat = psislw(body, normalize=False)
    out = lw.copy()
    out[finite] = np.asarray(smoothed, dtype=np.float64)
    return out, float(k_hat)


def psis_verdict(k_hat: float) -> str:
    """``"good"`` (k̂ < 0.5), ``"acceptable"`` (0.5 ≤ k̂ ≤ 0.7) or ``"unreliable"`` (k̂ > 0.7 or not a number)."""
    if not math.isfinite(k_hat) or k_hat > PSIS_THRESHOLD:
        return "unreliable"
    return "good" if k_hat < PSIS_GOOD else "acceptable"


def sandwich_ess(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray, *, C: float = 1e6, max_iter: int = 10_000
) -> float:
    """Effective sample size of an importance-weighted logistic regression (A.6.1), corrected.

    The weighted MLE θ̂ on N synthetic rows has the sandwich variance J⁻¹ B_IW J⁻¹ / N; an unweighted MLE on n
    real rows has J⁻¹ B₀ J⁻¹ / n. Equating the traces (Lyddon et al. 2018) gives

        N_eff = N · tr(Ĵ⁻¹ B̂₀ Ĵ⁻¹) / tr(Ĵ⁻¹ B̂_IW Ĵ⁻¹),

    with g_i = ∇_θ[−log f(y_i | x_i; θ̂)] the per-row score at the weighted MLE, Ĵ = mean w_i ∇²_θ[−log f],
    B̂_IW = mean w_i² g_i g_iᵀ and B̂₀ = mean w_i g_i g_iᵀ (the synthetic rows, reweighted, stand in for real
    ones). The paper's Eq. 17 squares this ratio, and its empirical ratio (labelled Ṽ(θ̂₀)/Ṽ(θ̂_IW)) is the
    inverse of its label; both are corrected here. Weights are normalised to mean one first (the estimate
    depends on their scale, and exact importance weights have mean one under p_G), so uniform weights give
    exactly N.

    Args:
        x: (N, d) features (already encoded); an intercept is added.
        y: (N,) labels in {0, 1}.
        weights: (N,) non-negative importance weights.
        C: inverse L2 penalty of scikit-learn's ``LogisticRegression`` (large: nearly the unpenalised MLE).
        max_iter: iterations of its solver.

    Returns:
        N_eff (N for uniform weights, smaller for variable ones). A singular Ĵ (e.g. one-hot columns next to the
        intercept) is inverted with the pseudo-inverse.

    Raises:
        ValueError: shapes that do not match, labels outside {0, 1} or of one class, negative or non-finite
            weights.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(x, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x
    y = np.asarray(y)
    w = np.asarray(weights, dtype=np.float64)
    n = len(x)
    if x.ndim != 2 or y.shape != (n,) or w.shape != (n,):
        raise ValueError(f"x must be (N, d), y and weights (N,); got {x.shape}, {y.shape}, {w.shape}")
    if not np.isin(y, (0, 1)).all() or len(np.unique(y)) < 2:
        raise ValueError("y must hold labels 0 and 1, both present")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    w = w * n / w.sum()  # (N,) mean one
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = LogisticRegression(C=C, max_iter=max_iter).fit(x, y, sample_weight=w)
    z = np.hstack([np.ones((n, 1)), x])  # (N, d + 1) with the intercept first
    theta = np.concatenate([model.intercept_, model.coef_[0]])  # (d + 1,)
    p = expit(z @ theta)  # (N,)
    g = (p - y)[:, None] * z  # (N, d + 1) scores of -log f
    j = (z * (w * p * (1.0 - p))[:, None]).T @ z / n  # (d + 1, d + 1)
    b_iw = (g * (w**2)[:, None]).T @ g / n
    b_0 = (g * w[:, None]).T @ g / n
    j_inv = np.linalg.pinv(j, hermitian=True)
    v_0 = np.trace(j_inv @ b_0 @ j_inv)
    v_iw = np.trace(j_inv @ b_iw @ j_inv)
    return float(n * v_0 / v_iw)


def summarise(log_w: np.ndarray) -> dict[str, Any]:
    """The diagnostics of one set of weights, for a report.

    Args:
        log_w: (N,) log weights.

    Returns:
        ``n``, ``kish_ess``, ``kish_ess_fraction`` (ESS / N), ``psis_k`` (k̂ of :func:`psis`), ``psis_verdict``
        (:func:`psis_verdict`) and ``max_weight_share`` (the largest weight's share of Σ w).
    """
    lw = _log_weights(log_w)
    ess = kish_ess(lw)
    _, k_hat = psis(lw)
    return {
        "n": int(lw.size),
        "kish_ess": ess,
        "kish_ess_fraction": ess / lw.size,
        "psis_k": k_hat,
        "psis_verdict": psis_verdict(k_hat),
        "max_weight_share": float(np.exp(lw.max() - logsumexp(lw))),
    }
