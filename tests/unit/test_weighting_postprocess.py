"""Post-processing of importance weights: tempering, self-normalisation, PSIS k̂, Kish and sandwich ESS."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dp.errors import ConfigError
from lightning_dp.weighting.postprocess import (
    PSIS_THRESHOLD,
    kish_ess,
    psis,
    psis_verdict,
    sandwich_ess,
    self_normalise,
    summarise,
    temper,
)

N = 2000


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_uniform_weights_have_full_ess_and_a_small_k():
    s = summarise(np.full(N, 3.0))
    assert s["n"] == N and s["kish_ess"] == pytest.approx(N, rel=1e-12)
    assert s["kish_ess_fraction"] == pytest.approx(1.0) and s["max_weight_share"] == pytest.approx(1 / N)
    assert s["psis_k"] < 0.5 and s["psis_verdict"] == "good"


def test_kish_ess_of_one_dominant_weight_is_one():
    assert kish_ess(np.array([0.0, -800.0, -900.0])) == pytest.approx(1.0)
    assert kish_ess(np.log([1.0, 1.0, 2.0])) == pytest.approx(16 / 6)


def test_psis_flags_heavy_tails_and_passes_light_ones(rng):
    pareto = np.log(rng.pareto(1.2, N) + 1.0)  # classical Pareto(α = 1.2): k = 1/α ≈ 0.83
    lognormal = rng.normal(0.0, 3.0, N)
    light = rng.normal(0.0, 0.1, N)
    assert psis(pareto)[1] > PSIS_THRESHOLD and summarise(pareto)["psis_verdict"] == "unreliable"
    assert psis(lognormal)[1] > PSIS_THRESHOLD
    assert psis(light)[1] < 0.5 and summarise(light)["psis_verdict"] == "good"
    assert [psis_verdict(k) for k in (0.2, 0.6, 0.7, 0.71, float("inf"))] == [
        "good",
        "acceptable",
        "acceptable",
        "unreliable",
        "unreliable",
    ]


def test_psis_keeps_the_order_and_never_exceeds_the_largest_raw_weight(rng):
    log_w = rng.normal(0.0, 2.0, N) + 50.0  # an offset: returned on the input's scale
    smoothed, k_hat = psis(log_w)
    assert np.isfinite(k_hat) and smoothed.shape == log_w.shape
    order = np.argsort(log_w, kind="stable")
    assert np.all(np.diff(smoothed[order]) >= -1e-12)  # same order (ties allowed)
    assert smoothed.max() <= log_w.max() + 1e-12
    tail = log_w >= np.quantile(log_w, 0.9)
    np.testing.assert_array_equal(smoothed[~tail], log_w[~tail])  # only the tail is smoothed
    assert not np.array_equal(smoothed[tail], log_w[tail])


def test_psis_leaves_zero_weights_at_zero(rng):
    log_w = rng.normal(size=500)
    log_w[:3] = -np.inf
    smoothed, k_hat = psis(log_w)
    assert np.all(np.isneginf(smoothed[:3])) and np.isfinite(smoothed[3:]).all() and np.isfinite(k_hat)


def test_tempering(rng):
    log_w = rng.normal(0.0, 2.0, 100)
    np.testing.assert_array_equal(temper(log_w, 0.0), np.zeros(100))
    assert kish_ess(temper(log_w, 0.0)) == pytest.approx(100)
    np.testing.assert_allclose(temper(log_w, 0.5), 0.5 * log_w)
    np.testing.assert_array_equal(temper(log_w, 1), log_w)
    assert kish_ess(log_w) < kish_ess(temper(log_w, 0.5)) < 100
    for bad in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ConfigError, match=r"tau must be a number in \[0, 1\]"):
            temper(log_w, bad)


def test_self_normalise_has_mean_one_and_is_stable(rng):
    log_w = rng.normal(size=50)
    w = self_normalise(log_w)
    assert w.mean() == pytest.approx(1.0) and np.all(w > 0)
    np.testing.assert_allclose(w, np.exp(log_w) / np.exp(log_w).mean())
    np.testing.assert_allclose(self_normalise(log_w + 1000.0), w)  # exp(1000) overflows; log space does not
    np.testing.assert_allclose(self_normalise(log_w - 1000.0), w)
    np.testing.assert_allclose(self_normalise(np.array([0.0, -np.inf])), [2.0, 0.0])
    for bad in (np.array([np.nan, 0.0]), np.array([np.inf]), np.array([-np.inf, -np.inf]), np.zeros((2, 2))):
        with pytest.raises(ValueError):
            self_normalise(bad)


def _logistic_data(rng: np.random.Generator, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 2))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(0.5 + x @ np.array([1.0, -0.5]))))).astype(int)
    return x, y


def test_sandwich_ess_is_n_for_uniform_weights_and_smaller_for_variable_ones(rng):
    x, y = _logistic_data(rng)
    assert sandwich_ess(x, y, np.ones(N)) == pytest.approx(N, rel=1e-9)
    assert sandwich_ess(x, y, np.full(N, 7.0)) == pytest.approx(N, rel=1e-9)  # scale-free: mean-one weights
    variable = np.exp(rng.normal(0.0, 1.0, N))
    ess = sandwich_ess(x, y, variable)
    assert 0 < ess < 0.9 * N
    # independent log-normal weights: close to Kish's (Σw)²/Σw² = N e^{-σ²} in expectation
    assert ess == pytest.approx(kish_ess(np.log(variable)), rel=0.25)
    with pytest.raises(ValueError, match="labels 0 and 1"):
        sandwich_ess(x, np.zeros(N), np.ones(N))
    with pytest.raises(ValueError, match="non-negative"):
        sandwich_ess(x, y, -np.ones(N))
