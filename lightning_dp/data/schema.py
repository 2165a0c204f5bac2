"""Tabular schemas: which columns exist, their types, and the public facts about them.

A schema file (YAML) is what the data owner declares public:

.. code-block:: yaml

    label: income                 # optional: the column a conditional generator conditions on
    missing_values: ["?"]         # tokens read as a missing value
    columns:
      - {name: age, type: continuous, bounds: [17, 90], integer: true}
      - {name: capital-gain, type: continuous, bounds: [0, 99999], integer: true, spikes: [0]}
      - {name: premium, type: continuous, bounds: [0, 5000], decimals: 2, bins: [0, 500, 1000, 2000, 5000]}
      - {name: workclass, type: categorical, categories: [Private, State-gov], missing: true}
      - {name: income, type: categorical, categories: ["<=50K", ">50K"]}

Keys of a column:

* ``type``: ``continuous`` or ``categorical``.
* ``bounds: [lo, hi]`` (continuous): the public range; values outside it are refused.
* ``categories: [...]`` (categorical): the public category list.
* ``missing: true``: missing values are allowed and modelled (jointly with the other columns).
* ``integer: true`` (continuous): values are integers; samples are integers.
* ``decimals: N`` (continuous): samples are rounded to N decimal places (money in cents: ``decimals: 2``).
* ``spikes: [v, ...]`` (continuous): values that carry a mass of their own (a 0 in a money column, a top code);
  each gets its own cell in model space (``representation.py``). ``spikes: []`` declares that there are none.
* ``bins: [e_0, ..., e_k]`` (continuous): public bin edges from the lower to the upper bound (integers for an
  integer column); ``bins: K`` asks for K quantile bins released with DP.

Bounds or categories left out are *not* public: the run estimates them with DP and charges the
ledger (see ``dp_preprocessing.py``); so are spikes and bins left out under the default ``cells``
representation (``dp_cells.py``: one Gaussian release for all columns).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from lightning_dp.data.representation import check_edges
from lightning_dp.errors import UserError

log = logging.getLogger(__name__)

KINDS = ("continuous", "categorical")
CELL_KEYS = ("decimals", "spikes", "bins")  # left out of a schema's dict when not set (older data states)


class DataError(UserError, ValueError):
    """The data does not match its schema; the message says where and how to fix it."""


@dataclass
class Column:
    """One column of a tabular data set.

    Attributes:
        name: column name in the user's file.
        type: ``"continuous"`` or ``"categorical"``.
        bounds: public ``[lower, upper]`` of a continuous column, or ``None`` (estimated with DP).
        categories: public category list of a categorical column, or ``None`` (estimated with DP).
        missing: whether missing values are allowed (and modelled).
        integer: continuous values are integers (samples are rounded).
        decimals: continuous samples are rounded to this many places (``None``: not rounded).
        spikes: public point masses of a continuous column (``None``: found with DP under ``cells``).
        bins: public bin edges of a continuous column, or the number of DP quantile bins (``None``: the default).
    """

    name: str
    type: str
    bounds: list[float] | None = None
    categories: list[str] | None = None
    missing: bool = False
    integer: bool = False
    decimals: int | None = None
    spikes: list[float] | None = None
    bins: list[float] | int | None = None

    def __post_init__(self) -> None:
        if self.type not in KINDS:
            raise DataError(f"Column {self.name!r}: unknown type {self.type!r}; use one of {', '.join(KINDS)}.")
        if self.bounds is not None:
            try:
                lo, hi = (float(b) for b in self.bounds)
            except (TypeError, ValueError):
                raise DataError(f"Column {self.name!r}: bounds must be two numbers [lower, upper], got "
                                f"{self.bounds!r}.") from None
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise DataError(f"Column {self.name!r}: bounds must be finite with lower < upper, got {self.bounds!r}. "
                                "Give the public range, or leave bounds out to release them with DP.")
            self.bounds = [lo, hi]
        if self.categories is not None:
            self.categories = [str(c) for c in self.categories]
            if len(set(self.categories)) != len(self.categories):
                raise DataError(f"Column {self.name!r}: the category list has duplicates.")
        self._check_cells()

    def _check_cells(self) -> None:
        """``decimals``, ``spikes`` and ``bins``: only on continuous columns, consistent with bounds and integer."""
        given = [k for k in ("decimals", "spikes", "bins") if getattr(self, k) is not None]
        if given and self.type != "continuous":
            raise DataError(f"Column {self.name!r}: {', '.join(given)} apply to continuous columns only.")
        if self.decimals is not None:
            if isinstance(self.decimals, bool) or not isinstance(self.decimals, int) or not 0 <= self.decimals <= 12:
                raise DataError(f"Column {self.name!r}: decimals must be a whole number of places from 0 to 12, got "
                                f"{self.decimals!r}.")
            if self.integer and self.decimals != 0:
                raise DataError(f"Column {self.name!r} is integer: drop decimals: {self.decimals}, or integer: true.")
        if self.spikes is not None:
            try:
                spikes = sorted({float(v) for v in self.spikes})
            except (TypeError, ValueError):
                raise DataError(f"Column {self.name!r}: spikes must be a list of numbers, got {self.spikes!r}.") from None
            lo, hi = self.bounds or (-math.inf, math.inf)
            bad = [v for v in spikes if not (math.isfinite(v) and lo <= v <= hi) or (self.integer and v != round(v))]
            if bad:
                raise DataError(f"Column {self.name!r}: spikes {bad} are not {'integers ' if self.integer else ''}"
                                f"inside the bounds {self.bounds}. Fix them or the bounds.")
            self.spikes = spikes
        if isinstance(self.bins, bool) or not (self.bins is None or isinstance(self.bins, int | list)):
            raise DataError(f"Column {self.name!r}: bins must be a list of edges or a number of DP quantile bins, "
                            f"got {self.bins!r}.")
        if isinstance(self.bins, int) and not 1 <= self.bins <= 1000:
            raise DataError(f"Column {self.name!r}: bins: {self.bins} must be from 1 to 1000.")
        if isinstance(self.bins, list):
            try:
                edges = [float(v) for v in self.bins]
            except (TypeError, ValueError):
                raise DataError(f"Column {self.name!r}: bins must be numbers, got {self.bins!r}.") from None
            if self.bounds is None and len(edges) >= 2:
                self.bounds = [edges[0], edges[-1]]
            why = check_edges(edges, lo=self.bounds[0], hi=self.bounds[1], integer=self.integer) if self.bounds else (
                "bins must be at least two increasing edges")
            if why:
                raise DataError(f"Column {self.name!r}: {why} (got bins: {self.bins!r}).")
            self.bins = edges


@dataclass
class Schema:
    """The public description of a tabular data set."""

    columns: list[Column]
    label: str | None = None
    missing_values: list[str] = field(default_factory=lambda: ["?", ""])

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise DataError(f"The schema lists these columns twice: {dupes}.")
        if self.label is not None:
            if self.label not in names:
                raise DataError(f"The schema's label {self.label!r} is not one of its columns {names}.")
            if self[self.label].type != "categorical":
                raise DataError(f"The label {self.label!r} must be categorical.")

    def __getitem__(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def features(self) -> list[Column]:
        """All columns but the label."""
        return [c for c in self.columns if c.name != self.label]

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "missing_values": list(self.missing_values),
                "columns": [{k: v for k, v in asdict(c).items() if v is not None or k not in CELL_KEYS}
                            for c in self.columns]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schema:
        cols = d.get("columns")
        if isinstance(cols, dict):  # {name: {...}} form
            cols = [{"name": k, **(v or {})} for k, v in cols.items()]
        if not cols:
            raise DataError("A schema needs a non-empty 'columns' list.")
        try:
            columns = [Column(**c) for c in cols]
        except TypeError as err:
            raise DataError(f"Bad column entry in the schema: {err}. Valid keys: name, type, bounds, "
                            "categories, missing, integer, decimals, spikes, bins.") from err
        return cls(columns=columns, label=d.get("label"), missing_values=list(d.get("missing_values", ["?", ""])))

    @classmethod
    def from_yaml(cls, path: str | Path) -> Schema:
        path = Path(path)
        if path.is_dir():
            raise DataError(f"data.schema={str(path)!r} is a folder; pass the path of a YAML schema file.")
        if not path.is_file():
            raise DataError(f"Schema file {str(path)!r} does not exist. Pass data.schema=PATH to a YAML schema.")
        try:
            d = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise DataError(f"Schema file {str(path)!r} is not valid YAML ({str(err).splitlines()[0]}). Fix it; "
                            "lightning_dp/data/schema.py shows the format.") from err
        if not isinstance(d, dict):
            raise DataError(f"Schema file {str(path)!r} must be a mapping with 'columns' (and optionally 'label', "
                            f"'missing_values'), not a {type(d).__name__}.")
        try:
            return cls.from_dict(d)
        except DataError as err:
            raise DataError(f"{path.name}: {err}") from err


def _row_list(index: Sequence[Any], limit: int = 8) -> str:
    """File line numbers of frame rows (the header is line 1, so row index i is on line i + 2)."""
    rows = [str(int(i) + 2) if isinstance(i, int | np.integer) else str(i) for i in list(index)[:limit]]
    more = f" and {len(index) - limit} more" if len(index) > limit else ""
    return ", ".join(rows) + more


def _canonical_categories(s: pd.Series) -> pd.Series:
    """Write integral numbers the same way (``1.0`` and ``1`` are the category ``"1"``)."""
    num = pd.to_numeric(s, errors="coerce")
    integral = num.notna() & (num == num.round())
    if integral.any():
        s = s.copy()
        s[integral] = num[integral].astype("int64").astype(str)
    return s


def validate(df: pd.DataFrame, schema: Schema, *, source: str = "the data") -> pd.DataFrame:
    """Check ``df`` against ``schema`` and return it with missing tokens as NaN and numbers parsed.

    Raises:
        DataError: unknown or absent columns, non-numeric values in a continuous column, or missing
            values where the schema does not allow them. The message names columns and rows.
    """
    unknown = [c for c in df.columns if c not in schema.names]
    absent = [c for c in schema.names if c not in df.columns]
    if unknown or absent:
        parts = []
        if unknown:
            parts.append(f"columns not in the schema: {unknown}")
        if absent:
            parts.append(f"schema columns missing from the file: {absent}")
        raise DataError(f"{source} does not match the schema ({'; '.join(parts)}). Add the columns to the "
                        "schema file, or drop them from the data.")
    out = df[schema.names].copy()
    tokens = set(schema.missing_values)
    for col in schema.columns:
        s = out[col.name]
        if s.dtype == object or pd.api.types.is_string_dtype(s):
            s = s.astype("string").str.strip()
            s = s.mask(s.isin(tokens))
            empty = s.notna() & (s == "")
            if empty.any():
                raise DataError(f"Column {col.name!r} has empty cells in {source} on lines {_row_list(s.index[empty])}, "
                                f"and the schema's missing_values {sorted(tokens)} do not include the empty string. "
                                "Fill them, or add \"\" to missing_values (with missing: true on the column).")
        if col.type == "continuous":
            parsed = pd.to_numeric(s, errors="coerce")
            bad = parsed.isna() & s.notna()
            if bad.any():
                examples = [repr(v) for v in s[bad].unique()[:5]]
                raise DataError(f"Column {col.name!r} is continuous but {source} has non-numeric values "
                                f"{examples} on lines {_row_list(s.index[bad])}. Fix those cells, declare the "
                                "column categorical, or add the token to the schema's missing_values.")
            s = parsed.astype(float)
            infinite = s.notna() & ~np.isfinite(s)
            if infinite.any():
                raise DataError(f"Column {col.name!r} has infinite values in {source} on lines "
                                f"{_row_list(s.index[infinite])}. Fix those cells (or mark them missing).")
            if col.bounds is not None:
                outside = s.notna() & ((s < col.bounds[0]) | (s > col.bounds[1]))
                if outside.any():
                    raise DataError(f"Column {col.name!r} has values outside its public bounds {col.bounds} in "
                                    f"{source} on lines {_row_list(s.index[outside])}. Widen the bounds in the "
                                    "schema or fix those cells; nothing is clipped silently.")
        else:
            s = _canonical_categories(s.astype("string").astype(object).where(s.notna(), np.nan))
        missing = s.isna()
        if missing.any() and not col.missing:
            raise DataError(f"Column {col.name!r} has missing values in {source} (lines "
                            f"{_row_list(s.index[missing])}) but the schema does not allow them. Set "
                            f"'missing: true' for {col.name!r} to model them, or clean those rows.")
        if col.type == "categorical" and col.categories is not None:
            outside = s.notna() & ~s.isin(col.categories)
            if outside.any():
                examples = [repr(v) for v in s[outside].unique()[:5]]
                raise DataError(f"Column {col.name!r} has categories {examples} that the schema does not list, on "
                                f"lines {_row_list(s.index[outside])} of {source}. Add them to the schema's categories "
                                "or fix those cells.")
        out[col.name] = s
    return out
