"""Empirical ε lower bounds: exact Clopper–Pearson values, validity on a (1, 1e-5)-DP Gaussian mechanism, power."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binomtest, norm

from audits.empirical_dp import audit_mechanism, clopper_pearson, epsilon_lower_bound

DELTA = 1e-5


def _gaussian_sum_mechanism(sigma: float, with_canary: bool):
    """Release sum(D) (+1 for the canary record) + N(0, σ²); the attack score is the release itself."""
    data = np.random.default_rng(123).uniform(size=100)

    def run(seed: int) -> float:
        return float(
            data.sum() + (1.0 if with_canary else 0.0) + sigma * np.random.default_rng(seed).normal()
        )

    return run


def _true_epsilon(sigma: float, delta: float) -> float:
    """Tight ε of the Gaussian mechanism with sensitivity 1 (Balle & Wang 2018, Thm. 8)."""

    def gap(eps: float) -> float:
        return (
            norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma) - delta
        )

    return brentq(gap, 0.0, 100.0)


def test_clopper_pearson_values():
    n = 100
    lo, hi = clopper_pearson(0, n)
    assert lo == 0.0
    assert hi == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-12)  # 0.036217
    for k in (1, 7, 50, 99):
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert clopper_pearson(n, n)[1] == 1.0
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_epsilon_lower_bound_by_hand():
    # no errors in 100 + 100 runs: FPR_ub = FNR_ub = 1 - 0.025^(1/100) = 0.0362167
    ub = 1 - 0.025 ** (1 / 100)
    want = math.log((1 - DELTA - ub) / ub)  # = log(0.963773 / 0.0362167) = 3.28134
    got = epsilon_lower_bound(
        false_positives=0, false_negatives=0, n_negatives=100, n_positives=100, delta=DELTA
    )
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(3.28134, abs=1e-5)
    # a coin flip gives nothing
    assert (
        epsilon_lower_bound(
            false_positives=50, false_negatives=50, n_negatives=100, n_positives=100, delta=DELTA
        )
        == 0.0
    )
    # asymmetric errors: the second inequality (1 - δ - FPR) / FNR can be the binding one
    fpr_ub = clopper_pearson(30, 100)[1]
    fnr_ub = clopper_pearson(0, 100)[1]
    want = max(math.log((1 - DELTA - fnr_ub) / fpr_ub), math.log((1 - DELTA - fpr_ub) / fnr_ub))
    got = epsilon_lower_bound(
        false_positives=30, false_negatives=0, n_negatives=100, n_positives=100, delta=DELTA
    )
    assert got == pytest.approx(want)
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound(false_positives=0, false_negatives=0, n_negatives=1, n_positives=1, delta=1.0)


def test_bound_stays_below_epsilon_of_a_dp_mechanism():
    sigma = math.sqrt(2 * math.log(1.25 / DELTA))  # classical calibration for ε = 1 at δ = 1e-5: σ = 4.84
    res = audit_mechanism(
        _gaussian_sum_mechanism(sigma, True), _gaussian_sum_mechanism(sigma, False), trials=1000, delta=DELTA
    )
    assert res.epsilon_lower_bound < 1.0
    assert res.epsilon_lower_bound < _true_epsilon(sigma, DELTA)  # the classical σ is loose: tight ε ≈ 0.751
    assert res.n_positives == res.n_negatives == 500


def test_bound_is_below_the_tight_epsilon_and_informative():
    sigma = 0.5
    eps_true = _true_epsilon(sigma, DELTA)  # ≈ 10.0
    res = audit_mechanism(
        _gaussian_sum_mechanism(sigma, True), _gaussian_sum_mechanism(sigma, False), trials=1000, delta=DELTA
    )
    assert 1.0 < res.epsilon_lower_bound < eps_true


def test_audit_has_power_when_the_noise_is_tiny():
    res = audit_mechanism(
        _gaussian_sum_mechanism(1e-3, True), _gaussian_sum_mechanism(1e-3, False), trials=300, delta=DELTA
    )
    # 150 + 150 held-out runs without errors: ε_lb = log((1 - δ - u) / u), u = 1 - 0.025^(1/150)
    assert res.false_positives == res.false_negatives == 0
    assert res.epsilon_lower_bound > 3.0
    assert res.sign == 1 and res.to_dict()["threshold"] == res.threshold


def test_direction_is_selected_too():
    # a score that is *lower* with the canary still audits
    res = audit_mechanism(lambda s: -1.0 - 1e-3 * s, lambda s: 1e-3 * s, trials=200, delta=DELTA)
    assert res.sign == -1 and res.epsilon_lower_bound > 2.5


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="trials"):
        audit_mechanism(lambda s: 0.0, lambda s: 0.0, trials=3, delta=DELTA)
    with pytest.raises(ValueError, match="delta"):
        audit_mechanism(lambda s: 0.0, lambda s: 0.0, trials=10, delta=-0.1)
