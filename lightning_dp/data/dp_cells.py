"""DP release of the cells of continuous columns (``representation.py``) that the schema does not declare.

One Gaussian release serves every such column: a histogram of each column on a *public* fine grid, from which
the spikes (point masses) and quantile bin edges are read off by post-processing.

Grid of a column with bounds ``[lo, hi]`` (public or DP-released before this release):

* an integer column with at most ``MAX_POINTS`` values: every integer is a point of the grid;
* otherwise: candidate points (the declared spikes, or ``lo``, ``hi`` and 0 when inside the bounds) and
  ``GRID`` intervals whose edges are equally spaced in x and in asinh(x) (the second half resolves heavy tails
  such as money), rounded to integers for integer columns.

A value equal to a point counts for that point, any other value for the interval holding it; a missing value
counts nowhere. Sensitivity: adding or removing a row changes at most one count of each of the K columns by
one, so the L2 sensitivity of the concatenated histogram is √K (replace-one: two counts per column, √(2K)).
Gaussian noise ``N(0, (σ√K)²)`` on every count is the Gaussian mechanism (Dwork & Roth 2014, App. A), recorded
on the ledger as ``data/cells`` before any noise is drawn; σ is calibrated so that this release alone spends its
ε share. The grid, the threshold and the number of bins are public, so everything read from the noisy counts is
post-processing:

* spikes (when not declared): points holding at least ``1/bins`` of the column's noisy mass and 3 noise
  standard deviations, at most ``bins`` of them;
* bins (when not declared as edges): ``k = ⌈bins · rest share⌉`` (at least ``min(4, bins)``) bins cut at the
  noisy quantiles ``j/k`` of the mass outside the spikes, on the grid's cut points; a column whose noisy
  counts are too noisy to place quantiles (total under 4 noise standard deviations of the cumulative sum)
  gets ``k`` equal-width bins instead.

When the released (or public) row count is too small for the noise (``num_rows < 4·σ√K·√GRID``, a public
function of the count, σ and the grid), nothing is released: a column that declares neither spikes nor bins stays
one min-max number (nothing is known of its shape), one that declares some of them gets ``spikes: []`` or
equal-width bins over its bounds (its ``bins: K``, else ``min(bins, 10)``) for the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from lightning_dp.data.encoders import cells_incomplete
from lightning_dp.data.representation import uniform_edges
from lightning_dp.data.schema import Column, Schema
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release

log = logging.getLogger(__name__)

GRID = 64  # intervals of the fine grid (half equally spaced in x, half in asinh(x))
MAX_POINTS = 128  # an integer column with at most this many values has one grid point per value
DEFAULT_BINS = 20  # quantile bins of a column whose schema says neither bins: [edges] nor bins: K
FALLBACK_BINS = 10  # at most this many equal-width bins when the rows are too few for the release


@dataclass(frozen=True)
class Grid:
    """The public fine grid of one column: candidate points and interval edges (either may be empty)."""

    points: np.ndarray  # (P,) sorted
    edges: np.ndarray  # (G + 1,) sorted, or empty when the points cover every value

    @property
    def size(self) -> int:
        return len(self.points) + max(len(self.edges) - 1, 0)

    def counts(self, values: np.ndarray) -> np.ndarray:
        """Histogram of ``values`` (NaN ignored) on the grid: points first, then intervals, shape (size,)."""
        v = np.asarray(values, dtype=float)
        v = v[~np.isnan(v)]
        out = np.zeros(self.size)
        at_point = np.isin(v, self.points)
        np.add.at(out, np.searchsorted(self.points, v[at_point]), 1.0)
        if len(self.edges):
            rest = np.clip(v[~at_point], self.edges[0], self.edges[-1])
            i = np.clip(np.searchsorted(self.edges, rest, side="right") - 1, 0, len(self.edges) - 2)
            np.add.at(out, len(self.points) + i, 1.0)
        return out


def fine_grid(column: Column) -> Grid:
    """The public grid of a continuous column with bounds (module docstring)."""
    lo, hi = column.bounds
    if column.integer and hi - lo + 1 <= MAX_POINTS:
        return Grid(points=np.arange(lo, hi + 1, dtype=float), edges=np.zeros(0))
    if column.spikes is not None:
        points = [float(v) for v in column.spikes if lo <= v <= hi]
    else:
        points = [lo, hi] + ([0.0] if lo < 0 < hi else [])
    half = GRID // 2
    t = np.sinh(np.linspace(np.arcsinh(lo), np.arcsinh(hi), half + 1))
    edges = np.union1d(np.linspace(lo, hi, half + 1), t)
    if column.integer:
        edges = np.unique(np.round(edges))
    edges[0], edges[-1] = lo, hi
    return Grid(points=np.unique(np.asarray(points, dtype=float)), edges=np.unique(edges))


def cells_from_counts(column: Column, grid: Grid, noisy: np.ndarray, *, std: float,
                      bins: int = DEFAULT_BINS) -> tuple[list[float], list[float]]:
    """Spikes and bin edges of one column from its noisy grid counts (post-processing; module docstring).

    Declared spikes or edges are kept as they are.

    Returns:
        ``(spikes, edges)``.
    """
    lo, hi = column.bounds
    c = np.maximum(np.asarray(noisy, dtype=float), 0.0)
    total = float(c.sum())
    n_points = len(grid.points)
    if column.spikes is not None:
        spikes = list(column.spikes)
    else:
        mass = c[:n_points]
        ok = (mass >= total / bins) & (mass >= 3.0 * std) & (total > 0)
        order = np.argsort(-mass)[: min(bins, n_points)]
        spikes = sorted(float(grid.points[i]) for i in order if ok[i])
    if isinstance(column.bins, list):
        return spikes, list(column.bins)
    k_max = int(column.bins) if isinstance(column.bins, int) else bins
    is_spike = np.isin(grid.points, spikes)
    rest = c.copy()
    rest[:n_points][is_spike] = 0.0
    share = float(rest.sum()) / total if total > 0 else 1.0
    k = max(min(4, k_max), min(k_max, math.ceil(k_max * share)))
    if len(grid.edges) == 0:  # one point per integer: cut after any integer
        mass, cuts = rest, grid.points[:-1] + 1.0  # (P,), (P − 1,): cut j lies after point j
    else:  # the points' mass joins the interval holding them
        mass = rest[n_points:].copy()
        i = np.clip(np.searchsorted(grid.edges, grid.points, side="right") - 1, 0, len(grid.edges) - 2)
        np.add.at(mass, i, rest[:n_points])
        cuts = grid.edges[1:-1]
    cumulative = np.cumsum(mass)[:-1]  # (len(cuts),) mass left of each cut
    noise_of_sum = 4.0 * std * math.sqrt(max(len(mass), 1))
    if float(mass.sum()) <= noise_of_sum or len(cuts) == 0:
        return spikes, uniform_edges(lo, hi, k, integer=column.integer)
    targets = np.arange(1, k) / k * float(mass.sum())
    chosen = {float(cuts[int(np.argmin(np.abs(cumulative - t)))]) for t in targets}
    edges = sorted({lo, hi} | {x for x in chosen if lo < x < hi})
    return spikes, edges


def needs_cells(schema: Schema, minmax_columns: Sequence[str] = ()) -> list[Column]:
    """Continuous feature columns of the cells representation whose spikes or bin edges are not public."""
    return [c for c in schema.features if c.name not in minmax_columns and cells_incomplete(c)]


def release_cells(df: pd.DataFrame, schema: Schema, ledger: PrivacyLedger, *, epsilon: float, num_rows: float,
                  generator: torch.Generator, minmax_columns: Sequence[str] = (),
                  bins: int = DEFAULT_BINS) -> tuple[Schema, list[str]]:
    """Fill in the spikes and bin edges the schema leaves private, in one Gaussian release of ``epsilon``.

    Args:
        df: validated private rows (``schema.validate``).
        schema: a schema whose bounds are complete (public or released).
        ledger: the run's ledger; the release is recorded before any noise is drawn.
        epsilon: ε share of this release on its own.
        num_rows: a DP (noisy) or public count of the rows of ``df``; never the exact count.
        generator: the run's privacy-noise generator.
        minmax_columns: columns kept as one min-max number (no cells).
        bins: number of quantile bins of a column that does not say ``bins: K``.

    Returns:
        The schema with ``spikes`` and ``bins`` (edges) on every cells column, and the columns left as one min-max
        number (too few rows, nothing declared).
    """
    todo = needs_cells(schema, minmax_columns)
    if not todo:
        return schema, []
    k = len(todo)
    sens = math.sqrt(k) if ledger.adjacency == "add_remove" else math.sqrt(2 * k)

    def gauss(s: float) -> list[Release]:
        return [Release(name="data/cells", mechanism="gaussian", sensitivity=sens, noise_multiplier=s,
                        note="histograms on public grids for spikes and quantile bins (one count per row and column)")]

    sigma = PrivacyLedger(target_epsilon=epsilon, delta=ledger.delta).calibrate(gauss)
    columns = {c.name: c for c in schema.columns}
    if num_rows < 4.0 * sigma * sens * math.sqrt(GRID):
        fallback, minmax = min(bins, FALLBACK_BINS), []
        for c in todo:
            if c.spikes is None and c.bins is None:
                minmax.append(c.name)
                continue
            k = c.bins if isinstance(c.bins, int) else fallback
            edges = c.bins if isinstance(c.bins, list) else uniform_edges(*c.bounds, k, integer=c.integer)
            columns[c.name] = replace(c, spikes=[] if c.spikes is None else c.spikes, bins=edges)
        log.warning("Columns %s: about %.0f rows are too few for DP spikes and quantile bins at ε=%.3g (nothing "
                    "released); columns that declare neither stay min-max scaled, the others get equal-width bins. "
                    "Declare spikes: [...] and bins: [...] in the schema.", [c.name for c in todo], num_rows, epsilon)
        return Schema(columns=[columns[c.name] for c in schema.columns], label=schema.label,
                      missing_values=schema.missing_values), minmax
    ledger.record(gauss(sigma)[0])
    grids = [fine_grid(c) for c in todo]
    exact = np.concatenate([g.counts(df[c.name].to_numpy(dtype=float)) for c, g in zip(todo, grids, strict=True)])
    noisy = mech.gaussian_noise(torch.from_numpy(exact), sensitivity=sens, noise_multiplier=sigma,
                                generator=generator).numpy()
    offset = 0
    for c, g in zip(todo, grids, strict=True):
        spikes, edges = cells_from_counts(c, g, noisy[offset : offset + g.size], std=sigma * sens, bins=bins)
        offset += g.size
        columns[c.name] = replace(c, spikes=spikes, bins=edges)
        log.info("Column %r: %d spikes and %d bins released with DP; declare spikes: [...] and bins: [...] in the "
                 "schema to spend nothing on them.", c.name, len(spikes), len(edges) - 1)
    return Schema(columns=[columns[c.name] for c in schema.columns], label=schema.label,
                  missing_values=schema.missing_values), []


# ---------------------------------------------------------------- counts before the release (public)
def declared_spikes(column: Column) -> int:
    """How many of the declared spikes become cells (``column_cells`` drops those outside public bounds)."""
    if column.bounds is None:
        return len(column.spikes or [])
    lo, hi = column.bounds
    return sum(lo <= float(v) <= hi for v in column.spikes or [])


def _bins_cap(column: Column, k: int) -> int:
    """At most ``k`` bins; an integer column with public bounds has integer edges (:func:`uniform_edges`' count)."""
    if column.integer and column.bounds is not None:
        return len(uniform_edges(*column.bounds, k, integer=True)) - 1
    return k


def most_cells(column: Column, *, bins: int = DEFAULT_BINS) -> int:
    """The most cells a continuous column can have after :func:`release_cells` with ``bins``, whatever the noise
    and the rows draw: a function of the public schema only, and the exact count when the schema declares the
    spikes, the bin edges and the bounds.

    Released spikes are at most ``min(bins, P)`` (P: the public grid's points, :func:`fine_grid`) and each holds at
    least ``1/bins`` of the column's clipped noisy mass, so ``s`` of them leave a share ``≤ 1 − s/bins`` to the
    bins, whose number is then ``k ≤ max(min(4, K), min(K, ⌈K·share⌉)) ≤ max(min(4, K), min(K, ⌊K(bins − s) /
    bins⌋ + 1))`` (K: the column's ``bins: K`` or ``bins``; the ``+ 1`` also covers rounding of the float share).
    The quantile cuts or equal-width edges give at most ``k`` bins, an integer column's at most ``hi − lo``. The
    bound is the largest ``s + k`` over ``s``, plus the missing cell. Declared spikes leave ``k ≤ K``.
    """
    missing = int(column.missing)
    if isinstance(column.bins, list):
        n_bins = len(column.bins) - 1
        if column.spikes is not None:
            return declared_spikes(column) + n_bins + missing
        return _max_released_spikes(column, bins) + n_bins + missing
    k_max = column.bins if isinstance(column.bins, int) else bins
    if column.spikes is not None:
        return declared_spikes(column) + _bins_cap(column, k_max) + missing
    most = 0
    for s in range(_max_released_spikes(column, bins) + 1):
        k = max(min(4, k_max), min(k_max, k_max * (bins - s) // bins + 1))
        most = max(most, s + _bins_cap(column, k))
    return most + missing


def _max_released_spikes(column: Column, bins: int) -> int:
    """At most ``min(bins, P)`` spikes: P = the integers of a short integer range, else the bounds and 0."""
    if column.bounds is None:  # bounds released first: any range
        points = MAX_POINTS if column.integer else 3
    else:
        lo, hi = column.bounds
        if column.integer and hi - lo + 1 <= MAX_POINTS:
            points = int(hi - lo) + 1
        else:
            points = len({float(lo), float(hi)} | ({0.0} if lo < 0 < hi else set()))
    return min(bins, points)


def cells_without_release(column: Column, *, bins: int = DEFAULT_BINS) -> int | None:
    """The cells a column gets when the rows are too few for :func:`release_cells` (nothing released): None for
    one that declares neither spikes nor bins (it stays one min-max number), else the declared spikes and the
    declared edges or equal-width bins (its ``bins: K``, else ``min(bins, 10)``), plus the missing cell. At most
    that many: an integer column with a short range may get fewer equal-width bins."""
    if column.spikes is None and column.bins is None:
        return None
    spikes = declared_spikes(column) if column.spikes is not None else 0
    if isinstance(column.bins, list):
        n_bins = len(column.bins) - 1
    else:
        n_bins = _bins_cap(column, column.bins if isinstance(column.bins, int) else min(bins, FALLBACK_BINS))
    return spikes + n_bins + int(column.missing)
