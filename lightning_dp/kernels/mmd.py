"""MMD² and its importance-weighted estimators, pure differentiable torch.

From "Distribution Distance Measures in Generative and Privacy Models" (Diesendruck, PhD thesis, 2019):
the V- and U-statistics of MMD² (Eqs. 2.3, 3.2), RBF mixtures and the energy kernel, and the estimators of
Chapter 3 for data drawn from MP when the target is P (weights w_i = 1/M(x_i)):

* IW (Eq. 3.3): unbiased; SNIW (Eq. 3.5): self-normalised, invariant to rescaling w;
* MIW (Eq. 3.4): median of the IW estimates of k random groups (robust to heavy-tailed weights);
* ID: duplicate each row ⌈w_i⌉ times and use the plain estimator;
* the generic weighted U-, V-statistics and averages of Table 3.1, and the weighted cross-entropy losses.

A kernel is any ``kernel(a, b) -> Tensor`` mapping (..., n, D) and (..., m, D) to (..., n, m). Quadratic sums
are taken over row chunks, so memory stays O(chunk · m). The energy distance is
:func:`lightning_dp.kernels.energy.energy_distance` (re-exported here): it is MMD²_V with the energy kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_dp.kernels.energy import energy_distance, lp_distances

__all__ = [
    "ESTIMATORS",
    "Kernel",
    "bce_discriminator_loss",
    "bce_generator_loss",
    "duplication_counts",
    "energy_distance",
    "energy_kernel",
    "importance_duplicate",
    "iw_deviation_bound",
    "label_product_kernel",
    "median_of_means",
    "mmd2",
    "mmd2_estimate",
    "mmd2_iw",
    "mmd2_miw",
    "mmd2_sniw",
    "mmd2_weighted",
    "rbf_kernel",
    "upper_median",
    "weighted_average",
    "weighted_mean",
    "weighted_u_statistic",
    "weighted_v_statistic",
]

Kernel = Callable[[Tensor, Tensor], Tensor]
ESTIMATORS = ("standard", "iw", "miw", "sniw", "id")
STATISTICS = ("u", "v")
SIGMA_IS = ("variance", "std")
CHUNK = 2048


# ----------------------------------------------------------------------------------------- kernels
def _rbf(a: Tensor, b: Tensor, *, sigmas: tuple[float, ...], sigma_is: str) -> Tensor:
    sq = (a.square().sum(-1, keepdim=True) + b.square().sum(-1).unsqueeze(-2)
          - 2 * a @ b.transpose(-1, -2)).clamp_min(0)  # (..., n, m)
    out = torch.zeros_like(sq)
    for s in sigmas:
        out = out + torch.exp(-sq / (2 * (s if sigma_is == "variance" else s * s)))
    return out


def rbf_kernel(sigmas: float | Sequence[float], *, sigma_is: str = "std") -> Kernel:
    """A mixture of RBF kernels ``k(x, y) = Σ_σ exp(−||x − y||² / (2σ²))`` (max K = number of σ).

    Args:
        sigmas: one σ or a list (MMD-GAN: {1, 2, 4, 8, 16}; the thesis' synthetic runs: {0.01, 1, 2}; its
            medical records: {0.1, 0.5, 1}).
        sigma_is: ``"std"`` (exp(−d²/(2σ²)), MMD-GAN's convention) or ``"variance"`` (exp(−d²/(2σ)), the
            thesis' Ch. 5 Remark 2 and its Ch. 3 code).

    Raises:
        ValueError: an unknown ``sigma_is`` or a σ that is not positive.
    """
    values = (float(sigmas),) if isinstance(sigmas, int | float) else tuple(float(s) for s in sigmas)
    if sigma_is not in SIGMA_IS:
        raise ValueError(f"sigma_is={sigma_is!r}; valid: {', '.join(SIGMA_IS)}.")
    if not values or any(not s > 0 for s in values):
        raise ValueError(f"RBF bandwidths must be positive, got {list(values)}.")
    return partial(_rbf, sigmas=values, sigma_is=sigma_is)


def label_product_kernel(kernel: Kernel, num_classes: int) -> Kernel:
    """``k((u, y), (v, y')) = kernel(u, v) · ⟨y, y'⟩`` on inputs whose last ``num_classes`` columns are a label one-hot.

    The product of a characteristic kernel with the label's delta kernel measures the joint of label and features:
    MMD² = Σ_c ‖p(c) μ_P(·|c) − q(c) μ_Q(·|c)‖², so label shares and each class's feature distribution must both
    match (DP-MERF's embedding, "DP-MERF: Differentially Private Mean Embeddings with Random Features", Eq. 5, uses
    the same product). With a soft or straight-through one-hot ⟨y, y'⟩ is differentiable in y.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes} must be ≥ 1.")
    return partial(_label_product, kernel=kernel, k=int(num_classes))


def _label_product(a: Tensor, b: Tensor, *, kernel: Kernel, k: int) -> Tensor:
    return kernel(a[..., :-k], b[..., :-k]) * (a[..., -k:] @ b[..., -k:].transpose(-1, -2))


def _negative_distance(a: Tensor, b: Tensor, *, p: float) -> Tensor:
    return -lp_distances(a, b, p, eps=1e-12)  # the safe norm: a finite gradient at coincident points


def energy_kernel(p: float = 2.0) -> Kernel:
    """The energy kernel ``k(x, y) = −||x − y||_p`` (safe norm); MMD²_V with it is the energy distance."""
    return partial(_negative_distance, p=float(p))


# ----------------------------------------------------------------------------------------- chunked sums
def _pair_sum(a: Tensor, b: Tensor, kernel: Kernel, wa: Tensor | None = None, wb: Tensor | None = None,
              chunk: int = CHUNK) -> Tensor:
    """``Σ_ij wa_i wb_j k(a_i, b_j)`` over row chunks of ``a`` (weights default to 1)."""
    total = a.new_zeros(())
    for s in range(0, len(a), chunk):
        g = kernel(a[s : s + chunk], b)  # (c, m)
        rows = g @ wb if wb is not None else g.sum(1)  # (c,)
        total = total + (rows @ wa[s : s + chunk] if wa is not None else rows.sum())
    return total


def _diag(a: Tensor, kernel: Kernel) -> Tensor:
    """``k(a_i, a_i)`` for every row, shape (n,)."""
    return kernel(a.unsqueeze(-2), a.unsqueeze(-2)).reshape(len(a))


def _check(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}; valid: u (Eq. 3.2), v (Eq. 2.3).")


def _within(a: Tensor, kernel: Kernel, w: Tensor | None, *, statistic: str, self_normalized: bool,
            chunk: int) -> Tensor:
    """The within-sample term of MMD², weighted as in Table 3.1 (pairs i ≠ j for U, all pairs for V)."""
    n = len(a)
    total = _pair_sum(a, a, kernel, w, w, chunk)
    if statistic == "u":
        total = total - (_diag(a, kernel) @ (w.square() if w is not None else torch.ones_like(a[:, 0])))
    if w is None or not self_normalized:
        return total / (n * (n - 1) if statistic == "u" else n * n)
    return total / (w.sum().square() - (w.square().sum() if statistic == "u" else 0))


def _cross(x: Tensor, y: Tensor, kernel: Kernel, w: Tensor | None, *, self_normalized: bool, chunk: int) -> Tensor:
    """``(1/(nm)) Σ_ij w_i k(x_i, y_j)`` (IW) or ``Σ_ij w_i k(x_i, y_j) / (m Σ_i w_i)`` (SNIW), Table 3.1's average."""
    total = _pair_sum(x, y, kernel, w, None, chunk)
    if w is not None and self_normalized:
        return total / (len(y) * w.sum())
    return total / (len(x) * len(y))


# ----------------------------------------------------------------------------------------- MMD² estimators
def mmd2(x: Tensor, y: Tensor, kernel: Kernel, *, statistic: str = "u", chunk: int = CHUNK) -> Tensor:
    """MMD² between samples x (n, D) and y (m, D): U-statistic (Eq. 3.2, can be negative) or V (Eq. 2.3).

    Raises:
        ValueError: an unknown statistic, or fewer than 2 rows on a side for the U-statistic.
    """
    return mmd2_weighted(x, y, None, kernel, statistic=statistic, chunk=chunk)


def mmd2_weighted(x: Tensor, y: Tensor, w: Tensor | None, kernel: Kernel, *, statistic: str = "u",
                  self_normalized: bool = False, chunk: int = CHUNK) -> Tensor:
    """MMD² with the data side x ~ MP weighted by w_i = 1/M(x_i) (Table 3.1 applied to Eq. 3.1).

    Args:
        x: data rows (n, D); y: generated rows (m, D); w: weights (n,), or None for w ≡ 1.
        kernel: see :func:`rbf_kernel`, :func:`energy_kernel`.
        statistic: ``"u"`` (pairs i ≠ j; with w this is IW, Eq. 3.3) or ``"v"`` (all pairs).
        self_normalized: divide by the weights' sums instead of the counts (SNIW, Eq. 3.5).

    Raises:
        ValueError: an unknown statistic, w of the wrong shape, or fewer than 2 rows for the U-statistic.
    """
    _check(statistic)
    if statistic == "u" and (len(x) < 2 or len(y) < 2):
        raise ValueError(f"The U-statistic needs at least 2 rows per sample, got {len(x)} and {len(y)}.")
    if w is not None and w.shape != (len(x),):
        raise ValueError(f"weights must have shape ({len(x)},), got {tuple(w.shape)}.")
    kw = {"statistic": statistic, "chunk": chunk}
    return (_within(x, kernel, w, self_normalized=self_normalized, **kw)
            + _within(y, kernel, None, self_normalized=False, **kw)
            - 2 * _cross(x, y, kernel, w, self_normalized=self_normalized, chunk=chunk))


def mmd2_iw(x: Tensor, y: Tensor, w: Tensor, kernel: Kernel, *, chunk: int = CHUNK) -> Tensor:
    """MMD²_IW (Eq. 3.3), unbiased for MMD²(P, Q) when w_i = 1/M(x_i) exactly; equals MMD²_U at w ≡ 1."""
    return mmd2_weighted(x, y, w, kernel, statistic="u", chunk=chunk)


def mmd2_sniw(x: Tensor, y: Tensor, w: Tensor, kernel: Kernel, *, chunk: int = CHUNK) -> Tensor:
    """MMD²_SNIW (Eq. 3.5): for w known up to a constant (w_i = 1/T(x_i)); invariant to w → c·w."""
    return mmd2_weighted(x, y, w, kernel, statistic="u", self_normalized=True, chunk=chunk)


def upper_median(values: Tensor) -> Tensor:
    """The median of a 1-D tensor; for an even count the upper of the two middle values (the thesis' code takes
    ``top_k(v, k/2)[k/2 − 1]``; ``torch.median`` would take the lower). Differentiable through the chosen one."""
    return values.sort().values[len(values) // 2]


def _groups(n: int, k: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """A uniformly random split of range(n) into k equal groups (n mod k rows left out), shape (k, n // k)."""
    perm = torch.randperm(n, generator=generator)[: k * (n // k)]
    return perm.view(k, n // k).to(device)


def mmd2_miw(x: Tensor, y: Tensor, w: Tensor, kernel: Kernel, *, groups: int,
             generator: torch.Generator | None = None, chunk: int = CHUNK) -> Tensor:
    """MMD²_MIW (Eq. 3.4): x and y each split at random into ``groups`` equal groups, MMD²_IW on each pair of
    groups, and their :func:`upper_median` (the gradient flows through the selected group).

    Groups are redrawn at every call (the thesis leaves it open); with ``groups=1`` this is MMD²_IW.

    Raises:
        ValueError: fewer than 2 rows of x or y per group.
    """
    if groups < 1 or len(x) // groups < 2 or len(y) // groups < 2:
        raise ValueError(f"MIW with {groups} groups needs at least 2 rows of each sample per group, got {len(x)} data "
                         f"and {len(y)} generated rows; lower the number of groups or raise the batch size.")
    gx, gy = _groups(len(x), groups, generator, x.device), _groups(len(y), groups, generator, y.device)
    values = torch.stack([mmd2_iw(x[i], y[j], w[i], kernel, chunk=chunk) for i, j in zip(gx, gy)])  # (k,)
    return upper_median(values)


def duplication_counts(w: Tensor, *, rescale: bool = True, max_copies: int | None = None) -> Tensor:
    """``⌈w_i⌉`` copies per row (importance duplication, ID), as int64.

    Args:
        w: weights (n,), positive.
        rescale: divide w by its minimum first, so that the smallest weight gets one copy and weights below 1
            still down-weight (with w < 1, ⌈w⌉ = 1 would ignore them).
        max_copies: an optional cap (an extension, off by default; the thesis caps nothing).
    """
    if (w <= 0).any():
        raise ValueError("Importance duplication needs positive weights.")
    w = w.detach()
    counts = torch.ceil((w / w.min() if rescale else w) - 1e-9).clamp_min(1).long()  # tolerance: 2.0 → 2, not 3
    return counts.clamp_max(max_copies) if max_copies is not None else counts


def importance_duplicate(x: Tensor, w: Tensor, *, rescale: bool = True, max_copies: int | None = None) -> Tensor:
    """Each row of x repeated :func:`duplication_counts` times, in order (ID of the thesis, §3.2)."""
    return torch.repeat_interleave(x, duplication_counts(w, rescale=rescale, max_copies=max_copies).to(x.device), 0)


def mmd2_estimate(x: Tensor, y: Tensor, w: Tensor | None, kernel: Kernel, *, estimator: str = "iw",
                  statistic: str = "u", groups: int = 4, generator: torch.Generator | None = None,
                  max_copies: int | None = None, chunk: int = CHUNK) -> Tensor:
    """One of the thesis' MMD² estimators by name (:data:`ESTIMATORS`); ``w=None`` means w ≡ 1.

    ``standard`` ignores w; ``iw``/``sniw`` weight the data side (Table 3.1, with ``statistic``); ``miw`` is the
    median of ``groups`` IW estimates; ``id`` duplicates rows ⌈w/min w⌉ times, then the plain estimator.

    Raises:
        ValueError: an unknown estimator (the valid names listed).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"Unknown MMD estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}.")
    if estimator == "standard" or (w is None and estimator != "miw"):
        return mmd2(x, y, kernel, statistic=statistic, chunk=chunk)
    if w is None:
        w = torch.ones(len(x), device=x.device, dtype=x.dtype)
    if estimator == "miw":
        return mmd2_miw(x, y, w, kernel, groups=groups, generator=generator, chunk=chunk)
    if estimator == "id":
        return mmd2(importance_duplicate(x, w, max_copies=max_copies), y, kernel, statistic=statistic, chunk=chunk)
    return mmd2_weighted(x, y, w, kernel, statistic=statistic, self_normalized=estimator == "sniw", chunk=chunk)


def iw_deviation_bound(t: float, m: int, *, kernel_max: float = 1.0, max_weight: float = 1.0) -> float:
    """Theorem 1's tail bound ``P(MMD²_IW − MMD² > t) ≤ exp(−2t²⌊m/2⌋ / (K²(W + 1)⁴))`` for 1 ≤ w ≤ W.

    The theorem's assumption 1 ≤ 1/M ≤ W forces M ≡ 1 (E_MP[1/M] = 1): read it as qualitative.
    """
    return math.exp(-2 * t * t * (m // 2) / (kernel_max**2 * (max_weight + 1) ** 4))


# ----------------------------------------------------------------------------------------- Table 3.1
def weighted_mean(values: Tensor, w: Tensor | None, *, self_normalized: bool = False) -> Tensor:
    """``(1/n) Σ w_i v_i`` (IW) or ``Σ w_i v_i / Σ w_i`` (SNIW) over the first axis; plain mean for w=None."""
    if w is None:
        return values.mean(0)
    w = w.reshape(-1, *([1] * (values.dim() - 1)))
    return (w * values).sum(0) / (w.sum() if self_normalized else len(values))


def weighted_average(f: Tensor, w: Tensor | None, *, self_normalized: bool = False) -> Tensor:
    """Table 3.1's average of f(X_i, Y_j), f of shape (n, m), weighted on the X side."""
    return weighted_mean(f.mean(1), w, self_normalized=self_normalized)


def weighted_u_statistic(g: Tensor, w: Tensor | None, *, self_normalized: bool = False) -> Tensor:
    """Table 3.1's U-statistic of order 2 from the pair matrix g (n, n): pairs i ≠ j, weights w_i w_j."""
    n = len(g)
    off = ~torch.eye(n, dtype=torch.bool, device=g.device)
    if w is None:
        return g[off].sum() / (n * (n - 1))
    ww = torch.outer(w, w)[off]
    return (ww * g[off]).sum() / (ww.sum() if self_normalized else n * (n - 1))


def weighted_v_statistic(g: Tensor, w: Tensor | None, *, self_normalized: bool = False) -> Tensor:
    """Table 3.1's V-statistic of order 2 from g (n, n); the SNIW denominator is (Σ w)² (the table's typo fixed)."""
    n = len(g)
    if w is None:
        return g.sum() / (n * n)
    return (torch.outer(w, w) * g).sum() / (w.sum().square() if self_normalized else n * n)


# ----------------------------------------------------------------------------------------- cross-entropy GANs
def median_of_means(values: Tensor, groups: int, *, generator: torch.Generator | None = None) -> Tensor:
    """The :func:`upper_median` of the means of ``groups`` random equal groups of ``values`` (n mod k left out)."""
    if groups < 1 or len(values) < groups:
        raise ValueError(f"median of means over {groups} groups needs at least {groups} values, got {len(values)}.")
    return upper_median(values[_groups(len(values), groups, generator, values.device)].mean(1))


def bce_discriminator_loss(real_logits: Tensor, fake_logits: Tensor, w: Tensor | None = None, *,
                           estimator: str = "iw", groups: int = 4, generator: torch.Generator | None = None) -> Tensor:
    """The weighted cross-entropy discriminator loss of the thesis' IW-CE, MIW-CE, SNIW-CE and ID-CE (§3.3.1).

    With e_i = BCE(D(x_i), 1): IW mean(w_i e_i); SNIW Σ w_i e_i / Σ w_i; MIW median of the group means of
    w_i e_i; ID (duplicated rows) Σ ⌈w_i⌉ e_i / Σ ⌈w_i⌉; standard mean(e_i). Plus mean BCE(D(G(z)), 0),
    unweighted: only the data term is weighted.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"Unknown estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}.")
    e = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits), reduction="none")  # (n,)
    if w is None or estimator == "standard":
        real = e.mean()
    elif estimator == "miw":
        real = median_of_means(w * e, groups, generator=generator)
    elif estimator == "id":
        real = weighted_mean(e, duplication_counts(w).to(e.dtype), self_normalized=True)
    else:
        real = weighted_mean(e, w, self_normalized=estimator == "sniw")
    fake = F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    return real + fake


def bce_generator_loss(fake_logits: Tensor) -> Tensor:
    """The non-saturating generator loss mean BCE(D(G(z)), 1); it has no data term, so no weights."""
    return F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits))
