"""Row assignment that keeps the guarantee on the user's whole file: a keyed hash of each row's canonical values.

A split that permutes ``range(n)`` moves many rows when one row is added (about 57 of 455 for breast
cancer), so the training set of ``D`` and of ``D + one row`` differ in dozens of rows and a mechanism
that is ε-DP on the training set is no longer ε-DP on the file (measured: ε ≥ 1.97 for a run claiming 1).
Hashing the cells *as read* is not enough either: a cell's text and dtype depend on other rows (one missing
age makes pandas write every ``79`` as ``79.0``; one fraction turns a Parquet int64 column into float64),
which moved about 190 of 500 rows (measured: ε ≥ 1.66 for a claim of 1 on Parquet).

Here a row's fate depends on the row alone: ``u(x) = H_k(c(x)) / 2⁶⁴`` with ``c(x)`` the row's canonical
values (``canonical.py``: parsed against the public schema, numbers as float64, categories as the schema's
strings, one missing token), ``H_k`` a keyed SipHash and ``k`` a public key (from the split seed and the
purpose). Row x goes to the holdout when ``u(x) < f``. Adding or removing a row therefore changes the
training set by at most that row, so a mechanism that is (ε, δ)-DP under add/remove on the training set is
(ε, δ)-DP on the file. The same holds for subsampling (``keep`` when ``u'(x) < rate`` with another key), as
long as the rate is public or itself a DP release. Identical rows share their fate, which changes nothing above.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from lightning_dp.data.canonical import row_digests

_SCALE = float(2**64)


def _key(purpose: str, seed: int) -> str:
    """A 16-character hash key (what pandas' SipHash takes) for a purpose and a public seed."""
    return hashlib.sha256(f"lightning-dp/{purpose}/{int(seed)}".encode()).hexdigest()[:16]


def row_uniforms(canonical: pd.DataFrame | np.ndarray, *, purpose: str, seed: int) -> np.ndarray:
    """One number in [0, 1) per row, a keyed hash of that row's canonical values alone.

    Args:
        canonical: canonical rows: :func:`~lightning_dp.data.canonical.canonical_frame` of a table, or
            :func:`~lightning_dp.data.canonical.canonical_images` of images (pixels and label).
        purpose: separates independent uses (``"holdout"``, ``"subsample"``).
        seed: public seed; a different seed gives an independent assignment.

    Returns:
        Array of shape (n,) in [0, 1).
    """
    # pandas keys only its hash of strings, so: an unkeyed 64-bit digest of each row's canonical values, then a
    # keyed SipHash of that number's decimal string
    digests = row_digests(canonical)
    keyed = pd.util.hash_array(digests.astype(str).astype(object), hash_key=_key(purpose, seed), categorize=False)
    return keyed.astype(np.float64) / _SCALE


def holdout_mask(canonical: pd.DataFrame | np.ndarray, *, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the held-out rows: each row independently, with probability ``fraction``."""
    if not 0 <= fraction < 1:
        raise ValueError(f"data.holdout_fraction must be in [0, 1), got {fraction}.")
    return row_uniforms(canonical, purpose="holdout", seed=seed) < fraction


def subsample_mask(canonical: pd.DataFrame | np.ndarray, *, rate: float, seed: int) -> np.ndarray:
    """Boolean mask of the rows kept by a keyed-hash Bernoulli(``rate``) subsample (``rate`` public or DP)."""
    return row_uniforms(canonical, purpose="subsample", seed=seed) < rate
