"""Statistical validation of the normalised linear KSD Ŝ_{l,n} on PPEM's synthetic Gaussian mixture.

The null is the 1-D, 5-component, equally weighted mixture of "Privacy-Preserving Energy-Based Generative
Models for Marginal Distribution Protection" (Tillman, Balch & Veloso, TMLR 2023), Appendix C.1, whose
score is analytic. Repetitions are vectorised: the linear Stein terms of all R repetitions are one call of
:func:`stein_kernel_pairs` with a per-repetition median bandwidth, which is checked to reproduce
:func:`ksd_linear_normalized` (PPEM eq. 17) exactly.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from scipy import stats
from torch import Tensor

from lightning_dp.kernels.stein import ksd_linear_normalized, linear_stein_terms, stein_kernel_pairs

pytestmark = pytest.mark.usefixtures("single_thread")

# PPEM Appendix C.1: component means and *variances* (not standard deviations), weights 1/5 each
MEANS = torch.tensor([6.9734, 7.1579, 2.4358, 9.2579, 3.0420], dtype=torch.float64)
VARIANCES = torch.tensor([0.2622, 0.9046, 0.4533, 0.0773, 0.7823], dtype=torch.float64)
# Alternative (ours; the paper gives none): every mean shifted by +0.75, every variance halved
ALT_MEANS = MEANS + 0.75
ALT_VARIANCES = VARIANCES * 0.5
CHI2_1_95 = 3.841458820694124  # 95% quantile of χ²₁, the α = 0.05 rejection threshold (PPEM Lemma 3.1)


def gmm_sample(gen: torch.Generator, shape: tuple[int, ...], means: Tensor, variances: Tensor) -> Tensor:
    """Draws from the equally weighted 1-D mixture, float64, any ``shape``."""
    comp = torch.randint(0, means.numel(), shape, generator=gen)  # shape
    noise = torch.randn(shape, generator=gen, dtype=torch.float64)
    return means[comp] + variances[comp].sqrt() * noise


def gmm_score(x: Tensor, means: Tensor = MEANS, variances: Tensor = VARIANCES) -> Tensor:
    """Analytic score s(x) = Σ_k r_k(x)·(−(x − μ_k)/σ_k²), r_k the posterior responsibilities.

    The responsibilities are a softmax of the component log-densities (a logsumexp normalisation), so
    they stay finite far in the tails.
    """
    diff = x.unsqueeze(-1) - means  # (..., K)
    log_comp = -0.5 * diff.square() / variances - 0.5 * torch.log(2 * math.pi * variances)  # (..., K)
    resp = torch.softmax(log_comp, dim=-1)  # (..., K)
    return (resp * (-diff / variances)).sum(-1)  # (...)


def batched_linear_terms(x: Tensor, score: Tensor) -> Tensor:
    """The B = ⌊n/2⌋ linear Stein terms u_i = u_q(x_{2i−1}, x_{2i}) of each row of ``x`` (R, n), 1-D samples.

    Same pairs, same median bandwidth over those pairs and same RBF Stein kernel as
    :func:`linear_stein_terms` with its defaults, for R repetitions at once.
    """
    reps, n = x.shape
    b = n // 2
    xa, xb = x[:, 0 : 2 * b : 2], x[:, 1 : 2 * b : 2]  # (R, B)
    sa, sb = score[:, 0 : 2 * b : 2], score[:, 1 : 2 * b : 2]  # (R, B)
    med = (xa - xb).square().quantile(0.5, dim=1, keepdim=True)  # (R, 1)
    h = torch.where(med > 0, med, torch.ones_like(med)).expand(reps, b)  # (R, B)
    u = stein_kernel_pairs(
        xa.reshape(-1, 1), sa.reshape(-1, 1), xb.reshape(-1, 1), sb.reshape(-1, 1), bandwidth=h.reshape(-1)
    )  # (R * B,)
    return u.reshape(reps, b)  # (R, B)


def batched_normalized_ksd(x: Tensor, score: Tensor, eps: float = 1e-12) -> Tensor:
    """Ŝ_{l,n} = (B−1)(Σu_i)²/(B Σu_i²) (PPEM eq. 17) for each row of ``x`` (R, n), as
    :func:`ksd_linear_normalized` computes it for one row."""
    u = batched_linear_terms(x, score)  # (R, B)
    b = u.shape[1]
    return (b - 1) * u.sum(1).square() / (b * u.square().sum(1) + eps)  # (R,)


def rejection_statistics(seed: int, reps: int, n: int, means: Tensor, variances: Tensor) -> Tensor:
    """Ŝ_{l,n} of ``reps`` samples of size n from the given mixture, always scored with the NULL model."""
    x = gmm_sample(torch.Generator().manual_seed(seed), (reps, n), means, variances)  # (R, n)
    return batched_normalized_ksd(x, gmm_score(x))


@functools.cache
def null_statistics() -> Tensor:
    """4000 null repetitions at n = 128 (shared by the type-I and mean tests)."""
    return rejection_statistics(0, 4000, 128, MEANS, VARIANCES)


def test_analytic_score_matches_autograd_of_the_log_density():
    mixture = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(probs=torch.full((5,), 0.2, dtype=torch.float64)),
        torch.distributions.Normal(MEANS, VARIANCES.sqrt()),
    )
    x = torch.linspace(-3.0, 14.0, 61, dtype=torch.float64).requires_grad_()  # tails and every mode
    (grad,) = torch.autograd.grad(mixture.log_prob(x).sum(), x)
    torch.testing.assert_close(gmm_score(x.detach()), grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("means,variances", [(MEANS, VARIANCES), (ALT_MEANS, ALT_VARIANCES)])
def test_batched_statistic_is_the_library_statistic(means, variances):
    x = gmm_sample(torch.Generator().manual_seed(7), (4, 33), means, variances)  # odd n: last row dropped
    s = gmm_score(x)
    terms, batched = batched_linear_terms(x, s), batched_normalized_ksd(x, s)  # (4, 16), (4,)
    for i in range(4):
        xi, si = x[i].unsqueeze(1), s[i].unsqueeze(1)  # (n, 1)
        torch.testing.assert_close(terms[i], linear_stein_terms(xi, si), rtol=1e-12, atol=1e-14)
        assert batched[i].item() == pytest.approx(ksd_linear_normalized(xi, si).item(), rel=1e-12)


def test_type_one_error_is_at_most_nominal():
    """Rejection rate of Ŝ_{l,n} > χ²₁(0.95) on 4000 null repetitions at n = 128.

    Asserted: (i) the rate is at most the upper edge of the exact 99.9% band of Binomial(4000, 0.05)/4000,
    i.e. the test is not detectably liberal (cross-checked: the Clopper–Pearson 99.9% interval of the
    rate reaches down to 0.05); (ii) the rate is at least 0.02. The test is only *asymptotically* at level α and
    is slightly conservative at B = 64 pairs: 200,000 repetitions give 0.0352 (standard error 0.0004), so
    a two-sided band around 0.05 would be wrong; 0.02 is 5 standard errors (of R = 4000) below 0.035 and
    catches a statistic that never rejects.
    """
    s = null_statistics()
    reps = s.numel()
    k = int((s > CHI2_1_95).sum())
    rate = k / reps
    upper = stats.binom.ppf(0.9995, reps, 0.05) / reps
    ci = stats.binomtest(k, reps, 0.05).proportion_ci(confidence_level=0.999, method="exact")
    assert rate <= upper, f"type-I rate {rate:.4f} above the 99.9% binomial band edge {upper:.4f}"
    assert ci.low <= 0.05
    assert rate >= 0.02, f"type-I rate {rate:.4f}: the test hardly ever rejects"


def test_null_mean_is_one():
    """Mean of Ŝ_{l,n} over 4000 null repetitions is the χ²₁ mean 1, within 5 simulated standard errors.

    The standard error is sd/√R ≈ 1.19/√4000 ≈ 0.019 (the finite-n sd, below the χ²₁ value √2), so the
    tolerance is ≈ 0.095. The finite-sample mean at n = 128 is 0.982 (200,000 repetitions), about
    one standard error below 1, so a correct statistic fails only on a >= 4 standard-error excursion.
    """
    s = null_statistics()
    se = s.std().item() / math.sqrt(s.numel())
    assert s.mean().item() == pytest.approx(1.0, abs=5 * se)
    assert (s >= 0).all() and (s <= 63).all()  # 0 <= Ŝ_{l,n} <= B − 1


def test_power_grows_with_sample_size():
    """Rejection rates, 1000 repetitions each, on the alternative (means +0.75, variances × 0.5) scored with
    the null's score: strictly increasing over n = 32, 128, 512, above α at n = 32 and >= 0.95 at n = 512.

    Offline, over 6 seeds: 0.196-0.231, 0.627-0.662 and 0.999-1.000 (standard errors <= 0.016), so each
    assertion holds by 7 or more standard errors.
    """
    power = [
        (rejection_statistics(1 + i, 1000, n, ALT_MEANS, ALT_VARIANCES) > CHI2_1_95).double().mean().item()
        for i, n in enumerate((32, 128, 512))
    ]
    assert power[0] < power[1] < power[2], power
    assert power[0] > 0.05, power
    assert power[2] >= 0.95, power
