"""What an audit reads: synthetic rows, the real training rows (REAL) and a real holdout (HOLDOUT).

* synthetic: a CSV/Parquet file in the user's columns, or a lightning-dp checkpoint, loaded (its whole record
  checked first) with :func:`lightning_dp.checkpoint.load_run` and sampled with
  :func:`lightning_dp.sample.sample_run` (its ledger and config then go into the report);
* REAL and HOLDOUT: CSV/Parquet files, or a data set name (``adult``, ``breast_cancer``, ...), loaded with
  :class:`~lightning_dp.data.datamodule.PrivateDataModule` (``.train_frame`` and ``.holdout``) with the
  checkpoint's data config and released schema, so that nothing is released again.
* an energy model's score: when the checkpoint's model has a ``sensitive_score`` (the score −∇E_ξ(x′) of its
  marginal energy over the sensitive columns x′), :func:`sensitive_score_of` keeps it for the α-LMDP
  goodness-of-fit tests (:mod:`audits.lmdp_checks`).
* importance weights: a ``weight`` column of the synthetic data (the sampler writes it next to the rows) is taken
  out of the rows (:func:`pop_weights`), never compared as a feature, and kept for the report's weights section
  (:mod:`audits.weighted`).

All three frames are brought to one set of column types: numeric columns (the schema's continuous ones, or
those whose REAL values all parse as numbers) as floats, the others as strings (``1.0`` and ``1`` are the
category ``"1"``), missing tokens as NaN. Numbers must be finite; magnitudes beyond :data:`MAX_MAGNITUDE` are
clipped to it (with a warning in the report), so that squares and variances stay finite in float64.

Bad input is an :class:`InputError` whose message names the input, the problem and the fix: a folder given as a
file, a column name repeated in a header, REAL and HOLDOUT holding the same rows (every privacy check would then
pass trivially), a non-number in a numeric column (by its file line: the header is line 1, so row index i is on
line i + 2), too many rows to sample.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from lightning_dp.errors import UserError

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
DEFAULT_MISSING = ("", "?", "NA", "N/A", "NaN", "nan", "null")
MIN_HOLDOUT = 4  # half become non-member candidates, the other half the reference set
MAX_NUM_ROWS = 1_000_000  # rows sampled from a checkpoint at most (--num-rows, or |REAL| by default)
MAX_MAGNITUDE = 1e100  # numbers beyond ±this are clipped to it: their squares would overflow float64
WEIGHT_COLUMN = "weight"  # importance weights the sampler writes next to the synthetic rows (never a feature)


class InputError(UserError, ValueError):
    """The synthetic data, REAL or HOLDOUT cannot be audited; the message says which and why."""


@dataclass(frozen=True)
class SensitiveScore:
    """An energy model's sensitive columns x′ and the score of its x′ marginal.

    Attributes:
        columns: the user's names of the sensitive continuous columns, in the model's order.
        score: ``x -> −∇_x E_ξ(x)``, (n, d′) -> (n, d′), x in model space ((clip(v, lo, hi) − lo) / (hi − lo)
            per column, with the column's bounds); gradients are enabled inside, the output is detached.
        model: the model's name, for the report.
        jitter: per column, the model-space σ of the Gaussian dequantisation the model was trained with (0: none);
            the tests add the same noise to REAL's x′.
        density: whether the energy was fitted as a density of x′; when it was not (PPEM's EBGAN energy), the
            tests reject with or without the penalty and the report says the verdict is vacuous.
    """

    columns: list[str]
    score: Callable[[Tensor], Tensor]
    model: str = ""
    jitter: list[float] = field(default_factory=list)
    density: bool = True


def sensitive_score_of(model: Any, name: str = "") -> SensitiveScore | None:
    """The :class:`SensitiveScore` of a model that has ``sensitive_score`` and ``sensitive_columns``, else None.

    The model is put in eval mode; the score is computed in the model's dtype and device, with gradients enabled
    (it differentiates the marginal energy), and returned detached, on the CPU, in the input's dtype.
    """
    import torch

    method = getattr(model, "sensitive_score", None)
    columns = getattr(model, "sensitive_columns", None)
    if not callable(method) or not columns:
        return None
    if hasattr(model, "eval"):
        model.eval()
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None

    def score(x: Tensor) -> Tensor:
        z = x if param is None else x.to(device=param.device, dtype=param.dtype)
        with torch.enable_grad():
            out = method(z.detach())  # (n, d′)
        return out.detach().to(device="cpu", dtype=x.dtype)

    jitter = [float(v) for v in getattr(model, "sensitive_jitter", None) or [0.0] * len(columns)]
    density = bool(getattr(model, "sensitive_is_density", True))
    return SensitiveScore([str(c) for c in columns], score, name, jitter, density)


@dataclass
class AuditInputs:
    """The three frames of an audit in one set of column types, and where they came from.

    Attributes:
        synthetic: synthetic rows, REAL's columns in REAL's order.
        real: the private training rows (members).
        holdout: real rows never used in training (non-members and reference).
        numeric: numeric columns; all others are categorical.
        label: the label column, if known (schema or ``--label``).
        sources: per input (``synthetic``, ``real``, ``holdout``, ``checkpoint``): path or data set name,
            rows, SHA-256 and what was hashed.
        ledger: the run's ledger (:meth:`PrivacyLedger.to_dict`), when a checkpoint or run is given.
        config: the run's resolved config, likewise.
        bounds: public ``(lower, upper)`` of numeric columns, from the run's schema (empty without one).
        sensitive: the checkpoint's energy-model score over the sensitive columns x′, or None (a file, or a
            model that is not an energy model).
        warnings: what the inputs' checks found worth telling (values clipped, rows shared by REAL and
            HOLDOUT); they go into the report.
        weights: (N,) importance weights of the synthetic rows, from the synthetic data's ``weight`` column
            (:func:`pop_weights`; never a feature), or None.
    """

    synthetic: pd.DataFrame
    real: pd.DataFrame
    holdout: pd.DataFrame
    numeric: list[str]
    label: str | None = None
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    ledger: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    sensitive: SensitiveScore | None = None
    weights: np.ndarray | None = None

    @property
    def categorical(self) -> list[str]:
        return [c for c in self.real.columns if c not in set(self.numeric)]


# ------------------------------------------------------------------------------------------ hashing
def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_frame(frame: pd.DataFrame) -> str:
    """SHA-256 of a frame written as CSV without its index (for rows that are not a file)."""
    return hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()


def _file_source(path: Path, frame: pd.DataFrame) -> dict[str, Any]:
    return {
        "path": str(path),
        "kind": "file",
        "rows": len(frame),
        "columns": frame.shape[1],
        "sha256": sha256_file(path),
        "sha256_of": "file bytes",
    }


def frame_source(what: str, frame: pd.DataFrame, **extra: Any) -> dict[str, Any]:
    """Source record of in-memory rows: their SHA-256 as CSV."""
    return {
        "path": what,
        "rows": len(frame),
        "columns": frame.shape[1],
        "sha256": sha256_frame(frame),
        "sha256_of": "rows as CSV",
        **extra,
    }


# ------------------------------------------------------------------------------------------ reading
def read_frame(path: str | Path, what: str) -> pd.DataFrame:
    """A CSV (all cells as strings) or Parquet file.

    Raises:
        InputError: absent, unreadable, or without rows or columns.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"{what} {str(path)!r} is a folder, not a file. Pass the path of a .csv or .parquet file."
        )
    if not path.is_file():
        raise InputError(f"{what} {str(path)!r} does not exist.")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            frame = pd.read_parquet(path)
            header = [str(c) for c in frame.columns]
        else:
            header = list(pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0])
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError as err:
        raise InputError(f"{what} {str(path)!r} is empty (no header, no rows).") from err
    except Exception as err:  # parser, encoding and Arrow errors alike
        raise InputError(
            f"Could not read {what} {str(path)!r}: {type(err).__name__}: {str(err)[:200]}. "
            "Pass a well-formed CSV (one header line) or a Parquet file."
        ) from err
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise InputError(
            f"{what} {str(path)!r}: the column name(s) {repeated} appear more than once in the file's header "
            "(line 1). Give every column a distinct name."
        )
    return frame


def pop_weights(
    synthetic: pd.DataFrame, real_columns: Any, *, kind: str = ""
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """Take the importance-weight column (``weight``, written by the sampler next to the rows) out of the synthetic
    rows, so that no check uses it as a feature. A ``weight`` column that REAL has too is a feature and stays.

    Returns:
        ``(synthetic without the column, weights)``, or ``(synthetic, None)`` without a weight column.

    Raises:
        InputError: a weight that is missing, not a number, negative or infinite (by line), or all weights zero.
    """
    if WEIGHT_COLUMN not in synthetic.columns or WEIGHT_COLUMN in {str(c) for c in real_columns}:
        return synthetic, None
    raw = synthetic[WEIGHT_COLUMN]
    weights = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(weights) | (weights < 0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"The synthetic data's {WEIGHT_COLUMN!r} column (importance weights) must hold finite numbers >= 0; "
            f"{raw.iloc[first]!r} on {_row_ref(kind, first)} is not ({int(bad.sum())} in all). Fix the weights or "
            "drop the column."
        )
    if not weights.sum() > 0:
        raise InputError(
            f"Every value of the synthetic data's {WEIGHT_COLUMN!r} column is 0: no row has weight."
        )
    return synthetic.drop(columns=[WEIGHT_COLUMN]), weights


def _row_ref(kind: str, index: int) -> str:
    """Where row ``index`` (0-based, after the header) is: a CSV file line (the header is line 1), else a row."""
    return f"line {index + 2}" if kind == "csv" else f"row {index + 1}"


def _file_kind(path: Path) -> str:
    return "parquet" if path.suffix.lower() in (".parquet", ".pq") else "csv"


def _data_set_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from lightning_dp.data.sources import IMAGES, LOADERS

    return tuple(n for n in LOADERS if n not in IMAGES), IMAGES


def _load_data_set(name: str, *, record: dict[str, Any] | None, root: str | None) -> tuple[Any, Any]:
    """``(datamodule, schema)`` of a named data set, split exactly as the run split it.

    With a checkpoint's record the run's data config (split seed, holdout fraction, max_rows, ...) and its
    released schema are used: ``prepare`` then releases nothing. Without one, only data sets whose schema is
    fully public can be loaded (a throwaway ledger proves that nothing was released).
    """
    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.data.dp_preprocessing import needs_release
    from lightning_dp.data.schema import Schema
    from lightning_dp.data.sources import bundled_schema
    from lightning_dp.privacy.ledger import PrivacyLedger
    from lightning_dp.privacy.mechanisms import noise_generator

    tabular, images = _data_set_names()
    if name in images:
        raise InputError(
            f"{name!r} is an image data set; the report audits tabular data only (use "
            "audits.fidelity.image_fidelity for images)."
        )
    run_data = (record or {}).get("config", {}).get("data") or {}
    kwargs = dict(run_data) if run_data.get("name") == name else {"name": name}
    if root is not None:
        kwargs["root"] = root
    state = record["data"] if record and run_data.get("name") == name else None
    if state is None and name != "csv" and needs_release(bundled_schema(name)):
        raise InputError(
            f"The {name!r} schema leaves facts to a DP release: pass the run's checkpoint so that "
            "its released schema is used, or pass REAL and HOLDOUT as files."
        )
    dm = PrivateDataModule(**kwargs)
    throwaway = PrivacyLedger(target_epsilon=1.0, delta=1e-9)
    dm.prepare(throwaway, generator=noise_generator(0), state=state, private_use=True)
    if throwaway.releases:  # prepare releases nothing when the schema is public or given
        raise RuntimeError(f"Loading {name!r} for an audit released {throwaway.releases}; this is a bug.")
    return dm, Schema.from_dict(dm.state_dict()["schema"])


# ------------------------------------------------------------------------------------------ types
def _strip(s: pd.Series, tokens: set[str]) -> pd.Series:
    if s.dtype == object or pd.api.types.is_string_dtype(s):
        s = s.astype(object).where(s.notna(), None)
        s = s.map(lambda v: v.strip() if isinstance(v, str) else v)
        s = s.map(lambda v: np.nan if v is None or (isinstance(v, str) and (v in tokens or v == "")) else v)  # "": empty
    return s


def _categories(s: pd.Series) -> pd.Series:
    """Categories as strings; integral numbers written as integers (``1.0`` and ``1`` -> ``"1"``)."""

    def one(v: Any) -> Any:
        if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
            return np.nan
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        if isinstance(v, (int, float, np.integer, np.floating)):
            return str(int(v)) if float(v).is_integer() else str(v)
        text = str(v)
        try:
            number = float(text)
        except ValueError:
            return text
        return (
            str(int(number))
            if number.is_integer() and text.lstrip("+-").replace(".", "", 1).isdigit()
            else text
        )

    return s.astype(object).map(one)


def _is_numeric(s: pd.Series) -> bool:
    values = s.dropna()
    if pd.api.types.is_bool_dtype(s) or values.empty:
        return False
    return bool(pd.to_numeric(values, errors="coerce").notna().all())


def _check_columns(reference: list[str], frame: pd.DataFrame, what: str, ref_what: str) -> None:
    have = [str(c) for c in frame.columns]
    missing = [c for c in reference if c not in set(have)]
    extra = [c for c in have if c not in set(reference)]
    if missing or extra:
        parts = ([f"lacks {missing}"] if missing else []) + ([f"has extra {extra}"] if extra else [])
        raise InputError(
            f"The columns of {what} and {ref_what} differ: {what} {' and '.join(parts)}. The audit "
            "compares rows column by column; pass files in the same columns."
        )


def normalise(
    synthetic: pd.DataFrame,
    real: pd.DataFrame,
    holdout: pd.DataFrame,
    *,
    schema: Any = None,
    label: str | None = None,
    kinds: dict[str, str] | None = None,
    warnings: list[str] | None = None,
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Check the three frames' columns and give them one set of types.

    Args:
        synthetic, real, holdout: the raw frames.
        schema: the run's :class:`~lightning_dp.data.schema.Schema` (column types, missing tokens), or None
            to infer types from REAL.
        label: the label column (never treated as numeric when types are inferred).
        kinds: per frame, ``"csv"`` (messages give file lines), else rows are counted from 1.
        warnings: a list to which findings worth a line in the report are appended (values clipped to
            :data:`MAX_MAGNITUDE`, rows that HOLDOUT shares with REAL).

    Returns:
        ``({"synthetic", "real", "holdout"}, numeric_columns)``.

    Raises:
        InputError: columns differ (named), too few rows, non-numbers or infinite values in a numeric column
            (by line), or REAL and HOLDOUT holding the same rows.
    """
    kinds = kinds or {}
    warnings = [] if warnings is None else warnings
    names = {"synthetic": "the synthetic data", "real": "REAL", "holdout": "HOLDOUT"}
    frames = {"synthetic": synthetic, "real": real, "holdout": holdout}
    frames = {k: f.rename(columns=str) for k, f in frames.items()}
    columns = list(frames["real"].columns)
    if not columns:
        raise InputError("REAL has no columns.")
    _check_columns(columns, frames["synthetic"], "the synthetic data", "REAL")
    _check_columns(columns, frames["holdout"], "HOLDOUT", "REAL")
    if schema is not None:
        _check_columns(schema.names, frames["real"], "REAL", "the run's schema")
    if label is not None and label not in columns:
        raise InputError(f"The label {label!r} (--label) is not a column of REAL; columns: {columns}.")
    for what, n_min in (("synthetic", 2), ("real", 2), ("holdout", MIN_HOLDOUT)):
        if len(frames[what]) < n_min:
            name = {"synthetic": "The synthetic data", "real": "REAL", "holdout": "HOLDOUT"}[what]
            why = " (half become non-member candidates, half the reference set)" if what == "holdout" else ""
            raise InputError(f"{name} has {len(frames[what])} rows; the audit needs at least {n_min}{why}.")
    tokens = set(schema.missing_values if schema is not None else DEFAULT_MISSING)
    frames = {k: pd.DataFrame({c: _strip(f[c], tokens) for c in columns}) for k, f in frames.items()}
    if schema is not None:
        numeric = [c.name for c in schema.columns if c.type == "continuous"]
    else:
        numeric = [c for c in columns if c != label and _is_numeric(frames["real"][c])]
    out = {}
    for what, f in frames.items():
        cols = {}
        for c in columns:
            if c in numeric:
                cols[c] = _numbers(f[c], c, names[what], kinds.get(what, ""), warnings)
            else:
                cols[c] = _categories(f[c])
        out[what] = pd.DataFrame(cols).reset_index(drop=True)
    _check_disjoint(out["real"], out["holdout"], warnings)
    return out, numeric


def _numbers(values: pd.Series, column: str, what: str, kind: str, warnings: list[str]) -> pd.Series:
    """A numeric column as floats: non-numbers and infinities are errors (by line), huge magnitudes clipped."""
    parsed = pd.to_numeric(values, errors="coerce").astype(float)
    bad = parsed.isna() & values.notna()
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"Column {column!r} is numeric but {what} has non-numeric values "
            f"{[str(v) for v in values[bad].unique()[:5]]} (first on {_row_ref(kind, first)}, of {int(bad.sum())}). "
            "Fix or empty those cells (an empty cell is a missing value)."
        )
    infinite = np.isinf(parsed.to_numpy())
    if infinite.any():
        first = int(np.flatnonzero(infinite)[0])
        raise InputError(
            f"Column {column!r} of {what} has an infinite value on {_row_ref(kind, first)} "
            f"({int(infinite.sum())} in all). The audit needs finite numbers; empty the cell for a missing value."
        )
    huge = np.abs(parsed.to_numpy()) > MAX_MAGNITUDE
    if huge.any():
        first = int(np.flatnonzero(huge)[0])
        warnings.append(
            f"Column {column!r} of {what} has {int(huge.sum())} value(s) beyond ±{MAX_MAGNITUDE:g} (first on "
            f"{_row_ref(kind, first)}), clipped to ±{MAX_MAGNITUDE:g} so that the arithmetic stays finite; check "
            "the data."
        )
        parsed = parsed.clip(-MAX_MAGNITUDE, MAX_MAGNITUDE)
    return parsed


def _check_disjoint(real: pd.DataFrame, holdout: pd.DataFrame, warnings: list[str]) -> None:
    """Refuse a HOLDOUT that holds the same rows as REAL; warn when it shares some of them."""
    hr = pd.util.hash_pandas_object(real, index=False).to_numpy()
    hh = pd.util.hash_pandas_object(holdout, index=False).to_numpy()
    if len(hr) == len(hh) and np.array_equal(np.sort(hr), np.sort(hh)):
        raise InputError(
            f"REAL and HOLDOUT hold the same {len(hr):,} rows. HOLDOUT must be real rows never used in training "
            "(the run's held-out rows): against the training rows themselves every privacy check passes trivially."
        )
    shared = int(np.isin(hh, hr).sum())
    if shared:
        warnings.append(
            f"{shared:,} of HOLDOUT's {len(hh):,} rows ({shared / len(hh):.1%}) also appear in REAL. HOLDOUT should "
            "be rows never trained on; shared rows make the privacy checks look safer than they are, unless the "
            "data hold genuine duplicates."
        )


# ------------------------------------------------------------------------------------------ loading
@contextlib.contextmanager
def _refused_as_input_error() -> Iterator[None]:
    """A checkpoint the loader refuses (``UnsafeConfigError``) is bad input: the same message as an InputError."""
    from lightning_dp.checkpoint import UnsafeConfigError

    try:
        yield
    except UnsafeConfigError as err:
        raise InputError(str(err)) from err


def load_inputs(
    synthetic: str | Path,
    *,
    real: str,
    holdout: str,
    num_rows: int | None = None,
    seed: int = 0,
    data_root: str | None = None,
    label: str | None = None,
) -> AuditInputs:
    """Read (or sample) the synthetic rows, REAL and HOLDOUT for :func:`audits.report.build_report`.

    Args:
        synthetic: a ``.csv``/``.parquet`` file, or a checkpoint (any other suffix).
        real: a file, or a data set name (its ``.train_frame``).
        holdout: a file, or a data set name (its ``.holdout``).
        num_rows: rows to sample from a checkpoint (default: as many as REAL), at most :data:`MAX_NUM_ROWS`.
        seed: latent seed of that sample.
        data_root: folder of the shared data sets (default: the run's ``data.root``).
        label: the label column (default: the schema's).

    Raises:
        InputError: bad files or names, columns that differ, too few rows, an image checkpoint, or a checkpoint
            whose record the loader refuses (an ``UnsafeConfigError``'s message: a planted ``_target_``, ...).
        CheckpointError: an unreadable or foreign checkpoint, or one of an unknown model.
    """
    from lightning_dp.checkpoint import load_checkpoint
    from lightning_dp.data.schema import Schema
    from lightning_dp.privacy.ledger import PrivacyLedger

    synthetic = Path(synthetic)
    check_num_rows(num_rows)
    record = None
    sensitive = None
    sources: dict[str, dict[str, Any]] = {}
    if synthetic.is_dir():
        ckpt = synthetic / "checkpoints" / "last.ckpt"
        hint = f" (a run folder: did you mean {str(ckpt)!r}?)" if ckpt.is_file() else ""
        raise InputError(
            f"SYNTHETIC_OR_CHECKPOINT {str(synthetic)!r} is a folder, not a file{hint}. Pass a .csv/.parquet file of "
            "synthetic rows or a run's checkpoints/last.ckpt."
        )
    if synthetic.suffix.lower() not in TABLE_SUFFIXES:
        from lightning_dp.checkpoint import validate_record

        record = load_checkpoint(synthetic)["lightning_dp"]
        with _refused_as_input_error():  # the whole record, before its data config is used or a model built
            validate_record(record, path=synthetic)
        if record["data"].get("kind") != "tabular":
            raise InputError(
                f"Checkpoint {str(synthetic)!r} generates {record['data'].get('kind')} data; the "
                "report audits tabular data only."
            )
        sources["checkpoint"] = {
            "path": str(synthetic),
            "model": record["config"]["model"]["name"],
            "sha256": sha256_file(synthetic),
            "sha256_of": "file bytes",
        }
    schema = Schema.from_dict(record["data"]["schema"]) if record else None
    tabular, images = _data_set_names()
    loaded: dict[str, Any] = {}
    raw: dict[str, pd.DataFrame] = {}
    kinds: dict[str, str] = {}
    for what, arg, attr in (("real", real, "train_frame"), ("holdout", holdout, "holdout")):
        path = Path(arg)
        if path.is_dir():
            raise InputError(
                f"{'REAL' if what == 'real' else 'HOLDOUT'} {arg!r} is a folder, not a file. Pass the path of a "
                ".csv or .parquet file, or a data set name."
            )
        if path.is_file() or path.suffix.lower() in TABLE_SUFFIXES:
            raw[what] = read_frame(path, "REAL" if what == "real" else "HOLDOUT")
            sources[what] = _file_source(path, raw[what])
            kinds[what] = _file_kind(path)
        elif arg in tabular or arg in images:
            if arg not in loaded:
                loaded[arg] = _load_data_set(arg, record=record, root=data_root)
            dm, data_schema = loaded[arg]
            schema = schema or data_schema
            raw[what] = getattr(dm, attr)
            sources[what] = frame_source(f"data set {arg!r} ({attr})", raw[what], kind="data set")
        else:
            raise InputError(
                f"{'REAL' if what == 'real' else 'HOLDOUT'} {arg!r} is neither a file nor a data set "
                f"name; valid names: {', '.join(n for n in tabular if n != 'csv')}."
            )
    files = sources["real"].get("kind") == sources["holdout"].get("kind") == "file"
    if files and sources["real"]["sha256"] == sources["holdout"]["sha256"]:
        same = Path(real).resolve() == Path(holdout).resolve()
        raise InputError(
            f"REAL and HOLDOUT are {'the same file' if same else 'identical files'} ({real!r}). HOLDOUT must be real "
            "rows never used in training (the run's held-out rows): against the training rows themselves every "
            "privacy check passes trivially."
        )
    if record is None:
        raw["synthetic"] = read_frame(synthetic, "The synthetic data")
        sources["synthetic"] = _file_source(synthetic, raw["synthetic"])
        kinds["synthetic"] = _file_kind(synthetic)
    else:
        import torch

        from lightning_dp.checkpoint import load_run
        from lightning_dp.sample import sample_run

        n = num_rows or min(len(raw["real"]), MAX_NUM_ROWS)
        with tempfile.TemporaryDirectory() as tmp, torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the generator's categorical draws use the global RNG: seed it, locally
            with _refused_as_input_error():
                run = load_run(synthetic)
            path = sample_run(run, n, Path(tmp) / "synthetic.parquet", seed=seed)
            raw["synthetic"] = pd.read_parquet(path)
        sensitive = sensitive_score_of(run.model, record["config"]["model"]["name"])
        sources["synthetic"] = frame_source(
            f"{n:,} rows sampled from {synthetic}", raw["synthetic"], kind="checkpoint sample", seed=seed
        )
    raw["synthetic"], weights = pop_weights(
        raw["synthetic"], raw["real"].columns, kind=kinds.get("synthetic", "")
    )
    if weights is not None:
        sources["synthetic"]["weight_column"] = WEIGHT_COLUMN
    label = label or (schema.label if schema is not None else None)
    warnings: list[str] = []
    frames, numeric = normalise(
        raw["synthetic"],
        raw["real"],
        raw["holdout"],
        schema=schema,
        label=label,
        kinds=kinds,
        warnings=warnings,
    )
    ledger = PrivacyLedger.from_state_dict(record["ledger"]).to_dict() if record else None
    return AuditInputs(
        **frames,
        numeric=numeric,
        label=label,
        sources=sources,
        ledger=ledger,
        config=record.get("config") if record else None,
        bounds=schema_bounds(schema),
        warnings=warnings,
        sensitive=sensitive,
        weights=weights,
    )


def schema_bounds(schema: Any) -> dict[str, tuple[float, float]]:
    """Public (or DP-released) ``(lower, upper)`` of the schema's continuous columns that have them."""
    if schema is None:
        return {}
    return {
        c.name: (float(c.bounds[0]), float(c.bounds[1]))
        for c in schema.columns
        if c.type == "continuous" and c.bounds is not None
    }


def check_num_rows(num_rows: int | None) -> None:
    """Refuse a number of rows to sample that is not positive or exceeds :data:`MAX_NUM_ROWS`.

    Raises:
        InputError: with the limit and why it exists.
    """
    if num_rows is None:
        return
    if num_rows <= 0:
        raise InputError(f"--num-rows must be positive, got {num_rows}.")
    if num_rows > MAX_NUM_ROWS:
        raise InputError(
            f"--num-rows {num_rows:,} exceeds the audit's limit of {MAX_NUM_ROWS:,} rows (every check holds the "
            f"synthetic rows in memory, and more rows do not sharpen the verdicts, whose precision is set by the "
            f"real candidates). Pass --num-rows {MAX_NUM_ROWS:,} or fewer."
        )
