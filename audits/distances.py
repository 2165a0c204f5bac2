"""Chunked nearest-neighbour distances and a mixed-type tabular encoder for distance-based audits.

The distance-to-closest-record (DCR) between a query set (e.g. 50,000 candidate rows) and a reference set
(e.g. 50,000 synthetic rows) is computed block by block: query rows in chunks of ``query_chunk`` and
reference rows in chunks of ``ref_chunk``, with a running top-k per query row. Peak memory is
O(query_chunk * ref_chunk + n_query * k), never O(n_query * n_ref).

Candidates are *selected* with the matmul form of ``||a||^2 + ||b||^2 - 2 a.b`` (one GEMM per block, see
:func:`nearest_neighbors`), which is fast but loses precision for near-duplicates (exactly the case a
memorisation audit cares about). The returned distances of the selected neighbours are therefore
*recomputed* directly as ``||a - b||`` in float64. The blocks use numpy's BLAS by default: on the AMD CPUs
we run on, torch's MKL float64 GEMM was 2x slower (``backend="torch"`` remains available).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.special import logsumexp
from torch import Tensor

log = logging.getLogger(__name__)
_WARNED_UNSEEN: set[str] = set()  # columns already warned about (categories unseen at fit)

ArrayLike = np.ndarray | Tensor
_TORCH_TO_NUMPY = {torch.float64: np.float64, torch.float32: np.float32}


def _as_array(x: ArrayLike, dtype: Any = None) -> np.ndarray:
    a = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"expected a 2-D array (rows, features), got shape {a.shape}")
    return a if dtype is None else np.ascontiguousarray(a, dtype=dtype)


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise squared Euclidean distances by matmul, clamped at 0.

    Args:
        a: Array of shape (n, D).
        b: Array of shape (m, D).

    Returns:
        Array of shape (n, m) with ``||a_i||^2 + ||b_j||^2 - 2 a_i.b_j``, clamped at 0.
    """
    d = a @ b.T  # (n, m)
    d *= -2.0
    d += np.einsum("nd,nd->n", a, a)[:, None]
    d += np.einsum("md,md->m", b, b)[None, :]
    return np.maximum(d, 0.0, out=d)


def nearest_neighbors(
    query: ArrayLike,
    reference: ArrayLike,
    *,
    k: int = 1,
    query_chunk: int = 2048,
    ref_chunk: int = 8192,
    dtype: Any = np.float64,
    backend: str = "numpy",
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest neighbours (Euclidean) of every query row among the reference rows, in bounded memory.

    The ranking uses ``||q - r||^2 = ||q||^2 + ||r||^2 - 2 q.r``: per query row, the nearest r maximise
    ``q.r - ||r||^2 / 2``, which one GEMM of the augmented rows ``[q, 1]`` and ``[r, -||r||^2 / 2]``
    yields without any elementwise pass over the block.

    Args:
        query: Query rows, shape (n_q, D) (numpy array or CPU tensor).
        reference: Reference rows, shape (n_r, D), with n_r >= k.
        k: Number of neighbours.
        query_chunk: Query rows per block.
        ref_chunk: Reference rows per block. Peak extra memory is about ``query_chunk * ref_chunk``
            elements of ``dtype`` (128 MiB in float64 by default), a (n_r, D + 1) copy of the reference
            and the (n_q, k) outputs.
        dtype: Precision of the candidate *selection*, float64 (default) or float32 (numpy or torch
            dtype); float32 is faster but may mis-order neighbours whose distances agree to ~1e-6
            relative. The returned distances are always recomputed directly in float64.
        backend: ``"numpy"`` (default) or ``"torch"`` for the block matmuls.

    Returns:
        ``(distances, indices)``, both of shape (n_q, k), sorted by increasing distance; ``distances`` are
        float64 Euclidean distances, ``indices`` int64 row indices into ``reference``. Exact ties (e.g.
        duplicated reference rows) are broken arbitrarily.

    Raises:
        ValueError: If the shapes do not match, ``k < 1``, ``k > n_r`` or the backend is unknown.
    """
    if backend not in ("numpy", "torch"):
        raise ValueError(f"backend must be 'numpy' or 'torch', got {backend!r}")
    dt = np.dtype(_TORCH_TO_NUMPY.get(dtype, dtype))
    q, r = _as_array(query), _as_array(reference)
    if q.shape[1] != r.shape[1]:
        raise ValueError(f"query has {q.shape[1]} features but reference has {r.shape[1]}")
    if not 1 <= k <= r.shape[0]:
        raise ValueError(f"k must be in [1, n_reference={r.shape[0]}], got {k}")
    n_q, n_r, dim = q.shape[0], r.shape[0], q.shape[1]
    r_aug = np.empty((n_r, dim + 1), dtype=dt)  # [r, -||r||^2 / 2]
    r_aug[:, :dim] = r
    r_aug[:, dim] = -0.5 * np.einsum("nd,nd->n", r_aug[:, :dim], r_aug[:, :dim])
    idx = np.empty((n_q, k), dtype=np.int64)
    for qs in range(0, n_q, query_chunk):
        q_aug = np.ones((min(query_chunk, n_q - qs), dim + 1), dtype=dt)  # [q, 1]
        q_aug[:, :dim] = q[qs : qs + query_chunk]
        rows = np.arange(q_aug.shape[0])[:, None]
        best_s = np.empty((q_aug.shape[0], 0), dtype=dt)
        best_i = np.empty((q_aug.shape[0], 0), dtype=np.int64)
        for rs in range(0, n_r, ref_chunk):
            rc = r_aug[rs : rs + ref_chunk]  # (cr, D + 1)
            s = (
                (torch.from_numpy(q_aug) @ torch.from_numpy(rc).T).numpy()
                if backend == "torch"
                else q_aug @ rc.T
            )
            kk = min(k, s.shape[1])  # s: (cq, cr), larger = nearer
            if kk == 1:
                ci = s.argmax(1)[:, None]  # (cq, 1)
            else:  # torch.topk returns only the k winners (argpartition would allocate a full index block)
                ci = torch.topk(torch.from_numpy(s), kk, dim=1, sorted=False).indices.numpy()  # (cq, kk)
            cs = s[rows, ci]
            del s  # free the block before the next one is allocated
            ms, mi = np.concatenate([best_s, cs], 1), np.concatenate([best_i, ci + rs], 1)  # running top-k
            order = np.argsort(-ms, axis=1, kind="stable")[:, :k]
            best_s, best_i = ms[rows, order], mi[rows, order]
        idx[qs : qs + q_aug.shape[0]] = best_i
    dist = exact_distances(q, r, idx)
    # the exact recomputation can reorder near-ties: sort once more by the exact values
    order = np.argsort(dist, axis=1, kind="stable")
    return np.take_along_axis(dist, order, 1), np.take_along_axis(idx, order, 1)


def exact_distances(
    query: ArrayLike, reference: ArrayLike, indices: np.ndarray, *, chunk: int = 8192
) -> np.ndarray:
    """Euclidean distances ``||query_i - reference_{indices[i, j]}||`` computed directly in float64.

    Args:
        query: Query rows, shape (n_q, D).
        reference: Reference rows, shape (n_r, D).
        indices: Integer array of shape (n_q, k).
        chunk: Query rows per block (bounds the temporaries).

    Returns:
        Float64 array of shape (n_q, k).
    """
    q, r = _as_array(query), _as_array(reference)
    out = np.empty(indices.shape, dtype=np.float64)
    for s in range(0, q.shape[0], chunk):
        qc = q[s : s + chunk].astype(np.float64)  # (c, D)
        for j in range(indices.shape[1]):
            diff = qc - r[indices[s : s + chunk, j]].astype(np.float64)  # (c, D)
            out[s : s + chunk, j] = np.sqrt(np.einsum("nd,nd->n", diff, diff))
    return out


def distance_to_closest_record(query: ArrayLike, reference: ArrayLike, **kwargs: Any) -> np.ndarray:
    """Distance of every query row to its closest reference row (DCR), shape (n_q,).

    Args:
        query: Query rows, shape (n_q, D).
        reference: Reference rows, shape (n_r, D).
        **kwargs: Chunk sizes, dtype and backend forwarded to :func:`nearest_neighbors`.

    Returns:
        Float64 array of shape (n_q,).
    """
    return nearest_neighbors(query, reference, k=1, **kwargs)[0][:, 0]


def gaussian_kernel_logsumexp(
    query: ArrayLike,
    reference: ArrayLike,
    *,
    gamma: float,
    query_chunk: int = 2048,
    ref_chunk: int = 8192,
) -> np.ndarray:
    """``log sum_j exp(-gamma * ||query_i - reference_j||^2)`` for every query row, in bounded memory.

    The building block of a Gaussian kernel density estimate; a running log-sum-exp over reference blocks
    keeps memory at O(query_chunk * ref_chunk).

    Args:
        query: Query rows, shape (n_q, D).
        reference: Reference rows, shape (n_r, D).
        gamma: Inverse length scale, ``1 / (2 h^2)`` for a Gaussian kernel of bandwidth h.
        query_chunk: Query rows per block.
        ref_chunk: Reference rows per block.

    Returns:
        Float64 array of shape (n_q,).
    """
    q, r = _as_array(query, np.float64), _as_array(reference, np.float64)
    out = np.empty(q.shape[0], dtype=np.float64)
    for qs in range(0, q.shape[0], query_chunk):
        qc = q[qs : qs + query_chunk]  # (cq, D)
        acc = np.full(qc.shape[0], -np.inf)
        for rs in range(0, r.shape[0], ref_chunk):
            logits = squared_distances(qc, r[rs : rs + ref_chunk])  # (cq, cr)
            logits *= -gamma
            acc = np.logaddexp(acc, logsumexp(logits, axis=1))
        out[qs : qs + qc.shape[0]] = acc
    return out


@dataclass
class TabularEncoder:
    """Encode mixed-type DataFrames to a numeric matrix for distances, fitted on one *reference* frame.

    Numeric columns are scaled by the reference frame's statistics (``"minmax"``: (x - min) / (max - min);
    ``"standard"``: (x - mean) / std); a constant column is only shifted. Numeric NaN is imputed with the
    reference mean (in scaled units) and, when the reference column had NaN, a 0/1 ``<col>__nan``
    indicator column is added. Categorical columns (object, string, category and bool dtypes, or the
    ``categorical_columns`` given) are one-hot encoded over the reference's categories plus a ``NaN``
    category when the reference had missing values; categories never seen in the reference encode as all
    zeros (logged once per column).

    Example:
        >>> enc = TabularEncoder().fit(real_df)
        >>> x_real, x_syn = enc.transform(real_df), enc.transform(synthetic_df)
    """

    scaling: str = "minmax"
    categorical_columns: Sequence[str] | None = None
    columns_: list[str] = field(default_factory=list, init=False)
    numeric_: dict[str, tuple[float, float, float, bool]] = field(default_factory=dict, init=False)
    categories_: dict[str, list[object]] = field(default_factory=dict, init=False)
    feature_names_: list[str] = field(default_factory=list, init=False)
    slices_: dict[str, slice] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.scaling not in ("minmax", "standard"):
            raise ValueError(f"scaling must be 'minmax' or 'standard', got {self.scaling!r}")

    def fit(self, frame: pd.DataFrame) -> TabularEncoder:
        """Learn column kinds, scales and categories from the reference frame.

        Args:
            frame: The reference frame (e.g. the real training data).

        Returns:
            ``self``.

        Raises:
            ValueError: If a declared categorical column is not in the frame.
        """
        declared = set(self.categorical_columns or ())
        if missing := sorted(declared - set(frame.columns)):
            raise ValueError(f"categorical_columns not in the frame: {missing}")
        self.columns_ = [str(c) for c in frame.columns]
        self.numeric_, self.categories_, self.feature_names_, self.slices_ = {}, {}, [], {}
        for col in self.columns_:
            s = frame[col]
            start = len(self.feature_names_)
            if col in declared or not _is_numeric(s):
                cats = sorted({v for v in s.dropna().unique()}, key=lambda v: (str(type(v)), str(v)))
                if s.isna().any():
                    cats.append(None)  # the NaN category
                self.categories_[col] = cats
                self.feature_names_ += [f"{col}={'NaN' if c is None else c}" for c in cats]
            else:
                v = s.to_numpy(dtype=np.float64, na_value=np.nan)
                lo, hi = np.nanmin(v), np.nanmax(v)
                mean, std = _moments(v)
                shift, scale = (lo, hi - lo) if self.scaling == "minmax" else (mean, std)
                scale = scale if scale > 0 and np.isfinite(scale) else 1.0
                fill = (mean - shift) / scale
                has_nan = bool(np.isnan(v).any())
                self.numeric_[col] = (float(shift), float(scale), float(fill), has_nan)
                self.feature_names_ += [col] + ([f"{col}__nan"] if has_nan else [])
            self.slices_[col] = slice(start, len(self.feature_names_))
        return self

    def check_columns(self, frame: pd.DataFrame) -> None:
        """Raise a ``ValueError`` naming the missing and extra columns if ``frame`` does not match the fit.

        Args:
            frame: Frame to check.

        Raises:
            ValueError: If the encoder is not fitted or the column sets differ.
        """
        if not self.columns_:
            raise ValueError("TabularEncoder is not fitted; call fit(reference_frame) first")
        have = [str(c) for c in frame.columns]
        missing = [c for c in self.columns_ if c not in set(have)]
        extra = [c for c in have if c not in set(self.columns_)]
        if missing or extra:
            raise ValueError(
                f"frame columns do not match the encoder's reference frame: missing {missing}, extra {extra}"
            )

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Encode a frame with the same columns as the reference frame (any order).

        Args:
            frame: Frame to encode.

        Returns:
            Float64 array of shape (len(frame), len(feature_names_)).

        Raises:
            ValueError: If the columns do not match (the message names the missing and extra columns).
        """
        self.check_columns(frame)
        frame = frame.rename(columns=str)
        out = np.zeros((len(frame), len(self.feature_names_)), dtype=np.float64)
        for col in self.columns_:
            sl = self.slices_[col]
            if col in self.numeric_:
                shift, scale, fill, has_nan = self.numeric_[col]
                v = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
                nan = np.isnan(v)
                out[:, sl.start] = np.where(nan, fill, (v - shift) / scale)
                if has_nan:
                    out[:, sl.start + 1] = nan
            else:
                cats = self.categories_[col]
                s = frame[col]
                # int64: pandas stores codes in the smallest integer type (int8 below 128 categories), and
                # sl.start + code would wrap around past 127 encoded columns
                codes = pd.Categorical(s, categories=[c for c in cats if c is not None]).codes.astype(
                    np.int64
                )
                nan = s.isna().to_numpy()
                if None in cats:
                    codes = np.where(nan, len(cats) - 1, codes)
                if int(((codes < 0) & ~nan).sum()) and col not in _WARNED_UNSEEN:
                    _WARNED_UNSEEN.add(col)  # once per column and process: each check re-encodes the frames
                    log.info(  # not a warning: nothing to act on
                        "column %r: some values' categories do not occur in the reference rows the distances "
                        "are fitted on (rare categories); they match no category (all-zero one-hot), so they "
                        "count as different from every category.",
                        col,
                    )
                rows = np.flatnonzero(codes >= 0)
                out[rows, sl.start + codes[rows]] = 1.0
        return out

    def fit_transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Fit on ``frame`` and encode it.

        Args:
            frame: The reference frame.

        Returns:
            The encoded frame, see :meth:`transform`.
        """
        return self.fit(frame).transform(frame)

    def feature_indices(self, columns: Sequence[str]) -> np.ndarray:
        """Encoded feature indices of the given original columns (e.g. the attacker's known columns).

        Args:
            columns: Original column names.

        Returns:
            Int64 array of positions in the encoded matrix.

        Raises:
            ValueError: If a column is unknown to the encoder.
        """
        if unknown := [c for c in columns if c not in self.slices_]:
            raise ValueError(f"columns not in the encoder's reference frame: {unknown}")
        return np.concatenate([np.arange(self.slices_[c].start, self.slices_[c].stop) for c in columns])


def _moments(v: np.ndarray) -> tuple[float, float]:
    """NaN-mean and NaN-std of a column computed on ``v / max|v|`` and scaled back, so that values near the
    float64 limit (1e308) give a finite std instead of an overflow to inf."""
    top = float(np.nanmax(np.abs(v))) if np.isfinite(v).any() else 0.0
    if not np.isfinite(top) or top == 0.0:
        return float(np.nanmean(v)) if top == 0.0 else np.nan, 0.0
    w = v / top
    return float(np.nanmean(w) * top), float(np.nanstd(w) * top)


def _is_numeric(s: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
