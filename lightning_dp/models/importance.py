"""The weighting function w(x) = 1/M(x) of the importance-weighted MMD generators, from plain-data config.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019, Ch. 3): the data come from
MP, a modified (e.g. over-sampled) version of the target P, and row x counts w(x) = 1/M(x) = dP/d(MP) in the
loss. ``model.weights`` gives w in one of these forms (no code, no expressions; only names and numbers):

.. code-block:: yaml

    weights: null                       # w ≡ 1: the unweighted model
    weights:                            # piecewise: w(x) = Π over the listed columns of a factor
      piecewise:
        - {column: age, cuts: [30, 50], values: [1.0, 2.0, 4.0], missing: 1.0}   # (−∞,30) [30,50) [50,∞)
        - {column: sex, categories: [Female], values: [2.0]}                     # others: 1.0
    weights:                            # logistic thinning: w = 1/T(x), T = floor + (1−floor)·σ(b + Σ a·v)
      logistic:
        intercept: 0.0
        floor: 0.05
        terms: [{column: age, coef: 0.05}, {column: sex, category: Male, coef: 1.0}]
    weights:                            # estimated up to a constant by a network (use estimator=sniw)
      estimated: {path: labelled.csv, weight_column: weight, hidden: [32, 32]}

Continuous columns are read in the user's units (the encoder's public bounds undo the [0, 1] scaling); the
label column may be named like any categorical one (class re-balancing). A known w is a function of row i
alone; an estimated w is fitted on labelled rows (a CSV with the data's columns and ``weight_column``) by the
``WeightRefresh`` callback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from lightning_dp.errors import ConfigError

log = logging.getLogger(__name__)

FORMS = ("piecewise", "logistic", "estimated")
EXAMPLE = "e.g. model.weights={piecewise:[{column:NAME,categories:[A],values:[2.0]}]}"


def weight_form(spec: Mapping[str, Any] | None) -> str | None:
    """``None`` (uniform), ``"piecewise"``, ``"logistic"`` or ``"estimated"``.

    Raises:
        ConfigError: not a mapping with exactly one of the forms.
    """
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in FORMS:
        raise ConfigError(f"model.weights must be null or a mapping with exactly one of {', '.join(FORMS)}; got "
                          f"{spec!r} ({EXAMPLE}).")
    return next(iter(spec))


def _number(value: Any, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (positive and not value > 0):
        raise ConfigError(f"{where} must be a {'positive ' if positive else ''}number, got {value!r}.")
    return float(value)


def _numbers(value: Any, where: str, *, positive: bool = False) -> list[float]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where} must be a list of numbers, got {value!r}.")
    return [_number(v, f"{where}[{i}]", positive=positive) for i, v in enumerate(value)]


def _column(schema: Any, name: Any, where: str) -> Any:
    if not isinstance(name, str) or name not in schema.names:
        raise ConfigError(f"{where} names {name!r}, which is not a column of the data; columns: {schema.names}.")
    return schema[name]


def _check_categories(column: Any, categories: Any, where: str) -> list[str]:
    if not isinstance(categories, list | tuple) or not categories:
        raise ConfigError(f"{where}.categories must be a non-empty list of {column.name!r}'s categories.")
    names = [str(c) for c in categories]
    if column.categories is not None:
        unknown = [c for c in names if c not in [str(k) for k in column.categories]]
        if unknown:
            raise ConfigError(f"{where} names categories {unknown} of {column.name!r}; its categories: "
                              f"{column.categories}.")
    return names


def _check_piecewise(entries: Any, schema: Any) -> None:
    if not isinstance(entries, list | tuple) or not entries:
        raise ConfigError(f"model.weights.piecewise must be a non-empty list of per-column factors ({EXAMPLE}).")
    seen = set()
    for i, entry in enumerate(entries):
        where = f"model.weights.piecewise[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping with column and values, got {entry!r}.")
        column = _column(schema, entry.get("column"), where)
        if column.name in seen:
            raise ConfigError(f"{where} names {column.name!r} a second time; give one factor per column.")
        seen.add(column.name)
        values = _numbers(entry.get("values"), f"{where}.values", positive=True)
        allowed = {"column", "values", "missing"} | ({"cuts"} if column.type == "continuous" else {"categories"})
        extra = set(entry) - allowed
        if extra:
            raise ConfigError(f"{where} has unknown keys {sorted(extra)}; for a {column.type} column use "
                              f"{sorted(allowed)}.")
        if "missing" in entry:
            _number(entry["missing"], f"{where}.missing", positive=True)
        if column.type == "continuous":
            cuts = _numbers(entry.get("cuts", []), f"{where}.cuts")
            if any(b <= a for a, b in zip(cuts, cuts[1:])) or len(values) != len(cuts) + 1:
                raise ConfigError(f"{where}: cuts must increase and values have one more entry than cuts (one per "
                                  f"interval); got cuts={cuts}, values={values}.")
        elif len(_check_categories(column, entry.get("categories"), where)) != len(values):
            raise ConfigError(f"{where}: categories and values must have the same length.")


def _check_logistic(spec: Any, schema: Any) -> None:
    where = "model.weights.logistic"
    if not isinstance(spec, Mapping) or set(spec) - {"intercept", "floor", "terms"}:
        raise ConfigError(f"{where} must be a mapping with intercept, floor and terms, got {spec!r}.")
    _number(spec.get("intercept", 0.0), f"{where}.intercept")
    floor = _number(spec.get("floor", 0.05), f"{where}.floor", positive=True)
    if floor > 1:
        raise ConfigError(f"{where}.floor must be in (0, 1] (T = floor + (1 − floor)·σ(...) ≤ 1), got {floor}.")
    terms = spec.get("terms") or []
    if not isinstance(terms, list | tuple):
        raise ConfigError(f"{where}.terms must be a list of {{column, coef[, category]}}, got {terms!r}.")
    for i, term in enumerate(terms):
        at = f"{where}.terms[{i}]"
        if not isinstance(term, Mapping) or set(term) - {"column", "coef", "category"}:
            raise ConfigError(f"{at} must be a mapping with column, coef and (categorical) category, got {term!r}.")
        column = _column(schema, term.get("column"), at)
        _number(term.get("coef"), f"{at}.coef")
        if column.type == "categorical":
            if "category" not in term:
                raise ConfigError(f"{at} names the categorical column {column.name!r}: give the category whose "
                                  "indicator the coefficient multiplies (category: NAME).")
            _check_categories(column, [term["category"]], at)
        elif "category" in term:
            raise ConfigError(f"{at}: {column.name!r} is continuous; drop category.")


def _check_estimated(spec: Any, schema: Any) -> None:
    where = "model.weights.estimated"
    if not isinstance(spec, Mapping) or set(spec) - {"path", "weight_column", "hidden"} or not spec.get("path"):
        raise ConfigError(f"{where} must be a mapping with path (a CSV of labelled rows), weight_column and hidden; "
                          f"got {spec!r}.")
    path = Path(str(spec["path"]))
    if not path.is_file():
        raise ConfigError(f"{where}.path={str(path)!r} does not exist; give a CSV of labelled rows (the data's columns "
                          "and a weight column).")
    header = list(pd.read_csv(path, nrows=0).columns)
    weight_column = spec.get("weight_column", "weight")
    absent = [c for c in [*schema.names, weight_column] if c not in header]
    if absent:
        raise ConfigError(f"{where}.path={str(path)!r} lacks the columns {absent}; it needs the data's columns and "
                          f"the weight column {weight_column!r}.")
    hidden = spec.get("hidden", [32, 32])
    if not isinstance(hidden, list | tuple) or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
        raise ConfigError(f"{where}.hidden must be a list of positive layer widths, got {hidden!r}.")


def check_weights(spec: Mapping[str, Any] | None, schema: Any) -> None:
    """Refuse a weights config that cannot be applied to this (public) schema, before any release.

    Raises:
        ConfigError: the first problem, with the setting and the fix.
    """
    form = weight_form(spec)
    if form is not None and schema is None:
        raise ConfigError("model.weights names columns of a table; this data set is images. Use model.weights=null.")
    if form == "piecewise":
        _check_piecewise(spec["piecewise"], schema)
    elif form == "logistic":
        _check_logistic(spec["logistic"], schema)
    elif form == "estimated":
        _check_estimated(spec["estimated"], schema)


def describe_weights(spec: Mapping[str, Any] | None) -> str:
    """One line for the log: which weights a run uses."""
    form = weight_form(spec)
    if form is None:
        return "uniform (w ≡ 1: no re-weighting; set model.weights to target another distribution)"
    if form == "piecewise":
        return f"known, piecewise on {[e['column'] for e in spec['piecewise']]}"
    if form == "logistic":
        return f"known, 1/T with logistic T on {[t['column'] for t in spec['logistic'].get('terms') or []]}"
    return f"estimated up to a constant by a network fitted on {spec['estimated']['path']}"


class KnownWeights:
    """A known w(x, y) compiled against the run's encoder (public schema): a function of each row alone.

    Args:
        spec: ``model.weights`` of form ``piecewise`` or ``logistic`` (checked by :func:`check_weights`).
        encoder: the run's ``TabularEncoder`` (released bounds and categories).
    """

    def __init__(self, spec: Mapping[str, Any], encoder: Any) -> None:
        self.form = weight_form(spec)
        self.encoder = encoder
        self._continuous = {c.name: j for j, c in enumerate(encoder.continuous)}
        self._blocks: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._indicators: dict[str, int] = {}
        offset = encoder.n_continuous
        for block in encoder.blocks:
            if block.indicator:
                self._indicators[block.column] = offset
            elif not block.cells:
                self._blocks[block.column] = (offset, block.categories)
            offset += block.size
        self.spec = spec[self.form]

    def _value(self, x: Tensor, name: str) -> tuple[Tensor, Tensor]:
        """A continuous column in user units and its missing mask, (B,) each."""
        return self.encoder.column_values(x, name)

    def _category(self, x: Tensor, y: Tensor, name: str) -> tuple[Tensor, tuple[str, ...]]:
        """Category indices (B,) of a categorical column (the label included) and its category names."""
        if name == self.encoder.schema.label:
            return y, tuple(self.encoder.classes)
        offset, categories = self._blocks[name]
        return x[:, offset : offset + len(categories)].argmax(1), categories

    def _lookup(self, x: Tensor, y: Tensor, name: str, named: dict[str, float], default: float) -> Tensor:
        idx, categories = self._category(x, y, name)
        table = torch.tensor([named.get(str(c), default) for c in categories], dtype=x.dtype, device=x.device)
        return table[idx]

    @torch.no_grad()
    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        """w for model-space rows x (B, D) with labels y (B,), shape (B,)."""
        if self.form == "piecewise":
            w = torch.ones(len(x), dtype=x.dtype, device=x.device)
            for entry in self.spec:
                name, values = entry["column"], [float(v) for v in entry["values"]]
                if name in self._continuous:
                    value, missing = self._value(x, name)
                    cuts = torch.tensor([float(c) for c in entry.get("cuts", [])], dtype=x.dtype, device=x.device)
                    factor = torch.tensor(values, dtype=x.dtype, device=x.device)[torch.bucketize(value, cuts, right=True)]
                    factor = torch.where(missing, torch.full_like(factor, float(entry.get("missing", 1.0))), factor)
                else:
                    factor = self._lookup(x, y, name, dict(zip(map(str, entry["categories"]), values)), 1.0)
                w = w * factor
            return w
        logit = torch.full((len(x),), float(self.spec.get("intercept", 0.0)), dtype=x.dtype, device=x.device)
        for term in self.spec.get("terms") or []:
            name, coef = term["column"], float(term["coef"])
            if name in self._continuous:
                value, missing = self._value(x, name)
                logit = logit + coef * torch.where(missing, torch.zeros_like(value), value)  # a missing value adds 0
            else:
                logit = logit + coef * self._lookup(x, y, name, {str(term["category"]): 1.0}, 0.0)
        floor = float(self.spec.get("floor", 0.05))
        return 1.0 / (floor + (1 - floor) * torch.sigmoid(logit))


def load_labelled(spec: Mapping[str, Any], encoder: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The labelled rows of ``weights.estimated`` in model space: ``(x, y, w)``.

    Raises:
        ConfigError: no usable row, or weights that are not positive numbers.
    """
    from lightning_dp.data.schema import validate

    path, column = Path(str(spec["path"])), spec.get("weight_column", "weight")
    frame = pd.read_csv(path)
    rows = validate(frame[encoder.schema.names], encoder.schema, source=f"the labelled rows {str(path)!r}")
    keep = encoder.keep_mask(rows)
    w = pd.to_numeric(frame[column], errors="coerce").to_numpy()[keep]
    if len(w) < 2 or not (w > 0).all():
        raise ConfigError(f"model.weights.estimated: {str(path)!r} needs at least 2 rows with positive numeric "
                          f"{column!r} (known categories only); fix the file.")
    x, y = encoder.transform(rows[keep].reset_index(drop=True))
    return x, y, torch.as_tensor(w, dtype=torch.float32)
