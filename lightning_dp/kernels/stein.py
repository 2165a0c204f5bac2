"""Stein kernels and kernel Stein discrepancy (KSD) estimators, pure differentiable torch.

Given samples x_i from p and the model's score s_q(x) = ∇_x log q(x), the Stein kernel (Liu, Lee & Jordan
2016; PPEM eq. 15 with the typo of its second term corrected, spec P1) is

    u_q(x, y) = s(x)ᵀ s(y) k(x, y) + s(x)ᵀ ∇_y k(x, y) + ∇_x k(x, y)ᵀ s(y) + tr(∇_x ∇_y k(x, y)),

and KSD(p, q) = E_{x,y~p}[u_q(x, y)] >= 0 with equality iff p = q. Base kernels, with ``bandwidth`` = s a
*squared* length scale, r = x − y and D the dimension:

* RBF: k = exp(−‖r‖²/(2s)), u = k·[s(x)ᵀs(y) + (s(x)ᵀr − rᵀs(y))/s + D/s − ‖r‖²/s²].
* IMQ (Gorham & Mackey 2017): k = (c² + ‖r‖²/s)^β, β ∈ (−1, 0), with q = c² + ‖r‖²/s:
  u = q^β s(x)ᵀs(y) − 2β q^(β−1) (s(x)ᵀr − rᵀs(y))/s − 2βD q^(β−1)/s − 4β(β−1) q^(β−2) ‖r‖²/s².

Gradients flow through the samples, the scores and (if not detached) the bandwidth, so the estimators can
serve as a training penalty (PPEM eq. 18). The paper's bandwidth convention is ambiguous (spec P2); here
k = exp(−‖r‖²/(2s)) with s the median of squared pair distances (:func:`median_bandwidth`), detached.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint as _checkpoint

KERNELS = ("rbf", "imq")


def _check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown base kernel {kernel!r}; valid names: {list(KERNELS)}")


def _stein_from_terms(
    sxsy: Tensor,
    sxr: Tensor,
    rsy: Tensor,
    r2: Tensor,
    dim: int,
    bandwidth: Tensor | float,
    kernel: str,
    imq_c: float,
    imq_beta: float,
) -> Tensor:
    """u_q from the inner products s(x)ᵀs(y), s(x)ᵀr, rᵀs(y) and ‖r‖² (any common shape)."""
    h = bandwidth
    if kernel == "rbf":
        k = torch.exp(-r2 / (2 * h))
        return k * (sxsy + (sxr - rsy) / h + dim / h - r2 / (h * h))
    b = imq_beta
    q = imq_c**2 + r2 / h
    qb1 = q.pow(b - 1)
    return (
        q.pow(b) * sxsy
        - 2 * b * qb1 * (sxr - rsy) / h
        - 2 * b * dim * qb1 / h
        - 4 * b * (b - 1) * q.pow(b - 2) * r2 / (h * h)
    )


def stein_kernel_matrix(
    x: Tensor,
    score_x: Tensor,
    y: Tensor | None = None,
    score_y: Tensor | None = None,
    *,
    bandwidth: Tensor | float,
    kernel: str = "rbf",
    imq_c: float = 1.0,
    imq_beta: float = -0.5,
) -> Tensor:
    """Matrix U_ij = u_q(x_i, y_j) of the Stein kernel.

    Args:
        x: Samples, shape (n, D).
        score_x: Scores ∇log q at x, shape (n, D).
        y: Second samples, shape (m, D); defaults to ``x``.
        score_y: Scores at y, shape (m, D); defaults to ``score_x``.
        bandwidth: Squared length scale s > 0 of the base kernel.
        kernel: ``"rbf"`` or ``"imq"``.
        imq_c: IMQ offset c > 0.
        imq_beta: IMQ exponent β in (−1, 0).

    Returns:
        Tensor of shape (n, m).

    Raises:
        ValueError: For an unknown base kernel.
    """
    _check_kernel(kernel)
    if y is None:
        y, score_y = x, score_x
    assert score_y is not None
    sxsy = score_x @ score_y.T  # (n, m)
    xy = x @ y.T  # (n, m)
    # s(x)ᵀ(x − y) and (x − y)ᵀs(y) without forming the (n, m, D) differences
    sxr = (score_x * x).sum(1, keepdim=True) - score_x @ y.T  # (n, m)
    rsy = x @ score_y.T - (y * score_y).sum(1).unsqueeze(0)  # (n, m)
    r2 = (x.square().sum(1, keepdim=True) + y.square().sum(1).unsqueeze(0) - 2 * xy).clamp_min(0)  # (n, m)
    return _stein_from_terms(sxsy, sxr, rsy, r2, x.shape[1], bandwidth, kernel, imq_c, imq_beta)


def stein_kernel_pairs(
    x: Tensor,
    score_x: Tensor,
    y: Tensor,
    score_y: Tensor,
    *,
    bandwidth: Tensor | float,
    kernel: str = "rbf",
    imq_c: float = 1.0,
    imq_beta: float = -0.5,
) -> Tensor:
    """Row-wise Stein kernel u_q(x_i, y_i).

    Args:
        x: Samples, shape (n, D).
        score_x: Scores at x, shape (n, D).
        y: Paired samples, shape (n, D).
        score_y: Scores at y, shape (n, D).
        bandwidth: Squared length scale of the base kernel.
        kernel: ``"rbf"`` or ``"imq"``.
        imq_c: IMQ offset.
        imq_beta: IMQ exponent.

    Returns:
        Tensor of shape (n,).
    """
    _check_kernel(kernel)
    r = x - y  # (n, D)
    return _stein_from_terms(
        (score_x * score_y).sum(1),
        (score_x * r).sum(1),
        (r * score_y).sum(1),
        r.square().sum(1),
        x.shape[1],
        bandwidth,
        kernel,
        imq_c,
        imq_beta,
    )


def median_bandwidth(x: Tensor, *, pairs: str = "all", max_samples: int = 1000) -> Tensor:
    """Median heuristic: the median squared distance, detached (use as ``bandwidth``).

    Args:
        x: Samples, shape (n, D), n >= 2.
        pairs: ``"all"``: median over all pairs i < j of the first ``max_samples`` rows; ``"linear"``: over
            the ⌊n/2⌋ consecutive pairs (x_{2i−1}, x_{2i}) that the linear statistic uses (spec §3.3).
        max_samples: Row cap for ``"all"``.

    Returns:
        Scalar tensor (1.0 if all distances are zero).

    Raises:
        ValueError: For an unknown ``pairs`` option or fewer than 2 rows.
    """
    if x.shape[0] < 2:
        raise ValueError("median_bandwidth needs at least 2 rows")
    x = x.detach()
    if pairs == "linear":
        b = x.shape[0] // 2
        d2 = (x[0 : 2 * b : 2] - x[1 : 2 * b : 2]).square().sum(1)  # (B,)
    elif pairs == "all":
        xs = x[:max_samples]
        iu = torch.triu_indices(xs.shape[0], xs.shape[0], offset=1)
        d2 = torch.cdist(xs, xs).square()[iu[0], iu[1]]
    else:
        raise ValueError(f"pairs must be 'all' or 'linear', got {pairs!r}")
    med = d2.quantile(0.5)  # the midpoint median (torch.median returns the lower one)
    return torch.where(med > 0, med, torch.ones_like(med))


def _chunked_sum(
    x: Tensor, score: Tensor, bandwidth: Tensor | float, chunk_size: int, use_checkpoint: bool, **kw: object
) -> Tensor:
    """Σ_ij u_q(x_i, x_j) over row blocks of ``chunk_size``, keeping at most (chunk, n) in memory."""

    def block(xc: Tensor, sc: Tensor) -> Tensor:
        return stein_kernel_matrix(xc, sc, x, score, bandwidth=bandwidth, **kw).sum()  # type: ignore[arg-type]

    total = x.new_zeros(())
    for s in range(0, x.shape[0], chunk_size):
        xc, sc = x[s : s + chunk_size], score[s : s + chunk_size]
        grad = torch.is_grad_enabled() and (x.requires_grad or score.requires_grad)
        total = total + (
            _checkpoint(block, xc, sc, use_reentrant=False) if use_checkpoint and grad else block(xc, sc)
        )
    return total


def ksd_u_statistic(
    x: Tensor,
    score: Tensor,
    *,
    bandwidth: Tensor | float | None = None,
    kernel: str = "rbf",
    chunk_size: int = 4096,
    checkpoint: bool = False,
    imq_c: float = 1.0,
    imq_beta: float = -0.5,
) -> Tensor:
    """Unbiased KSD U-statistic Ŝ_u = Σ_{i≠j} u_q(x_i, x_j) / (n(n−1)) (PPEM eq. 14).

    Args:
        x: Samples from p, shape (n, D), n >= 2.
        score: Model scores s_q(x_i), shape (n, D).
        bandwidth: Squared length scale; default :func:`median_bandwidth` (all pairs).
        kernel: ``"rbf"`` or ``"imq"``.
        chunk_size: Rows per block; the (n, n) matrix is never formed.
        checkpoint: Recompute blocks in the backward pass so that autograd memory is also O(chunk * n).
        imq_c: IMQ offset.
        imq_beta: IMQ exponent.

    Returns:
        Scalar tensor (differentiable).
    """
    n = x.shape[0]
    h = median_bandwidth(x) if bandwidth is None else bandwidth
    kw = {"kernel": kernel, "imq_c": imq_c, "imq_beta": imq_beta}
    diag = stein_kernel_pairs(x, score, x, score, bandwidth=h, **kw).sum()  # type: ignore[arg-type]
    return (_chunked_sum(x, score, h, chunk_size, checkpoint, **kw) - diag) / (n * (n - 1))


def ksd_v_statistic(
    x: Tensor,
    score: Tensor,
    *,
    bandwidth: Tensor | float | None = None,
    kernel: str = "rbf",
    chunk_size: int = 4096,
    checkpoint: bool = False,
    imq_c: float = 1.0,
    imq_beta: float = -0.5,
) -> Tensor:
    """KSD V-statistic Ŝ_v = Σ_{i,j} u_q(x_i, x_j) / n² (diagonal included; biased, >= 0).

    Args:
        x: Samples from p, shape (n, D).
        score: Model scores, shape (n, D).
        bandwidth: Squared length scale; default :func:`median_bandwidth` (all pairs).
        kernel: ``"rbf"`` or ``"imq"``.
        chunk_size: Rows per block.
        checkpoint: Recompute blocks in the backward pass.
        imq_c: IMQ offset.
        imq_beta: IMQ exponent.

    Returns:
        Scalar tensor (differentiable).
    """
    h = median_bandwidth(x) if bandwidth is None else bandwidth
    kw = {"kernel": kernel, "imq_c": imq_c, "imq_beta": imq_beta}
    return _chunked_sum(x, score, h, chunk_size, checkpoint, **kw) / x.shape[0] ** 2


def linear_stein_terms(
    x: Tensor,
    score: Tensor,
    *,
    bandwidth: Tensor | float | None = None,
    kernel: str = "rbf",
    imq_c: float = 1.0,
    imq_beta: float = -0.5,
) -> Tensor:
    """The B = ⌊n/2⌋ terms u_i = u_q(x_{2i−1}, x_{2i}) of the linear-time KSD (consecutive pairs, spec §3.4).

    Args:
        x: Samples, shape (n, D), n >= 2 (an odd last row is dropped).
        score: Scores, shape (n, D).
        bandwidth: Squared length scale; default :func:`median_bandwidth` over the same pairs.
        kernel: ``"rbf"`` or ``"imq"``.
        imq_c: IMQ offset.
        imq_beta: IMQ exponent.

    Returns:
        Tensor of shape (B,).
    """
    b = x.shape[0] // 2
    h = median_bandwidth(x, pairs="linear") if bandwidth is None else bandwidth
    return stein_kernel_pairs(
        x[0 : 2 * b : 2],
        score[0 : 2 * b : 2],
        x[1 : 2 * b : 2],
        score[1 : 2 * b : 2],
        bandwidth=h,
        kernel=kernel,
        imq_c=imq_c,
        imq_beta=imq_beta,
    )


def ksd_linear(x: Tensor, score: Tensor, **kwargs: object) -> Tensor:
    """Linear-time KSD Ŝ_l = mean_i u_i (Liu et al. 2016; unbiased, may be negative).

    Args:
        x: Samples, shape (n, D).
        score: Scores, shape (n, D).
        **kwargs: Forwarded to :func:`linear_stein_terms`.

    Returns:
        Scalar tensor.
    """
    return linear_stein_terms(x, score, **kwargs).mean()  # type: ignore[arg-type]


def ksd_linear_normalized(x: Tensor, score: Tensor, *, eps: float = 1e-12, **kwargs: object) -> Tensor:
    """PPEM's non-negative normalised linear KSD (eq. 17): Ŝ_{l,n} = (B−1)(Σu_i)² / (B Σu_i²).

    It is the squared one-sample t-statistic of the u_i with the uncentred second moment as variance,
    asymptotically χ²₁ under H0 (Lemma 3.1) and bounded by B − 1. ``eps`` guards the denominator (P12).

    Args:
        x: Samples, shape (n, D), n >= 4.
        score: Scores, shape (n, D).
        eps: Added to the denominator.
        **kwargs: Forwarded to :func:`linear_stein_terms`.

    Returns:
        Scalar tensor in [0, B − 1].
    """
    u = linear_stein_terms(x, score, **kwargs)  # type: ignore[arg-type]  # (B,)
    b = u.shape[0]
    return (b - 1) * u.sum().square() / (b * u.square().sum() + eps)
