"""Maps user rows to the model space and back, from public (or already DP-released) facts only.

Model space of one row: ``x = [continuous block | one-hot blocks]`` and a label index ``y``; each continuous
column has one number in the continuous block, written one of two ways (the run's ``representation``):

* ``cells`` (the default): the column's cells (spikes, bins, missing; ``representation.py``) are a one-hot
  block and its number is the position inside the cell, so point masses, heavy tails and missingness are
  learned jointly with the other columns and decoded exactly (integers, decimals, bounds);
* ``minmax`` (checkpoints written before cells, and columns a model needs as one number, e.g. PPEM's sensitive
  columns): the value clipped to its bounds and scaled to [0, 1]; if it allows missing values, a 2-way
  ``{observed, missing}`` block (the value imputed with 0).

A categorical column is one-hot; if it allows missing values, ``MISSING`` is its last category. Blocks come in
this order: the minmax columns' missing indicators, the cells of each cells column, the categorical columns.
Every one-hot block has exactly one 1 and the continuous block lies in [0, 1], so ``||x_cat||² = number of
blocks``: the heterogeneous DP-MERF sensitivity relies on this.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from lightning_dp.data.representation import REPRESENTATIONS, Cells, round_within
from lightning_dp.data.schema import Column, DataError, Schema

log = logging.getLogger(__name__)

MISSING = "<missing>"


@dataclass(frozen=True)
class Block:
    """A one-hot block in model space: which column it encodes and its category names."""

    column: str
    categories: tuple[str, ...]
    indicator: bool = False  # the observed/missing block of a minmax continuous column
    cells: bool = False  # the cells of a continuous column (``representation.py``)

    @property
    def size(self) -> int:
        return len(self.categories)


def column_cells(column: Column) -> Cells:
    """The cells of a continuous column whose spikes and bin edges are public or released (``dp_cells.py``).

    Spikes outside the bounds (DP bounds may be tighter than declared spikes) are left out.
    """
    lo, hi = column.bounds
    spikes = tuple(float(v) for v in column.spikes if lo <= float(v) <= hi)
    return Cells(spikes=spikes, edges=tuple(column.bins), missing=column.missing, integer=column.integer,
                 decimals=column.decimals)


def cells_incomplete(column: Column) -> bool:
    """Whether a continuous column still lacks the spikes or bin edges of the cells representation."""
    return column.type == "continuous" and (column.spikes is None or not isinstance(column.bins, list))


class TabularEncoder:
    """Encoder for a complete schema (every continuous column has bounds, every categorical one
    categories, and under ``cells`` every cells column its spikes and bin edges).

    Args:
        schema: the public or released schema.
        representation: ``cells`` or ``minmax`` (module docstring); ``minmax`` is what checkpoints written
            before cells hold.
        minmax_columns: continuous columns kept as one min-max number under ``cells`` (a model's choice).

    Raises:
        DataError: the schema still has columns without public or DP-released bounds/categories/cells.
    """

    def __init__(self, schema: Schema, *, representation: str = "minmax", minmax_columns: tuple[str, ...] = ()) -> None:
        if representation not in REPRESENTATIONS:
            raise DataError(f"data.representation={representation!r}; valid: {', '.join(REPRESENTATIONS)}.")
        incomplete = [c.name for c in schema.columns
                      if (c.type == "continuous" and c.bounds is None) or (c.type == "categorical" and c.categories is None)]
        if incomplete:
            raise DataError(f"Columns {incomplete} have no bounds/categories; release them with DP first.")
        self.schema = schema
        self.representation = representation
        self.continuous = [c for c in schema.features if c.type == "continuous"]
        minmax = set(minmax_columns) if representation == "cells" else {c.name for c in self.continuous}
        self.minmax_columns = tuple(c.name for c in self.continuous if c.name in minmax)
        no_cells = [c.name for c in self.continuous if c.name not in minmax and cells_incomplete(c)]
        if no_cells:
            raise DataError(f"Columns {no_cells} have no spikes/bins; release them with DP first (dp_cells.py).")
        self.cells = {c.name: column_cells(c) for c in self.continuous if c.name not in minmax}
        blocks = [Block(c.name, ("observed", "missing"), indicator=True) for c in self.continuous
                  if c.missing and c.name in minmax]
        blocks += [Block(name, cells.names, cells=True) for name, cells in self.cells.items()]
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
        """Per continuous column, the model-space width of one unit for an integer minmax column (1 / (hi − lo)),
        else 0 (a cells column's unit differs from cell to cell)."""
        return [1.0 / (float(c.bounds[1]) - float(c.bounds[0])) if c.integer and c.name not in self.cells else 0.0
                for c in self.continuous]

    @property
    def continuous_cells(self) -> list[bool]:
        """Per continuous column, whether it is a cells column: its model-space number is the position inside the
        cell that its block holds (``representation.py``), not the value."""
        return [c.name in self.cells for c in self.continuous]

    @property
    def layout(self) -> dict[str, Any]:
        """What a model needs to know about model space (all public): the run's, the checkpoint's and the
        pre-release check's layout of a table."""
        return {"n_continuous": self.n_continuous, "block_sizes": self.block_sizes, "num_classes": self.num_classes,
                "continuous_names": [c.name for c in self.continuous], "continuous_units": self.continuous_units,
                "continuous_cells": self.continuous_cells}

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
        cols, cell_idx = [], {}
        for c in self.continuous:
            v = df[c.name].to_numpy(dtype=float)
            if c.name in self.cells:
                cell_idx[c.name], position = self.cells[c.name].to_cells(v)  # (n,), (n,)
                cols.append(position)
            else:
                lo, hi = c.bounds
                cols.append(np.nan_to_num((np.clip(v, lo, hi) - lo) / (hi - lo), nan=0.0))  # (n,)
        x_con = np.stack(cols, 1) if cols else np.zeros((n, 0))
        onehots = []
        for b in self.blocks:
            s = df[b.column]
            if b.cells:
                idx = cell_idx[b.column]
            elif b.indicator:
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

        Each one-hot block takes its arg-max category; a cells column's value comes from its cell and
        position (``Cells.from_cells``), a minmax column's from [0, 1] and its missing indicator (NaN).
        Integer columns are integers, ``decimals`` are honoured, and values stay inside the bounds.
        """
        x = x.detach().cpu().double().numpy()
        out: dict[str, Any] = {}
        for j, c in enumerate(self.continuous):
            lo, hi = c.bounds
            v = lo + np.clip(x[:, j], 0.0, 1.0) * (hi - lo)
            out[c.name] = round_within(v, lo=lo, hi=hi, decimals=0 if c.integer else c.decimals)
        offset = self.n_continuous
        position = {c.name: x[:, j] for j, c in enumerate(self.continuous)}
        for b in self.blocks:
            idx = x[:, offset : offset + b.size].argmax(1)
            offset += b.size
            if b.cells:
                out[b.column] = self.cells[b.column].from_cells(idx, position[b.column])
            elif b.indicator:
                out[b.column] = np.where(idx == 1, np.nan, out[b.column])
            else:
                out[b.column] = np.asarray(b.categories, dtype=object)[idx]
        if self.schema.label:
            labels = y.detach().cpu().numpy() if y is not None else np.zeros(len(x), dtype=int)
            out[self.schema.label] = np.asarray(self.classes, dtype=object)[labels]
        df = pd.DataFrame({name: out[name] for name in self.schema.names})
        return self._restore_dtypes(df)

    def column_values(self, x: Tensor, name: str) -> tuple[Tensor, Tensor]:
        """A continuous column of model-space rows in user units and its missing mask, (B,) each, decoded as
        :meth:`inverse_transform` decodes it (no gradient)."""
        j = [c.name for c in self.continuous].index(name)
        xs = x.detach().cpu().double().numpy()
        lo, hi = self.continuous[j].bounds
        value = lo + np.clip(xs[:, j], 0, 1) * (hi - lo)  # (B,) minmax
        missing = np.zeros(len(xs), dtype=bool)
        offset = self.n_continuous
        for b in self.blocks:
            if b.column == name and (b.cells or b.indicator):
                idx = xs[:, offset : offset + b.size].argmax(1)
                if b.cells:
                    value = self.cells[name].from_cells(idx, xs[:, j])
                    missing = np.isnan(value)
                    value = np.nan_to_num(value, nan=0.0)
                else:
                    missing = idx == 1
            offset += b.size
        return torch.from_numpy(value).to(x.device, x.dtype), torch.from_numpy(missing).to(x.device)

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
    def representation_state(self) -> dict[str, Any]:
        """What a data state records about the representation (:meth:`from_state_dict` reads it back)."""
        return {"kind": self.representation, "minmax_columns": list(self.minmax_columns)}

    def state_dict(self) -> dict[str, Any]:
        return {"schema": self.schema.to_dict(), "representation": self.representation_state()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TabularEncoder:
        """The encoder of a saved data state; a state without ``representation`` (written before cells) is minmax."""
        rep = state.get("representation") or {"kind": "minmax"}
        columns = rep.get("minmax_columns") if isinstance(rep, dict) else None
        if not isinstance(rep, dict) or not isinstance(columns or [], list) or not all(
                isinstance(c, str) for c in columns or []):
            raise DataError(f"The saved data state's representation {rep!r} is malformed: expected "
                            "{kind: cells|minmax, minmax_columns: [names]}. Use a checkpoint written by train.py.")
        return cls(Schema.from_dict(state["schema"]), representation=str(rep.get("kind")),
                   minmax_columns=tuple(columns or ()))
