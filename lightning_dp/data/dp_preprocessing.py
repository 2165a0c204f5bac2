"""DP release of the schema facts a user did not declare public: bounds and category lists.

Both are charged to the run's ledger before any noise is drawn, and no decision depends on an exact
count of the private rows (the caller passes ``num_rows``, a DP or public count charged elsewhere):

* bounds: the q and 1 − q DP quantiles of each column with the exponential mechanism over the
  intervals between sorted values (Smith 2011, "Privacy-preserving statistical estimation with optimal
  convergence rates"; Gillenwater et al. 2021, "Differentially private quantiles", §2). Values are
  clipped to a public range ``|x| <= max_abs`` and mapped by the fixed public bijection t = asinh(x),
  so a huge public range costs a few units of t instead of swamping the data. With z_j the clipped,
  transformed values, the output is a point t of ``[asinh(−max_abs), asinh(max_abs)]`` with density
  ∝ ``exp(ε·u(t)/2)``, ``u(t) = −|#{j: z_j < t} − q·n|``. Sensitivity: adding or removing a row moves
  the rank ``#{j: z_j < t}`` by 0 or 1 and q·n by q ≤ 1, so u moves by at most max(q, 1 − q) ≤ 1;
  replacing a row moves the rank by at most 1 with n fixed. So Δu = 1 under both adjacencies and one
  quantile is ε-DP: this is the exponential mechanism over a continuous range with the
  data-independent base measure dt (McSherry & Talwar 2007; Dwork & Roth 2014, Thm. 3.10). The
  interval lengths depend on the data only as the integrals of that density over the pieces where u
  is constant, which the standard analysis of this mechanism covers (Smith 2011; Gillenwater et al.
  2021, §2); ties (zero-length intervals) get probability 0. The level q is post-processing of
  ``num_rows`` and ε (:func:`quantile_level`).
* categories: Gaussian partition selection (Korolova et al. 2009; Gopi et al. 2020). Every observed
  value's count gets ``N(0, (σ·Δ)²)`` with Δ = √K for K columns (a row adds 1 to one count in each
  column; √(2K) under replace-one), and is kept when above ``τ = 1 + σΔ·Φ⁻¹(1 − δ_col)``. A value held
  by a single row survives with probability ≤ δ_col, which the ledger adds to the run's δ. The
  threshold is public (σ, Δ, δ), so nothing here depends on the number of rows either.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from scipy.special import logsumexp
from scipy.stats import norm

from lightning_dp.data.schema import Column, DataError, Schema
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release

log = logging.getLogger(__name__)

DEFAULT_MAX_ABS = 1e9  # public clipping range |x| <= R of columns without declared bounds
MIN_QUANTILE = 0.01  # never release bounds tighter than the 1% / 99% quantiles
MAX_QUANTILE = 0.25  # beyond this the budget share is too small for useful bounds: refuse


def quantile_intervals(values: np.ndarray, q: float, *, epsilon: float,
                       max_abs: float = DEFAULT_MAX_ABS) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the DP q-quantile mechanism and their log-probabilities (Smith 2011).

    With z_1 <= ... <= z_n the sorted values of asinh(clip(x, −R, R)), z_0 = asinh(−R) and
    z_{n+1} = asinh(R), interval i = [z_i, z_{i+1}] (i = 0..n) holds the points of rank i and is
    chosen with probability ∝ (z_{i+1} − z_i)·exp(ε·u_i/2), u_i = −|i − q·n| (Δu = 1, see the module
    docstring). Ties give zero-length intervals, which get probability 0 (log-probability −inf).
    O(n log n) for the sort, O(n) memory.

    Args:
        values: the private column; NaN are ignored (missing values are not part of the quantile).
        q: quantile level in [0, 1].
        epsilon: ε of this one quantile.
        max_abs: public range R; values are clipped to [−R, R].

    Returns:
        ``(edges, log_prob)``: the n + 2 interval end points in t = asinh(x), shape (n + 2,), and the
        normalised log-probabilities of the n + 1 intervals, shape (n + 1,).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"Quantile level q must be in [0, 1], got {q}.")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"The quantile's epsilon must be a finite number > 0, got {epsilon}.")
    if not (max_abs > 0 and math.isfinite(max_abs)):
        raise ValueError(f"max_abs must be a finite number > 0, got {max_abs}.")
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    end = float(np.arcsinh(max_abs))
    z = np.sort(np.clip(np.arcsinh(x), -end, end))  # (n,); clipped in t, so that no interval is < 0 long
    edges = np.concatenate([[-end], z, [end]])  # (n + 2,)
    n = len(z)
    with np.errstate(divide="ignore"):
        log_length = np.log(np.diff(edges))  # (n + 1,); −inf on ties
    utility = -np.abs(np.arange(n + 1) - q * n)  # (n + 1,), Δu = 1
    logits = log_length + (epsilon / 2.0) * utility
    return edges, logits - logsumexp(logits)


def _gumbel_argmax(log_prob: np.ndarray, generator: torch.Generator) -> int:
    """Index drawn with probability exp(log_prob) by the Gumbel-max trick (no underflow), as in
    ``mechanisms.exponential_mechanism``, with the uniforms from the run's ``generator``."""
    u = torch.rand(log_prob.shape, generator=generator, dtype=torch.float64, device=generator.device).cpu()
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
    return int(torch.argmax(torch.from_numpy(log_prob) + gumbel))


def dp_quantile(values: np.ndarray, q: float, *, epsilon: float, generator: torch.Generator,
                max_abs: float = DEFAULT_MAX_ABS) -> float:
    """ε-DP q-quantile of ``values``: an interval from :func:`quantile_intervals`, a point uniform in it.

    The point is uniform in t = asinh(x) inside the chosen interval and mapped back with sinh, so the
    result is finite and lies in [−max_abs, max_abs].
    """
    edges, log_prob = quantile_intervals(values, q, epsilon=epsilon, max_abs=max_abs)
    i = _gumbel_argmax(log_prob, generator)
    u = float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))
    t = edges[i] + u * (edges[i + 1] - edges[i])
    return float(np.clip(math.sinh(t), -max_abs, max_abs))


def quantile_level(epsilon: float, num_rows: float, *, beta: float = 0.05,
                   max_abs: float = DEFAULT_MAX_ABS) -> float:
    """Quantile level q of the DP bounds: ``max(0.01, c/(ε·num_rows))``, post-processing of public values.

    The lower bound must not land outside the data, i.e. in the outer interval [asinh(−R), z_1] (its
    length is at most L = 2·asinh(R) ≈ 42.8 for R = 1e9) that holds rank 0 at utility −q·n; the same
    holds for the upper bound and [z_n, asinh(R)] by symmetry. Near the
    target rank m = q·n the intervals are about s = w/n long, where w is the width in t of the data per
    unit of quantile level there, and the rank error is two-sided geometric with ratio e^{−ε/2} (mean
    ≈ 2/ε), so the mass within the data is at least ≈ s·Σ_j e^{−ε|j|/2} ≈ 4s/ε. Hence (the utility
    argument of the exponential mechanism, Dwork & Roth 2014, Thm. 3.11, with the base measure dt)

        P(bound outside the data) <= L·e^{−ε·m/2} / (4s/ε) = (L·ε·n / (4w))·e^{−ε·m/2},

    which is at most β when ε·m >= c = 2·ln(1/β) + 2·ln(L·ε·n/(4w)). We take w = 1 (the tail of a
    column spans at least a factor e in magnitude; narrower columns, or columns whose q-quantile is
    a tie, such as a mass of zeros, get their bound in the outer interval more often and should have
    declared bounds). At β = 0.05, c ≈ 6 + 2·ln(10.7·ε·n): 19.5 at ε·n = 80 (q = 0.24, about the
    smallest share we accept), 22 at ε·n = 280 (Adult at the default share: q ≈ 0.08), 29 at
    ε·n = 10⁴. The expected rank error, 2/ε, is then a tenth of m or less. ``num_rows`` counts rows,
    so for a column with missing values the target rank is smaller than m and the guarantee weaker.

    Args:
        epsilon: ε of one quantile.
        num_rows: a DP (noisy) or public count of the rows; never the exact count.
        beta: tolerated probability that one bound falls outside the data.
        max_abs: the public range R.

    Returns:
        q >= 0.01; ``inf`` when ``num_rows <= 0``. A value above 0.25 means the share is too small.
    """
    if not math.isfinite(num_rows):
        raise ValueError(f"num_rows must be a finite (noisy or public) row count, got {num_rows}.")
    scale = epsilon * num_rows
    if scale <= 0:
        return math.inf
    c = 2.0 * math.log(1.0 / beta) + 2.0 * max(math.log(2.0 * math.asinh(max_abs) * scale / 4.0), 0.0)
    return max(MIN_QUANTILE, c / scale)


def dp_bounds(values: np.ndarray, q: float, *, epsilon: float, generator: torch.Generator, integer: bool = False,
              max_abs: float = DEFAULT_MAX_ABS) -> tuple[float, float]:
    """DP ``[lower, upper]`` of a column: the q and 1 − q quantiles (each ε-DP), then post-processing.

    The two draws are sorted, rounded outward for integer columns, and widened when equal (by one
    unit for integer columns, by 1e-6 relative otherwise, 1e-6 at zero), so lower < upper and both
    are finite.
    """
    a = dp_quantile(values, q, epsilon=epsilon, generator=generator, max_abs=max_abs)
    b = dp_quantile(values, 1.0 - q, epsilon=epsilon, generator=generator, max_abs=max_abs)
    lo, hi = min(a, b), max(a, b)
    if integer:
        lo, hi = float(math.floor(lo)), float(math.ceil(hi))
        if lo == hi:
            hi = lo + 1.0
    elif not lo < hi:
        pad = 1e-6 * abs(lo) if lo != 0 else 1e-6
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _calibrate_alone(planned, epsilon: float, delta: float) -> float:
    """Noise multiplier for ``planned`` releases spending ``epsilon`` on their own."""
    return PrivacyLedger(target_epsilon=epsilon, delta=delta).calibrate(planned)


def release_schema(
    df: pd.DataFrame,
    schema: Schema,
    ledger: PrivacyLedger,
    *,
    epsilon: float,
    num_rows: float,
    generator: torch.Generator,
    delta_fraction: float = 0.1,
    max_abs: float = DEFAULT_MAX_ABS,
    beta: float = 0.05,
) -> Schema:
    """Fill in the bounds and categories the schema leaves private, spending ``epsilon`` of the ledger.

    The bounds of k columns are 2k exponential-mechanism quantiles, calibrated together to their
    share of ``epsilon`` and recorded as one ``data/bounds`` release of count 2k before any noise is
    drawn. Their level q (:func:`quantile_level`) comes from ``num_rows``, never from ``len(df)``.

    Args:
        df: validated private data (``schema.validate``).
        epsilon: ε share for these releases on their own (e.g. 10% of the run's target).
        num_rows: a DP (noisy) or public count of the rows of ``df``, computed and charged elsewhere.
        generator: the run's privacy-noise generator.
        delta_fraction: share of the run's δ given to partition selection.
        max_abs: public range R: values are clipped to [−R, R] for the bounds.
        beta: tolerated probability that one bound falls outside the data (sets q).

    Returns:
        A complete schema (public facts kept, missing ones DP-released).

    Raises:
        DataError: the share is too small for useful bounds on ``num_rows`` rows (q > 0.25; nothing is
            recorded on the ledger), or partition selection kept too few categories.
    """
    need_bounds = [c for c in schema.columns if c.type == "continuous" and c.bounds is None]
    need_cats = [c for c in schema.columns if c.type == "categorical" and c.categories is None]
    if not need_bounds and not need_cats:
        return schema
    share = epsilon / (int(bool(need_bounds)) + int(bool(need_cats)))
    columns = {c.name: c for c in schema.columns}
    if need_bounds:
        n_em = 2 * len(need_bounds)

        def em(s: float) -> list[Release]:
            return [Release(name="data/bounds", mechanism="exponential", sensitivity=1.0, epsilon=1.0 / s,
                            count=n_em, note="DP quantiles over the intervals between sorted values (Smith 2011)")]

        eps_each = 1.0 / _calibrate_alone(em, share, ledger.delta)
        q = quantile_level(eps_each, num_rows, beta=beta, max_abs=max_abs)
        if q > MAX_QUANTILE:
            names = [c.name for c in need_bounds]
            raise DataError(f"Columns {names} have no declared bounds, and ε={eps_each:.3g} per quantile on "
                            f"about {num_rows:.0f} rows is too little to estimate them with DP (it would take "
                            f"the {q:.0%} quantile). Declare bounds: [lo, hi] for these columns in the schema, "
                            "or raise data.preprocessing_epsilon_fraction / privacy.epsilon.")
        ledger.record(em(1.0 / eps_each)[0])
        for c in need_bounds:
            v = df[c.name].dropna().to_numpy(dtype=float)
            lo, hi = dp_bounds(v, q, epsilon=eps_each, generator=generator, integer=c.integer, max_abs=max_abs)
            columns[c.name] = replace(c, bounds=[lo, hi])
            log.warning("Column %r: bounds [%g, %g] released with DP (the %g and %g quantiles, ε=%.3g each). "
                        "Declare them in the schema to spend nothing on them.", c.name, lo, hi, q, 1 - q, eps_each)
    if need_cats:
        k = len(need_cats)
        sens = math.sqrt(k) if ledger.adjacency == "add_remove" else math.sqrt(2 * k)
        delta_col = delta_fraction * ledger.delta / k

        def gauss(s: float) -> list[Release]:
            return [Release(name="data/categories", mechanism="gaussian", sensitivity=sens, noise_multiplier=s,
                            delta=delta_col * k, note="Gaussian partition selection of category lists")]

        sigma = _calibrate_alone(gauss, share, ledger.delta)
        ledger.record(gauss(sigma)[0])
        std = sigma * sens
        threshold = 1 + std * norm.ppf(1 - delta_col)
        for c in need_cats:
            counts = df[c.name].dropna().astype(str).value_counts()
            noisy = mech.gaussian_noise(torch.tensor(counts.to_numpy(dtype=float)), sensitivity=sens,
                                        noise_multiplier=sigma, generator=generator).numpy()
            kept = sorted(counts.index[noisy > threshold].tolist())
            if len(kept) < (2 if c.name == schema.label else 1):
                raise DataError(f"Column {c.name!r}: DP partition selection kept {len(kept)} categories (threshold "
                                f"{threshold:.1f} rows). The data set is too small for this budget: declare the "
                                "categories in the schema, or raise privacy.epsilon.")
            columns[c.name] = replace(c, categories=kept)
            log.warning("Column %r: %d categories released with DP (threshold %.1f rows); rarer ones are dropped. "
                        "Declare them in the schema to keep all and spend nothing.", c.name, len(kept), threshold)
    return Schema(columns=[columns[c.name] for c in schema.columns], label=schema.label,
                  missing_values=schema.missing_values)


def needs_release(schema: Schema) -> list[Column]:
    """Columns whose bounds or categories are not public."""
    return [c for c in schema.columns
            if (c.type == "continuous" and c.bounds is None) or (c.type == "categorical" and c.categories is None)]
