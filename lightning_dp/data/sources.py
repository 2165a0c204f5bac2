"""Where data comes from: bundled data sets, the shared real data sets, and user CSV/Parquet files.

Every loader returns raw frames (tabular) or arrays (images); validation and encoding happen in the
data modules. Nothing here downloads anything.
"""

from __future__ import annotations

import collections
import csv
import gzip
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_dp.data.schema import DataError, Schema

log = logging.getLogger(__name__)

TABULAR = ("breast_cancer", "diabetes", "adult", "cervical", "csv")
IMAGES = ("mnist_test", "digits", "npz")
DEFAULT_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@dataclass
class TabularSource:
    """Raw private rows plus the public schema. ``test`` is a held-out real split, if the source has one."""

    train: pd.DataFrame
    test: pd.DataFrame | None
    schema: Schema
    name: str


@dataclass
class ImageSource:
    """Images in [0, 1], shape (N, H, W), with integer labels; ``classes`` is public."""

    images: np.ndarray
    labels: np.ndarray
    classes: list[str]
    name: str


def bundled_schema(name: str) -> Schema:
    """The schema shipped for a bundled data set."""
    text = resources.files("lightning_dp.data").joinpath(f"schemas/{name}.yaml").read_text()
    import yaml

    return Schema.from_dict(yaml.safe_load(text))


def source_schema(name: str, schema: str | Path | None = None) -> Schema:
    """The schema of a bundled data set: the shipped one, or the user's ``data.schema=PATH`` in its place.

    A user's schema may change any column's keys (spikes, bins, bounds, integer, missing...) and the label, but it
    must name exactly the bundled columns (the files are read by those names).

    Raises:
        DataError: the file cannot be read as a schema, or its column names differ from the data set's.
    """
    shipped = bundled_schema(name)
    if not schema:
        return shipped
    own = Schema.from_yaml(schema)
    missing = [n for n in shipped.names if n not in own.names]
    unknown = [n for n in own.names if n not in shipped.names]
    if missing or unknown:
        raise DataError(f"data.schema={str(schema)!r} must name exactly the {name} columns: missing {missing}, unknown "
                        f"{unknown}. Start from a copy of lightning_dp/data/schemas/{name}.yaml and change keys, not "
                        "names.")
    return own


def _root(root: str | Path | None) -> Path:
    return Path(root) if root else DEFAULT_ROOT


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        from lightning_dp.errors import python_command

        folder = next((p for p in (path.name, path.parent.name) if p in ("adult", "cervical", "mnist-test")), "adult")
        name = "mnist" if folder == "mnist-test" else folder
        raise DataError(f"{what} not found at {str(path)!r}. Download it (SHA-256 checked): {python_command()} -m "
                        f"lightning_dp.data fetch {name} [--root PATH], or point data.root=PATH at the folder holding "
                        "adult/, cervical/, mnist-test/.")
    return path


def _header(path: Path) -> list[str]:
    """The names in a CSV file's first line (empty for an empty file)."""
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def read_table(path: str | Path, **kwargs) -> pd.DataFrame:
    """Read a CSV or Parquet file as strings-or-numbers, with a clear error for malformed files."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{str(path)!r} is a folder; pass data.path=PATH to a CSV or Parquet file in it.")
    if not path.is_file():
        raise DataError(f"Data file {str(path)!r} does not exist. Pass data.path=PATH to a CSV or Parquet file.")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            df = pd.read_parquet(path)
        else:
            names = _header(path)  # the csv module: a 200,000-column header in a second, before the body is parsed
            dupes = sorted(n for n, k in collections.Counter(names).items() if k > 1)  # linear: names.count is n²
            if dupes:
                raise DataError(f"The header of {str(path)!r} names these columns more than once: {dupes}. Give "
                                "every column a unique name.")
            df = pd.read_csv(path, dtype=str, keep_default_na=False, **kwargs)
    except DataError:
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError, OSError) as err:
        raise DataError(f"Could not parse {str(path)!r}: {err}. Check that it is a well-formed CSV (one header "
                        "line, the same number of fields on every line) or a Parquet file.") from err
    return df


def load_breast_cancer(schema: str | Path | None = None, **_: object) -> TabularSource:
    """scikit-learn's breast cancer data (569 × 30, binary), bundled with scikit-learn."""
    from sklearn.datasets import load_breast_cancer as sk_load

    bc = sk_load()
    df = pd.DataFrame(bc.data, columns=list(bc.feature_names))
    df["diagnosis"] = np.asarray(bc.target_names, dtype=object)[bc.target]
    return TabularSource(train=df, test=None, schema=source_schema("breast_cancer", schema),
                         name="breast_cancer")


def load_diabetes(schema: str | Path | None = None, **_: object) -> TabularSource:
    """scikit-learn's diabetes data (442 × 10 features + a regression target), bundled with scikit-learn.

    The features as scikit-learn ships them (mean-centred, scaled so that each column's squares sum to 1), the
    target (disease progression after one year) as the last column, a continuous column: no label.
    """
    from sklearn.datasets import load_diabetes as sk_load

    d = sk_load()
    df = pd.DataFrame(d.data, columns=list(d.feature_names))
    df["target"] = d.target
    return TabularSource(train=df, test=None, schema=source_schema("diabetes", schema), name="diabetes")


def load_adult(root: str | Path | None = None, schema: str | Path | None = None, **_: object) -> TabularSource:
    """UCI Adult, train (32,561) and test (16,281) as shipped; test labels lose their trailing '.'."""
    folder = _require(_root(root) / "adult", "The Adult data set")
    kw = dict(header=None, names=bundled_schema("adult").names, skipinitialspace=True, dtype=str, keep_default_na=False)
    train = pd.read_csv(_require(folder / "adult.data", "adult.data"), **kw)
    test = pd.read_csv(_require(folder / "adult.test", "adult.test"), skiprows=1, **kw)
    train, test = (d[d["income"].str.len() > 0].reset_index(drop=True) for d in (train, test))
    test["income"] = test["income"].str.rstrip(".")
    return TabularSource(train=train, test=test, schema=source_schema("adult", schema), name="adult")


def load_cervical(root: str | Path | None = None, schema: str | Path | None = None, **_: object) -> TabularSource:
    """UCI Cervical cancer risk factors (858 rows, label Biopsy)."""
    path = _require(_root(root) / "cervical" / "risk_factors_cervical_cancer.csv", "The Cervical data set")
    return TabularSource(train=read_table(path), test=None, schema=source_schema("cervical", schema),
                         name="cervical")


def load_csv(path: str | Path | None = None, schema: str | Path | None = None, test_path: str | Path | None = None,
             **_: object) -> TabularSource:
    """A user's CSV/Parquet file with its schema YAML (required: nothing about the columns is read from rows).

    Raises:
        DataError: no path, or no schema (the message shows a schema to fill in, built from the header).
    """
    if not path:
        raise DataError("data=csv needs data.path=PATH (a CSV or Parquet file) and data.schema=PATH (a YAML schema).")
    train = read_table(path)
    if not schema:
        raise DataError(f"data=csv needs data.schema=PATH: a run reads nothing about the columns from private rows "
                        f"without spending privacy budget. Write a YAML file like this one (types proposed from "
                        f"{Path(path).name} for you alone: check each, give bounds/categories you know, the rest are "
                        f"released with DP) and pass data.schema=PATH:\n{schema_template(train.columns, train)}")
    test = read_table(test_path) if test_path else None
    return TabularSource(train=train, test=test, schema=Schema.from_yaml(schema), name=Path(path).stem)


MISSING_TOKENS = ("", "?", "NA", "N/A", "nan", "NaN", "null", "None")


def propose_column(values: pd.Series, limit_categories: int = 12) -> str:
    """A schema entry's keys proposed from a column's values (for the operator's eyes only: see
    :func:`schema_template`): ``type``, ``integer``, ``decimals``, ``spikes: [0]`` and ``missing``; never bounds or
    category lists, which would copy private extremes and rare values."""
    raw = values.astype("string").str.strip()
    missing = raw.isna() | raw.isin(MISSING_TOKENS)
    present = raw[~missing]
    number = pd.to_numeric(present, errors="coerce")
    keys: list[str] = []
    if len(present) and number.notna().all() and number.nunique() > min(limit_categories, len(present) // 2):
        keys.append("type: continuous")
        v = number.to_numpy(float)
        if np.all(v == np.round(v)):
            keys.append("integer: true")
        else:
            places = present.str.extract(r"\.(\d+)$")[0].str.len().fillna(0)
            if places.max() <= 4:
                keys.append(f"decimals: {int(places.max())}")
        if (v == 0).mean() >= 0.05:
            keys.append("spikes: [0]")
    else:
        keys.append("type: categorical")
    if missing.any():
        keys.append("missing: true")
    return ", ".join(keys)


def schema_template(names: Sequence[object], frame: pd.DataFrame | None = None, limit: int = 40) -> str:
    """A YAML schema to fill in. From the header alone (structure, not a private value), every column is continuous;
    with ``frame``, each column's keys are proposed from its values (:func:`propose_column`). That proposal reads
    private rows: it goes into the refusal the operator sees on the console, before anything is released, so no run
    folder or log file exists to hold it; it is never written anywhere."""
    lines = ["label: null   # the class column, if any (categorical)",
             "missing_values: ['', '?']" if frame is not None else "columns:"]
    if frame is not None:
        lines += ["# types proposed from your rows (private: shown only to you); add bounds: [lo, hi] you know",
                  "columns:"]
    for n in list(names)[:limit]:
        keys = propose_column(frame[n]) if frame is not None else "type: continuous"
        hint = "" if frame is not None else "   # or: type: categorical"
        lines.append(f"  - {{name: {json.dumps(str(n))}, {keys}}}{hint}")
    if len(names) > limit:
        lines.append(f"  # ... and {len(names) - limit} more columns")
    return "\n".join(lines)


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\x00\x00":
        raise DataError(f"{str(path)!r} is not an IDX file (bad magic number).")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_mnist_test(root: str | Path | None = None, **_: object) -> ImageSource:
    """The MNIST test split (10,000 × 28 × 28) from IDX files."""
    folder = _require(_root(root) / "mnist-test", "The MNIST test split")
    images = _read_idx(folder / "t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    labels = _read_idx(folder / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    return ImageSource(images=images, labels=labels, classes=[str(i) for i in range(10)], name="mnist_test")


def load_digits(**_: object) -> ImageSource:
    """scikit-learn's 8×8 digits (1,797 images), bundled with scikit-learn."""
    from sklearn.datasets import load_digits as sk_load

    d = sk_load()
    return ImageSource(images=(d.images / 16.0).astype(np.float32), labels=d.target.astype(np.int64),
                       classes=[str(i) for i in range(10)], name="digits")


def load_npz(path: str | Path | None = None, num_classes: int | None = None, **_: object) -> ImageSource:
    """Images from an ``.npz`` with arrays ``images`` (N, H, W; uint8 or [0, 1] floats) and ``labels`` in 0..K−1.

    The number of classes K is public configuration (``data.num_classes``), never read from the labels; the
    pixel scale follows from the array's dtype.
    """
    if not path or not Path(path).is_file():
        raise DataError(f"data=npz needs data.path=PATH to an .npz file with 'images' and 'labels'; got {path!r}.")
    if not num_classes or int(num_classes) < 1:
        raise DataError("data=npz needs data.num_classes=K (public): labels must be the integers 0..K-1.")
    with np.load(path) as z:
        if "images" not in z or "labels" not in z:
            raise DataError(f"{str(path)!r} must hold arrays 'images' and 'labels'; it has {list(z.keys())}.")
        images, labels = z["images"], z["labels"].astype(np.int64)
    images = images.astype(np.float32) / (255.0 if images.dtype == np.uint8 else 1.0)
    if not (np.isfinite(images).all() and images.min() >= 0 and images.max() <= 1):
        raise DataError(f"{str(path)!r}: images must be uint8 or floats in [0, 1].")
    if labels.min() < 0 or labels.max() >= int(num_classes):
        raise DataError(f"{str(path)!r}: labels must be integers in 0..{int(num_classes) - 1} (data.num_classes="
                        f"{int(num_classes)}).")
    return ImageSource(images=images, labels=labels, classes=[str(i) for i in range(int(num_classes))],
                       name=Path(path).stem)


LOADERS: dict[str, Callable[..., TabularSource | ImageSource]] = {
    "breast_cancer": load_breast_cancer, "diabetes": load_diabetes, "adult": load_adult, "cervical": load_cervical, "csv": load_csv,
    "mnist_test": load_mnist_test, "digits": load_digits, "npz": load_npz,
}


def load_source(name: str, **kwargs: object) -> TabularSource | ImageSource:
    """Load a data set by name.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    if name not in LOADERS:
        raise ValueError(f"Unknown data set {name!r}; valid: {', '.join(LOADERS)}.")
    return LOADERS[name](**kwargs)
