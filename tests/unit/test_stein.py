"""Stein kernels and KSD estimators: hand values, autograd agreement, chunking, gradients."""

import math

import pytest
import torch

from lightning_dp.kernels.stein import (
    ksd_linear,
    ksd_linear_normalized,
    ksd_u_statistic,
    ksd_v_statistic,
    linear_stein_terms,
    median_bandwidth,
    stein_kernel_matrix,
    stein_kernel_pairs,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def _autograd_stein(x, y, sx, sy, base):
    """u = sxᵀsy k + sxᵀ∇_y k + ∇_x kᵀsy + tr(∇_x∇_y k), every derivative by autograd."""
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    k = base(x, y)
    gx, gy = torch.autograd.grad(k, (x, y), create_graph=True)
    trace = sum(torch.autograd.grad(gx[i], y, retain_graph=True)[0][i] for i in range(x.numel()))
    return (sx @ sy * k + sx @ gy + gx @ sy + trace).detach()


def test_rbf_hand_values():
    # D = 1, h = 1, k = exp(-r²/2): u(x, y) = k [s(x)s(y) + (s(x) - s(y)) r + 1 - r²]
    x = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    s = -x  # standard normal: s(0) = 0, s(1) = -1
    u = stein_kernel_matrix(x, s, bandwidth=1.0)
    assert u[0, 0].item() == pytest.approx(1.0)  # k = 1, only the trace term D/h
    assert u[1, 1].item() == pytest.approx(2.0)  # s² + 1
    # x = 1, y = 0: r = 1, k = e^{-1/2}; [0 + (-1 - 0)·1 + 1 - 1] = -1
    assert u[1, 0].item() == pytest.approx(-math.exp(-0.5))
    assert u[0, 1].item() == pytest.approx(-math.exp(-0.5))  # symmetric


@pytest.mark.parametrize("kernel", ["rbf", "imq"])
def test_stein_kernel_matches_autograd_for_a_standard_gaussian(kernel):
    torch.manual_seed(0)
    h, c, beta = 0.7, 1.3, -0.4
    x = torch.randn(6, 3, dtype=torch.float64)
    s = -x  # score of N(0, I)
    if kernel == "rbf":
        base = lambda a, b: torch.exp(-(a - b).square().sum() / (2 * h))  # noqa: E731
    else:
        base = lambda a, b: (c**2 + (a - b).square().sum() / h) ** beta  # noqa: E731
    u = stein_kernel_matrix(x, s, bandwidth=h, kernel=kernel, imq_c=c, imq_beta=beta)
    for i in range(6):
        for j in range(6):
            assert u[i, j].item() == pytest.approx(
                _autograd_stein(x[i], x[j], s[i], s[j], base).item(), rel=1e-10
            )
    pairs = stein_kernel_pairs(x[:3], s[:3], x[3:], s[3:], bandwidth=h, kernel=kernel, imq_c=c, imq_beta=beta)
    torch.testing.assert_close(pairs, torch.stack([u[i, i + 3] for i in range(3)]))


def test_estimators_match_explicit_sums_and_chunking():
    torch.manual_seed(1)
    x = torch.randn(37, 2, dtype=torch.float64)
    s = -x + 0.3
    u = stein_kernel_matrix(x, s, bandwidth=0.9)
    n = 37
    assert ksd_u_statistic(x, s, bandwidth=0.9).item() == pytest.approx(
        ((u.sum() - u.trace()) / (n * (n - 1))).item()
    )
    assert ksd_v_statistic(x, s, bandwidth=0.9).item() == pytest.approx((u.sum() / n**2).item())
    for fn in (ksd_u_statistic, ksd_v_statistic):
        torch.testing.assert_close(fn(x, s, bandwidth=0.9, chunk_size=5), fn(x, s, bandwidth=0.9))
    terms = linear_stein_terms(x, s, bandwidth=0.9)  # pairs (0, 1), (2, 3), ..., (34, 35); row 36 dropped
    torch.testing.assert_close(terms, torch.stack([u[2 * i, 2 * i + 1] for i in range(18)]))
    assert ksd_linear(x, s, bandwidth=0.9).item() == pytest.approx(terms.mean().item())
    b = 18
    want = (b - 1) * terms.sum() ** 2 / (b * terms.square().sum())  # = squared t-statistic, <= B - 1
    assert ksd_linear_normalized(x, s, bandwidth=0.9).item() == pytest.approx(want.item())
    assert 0.0 <= want.item() <= b - 1


def test_ksd_separates_the_model_from_a_shift():
    torch.manual_seed(2)
    x = torch.randn(400, 2, dtype=torch.float64)
    null = ksd_u_statistic(x, -x).item()
    alt = ksd_u_statistic(x, -(x - 1.0)).item()  # model N(1, I)
    assert abs(null) < 0.01 < 0.1 < alt


@pytest.mark.parametrize("checkpoint", [False, True])
def test_gradients_flow_through_chunks_to_model_parameters(checkpoint):
    torch.manual_seed(3)
    x = torch.randn(50, 2, dtype=torch.float64, requires_grad=True)
    mu = torch.tensor([0.5, -0.2], dtype=torch.float64, requires_grad=True)

    def score(t):
        return -(t - mu)  # model N(mu, I), differentiable in mu and in the samples

    full = torch.autograd.grad(ksd_u_statistic(x, score(x), bandwidth=1.0), (x, mu))
    chunked = torch.autograd.grad(
        ksd_u_statistic(x, score(x), bandwidth=1.0, chunk_size=7, checkpoint=checkpoint), (x, mu)
    )
    for a, b in zip(full, chunked):
        torch.testing.assert_close(a, b)
    assert mu.grad is None and full[1].abs().sum() > 0
    # the energy-model penalty: the score comes from autograd of an energy with create_graph=True
    theta = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    xs = x.detach().clone().requires_grad_()
    energy = 0.5 * theta * xs.square().sum()
    (s,) = torch.autograd.grad(-energy, xs, create_graph=True)
    (g,) = torch.autograd.grad(ksd_linear_normalized(xs, s), theta)
    assert torch.isfinite(g)


def test_gradcheck_u_statistic():
    torch.manual_seed(4)
    x = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    s = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ksd_u_statistic(a, b, bandwidth=0.8, chunk_size=3), (x, s))
    assert torch.autograd.gradcheck(lambda a, b: ksd_v_statistic(a, b, bandwidth=0.8, kernel="imq"), (x, s))


def test_median_bandwidth_and_errors():
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    # all pairs squared distances: 1, 9, 49, 4, 36, 16 -> median (9 + 16)/2 = 12.5
    assert median_bandwidth(x).item() == pytest.approx(12.5)
    # linear pairs (0, 1), (3, 7): 1, 16 -> 8.5
    assert median_bandwidth(x, pairs="linear").item() == pytest.approx(8.5)
    assert median_bandwidth(torch.zeros(4, 2)).item() == 1.0
    with pytest.raises(ValueError, match="valid names"):
        stein_kernel_matrix(x, x, bandwidth=1.0, kernel="laplace")
    with pytest.raises(ValueError, match="pairs"):
        median_bandwidth(x, pairs="some")
