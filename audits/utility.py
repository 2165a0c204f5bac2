"""Train on synthetic, test on real (TSTR): the downstream-utility audit of DP-MERF §5 and PEARL §4.

Classifiers (regressors for numeric targets) are fitted on the synthetic data and scored on the real test
split; the same models fitted on the real training split give the reference row. Binary labels get ROC-AUC
and average precision (PRC) both from hard ``predict`` outputs (the papers' protocol, ``roc_auc_*_hard``)
and from scores (``predict_proba`` / ``decision_function``); multi-class labels get weighted F1, accuracy
and macro F1; regression targets get R² and MSE.
"""

from __future__ import annotations

import importlib
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sklearn.base import BaseEstimator
from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.ensemble import (
    AdaBoostClassifier,
    AdaBoostRegressor,
    BaggingClassifier,
    BaggingRegressor,
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    mean_squared_error,
    r2_score,
    roc_auc_score,
)
from sklearn.naive_bayes import BernoulliNB, GaussianNB
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import LabelEncoder, OneHotEncoder, StandardScaler
from sklearn.svm import SVC, LinearSVC, LinearSVR
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor
from sklearn.utils.validation import has_fit_parameter

logger = logging.getLogger(__name__)

ModelFactory = Callable[[int], BaseEstimator]
MAX_CLASSES = 20  # a numeric label with more distinct values than this is treated as a regression target


# ------------------------------------------------------------------------------------------- encoding
MISSING = "__missing__"  # the category that NaN becomes in a categorical column


def json_safe(obj: Any) -> Any:
    """Recursively convert numpy scalars/arrays to Python and non-finite floats to ``None``."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.generic, float)):
        obj = obj.item() if isinstance(obj, np.generic) else obj
        return None if isinstance(obj, float) and not np.isfinite(obj) else obj
    return obj


def is_categorical(column: pd.Series) -> bool:
    """Default rule: bool and non-numeric (object, category, string) columns are categorical."""
    return pd.api.types.is_bool_dtype(column) or not pd.api.types.is_numeric_dtype(column)


def category_strings(column: pd.Series) -> np.ndarray:
    """A categorical column as strings, NaN as :data:`MISSING`, integral floats as ints (``1.0`` -> ``"1"``)."""
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        values = column.to_numpy(dtype=float, na_value=np.nan)
        finite = values[np.isfinite(values)]
        if np.all(finite == np.round(finite)):
            column = column.astype("Int64")
    return column.astype(object).where(column.notna(), MISSING).astype(str).to_numpy(dtype=object)


def align_labels(labels: Sequence[pd.Series]) -> list[pd.Series]:
    """Give class labels from several sources one type: ints if all numeric and integral, else strings."""

    def is_number(y: pd.Series) -> bool:
        return pd.api.types.is_numeric_dtype(y) and not pd.api.types.is_bool_dtype(y)

    if any(is_number(y) for y in labels):  # True/False next to 0/1 labels means 1/0
        labels = [y.astype(np.int64) if pd.api.types.is_bool_dtype(y) else y for y in labels]
    numeric = all(is_number(y) for y in labels)
    if numeric and all(np.all(y.to_numpy(float) == np.round(y.to_numpy(float))) for y in labels):
        return [y.astype(np.int64) for y in labels]
    if numeric:
        return [y.astype(float) for y in labels]
    return [pd.Series(category_strings(y), index=y.index) for y in labels]


@dataclass
class FeatureEncoder:
    """Encoding fitted on one data set: median-imputed (+ missing indicator) standardised numerics and
    one-hot categoricals (NaN its own category, unseen categories ignored)."""

    numeric: list[str]
    categorical: list[str]
    transformer: ColumnTransformer

    def frame(self, data: pd.DataFrame) -> pd.DataFrame:
        """Coerce the columns to the encoder's types (numerics to float, categoricals to strings)."""
        out = {c: pd.to_numeric(data[c], errors="coerce").astype(float) for c in self.numeric}
        out |= {c: category_strings(data[c]) for c in self.categorical}
        return pd.DataFrame(out, index=data.index)

    def transform(self, data: pd.DataFrame) -> np.ndarray:
        """Encode ``data`` (extra columns, such as the label, are ignored) to a dense float matrix."""
        return np.asarray(self.transformer.transform(self.frame(data)), dtype=float)


def fit_feature_encoder(data: pd.DataFrame, *, categorical: Sequence[str] | None = None) -> FeatureEncoder:
    """Fit a :class:`FeatureEncoder` on ``data`` (all its columns are features).

    Args:
        data: the training side (synthetic data when scoring synthetic data).
        categorical: categorical columns; default: :func:`is_categorical` columns.

    Returns:
        The fitted encoder.
    """
    if categorical is None:
        categorical = [c for c in data.columns if is_categorical(data[c])]
    cats = [c for c in data.columns if c in set(categorical)]
    nums = [c for c in data.columns if c not in set(cats)]
    parts = []
    if nums:
        imputer = SimpleImputer(strategy="median", add_indicator=True, keep_empty_features=True)
        parts.append(("numeric", make_pipeline(imputer, StandardScaler()), nums))
    if cats:
        parts.append(("categorical", OneHotEncoder(handle_unknown="ignore", sparse_output=False), cats))
    encoder = FeatureEncoder(nums, cats, ColumnTransformer(parts, sparse_threshold=0.0))
    encoder.transformer.fit(encoder.frame(data))
    return encoder


# ------------------------------------------------------------------------------------------- registry
class ModelUnavailableError(ImportError):
    """An optional model's library is not installed; the model is skipped, not failed."""


def _boosting_model(kind: str, seed: int) -> BaseEstimator:
    """XGBoost (the DP-MERF row), else LightGBM, else :class:`ModelUnavailableError`."""
    for library, names in (("xgboost", "XGB"), ("lightgbm", "LGBM")):
        try:
            module = importlib.import_module(library)
        except ImportError:
            continue
        extra = {"verbose": -1} if library == "lightgbm" else {}
        return getattr(module, f"{names}{kind}")(random_state=seed, n_jobs=1, **extra)
    raise ModelUnavailableError("neither xgboost nor lightgbm is importable")


# DP-MERF §5 tabular settings [C]; AdaBoost is SAMME (SAMME.R was removed from scikit-learn).
CLASSIFIERS: dict[str, ModelFactory] = {
    "logistic_regression": lambda s: LogisticRegression(solver="lbfgs", max_iter=2000),
    "gaussian_nb": lambda s: GaussianNB(),
    "bernoulli_nb": lambda s: BernoulliNB(alpha=0.02),
    "linear_svm": lambda s: LinearSVC(random_state=s),
    "decision_tree": lambda s: DecisionTreeClassifier(random_state=s),
    "lda": lambda s: LinearDiscriminantAnalysis(),
    "adaboost": lambda s: AdaBoostClassifier(random_state=s),
    "bagging": lambda s: BaggingClassifier(random_state=s),
    "random_forest": lambda s: RandomForestClassifier(random_state=s),
    "gbm": lambda s: GradientBoostingClassifier(random_state=s),
    "mlp": lambda s: MLPClassifier(random_state=s),
    "xgboost": lambda s: _boosting_model("Classifier", s),
    "svc": lambda s: SVC(random_state=s),  # bias-mitigation §4.1 downstream set
}


def _scaled(model: BaseEstimator) -> TransformedTargetRegressor:
    """Fit on a standardised target (MLPs need it; a no-op for the others' predictions)."""
    return TransformedTargetRegressor(regressor=model, transformer=StandardScaler())


REGRESSORS: dict[str, ModelFactory] = {
    "linear_regression": lambda s: _scaled(LinearRegression()),
    "ridge": lambda s: _scaled(Ridge()),
    "linear_svr": lambda s: _scaled(LinearSVR(random_state=s, max_iter=5000)),
    "decision_tree": lambda s: _scaled(DecisionTreeRegressor(random_state=s)),
    "adaboost": lambda s: _scaled(AdaBoostRegressor(random_state=s)),
    "bagging": lambda s: _scaled(BaggingRegressor(random_state=s)),
    "random_forest": lambda s: _scaled(RandomForestRegressor(random_state=s)),
    "gbm": lambda s: _scaled(GradientBoostingRegressor(random_state=s)),
    "mlp": lambda s: _scaled(MLPRegressor(random_state=s, max_iter=1000)),
    "xgboost": lambda s: _scaled(_boosting_model("Regressor", s)),
}

_DP_MERF = [
    "logistic_regression", "gaussian_nb", "bernoulli_nb", "linear_svm", "decision_tree", "lda",
    "adaboost", "bagging", "random_forest", "gbm", "mlp", "xgboost",
]  # fmt: skip
PRESETS: dict[str, list[str]] = {
    "dp_merf": _DP_MERF,  # DP-MERF Table 2 rows
    "pearl": [n for n in _DP_MERF if n not in ("random_forest", "xgboost")],  # PEARL Table 2 rows
    "bias_mitigation": ["logistic_regression", "svc", "random_forest", "mlp"],  # bias-mitigation §5
}
REGRESSION_PRESETS: dict[str, list[str]] = {"default": list(REGRESSORS)}

METRICS: dict[str, tuple[str, ...]] = {
    "binary": ("roc_auc_hard", "prc_hard", "roc_auc", "prc", "accuracy"),
    "multiclass": ("f1_weighted", "accuracy", "f1_macro"),
    "regression": ("r2", "mse"),
}
PRIMARY_METRIC = {"binary": "roc_auc_hard", "multiclass": "f1_weighted", "regression": "r2"}
PROTOCOL = (
    "TSTR: models fitted on synthetic data, scored on real test data; reference models fitted on real "
    "training data. roc_auc_hard/prc_hard use predict() (DP-MERF/PEARL protocol), roc_auc/prc use "
    "predict_proba or decision_function. Averages are nan-means over models; std is the population std."
)


@dataclass
class UtilityResult:
    """Outcome of a TSTR audit.

    Attributes:
        table: one row per model; metric columns for synthetic training, ``real_<metric>`` for the real
            reference, ``error`` (why a model has NaN scores). Over seeds: ``<metric>_mean``/``<metric>_std``.
        summary: JSON-serialisable summary (task, averages, skipped and failed models, warnings).
        skipped: models not run because their library is missing.
        per_seed: long table of every seed's rows (only from :func:`tstr_over_seeds`).
        predictions: per model, its predictions on the real test rows (``y_true``, ``prediction``, ``scores``),
            under ``synthetic`` and ``real`` (the reference models); not serialised. They let a caller resample
            the test rows (:func:`audits.resampling.utility_interval`) without refitting.
    """

    table: pd.DataFrame
    summary: dict[str, Any]
    skipped: list[str] = field(default_factory=list)
    per_seed: pd.DataFrame | None = None
    predictions: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return summary and table as JSON-serialisable data (NaN becomes ``None``)."""
        table = self.table.reset_index().to_dict(orient="records")
        return json_safe({"summary": self.summary, "table": table, "skipped": self.skipped})


def infer_task(y: pd.Series, task: str = "auto") -> str:
    """Decide between ``binary``, ``multiclass`` and ``regression`` from the real labels.

    Args:
        y: real labels (test and train together).
        task: ``auto``, ``classification``, ``binary``, ``multiclass`` or ``regression``.

    Returns:
        ``binary``, ``multiclass`` or ``regression``.

    Raises:
        ValueError: for an unknown ``task``.
    """
    valid = ("auto", "classification", "binary", "multiclass", "regression")
    if task not in valid:
        raise ValueError(f"Unknown task {task!r}; valid tasks: {list(valid)}")
    if task in ("binary", "multiclass", "regression"):
        return task
    y = y.dropna()
    if task == "auto" and pd.api.types.is_numeric_dtype(y) and not pd.api.types.is_bool_dtype(y):
        values = y.to_numpy(dtype=float)
        if not np.all(values == np.round(values)) or len(np.unique(values)) > MAX_CLASSES:
            return "regression"
    return "binary" if y.nunique() <= 2 else "multiclass"


def resolve_models(models: Sequence[str] | str, task: str) -> list[str]:
    """Turn a preset name, a model name or a list of names into registry names.

    Raises:
        ValueError: if a name is in neither the registry nor the presets; the message lists valid names.
    """
    registry, presets = (REGRESSORS, REGRESSION_PRESETS) if task == "regression" else (CLASSIFIERS, PRESETS)
    if isinstance(models, str):
        if models in presets:
            return list(presets[models])
        if task == "regression" and models in PRESETS:
            logger.info("Preset %r is for classification; using the regression preset 'default'.", models)
            return list(REGRESSION_PRESETS["default"])
        models = [models]
    unknown = [m for m in models if m not in registry]
    if unknown:
        raise ValueError(
            f"Unknown {'regressor' if task == 'regression' else 'classifier'} name(s) {unknown}; valid names: "
            f"{sorted(registry)}; presets: {sorted(presets)}"
        )
    return list(models)


def classification_metrics(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    *,
    task: str,
    pos_label: Any = None,
    scores: np.ndarray | None = None,
) -> dict[str, float]:
    """Score predictions of one classifier.

    Args:
        y_true: real labels.
        y_pred: hard predictions (``predict``).
        task: ``binary`` or ``multiclass``.
        pos_label: positive class for binary metrics.
        scores: positive-class scores (probability or decision value); ``None`` gives NaN score metrics.

    Returns:
        The metrics of ``METRICS[task]``; ROC-AUC is NaN when ``y_true`` holds a single class.
    """
    if task == "multiclass":
        return {
            "f1_weighted": f1_score(y_true, y_pred, average="weighted", zero_division=0),
            "accuracy": accuracy_score(y_true, y_pred),
            "f1_macro": f1_score(y_true, y_pred, average="macro", zero_division=0),
        }
    truth, hard = np.asarray(y_true) == pos_label, (np.asarray(y_pred) == pos_label).astype(float)
    both = truth.any() and not truth.all()
    has_scores = scores is not None and both and bool(np.all(np.isfinite(scores)))
    return {
        "roc_auc_hard": roc_auc_score(truth, hard) if both else np.nan,
        "prc_hard": average_precision_score(truth, hard) if truth.any() else np.nan,
        "roc_auc": roc_auc_score(truth, scores) if has_scores else np.nan,
        "prc": average_precision_score(truth, scores) if has_scores else np.nan,
        "accuracy": accuracy_score(truth, hard.astype(bool)),
    }


def _positive_scores(model: BaseEstimator, x: np.ndarray, pos_code: int | None) -> np.ndarray | None:
    """Score of the positive class from ``predict_proba`` or ``decision_function``, if it can be had."""
    classes = list(getattr(model, "classes_", []))
    if pos_code is None or pos_code not in classes:
        return None
    column = classes.index(pos_code)
    if hasattr(model, "predict_proba"):
        return model.predict_proba(x)[:, column]
    if hasattr(model, "decision_function"):
        decision = model.decision_function(x)
        if decision.ndim == 1:  # binary: positive means classes_[1]
            return decision if column == 1 else -decision
        return decision[:, column]
    return None


def _fit_and_score(
    name: str, model: BaseEstimator, data: dict[str, Any], *, task: str, pos_label: Any
) -> dict[str, float]:
    """Fit one model on the encoded training side and score it on the real test side."""
    fit_kwargs = {}
    inner = model.regressor if isinstance(model, TransformedTargetRegressor) else model
    if data["sample_weight"] is not None:
        if has_fit_parameter(inner, "sample_weight"):
            fit_kwargs["sample_weight"] = data["sample_weight"]
        else:
            data["warnings"].append(f"{name}: does not accept sample_weight; fitted unweighted")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(data["x_train"], data["y_train"], **fit_kwargs)
        prediction = model.predict(data["x_test"])
        scores = None
        if task == "binary" and pos_label in data["label_encoder"].classes_:
            pos_code = int(data["label_encoder"].transform([pos_label])[0])
            scores = _positive_scores(model, data["x_test"], pos_code)
    data["predictions"][name] = {"prediction": prediction, "scores": scores}
    for category in sorted(
        {w.category.__name__ for w in caught if issubclass(w.category, ConvergenceWarning)}
    ):
        data["warnings"].append(f"{name}: {category} while fitting")
    if task == "regression":
        return score_predictions(data["y_test"], prediction, task=task)
    y_pred = data["label_encoder"].inverse_transform(np.asarray(prediction, dtype=int))
    data["predictions"][name]["prediction"] = y_pred
    return score_predictions(data["y_test"], y_pred, task=task, pos_label=pos_label, scores=scores)


def score_predictions(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    *,
    task: str,
    pos_label: Any = None,
    scores: np.ndarray | None = None,
) -> dict[str, float]:
    """The metrics of ``METRICS[task]`` of one model's predictions (regression: R² and MSE)."""
    if task == "regression":
        return {"r2": r2_score(y_true, y_pred), "mse": mean_squared_error(y_true, y_pred)}
    return classification_metrics(y_true, y_pred, task=task, pos_label=pos_label, scores=scores)


def _score_models(
    names: Sequence[str],
    train: pd.DataFrame,
    test: pd.DataFrame,
    *,
    label: str,
    task: str,
    categorical: Sequence[str],
    pos_label: Any,
    seed: int,
    sample_weight: np.ndarray | None = None,
) -> tuple[pd.DataFrame, dict[str, str], list[str]]:
    """Fit every named model on ``train`` and score it on ``test``.

    Returns:
        A table (one row per model that ran), the skip reasons, and warnings.
    """
    registry = REGRESSORS if task == "regression" else CLASSIFIERS
    encoder = fit_feature_encoder(train.drop(columns=[label]), categorical=categorical)
    data: dict[str, Any] = {
        "x_train": encoder.transform(train),
        "x_test": encoder.transform(test),
        "y_test": test[label].to_numpy(),
        "sample_weight": sample_weight,
        "warnings": [],
        "predictions": {},
    }
    single_class = ""
    if task == "regression":
        data["y_train"] = train[label].to_numpy(dtype=float)
        data["y_test"] = data["y_test"].astype(float)
    else:
        data["label_encoder"] = LabelEncoder().fit(train[label].to_numpy())
        data["y_train"] = data["label_encoder"].transform(train[label].to_numpy())
        if len(data["label_encoder"].classes_) < 2:
            single_class = f"training data has a single class ({data['label_encoder'].classes_.tolist()})"
    rows, skipped = {}, {}
    for name in names:
        row: dict[str, Any] = dict.fromkeys(METRICS[task], np.nan) | {"estimator": None, "error": None}
        try:
            model = registry[name](seed)
        except ModelUnavailableError as err:
            skipped[name] = str(err)
            continue
        inner = model.regressor if isinstance(model, TransformedTargetRegressor) else model
        row["estimator"] = type(inner).__name__
        start = time.perf_counter()
        try:
            if single_class:
                raise ValueError(single_class)
            row |= _fit_and_score(name, model, data, task=task, pos_label=pos_label)
        except Exception as err:  # noqa: BLE001 - any model failure becomes NaN with a reason
            row["error"] = f"{type(err).__name__}: {err}"
            logger.warning("TSTR model %s failed: %s", name, row["error"])
        row["fit_seconds"] = time.perf_counter() - start
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    predictions = {
        name: {**p, "y_true": data["y_test"]}
        for name, p in data["predictions"].items()
        if name in rows and not rows[name]["error"]
    }
    return table, skipped, data["warnings"], predictions


def _label_warnings(synthetic: pd.Series, real: pd.Series) -> list[str]:
    """Warnings about labels present on one side only."""
    syn, rea = set(synthetic.unique().tolist()), set(real.unique().tolist())
    notes = []
    if rea - syn:
        notes.append(f"labels in real_test missing from synthetic: {sorted(map(str, rea - syn))}")
    if syn - rea:
        notes.append(f"labels in synthetic absent from real_test: {sorted(map(str, syn - rea))}")
    return notes


def _nan_stat(values: np.ndarray, stat: Callable[[np.ndarray], float]) -> float:
    """``stat`` over the finite entries; NaN (no warning) when there are none."""
    finite = values[np.isfinite(values)]
    return float(stat(finite)) if finite.size else np.nan


def _averages(table: pd.DataFrame, metrics: Sequence[str], prefix: str = "") -> dict[str, float]:
    """Nan-mean over models of each metric column."""
    return {m: _nan_stat(table[prefix + m].to_numpy(dtype=float), np.mean) for m in metrics}


def tstr(
    synthetic: pd.DataFrame,
    real_test: pd.DataFrame,
    *,
    label: str,
    real_train: pd.DataFrame | None = None,
    classifiers: Sequence[str] | str = "dp_merf",
    categorical: Sequence[str] | None = None,
    seed: int = 0,
    task: str = "auto",
    pos_label: Any = None,
    sample_weight: Sequence[float] | np.ndarray | None = None,
) -> UtilityResult:
    """Train on synthetic, test on real, with an optional real-data reference row.

    Args:
        synthetic: synthetic rows in the real data's columns (the label included).
        real_test: real held-out rows; its columns define the features.
        label: name of the label column.
        real_train: real training rows for the reference scores (``real_<metric>`` columns).
        classifiers: a preset (``dp_merf``: 12 models, ``pearl``: 10, ``bias_mitigation``: 4), a model name
            or a list of names. For regression targets a classification preset means all regressors.
        categorical: categorical feature columns; default: bool and non-numeric columns of ``real_test``.
        seed: ``random_state`` of every stochastic model.
        task: ``auto``, ``classification``, ``binary``, ``multiclass`` or ``regression``.
        pos_label: positive class for binary metrics; default: the last of the sorted real classes.
        sample_weight: per-synthetic-row weights (importance weights, bias-mitigation §4.1), passed to
            models whose ``fit`` accepts them.

    Returns:
        The :class:`UtilityResult`.

    Raises:
        ValueError: for a missing label or feature column, or an unknown model name.
    """
    for name, frame in (("synthetic", synthetic), ("real_train", real_train)):
        missing = [] if frame is None else sorted(set(real_test.columns) - set(frame.columns))
        if missing:
            raise ValueError(f"{name} lacks columns of real_test: {missing}")
    if label not in real_test.columns:
        raise ValueError(f"label {label!r} is not a column of real_test")
    columns = list(real_test.columns)
    frames = {"synthetic": synthetic[columns], "real_test": real_test[columns]}
    if real_train is not None:
        frames["real_train"] = real_train[columns]
    weights = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    if weights is not None and len(weights) != len(synthetic):
        raise ValueError(f"sample_weight has {len(weights)} entries for {len(synthetic)} synthetic rows")
    notes = []
    for name, frame in frames.items():
        keep = frame[label].notna().to_numpy()
        if not keep.all():
            notes.append(f"{name}: dropped {int((~keep).sum())} rows with a missing label")
            frames[name] = frame[keep]
            weights = weights[keep] if name == "synthetic" and weights is not None else weights
    real_labels = pd.concat([f[label] for n, f in frames.items() if n != "synthetic"], ignore_index=True)
    task = infer_task(real_labels, task)
    if task != "regression":
        aligned = align_labels([f[label] for f in frames.values()])
        frames = {n: f.assign(**{label: y.to_numpy()}) for (n, f), y in zip(frames.items(), aligned)}
        classes = sorted(pd.concat(aligned[1:]).unique().tolist(), key=str)
        pos_label = classes[-1] if pos_label is None and task == "binary" else pos_label
        notes += _label_warnings(frames["synthetic"][label], frames["real_test"][label])
    categorical = (
        [c for c in columns if c != label and is_categorical(real_test[c])]
        if categorical is None
        else [c for c in categorical if c != label]
    )
    names = resolve_models(classifiers, task)
    common = {"label": label, "task": task, "categorical": categorical, "pos_label": pos_label, "seed": seed}
    table, skipped, fit_notes, predictions = _score_models(
        names, frames["synthetic"], frames["real_test"], sample_weight=weights, **common
    )
    metrics = METRICS[task]
    summary: dict[str, Any] = {
        "protocol": PROTOCOL,
        "task": task,
        "label": label,
        "pos_label": pos_label,
        "primary_metric": PRIMARY_METRIC[task],
        "models": list(table.index),
        "n_rows": {n: len(f) for n, f in frames.items()},
        "categorical": categorical,
        "seed": seed,
        "average": _averages(table, metrics),
        "average_std_over_models": {m: _nan_stat(table[m].to_numpy(float), np.std) for m in metrics},
        "per_model": table[list(metrics)].to_dict(orient="index"),
    }
    if real_train is not None:
        real_table, _, real_notes, real_predictions = _score_models(
            names, frames["real_train"], frames["real_test"], **common
        )
        real_table = real_table.rename(columns={c: f"real_{c}" for c in real_table.columns})
        table = table.join(real_table.drop(columns=["real_estimator", "real_fit_seconds"]))
        summary["real_average"] = _averages(table, metrics, prefix="real_")
        fit_notes += [f"real reference: {n}" for n in real_notes]
    summary["skipped"] = skipped
    summary["failed"] = {n: e for n, e in table["error"].items() if e}
    summary["warnings"] = notes + fit_notes
    predictions = {"synthetic": predictions, **({"real": real_predictions} if real_train is not None else {})}
    return UtilityResult(
        table=table, summary=json_safe(summary), skipped=list(skipped), predictions=predictions
    )


def tstr_over_seeds(
    synthetic_by_seed: Mapping[int, pd.DataFrame] | Iterable[tuple[int, pd.DataFrame]],
    real_test: pd.DataFrame,
    *,
    label: str,
    real_train: pd.DataFrame | None = None,
    **kwargs: Any,
) -> UtilityResult:
    """Run :func:`tstr` once per (seed, synthetic data set) and aggregate mean ± std over seeds.

    Args:
        synthetic_by_seed: mapping seed -> synthetic DataFrame, or an iterable of such pairs. The seed is
            also the models' ``random_state``.
        real_test: real held-out rows.
        label: label column.
        real_train: real training rows for the reference (re-fitted with each seed).
        **kwargs: other :func:`tstr` arguments (``classifiers``, ``categorical``, ``task``, ...).

    Returns:
        A :class:`UtilityResult` whose table has ``<metric>_mean`` and ``<metric>_std`` (population std over
        seeds) columns; ``summary["average"]`` is the mean ± std over seeds of each seed's model average
        (DP-MERF: "mean over the 12 models; the mean over seeds follows").

    Raises:
        ValueError: if no synthetic data set is given.
    """
    pairs = list(synthetic_by_seed.items() if isinstance(synthetic_by_seed, Mapping) else synthetic_by_seed)
    if not pairs:
        raise ValueError("synthetic_by_seed is empty; pass at least one (seed, DataFrame) pair")
    results = {
        seed: tstr(syn, real_test, label=label, real_train=real_train, seed=seed, **kwargs)
        for seed, syn in pairs
    }
    per_seed = pd.concat({s: r.table for s, r in results.items()}, names=["seed"]).reset_index()
    first = next(iter(results.values()))
    task_metrics = METRICS[first.summary["task"]]
    metrics = [p + m for p in ("", "real_") for m in task_metrics if p + m in per_seed.columns]
    grouped = per_seed.groupby("model", sort=False)[metrics]
    means, stds = grouped.mean(), grouped.std(ddof=0)
    table = pd.concat(
        {f"{m}_{k}": f[m] for m in metrics for k, f in (("mean", means), ("std", stds))}, axis=1
    )
    table["n_failed"] = per_seed.groupby("model", sort=False)["error"].apply(lambda e: int(e.notna().sum()))
    summary = dict(first.summary, seeds=[s for s, _ in pairs], per_model=table.to_dict(orient="index"))
    for key in ("average", "real_average"):
        if key in first.summary:
            by_seed = pd.DataFrame([r.summary[key] for r in results.values()], dtype=float)
            summary[key] = {m: {"mean": by_seed[m].mean(), "std": by_seed[m].std(ddof=0)} for m in by_seed}
    summary["average_std_over_models"] = {
        m: _nan_stat(table[f"{m}_mean"].to_numpy(float), np.std) for m in task_metrics
    }
    summary["failed"] = {f"seed {s}": r.summary["failed"] for s, r in results.items() if r.summary["failed"]}
    summary["warnings"] = [f"seed {s}: {w}" for s, r in results.items() for w in r.summary["warnings"]]
    return UtilityResult(table=table, summary=json_safe(summary), skipped=first.skipped, per_seed=per_seed)


def plot_utility(result: UtilityResult, metric: str | None = None) -> Figure:
    """Horizontal bars of one metric per model, synthetic vs real reference (error bars over seeds).

    Args:
        result: output of :func:`tstr` or :func:`tstr_over_seeds`.
        metric: metric to plot; default: the task's primary metric.

    Returns:
        A matplotlib Figure (not attached to pyplot; save with ``fig.savefig``).
    """
    metric = metric or result.summary["primary_metric"]
    table = result.table
    over_seeds = f"{metric}_mean" in table.columns
    series = {"synthetic": metric, "real": f"real_{metric}"}
    names = list(table.index)
    fig = Figure(figsize=(7, 0.45 * len(names) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(names))
    height = 0.38
    for offset, (source, column) in zip((-height / 2, height / 2), series.items()):
        mean_col = f"{column}_mean" if over_seeds else column
        if mean_col not in table.columns:
            continue
        err = table[f"{column}_std"].to_numpy(float) if over_seeds else None
        ax.barh(y + offset, table[mean_col].to_numpy(float), height, xerr=err, label=f"trained on {source}")
    if metric.startswith("roc_auc"):
        ax.axvline(0.5, color="grey", linestyle=":", label="chance")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel(metric)
    ax.set_title(f"TSTR {metric} on real test data")
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    return fig
