"""α-LMDP tests keep their level under H0 (binomial band over repetitions) and reject a shifted model."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import binom

from audits.lmdp import alpha_lmdp_audit, ksd_test, mmd_permutation_test

pytestmark = pytest.mark.usefixtures("single_thread")


ALPHA = 0.05
REPS = 200
# two-sided 99.8% band of Binomial(200, 0.05) rejections: [3, 20]
LOW, HIGH = binom.ppf(0.001, REPS, ALPHA), binom.isf(0.001, REPS, ALPHA)


def std_normal_score(x: torch.Tensor) -> torch.Tensor:
    return -x


def shifted_score(x: torch.Tensor) -> torch.Tensor:
    return -(x - torch.tensor([1.0, 0.0], dtype=x.dtype))  # model N((1, 0), I)


# spec §3.7 (App. C.1): 1-D, 5-component GMM, weights 0.2, σ² column = variances
GMM_MU = torch.tensor([6.9734, 7.1579, 2.4358, 9.2579, 3.0420], dtype=torch.float64)
GMM_VAR = torch.tensor([0.2622, 0.9046, 0.4533, 0.0773, 0.7823], dtype=torch.float64)


def gmm_sample(rng: np.random.Generator, n: int) -> np.ndarray:
    k = rng.integers(0, 5, size=n)
    return (GMM_MU.numpy()[k] + np.sqrt(GMM_VAR.numpy()[k]) * rng.normal(size=n))[:, None]


def gmm_score(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float64)  # (n, 1)
    logp = -0.5 * (x - GMM_MU) ** 2 / GMM_VAR - 0.5 * torch.log(GMM_VAR)  # (n, 5)
    resp = torch.softmax(logp, dim=1)
    return (resp * (-(x - GMM_MU) / GMM_VAR)).sum(1, keepdim=True)  # (n, 1)


@pytest.mark.parametrize("statistic", ["u", "v", "linear", "linear_z"])
def test_ksd_tests_keep_their_level(statistic):
    n = 200 if statistic.startswith("linear") else 50
    rejections = 0
    for r in range(REPS):
        x = np.random.default_rng(r).normal(size=(n, 2))
        rejections += ksd_test(x, std_normal_score, statistic=statistic, n_bootstrap=200, seed=r).reject
    assert LOW <= rejections <= HIGH, rejections


@pytest.mark.parametrize(("statistic", "n"), [("u", 50), ("v", 50), ("linear", 400), ("linear_z", 400)])
def test_ksd_tests_reject_a_shifted_model(statistic, n):
    rejections = 0
    for r in range(20):
        x = np.random.default_rng(1000 + r).normal(size=(n, 2))
        res = ksd_test(x, shifted_score, statistic=statistic, n_bootstrap=200, seed=r)
        rejections += res.reject
    assert rejections >= 18


def test_linear_statistic_on_the_paper_gmm_is_chi2_1():
    # spec §3.7: under H0 with n = 128, mean(Ŝ_{l,n}) ≈ 1 (0.98 over 10,000 sets) and type-I ≈ 0.035
    stats, rejects = [], 0
    for r in range(2000):
        res = ksd_test(gmm_sample(np.random.default_rng(r), 128), gmm_score, statistic="linear", seed=r)
        stats.append(res.statistic)
        rejects += res.reject
        assert 0.0 <= res.statistic <= 63.0  # Ŝ_{l,n} <= B - 1
    assert abs(np.mean(stats) - 1.0) < 0.1
    assert 0.02 <= rejects / 2000 <= 0.06


def test_mmd_permutation_test_level_and_power():
    rejections = 0
    for r in range(REPS):
        rng = np.random.default_rng(r)
        res = mmd_permutation_test(
            rng.normal(size=(40, 2)), rng.normal(size=(40, 2)), n_permutations=200, seed=r
        )
        rejections += res.reject
    assert LOW <= rejections <= HIGH, rejections
    power = 0
    for r in range(20):
        rng = np.random.default_rng(1000 + r)
        shifted = rng.normal(size=(40, 2)) + np.array([1.0, 0.0])
        power += mmd_permutation_test(rng.normal(size=(40, 2)), shifted, n_permutations=200, seed=r).reject
    assert power >= 18


def test_mmd_statistic_is_the_unbiased_estimator():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 2)), rng.normal(size=(20, 2)) + 0.5
    res = mmd_permutation_test(x, y, bandwidth=0.7, n_permutations=10)
    k = lambda a, b: np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / 1.4)  # noqa: E731
    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    want = (kxx.sum() - 30) / (30 * 29) + (kyy.sum() - 20) / (20 * 19) - 2 * kxy.mean()
    assert res.statistic == pytest.approx(want, rel=1e-7)  # cdist uses the matmul form
    assert res.n == (30, 20) and res.details["bandwidth"] == 0.7


def test_results_and_audit_report():
    rng = np.random.default_rng(0)
    real = rng.normal(size=(100, 2))
    res = ksd_test(real, std_normal_score, statistic="v", n_bootstrap=50)
    assert res.name == "ksd_v" and 0.0 <= res.p_value <= 1.0 and res.reject == (res.p_value <= ALPHA)
    json.dumps(res.to_dict())
    report = alpha_lmdp_audit(real, score_fn=shifted_score, synthetic=rng.normal(size=(100, 2)) + 1.0)
    assert set(report["tests"]) == {"ksd_u", "ksd_v", "ksd_linear", "mmd"}
    assert report["satisfied"] is True  # the model's x′ marginal is far from the data: α-LMDP holds
    json.dumps(report)


def test_errors():
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match=r"valid names: \['u', 'v', 'linear', 'linear_z'\]"):
        ksd_test(x, std_normal_score, statistic="w")
    with pytest.raises(ValueError, match="score_fn returned shape"):
        ksd_test(x, lambda t: t[:, :1])
    with pytest.raises(ValueError, match="alpha"):
        mmd_permutation_test(x, x, alpha=0.0)
    with pytest.raises(ValueError, match="equal width"):
        mmd_permutation_test(x, np.zeros((10, 3)))


def test_robust_standardise_is_not_moved_by_one_extreme_cell():
    from audits.lmdp import robust_standardise

    rng = np.random.default_rng(0)
    real = rng.normal(10.0, 2.0, size=(400, 1))
    synthetic = rng.normal(12.0, 2.0, size=(300, 1))
    base_r, base_s = robust_standardise(real, synthetic, [None])
    real[7, 0] = 1e308
    r, s = robust_standardise(real, synthetic, [None])
    inside = base_s[:, 0] < base_s.max()  # synthetic values not clipped to REAL's 99.5% quantile
    np.testing.assert_allclose(s[inside], base_s[inside], atol=0.01)  # a median and an IQR barely move
    assert r[7, 0] == pytest.approx(r.max()) and r.max() < 4  # the cell is clipped to REAL's 99.5% quantile
    assert mmd_permutation_test(r, s, n_permutations=100, seed=0).reject  # the shift is still detected
    # public bounds, where the schema has them, clip instead of REAL's quantiles
    r, s = robust_standardise(real, synthetic, [(0.0, 11.0)])
    clipped = np.clip(real[:, 0], 0.0, 11.0)
    q1, median, q3 = np.quantile(clipped, [0.25, 0.5, 0.75])
    assert r.max() == s.max() == pytest.approx((11.0 - median) / ((q3 - q1) / 1.349))
