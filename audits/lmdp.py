"""α-LMDP goodness-of-fit audits (PPEM, Tillman et al. 2023, Def. 2.2; spec §3.6 and §7.9).

A generator satisfies α-LMDP for the sensitive columns x′ iff a level-α goodness-of-fit test *rejects*
H0: "the real x′ are a sample of the model's x′ marginal". So here ``reject=True`` is the desired outcome
(p ≤ α, the paper's rule).

Tests:

* :func:`ksd_test` with the model's score function (e.g. −∇E_ξ of the marginal EBM):
  - ``"u"``: U-statistic Ŝ_u with the Liu et al. (2016) multinomial bootstrap,
    S*_b = (w − 1/n)ᵀ M (w − 1/n), w ~ Mult(n; 1/n)/n, M = [u_q(x_i, x_j)] with zero diagonal;
  - ``"v"``: V-statistic with the Rademacher wild bootstrap (Chwialkowski et al. 2016, i.i.d. case):
    test statistic n·Ŝ_v = (1/n) Σ H_ij against (1/n) εᵀHε;
  - ``"linear"``: the paper's Ŝ_{l,n} with the χ²₁ reference (Lemma 3.1), p = 1 − F_{χ²₁}(Ŝ_{l,n});
  - ``"linear_z"``: Liu et al.'s one-sided normal test of the linear Ŝ_l, z = √B ū / sd(u).
* :func:`mmd_permutation_test`: unbiased MMD² with an RBF kernel and a permutation null, between real and
  generated x′ (works for every generator; the only check acting on the generator itself, spec P14). The audit
  report scales both samples first with :func:`robust_standardise` (public bounds or REAL's quantiles, median and
  IQR), so that one extreme cell cannot squash its column and flip the test.

Ambiguities (spec §3.6, P2, P8): the paper's "bootstrap test" is unspecified; we implement the four well-
defined tests above. The bootstrap p-values are mean(S* ≥ S) as in Liu et al. (can be exactly 0, like the
paper's "0.00"); the permutation p-value is (1 + #{perm ≥ obs}) / (1 + P), which is exactly valid. Kernels
are exp(−‖r‖²/(2s)) with s the median squared pair distance. Quadratic tests subsample to ``max_samples``
rows (284,807² pairs would not fit), and the sample is shuffled before the linear tests pair consecutive
rows, so that ordered data (e.g. by time) does not bias the pairs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.stats import chi2, norm
from torch import Tensor

from lightning_dp.kernels.stein import (
    ksd_linear_normalized,
    linear_stein_terms,
    median_bandwidth,
    stein_kernel_matrix,
)

log = logging.getLogger(__name__)

KSD_STATISTICS = ("u", "v", "linear", "linear_z")
WINSOR = (
    0.005  # columns without public bounds are clipped to REAL's [0.5%, 99.5%] quantiles (robust_standardise)
)


@dataclass
class TestResult:
    """Outcome of one goodness-of-fit / two-sample test.

    Attributes:
        name: Test name (``ksd_u``, ``ksd_v``, ``ksd_linear``, ``ksd_linear_z``, ``mmd``).
        statistic: The reported statistic (Ŝ_u, Ŝ_v, Ŝ_{l,n}, z, or unbiased MMD²).
        p_value: p-value under H0.
        alpha: Level of the test.
        reject: ``p_value <= alpha``; for the α-LMDP audit, True means the property holds.
        n: Sample size(s) actually used.
        details: Bandwidth, number of resamples and the like.
    """

    __test__ = False  # not a pytest class

    name: str
    statistic: float
    p_value: float
    alpha: float
    reject: bool
    n: int | tuple[int, int]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict of all fields."""
        out = asdict(self)
        out["n"] = list(self.n) if isinstance(self.n, tuple) else self.n
        return out


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _subsample(x: Tensor, max_samples: int | None, gen: torch.Generator, what: str) -> Tensor:
    if max_samples is not None and x.shape[0] > max_samples:
        log.info("%s: subsampling %d of %d rows for a quadratic-time test (the policy's max_samples)", what,
                 max_samples, x.shape[0])
        return x[torch.randperm(x.shape[0], generator=gen)[:max_samples]]
    return x


def _as_float_tensor(a: Tensor | np.ndarray) -> Tensor:
    t = a.detach() if isinstance(a, Tensor) else torch.as_tensor(np.asarray(a))
    if not t.is_floating_point() or not isinstance(a, Tensor):
        t = t.to(torch.get_default_dtype())  # arrays and integer tensors: the default float dtype
    return t.reshape(-1, 1) if t.ndim == 1 else t


def ksd_test(
    samples: Tensor | np.ndarray,
    score_fn: Callable[[Tensor], Tensor],
    *,
    statistic: str = "u",
    alpha: float = 0.05,
    n_bootstrap: int = 500,
    seed: int = 0,
    bandwidth: float | None = None,
    kernel: str = "rbf",
    max_samples: int | None = 2000,
) -> TestResult:
    """KSD goodness-of-fit test of ``samples`` (real x′) against the model with score ``score_fn``.

    Args:
        samples: Real sensitive columns, shape (n, d′) (1-D is treated as d′ = 1).
        score_fn: ``x -> ∇_x log q(x)``, shape (n, d′) -> (n, d′); may use autograd internally (it is called
            with grad enabled; its output is detached). Called in the samples' dtype (float32 for arrays).
        statistic: ``"u"``, ``"v"``, ``"linear"`` or ``"linear_z"`` (see the module docstring).
        alpha: Level.
        n_bootstrap: Bootstrap draws for ``"u"`` and ``"v"``.
        seed: Seed of the subsample, the shuffle and the bootstrap.
        bandwidth: Squared length scale; default: median heuristic over all pairs (``u``/``v``) or over the
            linear pairs (``linear*``).
        kernel: Base kernel, ``"rbf"`` or ``"imq"``.
        max_samples: Row cap for ``"u"`` and ``"v"`` (None = no cap).

    Returns:
        The :class:`TestResult`.

    Raises:
        ValueError: For an unknown statistic, α out of range or too few samples.
    """
    if statistic not in KSD_STATISTICS:
        raise ValueError(f"unknown KSD statistic {statistic!r}; valid names: {list(KSD_STATISTICS)}")
    _check_alpha(alpha)
    gen = torch.Generator().manual_seed(seed)
    x = _as_float_tensor(samples)
    x = x[torch.randperm(x.shape[0], generator=gen)]  # shuffle: linear pairs must be i.i.d.
    if statistic in ("u", "v"):
        x = _subsample(x, max_samples, gen, f"ksd_{statistic}")
    n = x.shape[0]
    if n < 4:
        raise ValueError(f"ksd_test needs at least 4 samples, got {n}")
    score = score_fn(x).detach().to(torch.float64)
    x = x.to(torch.float64)
    if score.shape != x.shape:
        raise ValueError(
            f"score_fn returned shape {tuple(score.shape)} for samples of shape {tuple(x.shape)}"
        )
    details: dict[str, Any] = {"kernel": kernel}
    if statistic in ("linear", "linear_z"):
        h = median_bandwidth(x, pairs="linear") if bandwidth is None else torch.tensor(bandwidth)
        details["bandwidth"] = float(h)
        if statistic == "linear":
            stat = float(ksd_linear_normalized(x, score, bandwidth=h, kernel=kernel))
            p = float(chi2.sf(stat, df=1))
        else:
            u = linear_stein_terms(x, score, bandwidth=h, kernel=kernel)  # (B,)
            sd = float(u.std(unbiased=True))
            stat = math.sqrt(u.shape[0]) * float(u.mean()) / sd if sd > 0 else 0.0
            p = float(norm.sf(stat))
        return TestResult(f"ksd_{statistic}", stat, p, alpha, p <= alpha, n, details)

    h = median_bandwidth(x) if bandwidth is None else torch.tensor(bandwidth)
    details.update(bandwidth=float(h), n_bootstrap=n_bootstrap)
    mat = stein_kernel_matrix(x, score, bandwidth=h, kernel=kernel)  # (n, n)
    rng = np.random.default_rng(seed)
    if statistic == "u":
        mat.fill_diagonal_(0.0)
        stat = float(mat.sum()) / (n * (n - 1))
        draws = rng.integers(0, n, size=(n_bootstrap, n)) + n * np.arange(n_bootstrap)[:, None]  # (B, n)
        counts = np.bincount(draws.ravel(), minlength=n_bootstrap * n).reshape(n_bootstrap, n)  # Mult(n; 1/n)
        w = torch.from_numpy(counts / n - 1.0 / n)  # (B, n)
        boot = ((w @ mat) * w).sum(1)  # (B,)
        p = float((boot >= stat).double().mean())
    else:
        stat = float(mat.sum()) / n**2
        eps = torch.from_numpy(rng.choice([-1.0, 1.0], size=(n_bootstrap, n)))  # (B, n)
        boot = ((eps @ mat) * eps).sum(1) / n  # (B,)
        p = float((boot >= n * stat).double().mean())
        details["n_times_statistic"] = n * stat
    return TestResult(f"ksd_{statistic}", stat, p, alpha, p <= alpha, n, details)


def mmd_permutation_test(
    real: np.ndarray | Tensor,
    synthetic: np.ndarray | Tensor,
    *,
    alpha: float = 0.05,
    n_permutations: int = 500,
    seed: int = 0,
    bandwidth: float | None = None,
    max_samples: int | None = 2000,
    block: int = 100,
) -> TestResult:
    """Two-sample permutation test with the unbiased MMD² (Gretton et al. 2012), RBF kernel.

    Args:
        real: Real sensitive columns, shape (n, d′).
        synthetic: Generated sensitive columns, shape (m, d′).
        alpha: Level.
        n_permutations: Number of random permutations of the pooled sample.
        seed: Seed of the subsample and the permutations.
        bandwidth: Squared length scale s of exp(−‖r‖²/(2s)); default: median squared distance of the
            pooled sample (first 1000 rows after shuffling).
        max_samples: Row cap per sample (None = no cap); memory is O((n + m)²).
        block: Permutations evaluated per matrix product.

    Returns:
        The :class:`TestResult` with the unbiased MMD² as ``statistic``.

    Raises:
        ValueError: For α out of range, a sample with fewer than 2 rows or mismatched widths.
    """
    _check_alpha(alpha)
    gen = torch.Generator().manual_seed(seed)
    x = _subsample(_as_float_tensor(real).to(torch.float64), max_samples, gen, "mmd real")
    y = _subsample(_as_float_tensor(synthetic).to(torch.float64), max_samples, gen, "mmd synthetic")
    if x.shape[1] != y.shape[1] or min(x.shape[0], y.shape[0]) < 2:
        raise ValueError(
            f"need two samples of >= 2 rows and equal width, got {tuple(x.shape)}, {tuple(y.shape)}"
        )
    n, m = x.shape[0], y.shape[0]
    z = torch.cat([x, y])  # (N, d)
    if bandwidth is None:
        h = median_bandwidth(z[torch.randperm(n + m, generator=gen)[:1000]])
    else:
        h = torch.tensor(float(bandwidth), dtype=torch.float64)
    k = torch.exp(-torch.cdist(z, z).square() / (2 * h))  # (N, N), unit diagonal
    total, rows = k.sum(), k.sum(1)  # (), (N,)

    def mmd2(a: Tensor) -> Tensor:  # a: (P, N) 0/1 indicators of the "real" group
        sxx = ((a @ k) * a).sum(1)  # (P,)
        sxy = a @ rows - sxx
        syy = total - sxx - 2 * sxy
        return (sxx - n) / (n * (n - 1)) + (syy - m) / (m * (m - 1)) - 2 * sxy / (n * m)

    obs = float(mmd2(torch.cat([torch.ones(n), torch.zeros(m)]).to(torch.float64)[None])[0])
    null = []
    for s in range(0, n_permutations, block):
        p_blk = min(block, n_permutations - s)
        perm = torch.argsort(torch.rand(p_blk, n + m, generator=gen), dim=1)  # (P, N)
        null.append(mmd2((perm < n).to(torch.float64)))
    null_t = torch.cat(null) if null else torch.empty(0, dtype=torch.float64)
    exceed = int((null_t >= obs).sum())
    p = (1.0 + exceed) / (1.0 + n_permutations)
    details = {
        "bandwidth": float(h),
        "n_permutations": n_permutations,
        "n_exceed": exceed,  # permutations whose MMD² reached the observed one
        "estimator": "unbiased MMD^2",
    }
    return TestResult("mmd", obs, p, alpha, p <= alpha, (n, m), details)


def robust_standardise(
    real: np.ndarray, synthetic: np.ndarray, bounds: list[tuple[float, float] | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Clip each column to its public bounds (or, without them, to REAL's [0.5%, 99.5%] quantiles), then centre
    it on REAL's median and scale it by REAL's IQR / 1.349 (its standard deviation if the IQR is 0; 1 if constant).

    One extreme cell (a typo, a 1e308) can then neither stretch the scale of its column nor dominate the kernel:
    it is clipped to the column's range like any other value beyond it.

    Args:
        real: (n, d) REAL's sensitive columns.
        synthetic: (m, d) the synthetic ones.
        bounds: per column, public ``(lower, upper)`` or None.

    Returns:
        Both arrays, clipped and scaled.
    """
    real, synthetic = real.astype(np.float64, copy=True), synthetic.astype(np.float64, copy=True)
    for j, b in enumerate(bounds):
        lo, hi = b if b is not None else np.quantile(real[:, j], [WINSOR, 1.0 - WINSOR])
        real[:, j], synthetic[:, j] = np.clip(real[:, j], lo, hi), np.clip(synthetic[:, j], lo, hi)
        q1, median, q3 = np.quantile(real[:, j], [0.25, 0.5, 0.75])
        scale = (q3 - q1) / 1.349 or float(real[:, j].std()) or 1.0
        real[:, j], synthetic[:, j] = (real[:, j] - median) / scale, (synthetic[:, j] - median) / scale
    return real, synthetic


def alpha_lmdp_audit(
    real: np.ndarray | Tensor,
    *,
    score_fn: Callable[[Tensor], Tensor] | None = None,
    synthetic: np.ndarray | Tensor | None = None,
    alpha: float = 0.05,
    statistics: tuple[str, ...] = ("u", "v", "linear"),
    seed: int = 0,
) -> dict[str, Any]:
    """Run every applicable α-LMDP test: KSD tests if a score is given, MMD if generated x′ are given.

    Args:
        real: Real sensitive columns x′.
        score_fn: Score of the model's x′ marginal (e.g. −∇E_ξ), or None.
        synthetic: Generated x′, or None.
        alpha: Level.
        statistics: KSD statistics to run.
        seed: Seed for all tests.

    Returns:
        ``{"tests": {name: TestResult.to_dict()}, "satisfied": all tests reject}``.

    Raises:
        ValueError: If neither ``score_fn`` nor ``synthetic`` is given.
    """
    if score_fn is None and synthetic is None:
        raise ValueError("alpha_lmdp_audit needs a score_fn (KSD tests) and/or synthetic samples (MMD test)")
    results: list[TestResult] = []
    if score_fn is not None:
        results += [ksd_test(real, score_fn, statistic=s, alpha=alpha, seed=seed) for s in statistics]
    if synthetic is not None:
        results.append(mmd_permutation_test(real, synthetic, alpha=alpha, seed=seed))
    return {"tests": {r.name: r.to_dict() for r in results}, "satisfied": all(r.reject for r in results)}
