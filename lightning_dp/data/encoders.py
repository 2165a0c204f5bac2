"""Maps user rows to the model space and back, from public (or already DP-released) facts only.

Model space of one row: ``x = [continuous block | one-hot blocks]`` and a label index ``y``.
* continuous columns are clipped to their bounds and scaled to [0, 1];
* a continuous column that allows missing values gets a 2-way ``{observed, missing}`` one-hot block
  (the value is imputed with 0 in [0, 1] space);
* a categorical column is one-hot; if it allows missing values, ``MISSING`` is its last category.
Every one-hot block has exactly one 1, so ``||x_cat||² = number of blocks``: the heterogeneous
DP-MERF sensitivity relies on this.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from lightning_dp.data.schema import DataError, Schema

log = logging.getLogger(__name__)

MISSING = "<missing>"


@dataclass(frozen=True)
class Block:
    """A one-hot block in model space: which column it encodes and its category names."""

    column: str
    categories: tuple[str, ...]
    indicator: bool = False  # the observed/missing block of a continuous column

    @property
    def size(self) -> int:
        return len(self.categories)


class TabularEncoder:
    """Encoder for a complete schema (every continuous column has bounds, every categorical one
    categories).

    Raises:
        DataError: the schema still has columns without public or DP-released bounds/categories.
    """

    def __init__(self, schema: Schema) -> None:
        incomplete = [c.name for c in schema.columns
                      if (c.type == "continuous" and c.bounds is None) or (c.type == "categorical" and c.categories is None)]
        if incomplete:
            raise DataError(f"Columns {incomplete} have no bounds/categories; release them with DP first.")
        self.schema = schema
        self.continuous = [c for c in schema.features if c.type == "continuous"]
        blocks = [Block(c.name, ("observed", "missing"), indicator=True) for c in self.continuous if c.missing]
        for c in schema.features:
            if c.type == "categorical":
                blocks.append(Block(c.name, tuple(c.categories) + ((MISSING,) if c.missing else ())))
        self.blocks = blocks
        self.classes: tuple[str, ...] = tuple(schema[schema.label].categories) if schema.label else ()

    # ---------------------------------------------------------------- layout
    @property
    def n_continuous(self) -> int:
        return len(self.continuous)

    @property
    def continuous_units(self) -> list[float]:
        """Per continuous column, the model-space width of one unit for an integer column (1 / (hi − lo)), else 0."""
        return [1.0 / (float(c.bounds[1]) - float(c.bounds[0])) if c.integer else 0.0 for c in self.continuous]

    @property
    def block_sizes(self) -> list[int]:
        return [b.size for b in self.blocks]

    @property
    def dim(self) -> int:
        """Width of ``x`` in model space."""
        return self.n_continuous + sum(self.block_sizes)

    @property
    def num_classes(self) -> int:
        """Number of label classes (1 for an unlabelled data set)."""
        return max(len(self.classes), 1)

    # ---------------------------------------------------------------- forward
    def transform(self, df: pd.DataFrame) -> tuple[Tensor, Tensor]:
        """Encode a validated frame. Returns ``x`` (n, dim) float32 and ``y`` (n,) int64.

        Rows whose category is not in the released list must have been dropped (``keep_mask``).
        """
        n = len(df)
        cols = []
        for c in self.continuous:
            lo, hi = c.bounds
            v = df[c.name].to_numpy(dtype=float)
            cols.append(np.nan_to_num((np.clip(v, lo, hi) - lo) / (hi - lo), nan=0.0))  # (n,)
        x_con = np.stack(cols, 1) if cols else np.zeros((n, 0))
        onehots = []
        for b in self.blocks:
            s = df[b.column]
            if b.indicator:
                idx = s.isna().to_numpy().astype(int)
            else:
                lookup = {cat: i for i, cat in enumerate(b.categories)}
                keys = s.astype(object).where(s.notna(), MISSING)
                idx = keys.map(lookup).to_numpy()
                if pd.isna(idx).any():
                    raise DataError(f"Column {b.column!r} has categories outside {list(b.categories)}; "
                                    "drop those rows first (keep_mask) or add them to the schema.")
                idx = idx.astype(int)
            onehot = np.zeros((n, b.size), dtype=np.float32)  # (n, size); no (size, size) identity
            onehot[np.arange(n), idx] = 1.0
            onehots.append(onehot)
        x = np.concatenate([x_con, *onehots], axis=1).astype(np.float32)
        if self.schema.label:
            lookup = {cat: i for i, cat in enumerate(self.classes)}
            y = df[self.schema.label].map(lookup).to_numpy().astype(np.int64)
        else:
            y = np.zeros(n, dtype=np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    def keep_mask(self, df: pd.DataFrame) -> np.ndarray:
        """Rows whose categories are all in the (possibly DP-released) category lists.

        Dropping the other rows is a public function of the data given the released lists, so later
        releases on the kept rows still compose (adaptive composition).
        """
        keep = np.ones(len(df), dtype=bool)
        for c in self.schema.columns:
            if c.type == "categorical":
                s = df[c.name]
                keep &= (s.isna() | s.isin(c.categories)).to_numpy()
        return keep

    # ---------------------------------------------------------------- inverse
    def inverse_transform(self, x: Tensor, y: Tensor | None = None) -> pd.DataFrame:
        """Decode model-space rows into the user's columns, categories and dtypes.

        Continuous values are mapped back from [0, 1] and rounded for integer columns; each one-hot
        block takes its arg-max category; missing indicators give NaN.
        """
        x = x.detach().cpu().double().numpy()
        out: dict[str, Any] = {}
        for j, c in enumerate(self.continuous):
            lo, hi = c.bounds
            v = lo + np.clip(x[:, j], 0.0, 1.0) * (hi - lo)
            out[c.name] = np.round(v) if c.integer else v
        offset = self.n_continuous
        for b in self.blocks:
            idx = x[:, offset : offset + b.size].argmax(1)
            offset += b.size
            if b.indicator:
                out[b.column] = np.where(idx == 1, np.nan, out[b.column])
            else:
                out[b.column] = np.asarray(b.categories, dtype=object)[idx]
        if self.schema.label:
            labels = y.detach().cpu().numpy() if y is not None else np.zeros(len(x), dtype=int)
            out[self.schema.label] = np.asarray(self.classes, dtype=object)[labels]
        df = pd.DataFrame({name: out[name] for name in self.schema.names})
        return self._restore_dtypes(df)

    def _restore_dtypes(self, df: pd.DataFrame) -> pd.DataFrame:
        for c in self.schema.columns:
            s = df[c.name]
            if c.type == "continuous":
                df[c.name] = s.astype("Int64") if c.integer and s.isna().any() else (
                    s.astype("int64") if c.integer else s.astype(float))
            else:
                s = s.where(s != MISSING, np.nan)
                numeric = pd.to_numeric(pd.Series(c.categories), errors="coerce")
                df[c.name] = pd.to_numeric(s) if numeric.notna().all() else s.astype(object)
        return df

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"schema": self.schema.to_dict()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TabularEncoder:
        return cls(Schema.from_dict(state["schema"]))
