"""Logistic-regression importance weights: noise moments, unbiasedness, sensitivity, refusals, calibration.

Monte Carlo tolerances are 5 standard errors of the estimate (computed from the closed-form moments where
they exist, from the replicates otherwise); every draw is seeded, so the tests are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from lightning_dp.errors import ConfigError
from lightning_dp.privacy.mechanisms import gaussian_noise, laplace_noise
from lightning_dp.weighting.base import PlanInputs
from lightning_dp.weighting.calibration import PrivateBetaCalibration
from lightning_dp.weighting.features import unit_ball
from lightning_dp.weighting.logistic import (
    BetaNoised,
    LogisticWeights,
    MLPWeights,
    OutputGaussian,
    OutputLaplace,
    coefficient_sensitivity,
    fit_logistic,
    max_rows,
)
from lightning_dp.weighting.noise import (
    gaussian_exp_moments,
    ji_elkan_factor,
    laplace_exp_moments,
    laplace_location,
)

N_MC = 200_000


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def laplace(shape: tuple[int, ...], scale: float, seed: int) -> np.ndarray:
    """Laplace(0, scale) draws from the project's mechanism (sensitivity 1, noise multiplier = scale)."""
    z = torch.zeros(shape, dtype=torch.float64)
    return laplace_noise(z, sensitivity=1.0, noise_multiplier=scale, generator=gen(seed)).numpy()


def rows(n: int, f: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    """n rows of f raw features plus the intercept, in the unit ball; (n, f + 1)."""
    x = torch.randn(n, f, generator=gen(seed), dtype=torch.float64) + shift
    return unit_ball(x, math.sqrt(f + 1) * 1.5)


def inputs(n_real: float, n_syn: int, width: int, **kw) -> PlanInputs:
    return PlanInputs(num_real=n_real, num_synthetic=n_syn, num_features=width, delta=1e-5, **kw)


# ------------------------------------------------------------------------------------------ noise moments
def test_log_laplace_noise_has_mean_one():
    rho = 0.3
    y = np.exp(laplace((N_MC,), rho, 1) + laplace_location(rho))
    _, var = laplace_exp_moments(rho)  # 0.294, finite since ρ < 1/2
    assert abs(y.mean() - 1.0) < 5 * math.sqrt(var / N_MC)
    # the uncentred noise (location 0, the Ji–Elkan choice) is biased by 1/(1 − ρ²) = 1.0989
    y0 = np.exp(laplace((N_MC,), rho, 2))
    assert y0.mean() - 1.0 > 0.09


def test_lognormal_noise_has_mean_one():
    gamma = 0.5
    zeta = gaussian_noise(torch.zeros(N_MC, dtype=torch.float64), sensitivity=1.0, noise_multiplier=gamma,
                          generator=gen(3)).numpy() - gamma**2 / 2
    y = np.exp(zeta)
    _, var = gaussian_exp_moments(gamma)
    assert abs(y.mean() - 1.0) < 5 * math.sqrt(var / N_MC)


def _variance_se(raw_moments: list[float], n: int) -> tuple[float, float]:
    """(Var Y, SE of the sample variance) of Y with E[Y] = 1 from E[Y^k], k = 1..4 (delta method)."""
    m1, m2, m3, m4 = raw_moments
    var = m2 - m1**2
    c4 = m4 - 4 * m3 + 6 * m2 - 4 * m1 + 1  # E[(Y − 1)^4]
    return var, math.sqrt((c4 - var**2) / n)


def test_log_laplace_variance_formula():
    # ρ = 0.2 so that E[e^{4ζ}] exists (4ρ < 1) and the sample variance has a standard error
    rho = 0.2
    loc = laplace_location(rho)
    var, se = _variance_se([math.exp(k * loc) / (1 - k * k * rho * rho) for k in (1, 2, 3, 4)], N_MC)
    assert var == pytest.approx(laplace_exp_moments(rho)[1])  # (1 − ρ²)²/(1 − 4ρ²) − 1
    y = np.exp(laplace((N_MC,), rho, 4) + loc)
    assert abs(y.var() - var) < 5 * se


def test_lognormal_variance_is_exp_gamma_squared_minus_one_not_gamma_squared():
    gamma = 0.5
    var, se = _variance_se([math.exp(k * (k - 1) * gamma**2 / 2) for k in (1, 2, 3, 4)], N_MC)
    assert var == pytest.approx(math.expm1(gamma**2)) == pytest.approx(gaussian_exp_moments(gamma)[1])
    zeta = gaussian_noise(torch.zeros(N_MC, dtype=torch.float64), sensitivity=1.0, noise_multiplier=gamma,
                          generator=gen(5)).numpy() - gamma**2 / 2
    sample = np.exp(zeta).var()
    assert abs(sample - var) < 5 * se
    assert sample - gamma**2 > 10 * se  # the paper's γ² = 0.25 is too small (e^0.25 − 1 = 0.284)


def test_log_laplace_variance_table():
    got = [round(laplace_exp_moments(r)[1], 3) for r in (0.1, 0.2, 0.3, 0.4, 0.45, 0.49)]
    assert got == [0.021, 0.097, 0.294, 0.96, 2.347, 13.582]
    assert laplace_exp_moments(0.5)[1] == math.inf and laplace_exp_moments(1.0)[0] == math.inf


def test_ji_elkan_bias_factor():
    x, b = np.array([0.5, 0.3, -0.6]), 0.5  # 2b|x_j| < 1, so exp(ζᵀx) has a finite variance
    factor = float(ji_elkan_factor(x[None], b)[0])
    assert factor == pytest.approx(1 / np.prod(1 - b**2 * x**2))
    second = 1 / np.prod(1 - 4 * b**2 * x**2)  # E[exp(2ζᵀx)]
    y = np.exp(laplace((N_MC, 3), b, 6) @ x)
    assert abs(y.mean() - factor) < 5 * math.sqrt((second - factor**2) / N_MC)
    assert factor > 1.1
    assert ji_elkan_factor(np.array([[1.0, 0.0]]), 1.0)[0] == math.inf


# ------------------------------------------------------------------------------------------ noisy IS
def test_noisy_importance_sampling_is_unbiased_and_shared_noise_is_not():
    """p_D = N(0.5, 1), p_G = N(0, 1): log w = 0.5x − 0.125 and E_{p_D}[x] = 0.5 (Theorem 2, Prop. 1)."""
    reps, n, rho = 400, 1000, 0.3
    x = torch.randn(reps, n, generator=gen(7), dtype=torch.float64).numpy()  # (R, N) ~ p_G
    log_w = 0.5 * x - 0.125
    fresh = laplace((reps, n), rho, 8) + laplace_location(rho)  # one ζ per weight
    est = (np.exp(log_w + fresh) * x).mean(1)  # (R,)
    assert abs(est.mean() - 0.5) < 5 * est.std() / math.sqrt(reps)

    # Ji–Elkan: one ζ ∈ R² per replicate, shared by its rows (features (x, 1)); E_ζ[w̄] = w/((1 − b²x²)(1 − b²))
    reps, n, b = 20_000, 20, 0.15
    x = torch.randn(reps, n, generator=gen(9), dtype=torch.float64).numpy()
    zeta = laplace((reps, 2), b, 10)
    shared = (np.exp((0.5 + zeta[:, :1]) * x - 0.125 + zeta[:, 1:]) * x).mean(1)
    se = shared.std() / math.sqrt(reps)
    assert shared.mean() - 0.5 > 5 * se
    grid = np.linspace(-5, 5, 20_001)  # E_{p_D}[x/((1 − b²x²)(1 − b²))] by quadrature (|x| < 1/b = 6.7)
    dens = np.exp(-((grid - 0.5) ** 2) / 2) / math.sqrt(2 * math.pi)
    predicted = np.trapezoid(grid * dens / (1 - b**2 * grid**2), grid) / (1 - b**2)  # 0.554
    assert abs(shared.mean() - predicted) < 5 * se


# ------------------------------------------------------------------------------------------ sensitivity
def _planted(f: int) -> list[np.ndarray]:
    """Adversarial rows: every sign corner of the ball's bounding cube, scaled to norm 1, and the axes."""
    corners = [np.array([(1 if (k >> j) & 1 else -1) for j in range(f)]) / math.sqrt(f) for k in range(2**f)]
    return corners + list(np.eye(f)) + list(-np.eye(f))


@pytest.mark.parametrize("l2", [0.5, 2.0])
def test_coefficient_and_log_weight_sensitivity_hold_on_neighbours(l2):
    """Refit on D ∪ {z} (add/remove) and D − {x_1} ∪ {z} (replace-one): ‖Δβ‖₂ and max |Δ log w| ≤ Δ₂."""
    worst = {"add_remove": 0.0, "replace_one": 0.0}
    for seed in range(3):
        real = rows(40, 3, 100 + seed, shift=0.5 * seed).numpy()  # (40, 4)
        syn = rows(40, 3, 200 + seed).numpy()
        beta = fit_logistic(real, syn, l2=l2)
        for z in _planted(4) + list(rows(4, 3, 300 + seed, shift=2.0).numpy()):
            for adjacency, other in (("add_remove", np.vstack([real, z])),
                                     ("replace_one", np.vstack([real[1:], z]))):
                bound = coefficient_sensitivity(l2, adjacency=adjacency)
                diff = beta - fit_logistic(other, syn, l2=l2)
                d_beta, d_log_w = float(np.linalg.norm(diff)), float(np.abs(syn @ diff).max())
                assert d_beta <= bound + 1e-6 and d_log_w <= bound + 1e-6, (adjacency, seed, d_beta, bound)
                worst[adjacency] = max(worst[adjacency], d_beta / bound)
    assert worst["add_remove"] > 0.1  # the planted rows move β̂ a sizeable share of the bound


# ------------------------------------------------------------------------------------------ refusals
def test_rows_outside_the_unit_ball_are_refused():
    real, syn = rows(30, 3, 1), rows(30, 3, 2)
    est = BetaNoised(epsilon=3.0)
    releases = est.plan(inputs(30.0, 30, 4))
    with pytest.raises(ValueError, match="unit ball"):
        est.fit(real * 3, syn, releases=releases, generator=gen(0))
    est = OutputLaplace(epsilon=3.0)
    releases = est.plan(inputs(30.0, 30, 4))
    with pytest.raises(ValueError, match="unit ball"):
        est.fit(real, syn * 3, releases=releases, generator=gen(0))


def test_output_laplace_refuses_too_many_rows_and_names_the_largest():
    est = OutputLaplace(epsilon=3.0)
    plan = inputs(500.0, 1000, 5)
    n_max = max_rows(plan, estimator=est)
    assert 50 < n_max < 1000
    assert est.noise_scale(replace(plan, num_synthetic=n_max)) < 0.5 <= est.noise_scale(
        replace(plan, num_synthetic=n_max + 1))
    with pytest.raises(ConfigError, match=rf"largest admissible N_S is {n_max}\b"):
        est.plan(plan)
    # the finite-mean condition ρ < 1 admits about twice as many; replace-one (Δ₂ = 2/μ) fewer
    assert max_rows(plan, estimator=OutputLaplace(epsilon=3.0, require_finite_variance=False)) > 1.5 * n_max
    assert max_rows(replace(plan, adjacency="replace_one"), estimator=est) < n_max
    assert len(est.plan(replace(plan, num_synthetic=n_max))) == 1


def test_output_gaussian_max_variance_refusal():
    plan = inputs(500.0, 10_000, 5)
    OutputGaussian(epsilon=3.0).check(plan)  # no hard limit by default
    est = OutputGaussian(epsilon=3.0, max_variance=0.5)
    n_max = max_rows(plan, estimator=est)
    assert math.expm1(est.noise_scale(replace(plan, num_synthetic=n_max)) ** 2) <= 0.5
    with pytest.raises(ConfigError, match=rf"largest admissible N_S is {n_max}\b"):
        est.plan(plan)


@pytest.mark.parametrize("cls", [BetaNoised, OutputLaplace, OutputGaussian])
def test_private_estimators_need_epsilon_and_a_positive_penalty(cls):
    with pytest.raises(ConfigError, match="weights.epsilon"):
        cls()
    with pytest.raises(ConfigError, match="l2"):
        cls(epsilon=1.0, l2=0.0)


def test_debias_is_refused_when_the_bias_factor_may_not_exist():
    with pytest.raises(ConfigError, match="debias"):
        BetaNoised(epsilon=0.01, l2=0.1, debias=True).plan(inputs(100.0, 100, 5))


def test_calibration_needs_epsilon():
    with pytest.raises(ConfigError, match="weights.epsilon"):
        PrivateBetaCalibration().plan(inputs(100.0, 100, 5), None)


# ------------------------------------------------------------------------------------------ prior term
def test_prior_term_orientation_with_identical_distributions():
    """N_G = 2 N_D from one distribution: the logit is ≈ log(N_D/N_G), so log w = logit + log(N_G/N_D) ≈ 0."""
    real, syn = rows(1000, 3, 11), rows(2000, 3, 12)
    est = LogisticWeights(l2=1.0)
    fit = est.fit(real, syn, releases=est.plan(inputs(1000.0, 2000, 4)), generator=gen(0))
    assert fit.private is False and fit.releases == []
    assert fit.info["prior"] == pytest.approx(math.log(2))
    assert abs(fit.log_w.mean()) < 0.05  # the inverted prior of the paper would give −2 log 2 = −1.39
    mlp = MLPWeights(max_iter=30)
    fit = mlp.fit(real, syn, releases=mlp.plan(inputs(1000.0, 2000, 4)), generator=gen(0))
    assert abs(np.median(fit.log_w)) < 0.3
    proba = mlp.model.predict_proba(syn.numpy())  # (N_G, 2), not saturated here
    assert np.allclose(fit.log_w, np.log(proba[:, 1] / proba[:, 0]) + math.log(2), atol=1e-6)


# ------------------------------------------------------------------------------------------ releases
def test_beta_noised_draws_exactly_the_recorded_noise():
    real, syn = rows(200, 3, 21, shift=0.4), rows(300, 3, 22)
    plan = inputs(205.0, 300, 4)  # the DP count, not len(real)
    est = BetaNoised(epsilon=2.0)
    (release,) = est.plan(plan)
    assert release.name == "weights/beta_noised" and release.mechanism == "laplace"
    assert release.sensitivity == pytest.approx(math.sqrt(4) / 50.0)
    fit = est.fit(real, syn, releases=[release], generator=gen(5))
    beta = fit_logistic(real.numpy(), syn.numpy(), l2=50.0)
    noise = laplace_noise(torch.zeros(4, dtype=torch.float64), sensitivity=release.sensitivity,
                          noise_multiplier=release.noise_multiplier, generator=gen(5)).numpy()
    assert np.allclose(fit.info["beta"], beta + noise, atol=1e-12)
    assert np.allclose(fit.log_w, syn.numpy() @ (beta + noise) + math.log(300 / 205.0))
    b = release.noise_multiplier * release.sensitivity
    # one Laplace use: the ledger's RDP conversion lands on the pure-DP scale S₁/ε (to 0.2%), not below it
    assert b == pytest.approx(release.sensitivity / 2.0, rel=2e-3)
    assert fit.info["bias_factor_max"] == pytest.approx(float(ji_elkan_factor(syn.numpy(), b).max()))

    debiased = BetaNoised(epsilon=2.0, debias=True)
    fit_d = debiased.fit(real, syn, releases=debiased.plan(plan), generator=gen(5))
    assert np.allclose(fit_d.log_w, fit.log_w - np.log(ji_elkan_factor(syn.numpy(), b)))

    wrong = replace(release, noise_multiplier=release.noise_multiplier / 2)
    with pytest.raises(ValueError, match="plan"):
        est.fit(real, syn, releases=[wrong], generator=gen(5))
    with pytest.raises(ValueError, match="plan"):
        est.fit(real, syn, releases=[], generator=gen(5))
    with pytest.raises(RuntimeError, match="plan"):
        BetaNoised(epsilon=2.0).fit(real, syn, releases=[release], generator=gen(5))


def test_gaussian_coefficient_noise_uses_the_l2_sensitivity_and_its_own_bias_factor():
    from lightning_dp.privacy.ledger import PrivacyLedger

    real, syn = rows(200, 3, 31, shift=0.4), rows(300, 3, 32)
    plan = inputs(205.0, 300, 4)
    est = BetaNoised(epsilon=2.0, noise="gaussian")
    (release,) = est.plan(plan)
    assert release.mechanism == "gaussian" and release.sensitivity == pytest.approx(1 / 50.0)  # no √F
    assert PrivacyLedger(target_epsilon=100, delta=1e-5).epsilon([release]) == pytest.approx(2.0, rel=1e-3)
    fit = est.fit(real, syn, releases=[release], generator=gen(7))
    beta = fit_logistic(real.numpy(), syn.numpy(), l2=50.0)
    noise = gaussian_noise(torch.zeros(4, dtype=torch.float64), sensitivity=release.sensitivity,
                           noise_multiplier=release.noise_multiplier, generator=gen(7)).numpy()
    assert np.allclose(fit.info["beta"], beta + noise, atol=1e-12)
    s = release.noise_multiplier * release.sensitivity
    x = syn.numpy()
    # E[exp(ζᵀx)] = exp(s²‖x‖²/2) for ζ ~ N(0, s²I), by Monte Carlo on the project's Gaussian draws
    zeta = gaussian_noise(torch.zeros(N_MC, 4, dtype=torch.float64), sensitivity=1.0, noise_multiplier=s,
                          generator=gen(8)).numpy()
    mc = np.exp(zeta @ x[0]).mean()
    assert mc == pytest.approx(math.exp(0.5 * s**2 * float(x[0] @ x[0])), rel=5 * np.exp(zeta @ x[0]).std() / math.sqrt(N_MC))
    debiased = BetaNoised(epsilon=2.0, noise="gaussian", debias=True)
    fit_d = debiased.fit(real, syn, releases=debiased.plan(plan), generator=gen(7))
    assert np.allclose(fit_d.log_w, fit.log_w - 0.5 * s**2 * np.square(x).sum(1))
    with pytest.raises(ConfigError, match="laplace"):
        BetaNoised(epsilon=2.0, noise="cauchy")


@pytest.mark.parametrize("cls", [OutputLaplace, OutputGaussian])
def test_output_perturbation_draws_exactly_the_recorded_noise(cls):
    real, syn = rows(200, 3, 31, shift=0.4), rows(40, 3, 32)
    plan = inputs(195.0, 40, 4, adjacency="replace_one")
    est = cls(epsilon=3.0)
    (release,) = est.plan(plan)
    assert release.count == 40 and release.sensitivity == pytest.approx(2 / 50.0)
    assert release.name == f"weights/{cls.name}"
    fit = est.fit(real, syn, releases=[release], generator=gen(6))
    scale = release.noise_multiplier * release.sensitivity
    base = syn.numpy() @ fit_logistic(real.numpy(), syn.numpy(), l2=50.0) + math.log(40 / 195.0)
    zero = torch.zeros(40, dtype=torch.float64)
    kw = {"sensitivity": release.sensitivity, "noise_multiplier": release.noise_multiplier, "generator": gen(6)}
    if cls is OutputLaplace:
        noise = laplace_noise(zero, **kw).numpy() + math.log(1 - scale**2)
        assert fit.info["rho"] == pytest.approx(scale) and scale < 0.5
        assert fit.info["noise_variance"] == pytest.approx(laplace_exp_moments(scale)[1])
    else:
        noise = gaussian_noise(zero, **kw).numpy() - scale**2 / 2
        assert fit.info["gamma"] == pytest.approx(scale)
        assert fit.info["noise_variance"] == pytest.approx(math.expm1(scale**2))
    assert fit.keep is None
    assert np.allclose(fit.log_w, base + noise, atol=1e-9)
    with pytest.raises(ValueError, match="N_S"):
        est.fit(real, syn[:30], releases=[release], generator=gen(6))
    with pytest.raises(ValueError, match="plan"):
        est.fit(real, syn, releases=[replace(release, count=41)], generator=gen(6))


# ------------------------------------------------------------------------------------------ calibration
def test_beta_calibration_repairs_an_overconfident_classifier():
    """p_D = N(0.5, 1), p_G = N(0, 1); the raw log weights are 3× the true ones (over-confident)."""
    n_real, n_fresh = 20_000, 40_000

    def normal(n: int, mean: float, seed: int) -> np.ndarray:
        return torch.randn(n, generator=gen(seed), dtype=torch.float64).numpy() + mean

    real, fresh, target = normal(n_real, 0.5, 41), normal(n_fresh, 0.0, 42), normal(5000, 0.0, 43)
    true = 0.5 * target - 0.125
    prior = 0.3  # whatever prior the estimator used: the calibration takes it out and puts its own in

    def raw(x: np.ndarray) -> np.ndarray:
        return 3 * (0.5 * x - 0.125) + prior

    cal = PrivateBetaCalibration(l2=1.0)
    releases = cal.plan(inputs(float(n_real), 5000, 7), 1e6)
    assert [(r.name, r.mechanism) for r in releases] == [("weights/calibration", "laplace")]
    assert releases[0].sensitivity == pytest.approx(math.sqrt(3) / 1.0)
    out = cal.apply(real_log_w=raw(real), fresh_log_w=raw(fresh), log_w=raw(target), prior=prior,
                    releases=releases, generator=gen(44))
    raw_mse = np.mean((raw(target) - prior - true) ** 2)
    cal_mse = np.mean((out - true) ** 2)
    assert cal_mse < 0.05 * raw_mse and cal_mse < 0.01
    # a ln s − b ln(1 − s) with a = b = 1/3 undoes the factor 3 (a and b alone trade off against the intercept)
    assert cal.info["a"] + cal.info["b"] == pytest.approx(2 / 3, abs=0.03)
    assert cal.features(np.array([-50.0, 0.0, 50.0])).norm(dim=1).max() <= 1 + 1e-12
    with pytest.raises(ValueError, match="plan"):
        cal.apply(real_log_w=raw(real), fresh_log_w=raw(fresh), log_w=raw(target), prior=prior,
                  releases=[replace(releases[0], noise_multiplier=1.0)], generator=gen(44))


def test_calibration_composes_after_beta_noised():
    real, syn, fresh = rows(400, 3, 51, shift=0.3), rows(400, 3, 52), rows(400, 3, 53)
    plan = inputs(400.0, 400, 4)
    est = BetaNoised(epsilon=3.0, l2=5.0)
    fit = est.fit(real, syn, releases=est.plan(plan), generator=gen(1))
    cal = PrivateBetaCalibration(l2=5.0)
    out = cal.apply(real_log_w=est.log_weights(real), fresh_log_w=est.log_weights(fresh), log_w=fit.log_w,
                    prior=fit.info["prior"], releases=cal.plan(plan, 1.0), generator=gen(2))
    assert out.shape == (400,) and np.all(np.isfinite(out))
