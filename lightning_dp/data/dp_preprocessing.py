"""DP release of the schema facts a user did not declare public: bounds and category lists.

Both are charged to the run's ledger before the values are used:
* bounds: two DP quantiles per column with the exponential mechanism over a fixed, data-independent
  grid of candidates (Smith 2011). Utility ``u(c) = −|#{x < c} − q·n|`` changes by at most 1 when a
  row is added, removed or replaced, so Δu = 1 under both adjacencies.
* categories: Gaussian partition selection (Korolova et al. 2009; Gopi et al. 2020). Every observed
  value's count gets ``N(0, (σ·Δ)²)`` with Δ = √K for K columns (a row adds 1 to one count in each
  column; √(2K) under replace-one), and is kept when above ``τ = 1 + σΔ·Φ⁻¹(1 − δ_col)``. A value held
  by a single row survives with probability ≤ δ_col, which the ledger adds to the run's δ.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from scipy.stats import norm

from lightning_dp.data.schema import Column, DataError, Schema
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release

log = logging.getLogger(__name__)


def candidate_grid() -> np.ndarray:
    """Public quantile candidates: 0 and ±m·10^k for m in 1..9.5 (20 mantissas), k in −3..9."""
    mantissas = np.array([1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8, 8.5, 9, 9.5])
    pos = np.concatenate([mantissas * 10.0**k for k in range(-3, 10)])
    return np.unique(np.concatenate([-pos, [0.0], pos]))


def dp_quantile(values: np.ndarray, q: float, *, epsilon: float, generator: torch.Generator,
                grid: np.ndarray | None = None) -> float:
    """ε-DP q-quantile of ``values`` over a public grid (exponential mechanism, Δu = 1).

    Every candidate beyond the data ties (same count), and a wide grid has many of them; a
    data-independent penalty of 2/ε per grid step toward the outside (for q > 1/2; toward the inside
    otherwise) breaks these ties in favour of the tightest bound without changing the sensitivity.
    """
    grid = candidate_grid() if grid is None else grid
    below = np.searchsorted(np.sort(values), grid, side="left")  # #{x < c} per candidate
    steps = np.arange(len(grid)) if q > 0.5 else np.arange(len(grid))[::-1]
    utility = -np.abs(below - q * len(values)) - (2.0 / epsilon) * steps
    return float(grid[mech.exponential_mechanism(torch.from_numpy(utility), epsilon=epsilon, sensitivity=1.0,
                                                 generator=generator)])


def _calibrate_alone(planned, epsilon: float, delta: float) -> float:
    """Noise multiplier for ``planned`` releases spending ``epsilon`` on their own."""
    return PrivacyLedger(target_epsilon=epsilon, delta=delta).calibrate(planned)


def release_schema(
    df: pd.DataFrame,
    schema: Schema,
    ledger: PrivacyLedger,
    *,
    epsilon: float,
    delta_fraction: float = 0.1,
    quantiles: Sequence[float] = (0.01, 0.99),
    generator: torch.Generator,
) -> Schema:
    """Fill in the bounds and categories the schema leaves private, spending ``epsilon`` of the ledger.

    Args:
        df: validated private data (``schema.validate``).
        epsilon: ε share for these releases on their own (e.g. 10% of the run's target).
        delta_fraction: share of the run's δ given to partition selection.
        quantiles: the DP quantiles used as lower and upper bounds.

    Returns:
        A complete schema (public facts kept, missing ones DP-released).
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
            return [Release(name="data/bounds", mechanism="exponential", sensitivity=1.0, epsilon=1.0 / s, count=n_em)]

        eps_each = 1.0 / _calibrate_alone(em, share, ledger.delta)
        ledger.record(em(1.0 / eps_each)[0])
        for c in need_bounds:
            v = df[c.name].dropna().to_numpy(dtype=float)
            lo, hi = (dp_quantile(v, q, epsilon=eps_each, generator=generator) for q in quantiles)
            if not lo < hi:  # post-processing: widen to the next grid point
                grid = candidate_grid()
                hi = float(grid[min(np.searchsorted(grid, lo) + 1, len(grid) - 1)])
            columns[c.name] = replace(c, bounds=[lo, hi])
            log.warning("Column %r: bounds [%g, %g] released with DP (ε=%.3g per quantile). Declare them in the "
                        "schema to spend nothing on them.", c.name, lo, hi, eps_each)
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
