"""How a continuous column is written in model space: cells (point masses, bins, missing) and a within-cell position.

A column with spikes ``s_1 < ... < s_m`` (values that carry a mass of their own, such as a capital gain of 0),
bin edges ``e_0 < ... < e_k`` (``e_0, e_k`` its bounds) and, if it allows missing values, a missing cell has
``m + k (+ 1)`` cells in this order. A value lands in exactly one cell:

* a spike cell when it equals a spike (position 0.5, unused);
* otherwise bin ``i`` with ``e_i <= v < e_{i+1}`` (the last bin is closed), at position
  ``(v − e_i) / (e_{i+1} − e_i)`` in [0, 1); an integer column's bin holds the integers of
  ``[e_i, e_{i+1})`` (the last one ``[e_{k−1}, e_k]``) that are not spikes, and its value of rank ``r`` among
  those ``w`` integers sits at position ``(r + 0.5) / w``, so decoding ``floor(p·w)`` gives the value back;
* the missing cell when the value is missing (position 0.5).

Model space then holds a one-hot block over the cells and the position as a continuous number, so a generator
learns the masses of the spikes, the shape of a heavy tail (the bins are quantiles of the data, released with DP
in ``dp_cells.py``, or declared public) and whether the value is missing jointly with every other column, instead
of squeezing all of that into one min-max number (CTGAN's mode-specific normalisation, Xu et al. 2019, "Modeling
tabular data using conditional GAN", §4.2, is the same idea with modes in place of cells).

Decoding (:meth:`Cells.from_cells`) maps a cell and a position back to a value and then honours the schema
exactly: integers for ``integer: true``, ``decimals: N`` places, and the bounds (rounding never leaves them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REPRESENTATIONS = ("cells", "minmax")  # cells: this module; minmax: one number in [0, 1] per column (the old way)
SPIKE_POSITION = 0.5  # the position written for a spike or a missing value (carries nothing)


def round_within(values: np.ndarray, *, lo: float, hi: float, decimals: int | None) -> np.ndarray:
    """Round to ``decimals`` places (``0`` for integers; ``None`` leaves values as they are), then keep them
    inside ``[lo, hi]``: a value rounded past a bound becomes the closest representable value inside it."""
    v = np.clip(np.asarray(values, dtype=float), lo, hi)
    if decimals is None:
        return v
    scale = 10.0**decimals
    v = np.round(v * scale) / scale
    top, bottom = math.floor(hi * scale + 1e-9) / scale, math.ceil(lo * scale - 1e-9) / scale
    return np.clip(v, bottom, top)


@dataclass(frozen=True)
class Cells:
    """The cells of one continuous column (all public or DP-released facts).

    Attributes:
        spikes: values with a cell of their own, sorted.
        edges: bin edges ``e_0 < ... < e_k`` with ``e_0, e_k`` the column's bounds (integers for integer columns).
        missing: whether the last cell is "missing".
        integer: the column holds integers.
        decimals: places values are rounded to at decoding (``None``: not rounded; integer columns: 0).
    """

    spikes: tuple[float, ...]
    edges: tuple[float, ...]
    missing: bool = False
    integer: bool = False
    decimals: int | None = None

    def __post_init__(self) -> None:
        e = np.asarray(self.edges, dtype=float)
        if len(e) < 2 or not np.all(np.diff(e) > 0):
            raise ValueError(f"Bin edges must be at least two increasing numbers, got {list(self.edges)}.")
        if self.integer and not np.all(e == np.round(e)):
            raise ValueError(f"An integer column's bin edges must be integers, got {list(self.edges)}.")

    # ---------------------------------------------------------------- layout
    @property
    def n_bins(self) -> int:
        return len(self.edges) - 1

    @property
    def size(self) -> int:
        """Number of cells: spikes, bins, missing."""
        return len(self.spikes) + self.n_bins + int(self.missing)

    @property
    def names(self) -> tuple[str, ...]:
        """Readable cell names (``=0``, ``[0, 10)``, ``<missing>``)."""
        e = self.edges
        bins = [f"[{e[i]:g}, {e[i + 1]:g}{']' if i == self.n_bins - 1 else ')'}" for i in range(self.n_bins)]
        return tuple([f"={s:g}" for s in self.spikes] + bins + (["<missing>"] if self.missing else []))

    @property
    def _decimals(self) -> int | None:
        return 0 if self.integer else self.decimals

    def _bin_integers(self) -> tuple[np.ndarray, np.ndarray]:
        """Per bin, its first integer and the number of its integers that are not spikes (integer columns)."""
        e = np.asarray(self.edges)
        first = e[:-1]
        last = np.concatenate([e[1:-1] - 1, e[-1:]])  # (k,) inclusive ends
        spikes = np.asarray(self.spikes, dtype=float)
        inside = ((spikes[None, :] >= first[:, None]) & (spikes[None, :] <= last[:, None])).sum(1)  # (k,)
        return first, (last - first + 1) - inside

    # ---------------------------------------------------------------- forward
    def to_cells(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cell index (int64) and within-cell position (float64 in [0, 1]) of each value; NaN is missing.

        Values are clipped to the bounds first (validation refuses values outside declared bounds; DP-released
        bounds may be tighter than the data).

        Raises:
            ValueError: a missing value in a column without a missing cell.
        """
        v = np.asarray(values, dtype=float)
        missing = np.isnan(v)
        if missing.any() and not self.missing:
            raise ValueError("A missing value in a column without a missing cell.")
        e = np.asarray(self.edges)
        v = np.clip(np.where(missing, e[0], v), e[0], e[-1])
        if self.integer:
            v = np.round(v)
        spikes = np.asarray(self.spikes, dtype=float)
        idx = np.zeros(len(v), dtype=np.int64)
        pos = np.full(len(v), SPIKE_POSITION)
        is_spike = np.isin(v, spikes)
        idx[is_spike] = np.searchsorted(spikes, v[is_spike])
        b = np.clip(np.searchsorted(e, v, side="right") - 1, 0, self.n_bins - 1)  # (n,) bin of each value
        if self.integer:
            first, width = self._bin_integers()
            below = (spikes[None, :] >= first[b][:, None]) & (spikes[None, :] < v[:, None])  # spikes skipped
            rank = v - first[b] - below.sum(1)
            p = (rank + 0.5) / np.maximum(width[b], 1)
        else:
            p = (v - e[b]) / (e[b + 1] - e[b])
        bins = ~is_spike
        idx[bins] = len(spikes) + b[bins]
        pos[bins] = np.clip(p[bins], 0.0, 1.0)
        if self.missing:
            idx[missing] = self.size - 1
            pos[missing] = SPIKE_POSITION
        return idx, pos

    # ---------------------------------------------------------------- inverse
    def from_cells(self, idx: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Values of cells ``idx`` at positions ``pos`` (clipped to [0, 1]); NaN for the missing cell.

        Spike cells give the spike; a bin gives ``e_i + p·(e_{i+1} − e_i)`` (an integer column: the non-spike
        integer of rank ``floor(p·w)``), rounded to the column's places and kept inside the bin's and the
        column's bounds.
        """
        idx = np.asarray(idx, dtype=np.int64)
        p = np.clip(np.asarray(pos, dtype=float), 0.0, 1.0)
        e = np.asarray(self.edges)
        m = len(self.spikes)
        out = np.full(len(idx), np.nan)
        is_spike = idx < m
        out[is_spike] = np.asarray(self.spikes, dtype=float)[idx[is_spike]]
        in_bin = (idx >= m) & (idx < m + self.n_bins)
        b = np.clip(idx - m, 0, self.n_bins - 1)
        if self.integer:
            first, width = self._bin_integers()
            rank = np.minimum(np.floor(p * width[b]), np.maximum(width[b] - 1, 0))
            v = first[b] + rank
            for s in sorted(self.spikes):  # skip the spikes inside the bin, in increasing order
                v = v + ((v >= s) & (s >= first[b])).astype(float)
            out[in_bin] = np.clip(v, e[0], e[-1])[in_bin]
        else:
            v = e[b] + p * (e[b + 1] - e[b])
            v = round_within(v, lo=float(e[0]), hi=float(e[-1]), decimals=self.decimals)
            out[in_bin] = np.clip(v, e[b], e[b + 1])[in_bin] if self.decimals is None else v[in_bin]
        return out


def uniform_edges(lo: float, hi: float, k: int, *, integer: bool = False) -> list[float]:
    """``k`` equal-width bins over ``[lo, hi]`` (integer edges, fewer bins if the range is short, for integers)."""
    if integer:
        k = max(1, min(k, int(hi - lo)))
        edges = np.unique(np.round(np.linspace(lo, hi, k + 1)))
    else:
        edges = np.linspace(lo, hi, k + 1)
    return [float(x) for x in edges]


def check_edges(edges: Sequence[float], *, lo: float, hi: float, integer: bool) -> str | None:
    """Why ``edges`` cannot be a column's bins (``None`` when they can)."""
    e = [float(x) for x in edges]
    if len(e) < 2 or any(b <= a for a, b in zip(e, e[1:], strict=False)):
        return "bins must be at least two increasing edges"
    if e[0] != lo or e[-1] != hi:
        return f"the first and last bin edges must be the bounds [{lo:g}, {hi:g}]"
    if integer and any(x != round(x) for x in e):
        return "an integer column's bin edges must be integers"
    return None
