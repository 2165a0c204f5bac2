"""Papernot & Steinke (ICLR 2022) selection bounds: exact values from the theorems, E[K], sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_dp.tuning.selection import (
    poisson_rdp,
    rdp_to_dp_delta,
    sample_tnb,
    tnb_mean,
    tnb_pmf,
    tnb_rdp,
)

ORDERS = np.array([2.0, 4.0, 8.0, 16.0])
SIGMA = 2.0
GAUSS = ORDERS / (2 * SIGMA**2)  # Gaussian mechanism, sensitivity 1: ε(λ) = λ/(2σ²) = λ/8


def test_expected_k_closed_forms():
    assert tnb_mean(0, 0.1) == pytest.approx(9 / math.log(10), rel=1e-14)  # (1/γ − 1)/log(1/γ)
    assert tnb_mean(1, 0.05) == pytest.approx(20.0, rel=1e-14)  # geometric: 1/γ
    assert tnb_mean(2, 0.2) == pytest.approx(2 * 0.8 / (0.2 * (1 - 0.04)), rel=1e-14)
    assert tnb_mean(-0.5, 0.1) == pytest.approx(-0.5 * 0.9 / (0.1 * (1 - 0.1**-0.5)), rel=1e-14)


@pytest.mark.parametrize("eta,gamma", [(0, 0.1), (1, 0.05), (-0.5, 0.1), (2, 0.2)])
def test_pmf_sums_to_one_with_mean_expected_k(eta, gamma):
    k = np.arange(1, 20000)
    p = tnb_pmf(k, eta, gamma)
    assert p.min() >= 0 and p.sum() == pytest.approx(1.0, abs=1e-10)
    assert (k * p).sum() == pytest.approx(tnb_mean(eta, gamma), rel=1e-9)
    assert tnb_pmf(0, eta, gamma)[0] == 0.0


def test_geometric_pmf():
    assert tnb_pmf(3, 1, 0.05)[0] == pytest.approx(0.05 * 0.95**2, rel=1e-12)  # η = 1: γ(1 − γ)^{k−1}


@pytest.mark.parametrize("eta,gamma", [(0, 0.1), (1, 0.05), (-0.5, 0.1), (2, 0.2)])
def test_sampling_matches_expected_k(eta, gamma):
    rng = np.random.default_rng(0)
    draws = np.array([sample_tnb(eta, gamma, rng) for _ in range(20000)])
    assert draws.min() >= 1
    k = np.arange(1, 200000)
    sd = math.sqrt((k**2 * tnb_pmf(k, eta, gamma)).sum() - tnb_mean(eta, gamma) ** 2)
    assert abs(draws.mean() - tnb_mean(eta, gamma)) < 5 * sd / math.sqrt(len(draws))


def test_theorem2_logarithmic_gamma_0_1():
    # η = 0, γ = 0.1; λ̂ term (1 − 1/λ̂)λ̂/8 + log(10)/λ̂ on {2, 4, 8, 16}: smallest at λ̂ = 4: 3/8 + log(10)/4
    hat = 3 / 8 + math.log(10) / 4
    expected = ORDERS / 8 + hat + math.log(9 / math.log(10)) / (ORDERS - 1)
    np.testing.assert_allclose(tnb_rdp(ORDERS, GAUSS, eta=0, gamma=0.1), expected, rtol=1e-14)
    assert tnb_rdp(ORDERS, GAUSS, eta=0, gamma=0.1)[0] == pytest.approx(2.5638384, abs=1e-6)


def test_theorem2_geometric_gamma_0_05():
    # η = 1, γ = 0.05, E[K] = 20; λ̂ term 2((1 − 1/λ̂)λ̂/8 + log(20)/λ̂): smallest at λ̂ = 4
    hat = 2 * (3 / 8 + math.log(20) / 4)
    expected = ORDERS / 8 + hat + math.log(20) / (ORDERS - 1)
    got = tnb_rdp(ORDERS, GAUSS, eta=1, gamma=0.05)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    assert got[1] == pytest.approx(3.7464429, abs=1e-6)


@pytest.mark.parametrize("eta,gamma", [(0, 0.05), (1, 0.1)])
def test_theorem2_other_settings(eta, gamma):
    hats = (1 + eta) * ((1 - 1 / ORDERS) * GAUSS + math.log(1 / gamma) / ORDERS)
    expected = GAUSS + hats.min() + math.log(tnb_mean(eta, gamma)) / (ORDERS - 1)
    np.testing.assert_allclose(tnb_rdp(ORDERS, GAUSS, eta=eta, gamma=gamma), expected, rtol=1e-14)


def test_bound_exceeds_one_candidate_and_grows_with_expected_k():
    small = tnb_rdp(ORDERS, GAUSS, eta=1, gamma=0.2)
    large = tnb_rdp(ORDERS, GAUSS, eta=1, gamma=0.02)
    assert np.all(small > GAUSS) and np.all(large > small)


def test_theorem6_poisson_with_given_dp_bound():
    # ε' = ε + μ δ̂ + log μ/(λ − 1), where e^{ε̂} ≤ 1 + 1/(λ − 1)
    got = poisson_rdp(ORDERS, GAUSS, mu=10.0, eps_hat=0.1, delta_hat=1e-3)
    expected = GAUSS + 10 * 1e-3 + math.log(10) / (ORDERS - 1)
    ok = math.exp(0.1) <= 1 + 1 / (ORDERS - 1)  # true for λ ≤ 10.5
    np.testing.assert_allclose(got[ok], expected[ok], rtol=1e-14)
    assert np.all(np.isinf(got[~ok])) and ok.tolist() == [True, True, True, False]


def test_theorem6_poisson_from_own_curve():
    got = poisson_rdp(ORDERS, GAUSS, mu=5.0)
    for i, lam in enumerate(ORDERS):
        delta = rdp_to_dp_delta(ORDERS, GAUSS, math.log(lam / (lam - 1)))
        assert got[i] == pytest.approx(GAUSS[i] + 5 * delta + math.log(5) / (lam - 1), rel=1e-12)


def test_rdp_to_dp_delta_value():
    # Canonne et al.: δ = exp((λ−1)(ε(λ) − ε))/λ · (1 − 1/λ)^{λ−1}; here at λ = 2, ε(2) = 1/4, ε = 1: e^{-3/4}/2 · 1/2
    assert rdp_to_dp_delta([2.0], np.array([0.25]), 1.0) == pytest.approx(math.exp(-0.75) / 4, rel=1e-12)


@pytest.mark.parametrize("eta,gamma", [(-1, 0.1), (0, 0.0), (0, 1.0)])
def test_invalid_parameters(eta, gamma):
    with pytest.raises(ValueError):
        tnb_mean(eta, gamma)
