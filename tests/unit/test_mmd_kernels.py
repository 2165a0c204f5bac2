"""MMD² and the importance-weighted estimators of Diesendruck 2019 ("Distribution Distance Measures in Generative
and Privacy Models", Ch. 3): exact values against brute force, the thesis' identities and bounds, and Monte Carlo properties.

Toy for the Monte Carlo tests: target P = U(0, 1) in one dimension, generated Q = U(0.2, 1.0), a single RBF
with σ = 0.2 (std); MMD²(P, Q) is computed by midpoint quadrature on a 1000 × 1000 grid (error < 1e-6).
"""

import math

import pytest
import torch

from lightning_dp.kernels.mmd import (
    bce_discriminator_loss,
    bce_generator_loss,
    duplication_counts,
    energy_distance,
    energy_kernel,
    importance_duplicate,
    iw_deviation_bound,
    median_of_means,
    mmd2,
    mmd2_estimate,
    mmd2_iw,
    mmd2_miw,
    mmd2_sniw,
    mmd2_weighted,
    rbf_kernel,
    upper_median,
    weighted_average,
    weighted_mean,
    weighted_u_statistic,
    weighted_v_statistic,
)

KERNEL = rbf_kernel(0.2, sigma_is="std")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny estimates: threads only add overhead on 2 shared cores
    yield
    torch.set_num_threads(n)


def brute(x, y, k, w=None, *, u=True, sn=False):
    """The estimators written out with explicit loops over index pairs (Eqs. 2.3, 3.2, 3.3, 3.5)."""
    n, m = len(x), len(y)
    w = torch.ones(n, dtype=x.dtype) if w is None else w
    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    xx = sum(w[i] * w[j] * kxx[i, j] for i in range(n) for j in range(n) if i != j or not u)
    yy = sum(kyy[i, j] for i in range(m) for j in range(m) if i != j or not u)
    xy = sum(w[i] * kxy[i, j] for i in range(n) for j in range(m))
    if sn:
        pairs = sum(w[i] * w[j] for i in range(n) for j in range(n) if i != j or not u)
        return xx / pairs + yy / (m * (m - 1) if u else m * m) - 2 * xy / (m * w.sum())
    return xx / (n * (n - 1) if u else n * n) + yy / (m * (m - 1) if u else m * m) - 2 * xy / (n * m)


def truth_mmd2() -> float:
    def mean_k(a0, a1, b0, b1, g=1000):
        a = a0 + (torch.arange(g, dtype=torch.float64) + 0.5) / g * (a1 - a0)
        b = b0 + (torch.arange(g, dtype=torch.float64) + 0.5) / g * (b1 - b0)
        return KERNEL(a[:, None], b[:, None]).mean().item()

    return mean_k(0, 1, 0, 1) + mean_k(0.2, 1, 0.2, 1) - 2 * mean_k(0, 1, 0.2, 1)


def target_q(n, g):
    return 0.2 + 0.8 * torch.rand(n, 1, dtype=torch.float64, generator=g)


# ----------------------------------------------------------------------------------------- exact values
@pytest.mark.parametrize("sigma_is", ["std", "variance"])
def test_u_and_v_statistics_match_brute_force(sigma_is):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 3, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    k = rbf_kernel([0.5, 2.0], sigma_is=sigma_is)
    w = torch.rand(9, generator=g, dtype=torch.float64) + 0.5
    assert mmd2(x, y, k).item() == pytest.approx(brute(x, y, k).item(), abs=1e-12)
    assert mmd2(x, y, k, statistic="v", chunk=2).item() == pytest.approx(brute(x, y, k, u=False).item(), abs=1e-12)
    assert mmd2_iw(x, y, w, k, chunk=4).item() == pytest.approx(brute(x, y, k, w).item(), abs=1e-12)
    assert mmd2_sniw(x, y, w, k).item() == pytest.approx(brute(x, y, k, w, sn=True).item(), abs=1e-12)
    v_sn = mmd2_weighted(x, y, w, k, statistic="v", self_normalized=True)
    assert v_sn.item() == pytest.approx(brute(x, y, k, w, u=False, sn=True).item(), abs=1e-12)


def test_the_bandwidth_switch():
    a, b = torch.zeros(1, 1), torch.full((1, 1), 2.0)  # ||a − b||² = 4
    assert rbf_kernel(2.0, sigma_is="std")(a, b).item() == pytest.approx(math.exp(-4 / 8))
    assert rbf_kernel(2.0, sigma_is="variance")(a, b).item() == pytest.approx(math.exp(-4 / 4))
    assert rbf_kernel([1, 2, 4, 8, 16])(a, a).item() == pytest.approx(5.0)  # a mixture's maximum K is its size
    with pytest.raises(ValueError, match="sigma_is"):
        rbf_kernel(1.0, sigma_is="bandwidth")


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_energy_distance_is_the_v_statistic_with_the_energy_kernel(p):
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(20, 2, generator=g, dtype=torch.float64), torch.rand(15, 2, generator=g, dtype=torch.float64)
    # the kernel's safe norm puts √1e-12 = 1e-6 on the diagonal: agreement to 1e-6
    assert mmd2(x, y, energy_kernel(p), statistic="v").item() == pytest.approx(energy_distance(x, y, p).item(), abs=1e-6)


def test_gradients_are_finite_at_coincident_points():
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.5]], requires_grad=True)
    y = torch.tensor([[0.0, 0.0], [0.3, 0.2]])
    for kernel in (energy_kernel(2.0), rbf_kernel([0.1, 1.0])):
        (grad,) = torch.autograd.grad(mmd2(x, y, kernel, statistic="v"), x)
        assert torch.isfinite(grad).all()


def test_table_3_1_helpers():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 2, generator=g, dtype=torch.float64)
    w = torch.rand(6, generator=g, dtype=torch.float64) + 0.1
    gram = KERNEL(x, x)
    off = ~torch.eye(6, dtype=torch.bool)
    assert weighted_u_statistic(gram, None).item() == pytest.approx(gram[off].mean().item())
    assert weighted_u_statistic(gram, w).item() == pytest.approx((torch.outer(w, w) * gram)[off].sum().item() / 30)
    sn = weighted_u_statistic(gram, w, self_normalized=True)
    assert sn.item() == pytest.approx(weighted_u_statistic(gram, 7 * w, self_normalized=True).item())
    # the SNIW V-statistic's denominator is (Σw)², the table's typo fixed
    assert weighted_v_statistic(gram, w, self_normalized=True).item() == pytest.approx(
        ((torch.outer(w, w) * gram).sum() / w.sum() ** 2).item())
    f = torch.randn(6, 4, generator=g, dtype=torch.float64)
    assert weighted_average(f, w).item() == pytest.approx((w[:, None] * f).sum().item() / 24)
    assert weighted_average(f, w, self_normalized=True).item() == pytest.approx(
        ((w[:, None] * f).sum() / (4 * w.sum())).item())
    assert torch.allclose(weighted_mean(x, w), (w[:, None] * x).mean(0))


# ----------------------------------------------------------------------------------------- identities (Eqs. 3.3–3.5, Thm. 1)
def test_anchors_iw_at_unit_weights_miw_with_one_group_sniw_scale_invariance():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 3, generator=g, dtype=torch.float64), torch.randn(24, 3, generator=g, dtype=torch.float64)
    w = torch.rand(32, generator=g, dtype=torch.float64) * 5 + 0.1
    k = rbf_kernel([1.0, 2.0])
    assert mmd2_iw(x, y, torch.ones(32, dtype=torch.float64), k).item() == pytest.approx(mmd2(x, y, k).item(), abs=1e-12)
    assert mmd2_miw(x, y, w, k, groups=1, generator=g).item() == pytest.approx(mmd2_iw(x, y, w, k).item(), abs=1e-12)
    for c in (1e-3, 0.5, 40.0):
        assert mmd2_sniw(x, y, c * w, k).item() == pytest.approx(mmd2_sniw(x, y, w, k).item(), abs=1e-12)


def test_theorem_1_bound():
    # exp(−2 t² ⌊m/2⌋ / (K² (W + 1)⁴)) at t = 0.1, m = 101 (⌊m/2⌋ = 50), K = 1, W = 1: exp(−1/16)
    assert iw_deviation_bound(0.1, 101) == pytest.approx(math.exp(-0.0625))
    assert iw_deviation_bound(0.1, 100, kernel_max=3, max_weight=4) == pytest.approx(math.exp(-1 / (9 * 625)))


def test_median_convention_and_duplication():
    assert upper_median(torch.tensor([4.0, 1.0, 3.0, 2.0])).item() == 3.0  # upper middle for even k
    assert upper_median(torch.tensor([5.0, 1.0, 3.0])).item() == 3.0
    assert duplication_counts(torch.tensor([0.5, 1.0, 1.6])).tolist() == [1, 2, 4]  # rescaled by min w = 0.5 first
    assert duplication_counts(torch.tensor([1.0, 2.0, 3.0]), rescale=False).tolist() == [1, 2, 3]
    assert duplication_counts(torch.tensor([1.0, 50.0]), max_copies=8).tolist() == [1, 8]
    x = torch.tensor([[1.0], [2.0], [3.0]])
    assert importance_duplicate(x, torch.tensor([1.0, 3.0, 2.0])).squeeze(1).tolist() == [1, 2, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="positive"):
        duplication_counts(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="valid: standard, iw, miw, sniw, id"):
        mmd2_estimate(x, x, None, KERNEL, estimator="median")
    with pytest.raises(ValueError, match="2 rows of each sample per group"):
        mmd2_miw(x, x, torch.ones(3), KERNEL, groups=2)


# ----------------------------------------------------------------------------------------- Monte Carlo properties
def test_iw_is_unbiased_on_a_toy_with_known_m():
    """MP has density M(x) = 0.5 + x on (0, 1), so w = 1/M ∈ [2/3, 2]. Over 1000 draws of n = m = 40 the mean of
    MMD²_IW is within 4 standard errors of MMD²(P, Q) (SE ≈ 0.0015); the unweighted U-statistic, which targets
    MMD²(MP, Q), is off by more than 15 of them."""
    truth, g = truth_mmd2(), torch.Generator().manual_seed(4)
    iw, plain = [], []
    for _ in range(1000):
        u = torch.rand(40, dtype=torch.float64, generator=g)
        x = (-0.5 + torch.sqrt(0.25 + 2 * u))[:, None]  # inverse CDF of M(x) = 0.5 + x
        w = 1 / (0.5 + x[:, 0])
        y = target_q(40, g)
        iw.append(mmd2_iw(x, y, w, KERNEL).item())
        plain.append(mmd2(x, y, KERNEL).item())
    iw, plain = torch.tensor(iw), torch.tensor(plain)
    se = iw.std().item() / math.sqrt(len(iw))
    assert abs(iw.mean().item() - truth) < 4 * se
    assert abs(plain.mean().item() - truth) > 15 * se


def test_miw_is_robust_to_heavy_tailed_weights_where_iw_is_not():
    """M(x) = 2.5 x^1.5 on (0, 1): w = 1/M has a Pareto tail of index 5/3 under MP (finite mean, infinite
    variance). Over 400 draws of n = m = 128, MIW with 8 groups of 16 (the thesis' Yearbook setting) has a 99th
    percentile absolute error under 0.6× IW's and a standard deviation under 0.75× IW's (seeds 0–3 gave ratios
    0.30–0.52 and 0.44–0.67); IW's largest error is several times its median one (heavy tails)."""
    truth, g = truth_mmd2(), torch.Generator().manual_seed(0)
    iw, miw = [], []
    for _ in range(400):
        x = torch.rand(128, dtype=torch.float64, generator=g) ** (1 / 2.5)  # density 2.5 x^1.5
        w = 1 / (2.5 * x**1.5)
        y = target_q(128, g)
        iw.append(mmd2_iw(x[:, None], y, w, KERNEL).item())
        miw.append(mmd2_miw(x[:, None], y, w, KERNEL, groups=8, generator=g).item())
    iw, miw = torch.tensor(iw), torch.tensor(miw)
    err_iw, err_miw = (iw - truth).abs(), (miw - truth).abs()
    assert err_miw.quantile(0.99) < 0.6 * err_iw.quantile(0.99)
    assert miw.std() < 0.75 * iw.std()
    assert err_iw.max() > 10 * err_iw.median()


def test_sniw_and_id_agree_with_iw_on_an_easy_case():
    """Bounded two-valued weights (M = 1.5 on [0, ½), 0.5 on [½, 1]: w ∈ {2/3, 2}, so ⌈w/min w⌉ ∈ {1, 3} exactly)
    and n = m = 300: on each of 40 draws SNIW is within 0.006 and ID within 0.008 of IW, while IW itself varies
    with a standard deviation about 0.013 across draws; all three means are within 0.004 of MMD²(P, Q)."""
    truth, g = truth_mmd2(), torch.Generator().manual_seed(0)
    est = {"iw": [], "sniw": [], "id": []}
    for _ in range(40):
        left = torch.rand(300, generator=g) < 0.75  # MP puts 3/4 of its mass on [0, ½)
        u = torch.rand(300, dtype=torch.float64, generator=g)
        x = torch.where(left, 0.5 * u, 0.5 + 0.5 * u)[:, None]
        w = torch.where(left, 2 / 3, 2.0).double()
        y = target_q(300, g)
        for name in est:
            est[name].append(mmd2_estimate(x, y, w, KERNEL, estimator=name).item())
    iw, sniw, dup = (torch.tensor(est[k]) for k in ("iw", "sniw", "id"))
    assert (sniw - iw).abs().max() < 0.006 and (dup - iw).abs().max() < 0.008
    assert iw.std() > 0.008
    for values in (iw, sniw, dup):
        assert abs(values.mean().item() - truth) < 0.004


# ----------------------------------------------------------------------------------------- cross-entropy variants
def test_weighted_bce_losses():
    g = torch.Generator().manual_seed(5)
    real, fake = torch.randn(16, generator=g), torch.randn(16, generator=g)
    w = torch.rand(16, generator=g) + 0.5
    ones = torch.ones(16)
    plain = bce_discriminator_loss(real, fake, None)
    assert bce_discriminator_loss(real, fake, ones, estimator="iw").item() == pytest.approx(plain.item())
    sn = bce_discriminator_loss(real, fake, w, estimator="sniw")
    assert sn.item() == pytest.approx(bce_discriminator_loss(real, fake, 9 * w, estimator="sniw").item(), rel=1e-6)
    e = torch.nn.functional.softplus(-real)  # BCE(D(x), 1)
    fake_part = torch.nn.functional.softplus(fake).mean()
    iw = bce_discriminator_loss(real, fake, w, estimator="iw") - fake_part
    assert iw.item() == pytest.approx((w * e).mean().item())
    miw = bce_discriminator_loss(real, fake, w, estimator="miw", groups=1, generator=g) - fake_part
    assert miw.item() == pytest.approx((w * e).mean().item(), rel=1e-6)
    dup = bce_discriminator_loss(real, fake, torch.tensor([1.0, 2.0] * 8), estimator="id") - fake_part
    counts = torch.tensor([1.0, 2.0] * 8)
    assert dup.item() == pytest.approx(((counts * e).sum() / counts.sum()).item(), rel=1e-6)
    assert bce_generator_loss(fake).item() == pytest.approx(torch.nn.functional.softplus(-fake).mean().item())
    assert median_of_means(torch.arange(12.0), 1, generator=g).item() == pytest.approx(5.5)
    assert median_of_means(torch.full((12,), 2.0), 3, generator=g).item() == 2.0


def test_label_product_kernel_measures_the_joint_of_label_and_features():
    from lightning_dp.kernels.mmd import label_product_kernel

    g = torch.Generator().manual_seed(0)
    u = torch.randn(400, 20, generator=g, dtype=torch.float64)  # many feature columns, as a table's blocks
    y = torch.nn.functional.one_hot((u[:, 0] > 0).long(), 2).double()  # the label depends on the features
    shuffled = y[torch.randperm(400, generator=g)]  # same features, same label shares, dependence lost
    base = rbf_kernel([2.0, 4.0, 8.0])
    k = label_product_kernel(base, 2)
    a, b = torch.cat([u, y], 1), torch.cat([u, shuffled], 1)
    assert torch.allclose(k(a[:5], b[:7]), base(u[:5], u[:7]) * (y[:5] @ shuffled[:7].T))
    assert mmd2(a, b, base, statistic="v") < 0.2 * mmd2(a, b, k, statistic="v")  # the row kernel barely sees it
    assert mmd2(a, a.flip(0), k, statistic="v") < 1e-12
