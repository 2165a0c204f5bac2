"""What a row *is*, independent of how its file was written: canonical values after parsing against the schema.

A file's cell text and dtype depend on other rows: pandas writes every ``79`` of a column as ``79.0`` once one
cell of it is missing, and Parquet stores an integer column as float64 once one row holds a fraction or a null.
Anything that must be a function of a row alone (the held-out split, the ``max_rows`` subsample, the data set's
fingerprint in the budget registry) therefore hashes the row's *canonical* values, never the cells as read:

* a continuous value is the float64 it parses to, with one zero (``-0.0`` is ``0.0``);
* a category is the schema's string for it (``validate`` writes integral numbers as ``"1"``, not ``"1.0"``);
* a missing cell is one token, whatever the file used to mark it.

Two files that hold the same values under the same schema give the same canonical rows, in any format, dtype or
export style, so adding a row can change nothing about another row's fate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lightning_dp.data.schema import Schema, validate

MISSING = "\x00<missing>"  # a categorical cell that is missing (no schema string starts with NUL)


def canonical_frame(rows: pd.DataFrame, schema: Schema, *, validated: bool = False) -> pd.DataFrame:
    """The rows' canonical values, one column per schema column in schema order.

    Args:
        rows: the rows as read (any dtype, any missing-value token of the schema) or, with ``validated``,
            the output of :func:`lightning_dp.data.schema.validate`.
        schema: the public schema the rows are parsed against.
        validated: skip parsing (``rows`` are already validated).

    Returns:
        A frame of float64 columns (continuous, NaN for missing, no ``-0.0``) and object columns of strings
        (categorical, :data:`MISSING` for missing), indexed 0..n−1.

    Raises:
        DataError: the rows do not match the schema (from ``validate``).
    """
    frame = rows if validated else validate(rows, schema, source="the rows")
    columns: dict[str, np.ndarray] = {}
    for col in schema.columns:
        s = frame[col.name]
        if col.type == "continuous":
            v = pd.to_numeric(s).to_numpy(dtype=np.float64, na_value=np.nan)  # (n,)
            columns[col.name] = np.where(np.isnan(v), np.nan, v) + 0.0  # one NaN bit pattern; -0.0 + 0.0 is 0.0
        else:
            columns[col.name] = s.astype(object).where(s.notna(), MISSING).astype(str).to_numpy(dtype=object)  # (n,)
    return pd.DataFrame(columns, columns=schema.names)


def row_digests(canonical: pd.DataFrame | np.ndarray) -> np.ndarray:
    """An unkeyed 64-bit digest per row of canonical values (pandas' row hash, dtype-exact), shape (n,).

    ``canonical`` is the output of :func:`canonical_frame`, or an array whose first axis is rows (images:
    canonical pixels and label, see :func:`canonical_images`).
    """
    if isinstance(canonical, np.ndarray):
        canonical = pd.DataFrame(canonical.reshape(len(canonical), -1))
    return pd.util.hash_pandas_object(canonical, index=False, categorize=False).to_numpy(dtype=np.uint64)


def canonical_images(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Canonical image rows: pixels in [0, 1] quantised to 1/65535 (uint16) and the label, shape (N, HW + 1).

    Pixels reach the data module as float32 in [0, 1] from 8-bit files (k/255) or from float files; rounding
    to 16 bits makes the value a function of the pixel alone, whatever dtype and float rounding the file used.
    """
    pixels = np.rint(np.clip(images.reshape(len(images), -1), 0.0, 1.0) * 65535.0).astype(np.uint16)  # (N, HW)
    return np.concatenate([pixels.astype(np.int64), labels.reshape(-1, 1).astype(np.int64)], axis=1)  # (N, HW+1)
