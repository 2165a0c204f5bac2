"""Statistical fidelity of synthetic data: per-column distances, marginals, range queries, MMD, FID/KID.

Tabular metrics follow PEARL App. I.1 (range queries, 2-way marginals, Gaussian-kernel MMD) plus per-column
total variation, Wasserstein-1 and KS distances. Image metrics are torchmetrics' FID and KID on the features
of a small CNN trained on the real training images (PEARL §3.4 uses a LeNet the same way), plus the accuracy
on real test images of classifiers trained on synthetic images (DP-MERF Table 4).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from scipy.spatial.distance import pdist
from scipy.stats import ks_2samp, wasserstein_distance
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.metrics.pairwise import rbf_kernel
from torch import Tensor
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance

from audits.feature_net import FeatureNet, as_image_batch, load_feature_net, predict, train_feature_net
from audits.utility import category_strings, fit_feature_encoder, is_categorical, json_safe

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- tabular
def _check_columns(real: pd.DataFrame, synthetic: pd.DataFrame) -> list[str]:
    missing = sorted(set(real.columns) - set(synthetic.columns))
    if missing:
        raise ValueError(f"synthetic lacks columns of real: {missing}")
    return list(real.columns)


def _categorical(real: pd.DataFrame, categorical: Sequence[str] | None) -> set[str]:
    return {c for c in real.columns if is_categorical(real[c])} if categorical is None else set(categorical)


def _numeric(column: pd.Series) -> np.ndarray:
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def total_variation(real: pd.Series, synthetic: pd.Series) -> float:
    """TV distance ½ Σ_v |p_real(v) − p_syn(v)| of two categorical columns (NaN is a category)."""
    p = pd.Series(category_strings(real)).value_counts(normalize=True)
    q = pd.Series(category_strings(synthetic)).value_counts(normalize=True)
    return float(0.5 * p.sub(q, fill_value=0.0).abs().sum())


def numeric_distances(real: pd.Series, synthetic: pd.Series) -> dict[str, float]:
    """Wasserstein-1 after min–max scaling by the real column's range, KS statistic, missing-rate gap."""
    x, y = _numeric(real), _numeric(synthetic)
    missing_gap = float(abs(np.isnan(x).mean() - np.isnan(y).mean()))
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if not len(x) or not len(y):
        return {"w1": np.nan, "ks": np.nan, "missing_rate_gap": missing_gap}
    low, span = x.min(), np.ptp(x) or 1.0  # a constant real column is left unscaled
    return {
        "w1": float(wasserstein_distance((x - low) / span, (y - low) / span)),
        "ks": float(ks_2samp(x, y).statistic),
        "missing_rate_gap": missing_gap,
    }


def column_distances(
    real: pd.DataFrame, synthetic: pd.DataFrame, *, categorical: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per-column distance: TV for categorical columns, W1 (range-scaled) and KS for numeric ones."""
    cats = _categorical(real, categorical)
    out: dict[str, dict[str, Any]] = {}
    for col in _check_columns(real, synthetic):
        if col in cats:
            out[col] = {"type": "categorical", "tv": total_variation(real[col], synthetic[col])}
        else:
            out[col] = {"type": "numeric", **numeric_distances(real[col], synthetic[col])}
    return out


def discretise(
    real: pd.Series, synthetic: pd.Series, *, categorical: bool, n_bins: int = 10
) -> tuple[np.ndarray, np.ndarray, int]:
    """Integer codes of both columns on levels defined by the real column.

    Categorical: one level per value (union of both sides; NaN its own level). Numeric: ``n_bins`` quantile
    bins of the real values (ties merge bins; values beyond the real range fall in the end bins), plus one
    level for NaN.

    Returns:
        Real codes, synthetic codes, number of levels.
    """
    if categorical:
        r, s = category_strings(real), category_strings(synthetic)
        levels = np.union1d(r, s)
        return np.searchsorted(levels, r), np.searchsorted(levels, s), len(levels)
    x, y = _numeric(real), _numeric(synthetic)
    finite = x[np.isfinite(x)]
    edges = (
        np.unique(np.quantile(finite, np.linspace(0, 1, n_bins + 1)[1:-1])) if len(finite) else np.array([])
    )
    nan_level = len(edges) + 1

    def codes(v: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(v), nan_level, np.searchsorted(edges, v, side="right"))

    return codes(x), codes(y), nan_level + 1


def two_way_marginal_error(
    real: pd.DataFrame, synthetic: pd.DataFrame, *, categorical: Sequence[str] | None = None, n_bins: int = 10
) -> dict[str, Any]:
    """Average L1 distance Σ|p_real − p_syn| between the 2-way marginal tables of all column pairs.

    Each table holds normalised counts (fractions), so the error of one pair lies in [0, 2].
    """
    cats = _categorical(real, categorical)
    cols = _check_columns(real, synthetic)
    coded = {c: discretise(real[c], synthetic[c], categorical=c in cats, n_bins=n_bins) for c in cols}
    errors = {}
    for a, b in combinations(cols, 2):
        (ra, sa, ka), (rb, sb, kb) = coded[a], coded[b]
        p = np.bincount(ra * kb + rb, minlength=ka * kb) / len(ra)
        q = np.bincount(sa * kb + sb, minlength=ka * kb) / len(sa)
        errors[f"{a} x {b}"] = float(np.abs(p - q).sum())
    values = np.array(list(errors.values()))
    worst = max(errors, key=errors.get) if errors else None
    return {
        "mean": float(values.mean()) if len(values) else np.nan,
        "max": float(values.max()) if len(values) else np.nan,
        "worst_pair": worst,
        "n_pairs": len(values),
        "n_bins": n_bins,
        "definition": "mean over column pairs of sum |p_real - p_syn| over cells; numerics in real-quantile bins",
    }


def range_query_masks(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    categorical: Sequence[str] | None = None,
    n_queries: int = 1000,
    n_attributes: int = 3,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The random range queries of :func:`range_query_error`, one at a time: per query, the boolean masks of
    the real and of the synthetic rows that satisfy it (shapes (n_real,) and (n_synthetic,))."""
    cats = _categorical(real, categorical)
    cols = _check_columns(real, synthetic)
    rng = np.random.default_rng(seed)
    k = min(n_attributes, len(cols))
    values, levels, finite = {}, {}, {}
    for c in cols:
        if c in cats:  # integer codes; the categories on offer are those of the real column
            r, s, n_levels = discretise(real[c], synthetic[c], categorical=True)
            values[c], levels[c] = (r, s), (np.unique(r), n_levels)
        else:
            values[c] = (_numeric(real[c]), _numeric(synthetic[c]))
            finite[c] = values[c][0][np.isfinite(values[c][0])]
    for _ in range(n_queries):
        masks = [np.ones(len(real), dtype=bool), np.ones(len(synthetic), dtype=bool)]
        for c in rng.choice(cols, size=k, replace=False):
            if c in cats:
                offered, n_levels = levels[c]
                chosen = offered[rng.random(len(offered)) < 0.5]
                chosen = chosen if len(chosen) else offered[[rng.integers(len(offered))]]
                keep = np.zeros(n_levels, dtype=bool)
                keep[chosen] = True
                predicates = [keep[v] for v in values[c]]
            else:
                pool = finite[c]
                low, high = np.sort(rng.choice(pool, size=2)) if len(pool) else (np.nan, np.nan)
                predicates = [(v >= low) & (v <= high) for v in values[c]]
            masks = [m & p for m, p in zip(masks, predicates)]
        yield masks[0], masks[1]


def range_query_error(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    categorical: Sequence[str] | None = None,
    n_queries: int = 1000,
    n_attributes: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Mean absolute error of random range-query answers (PEARL App. I.1), as fractions of rows.

    A query picks ``n_attributes`` distinct columns at random. A numeric column gets the interval between two
    values drawn from the real column (so queries follow the real data's spread); a categorical column gets
    a random non-empty subset of the real categories (each kept with probability ½). The answer is the
    fraction of rows satisfying all predicates; rows with NaN in a numeric attribute never satisfy it.
    """
    queries = range_query_masks(
        real, synthetic, categorical=categorical, n_queries=n_queries, n_attributes=n_attributes, seed=seed
    )
    answers = np.array([[r.mean(), s.mean()] for r, s in queries]).reshape(n_queries, 2)
    errors = np.abs(answers[:, 0] - answers[:, 1])
    return {
        "mean_abs_error": float(errors.mean()),
        "max_abs_error": float(errors.max()),
        "mean_real_answer": float(answers[:, 0].mean()),
        "n_queries": n_queries,
        "n_attributes": min(n_attributes, len(real.columns)),
        "seed": seed,
    }


def median_heuristic(x: np.ndarray, *, max_points: int = 1000, seed: int = 0) -> float:
    """Median pairwise Euclidean distance of (at most ``max_points`` rows of) ``x``."""
    rng = np.random.default_rng(seed)
    rows = x if len(x) <= max_points else x[rng.choice(len(x), max_points, replace=False)]
    median = float(np.median(pdist(rows))) if len(rows) > 1 else 0.0
    return median if median > 0 else 1.0


def mmd2(x: np.ndarray, y: np.ndarray, *, bandwidth: float, weights: np.ndarray | None = None) -> float:
    """Unbiased MMD² with the Gaussian kernel k(a, b) = exp(−‖a − b‖² / (2 h²)).

    Args:
        x: synthetic sample ``(m, d)``.
        y: real sample ``(n, d)``.
        bandwidth: h.
        weights: optional importance weights of the rows of ``x``, normalised here to mean 1 (the weighted
            estimator of bias-mitigation §5; all ones gives the plain U-statistic).

    Returns:
        MMD² (can be slightly negative, being unbiased).
    """
    gamma = 1.0 / (2.0 * bandwidth**2)
    m, n = len(x), len(y)
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=float) * m / np.sum(weights)
    k_xx, k_yy, k_xy = (
        rbf_kernel(x, x, gamma=gamma),
        rbf_kernel(y, y, gamma=gamma),
        rbf_kernel(x, y, gamma=gamma),
    )
    xx = (w @ k_xx @ w - np.sum(w**2 * np.diag(k_xx))) / (m * (m - 1))
    yy = (k_yy.sum() - np.trace(k_yy)) / (n * (n - 1))
    return float(xx + yy - 2.0 * (w @ k_xy).sum() / (m * n))


def tabular_fidelity(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    categorical: Sequence[str] | None = None,
    seed: int = 0,
    n_range_queries: int = 1000,
    max_mmd_rows: int = 2000,
    n_bins: int = 10,
    mmd_bandwidth: float | None = None,
) -> dict[str, Any]:
    """All tabular fidelity metrics of ``synthetic`` against ``real``, as a JSON-serialisable dict.

    Args:
        real: real rows (the label may be included; it is then treated like any column).
        synthetic: synthetic rows with at least the real columns.
        categorical: categorical columns; default: bool and non-numeric columns of ``real``.
        seed: seed of the range queries and the MMD subsamples.
        n_range_queries: number of random 3-attribute range queries.
        max_mmd_rows: rows of each side kept (at random) for MMD.
        n_bins: real-quantile bins of numeric columns in the 2-way marginals.
        mmd_bandwidth: Gaussian kernel bandwidth; default: median heuristic on the encoded real sample.

    Returns:
        ``columns`` (per-column distances), ``mean_tv``, ``mean_w1``, ``mean_ks``, ``two_way_marginal``,
        ``range_query`` and ``mmd`` (with its kernel, bandwidth and sample sizes).
    """
    cols = _check_columns(real, synthetic)
    synthetic = synthetic[cols]
    cats = [c for c in cols if c in _categorical(real, categorical)]
    per_column = column_distances(real, synthetic, categorical=cats)

    def mean_of(key: str) -> float:
        values = [d[key] for d in per_column.values() if np.isfinite(d.get(key, np.nan))]
        return float(np.mean(values)) if values else np.nan

    rng = np.random.default_rng(seed)
    encoder = fit_feature_encoder(real, categorical=cats)
    x_real, x_syn = (
        encoder.transform(f.iloc[np.sort(rng.choice(len(f), min(len(f), max_mmd_rows), replace=False))])
        for f in (real, synthetic)
    )
    bandwidth = mmd_bandwidth or median_heuristic(x_real, seed=seed)
    result = {
        "n_rows": {"real": len(real), "synthetic": len(synthetic)},
        "categorical": cats,
        "columns": per_column,
        "mean_tv": mean_of("tv"),
        "mean_w1": mean_of("w1"),
        "mean_ks": mean_of("ks"),
        "two_way_marginal": two_way_marginal_error(real, synthetic, categorical=cats, n_bins=n_bins),
        "range_query": range_query_error(
            real, synthetic, categorical=cats, n_queries=n_range_queries, seed=seed
        ),
        "mmd": {
            "mmd2": mmd2(x_syn, x_real, bandwidth=bandwidth),
            "kernel": "gaussian exp(-||a-b||^2 / (2 h^2)) on one-hot + standardised features (fitted on real)",
            "bandwidth": bandwidth,
            "bandwidth_rule": "fixed" if mmd_bandwidth else "median pairwise distance of the real sample",
            "estimator": "unbiased U-statistic",
            "n_real": len(x_real),
            "n_synthetic": len(x_syn),
        },
    }
    return json_safe(result)


def plot_marginals(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    columns: Sequence[str] | None = None,
    max_columns: int = 12,
    *,
    categorical: Sequence[str] | None = None,
    max_categories: int = 15,
) -> Figure:
    """Histograms of real vs synthetic per column (densities for numerics, frequencies for categoricals).

    Args:
        real: real rows.
        synthetic: synthetic rows.
        columns: columns to draw; default: the first ``max_columns`` real columns.
        max_columns: cap on the number of panels.
        categorical: categorical columns; default: bool and non-numeric columns of ``real``.
        max_categories: most frequent real categories shown per categorical column.

    Returns:
        A matplotlib Figure (not attached to pyplot).
    """
    cols = list(columns or real.columns)[:max_columns]
    cats = _categorical(real, categorical)
    ncols = min(4, len(cols))
    nrows = -(-len(cols) // ncols)
    fig = Figure(figsize=(3.6 * ncols, 2.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, col in zip(axes, cols):
        if col in cats:
            p = pd.Series(category_strings(real[col])).value_counts(normalize=True)
            q = pd.Series(category_strings(synthetic[col])).value_counts(normalize=True)
            levels = list(p.index[:max_categories])
            pos = np.arange(len(levels))
            ax.bar(pos - 0.2, p.reindex(levels).to_numpy(), 0.4, label="real")
            ax.bar(pos + 0.2, q.reindex(levels, fill_value=0.0).to_numpy(), 0.4, label="synthetic")
            ax.set_xticks(pos, levels, rotation=60, fontsize="x-small", ha="right")
        else:
            x, y = _numeric(real[col]), _numeric(synthetic[col])
            both = np.concatenate([x[np.isfinite(x)], y[np.isfinite(y)]])
            edges = np.histogram_bin_edges(both, bins=30) if len(both) else 10
            ax.hist(x[np.isfinite(x)], bins=edges, density=True, alpha=0.5, label="real")
            ax.hist(y[np.isfinite(y)], bins=edges, density=True, alpha=0.5, label="synthetic")
        ax.set_title(str(col), fontsize="small")
    for ax in axes[len(cols) :]:
        ax.set_visible(False)
    if cols:
        axes[0].legend(fontsize="x-small")
    return fig


# ------------------------------------------------------------------------------------------------ images
def _feature_metrics(
    net: FeatureNet, reference: Tensor, other: Tensor, *, subsets: int, subset_size: int, seed: int
) -> dict[str, float]:
    """torchmetrics FID and KID between two image sets in the feature space of ``net``."""
    fid = FrechetInceptionDistance(feature=net, normalize=True)
    size = min(subset_size, len(reference), len(other))
    with warnings.catch_warnings():  # "will save all extracted features": intended, they are small
        warnings.simplefilter("ignore", UserWarning)
        kid = KernelInceptionDistance(feature=net, subsets=subsets, subset_size=size, normalize=True)
    with torch.no_grad():
        for images, real in ((reference, True), (other, False)):
            for batch in images.split(1024):
                fid.update(batch, real=real)
                kid.update(batch, real=real)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # KID draws its subsets from the global torch RNG
            kid_mean, kid_std = kid.compute()
        return {
            "fid": float(fid.compute()),
            "kid_mean": float(kid_mean),
            "kid_std": float(kid_std),
            "kid_subset_size": size,
        }


def _feature_net(
    train: Tensor,
    train_labels: np.ndarray,
    test: Tensor,
    test_labels: np.ndarray | None,
    *,
    weights: str | None,
    epochs: int,
    seed: int,
) -> tuple[FeatureNet, str]:
    """Load the user's feature net, or train one on the real training images; describe it."""
    if weights is not None:
        return load_feature_net(weights), f"user weights: {weights}"
    if test_labels is not None:
        fit, held, where = (train, train_labels), (test, test_labels), "real test"
    else:  # no labelled test images: hold out 10% of the training images
        order = np.random.default_rng(seed).permutation(len(train))
        fit_idx, held_idx = order[len(train) // 10 :], order[: len(train) // 10]
        fit, held = (train[fit_idx], train_labels[fit_idx]), (train[held_idx], train_labels[held_idx])
        where = "10% of real train"
    net = train_feature_net(*fit, epochs=epochs, seed=seed)
    acc = float(np.mean(predict(net, held[0]) == held[1]))
    description = (
        f"small CNN trained on real training split, {len(fit[0])} images, acc {acc:.3f} on held-out "
        f"({where}, {len(held[0])} images)"
    )
    return net, description


def _real_floor(
    net: FeatureNet, test: Tensor, *, seed: int, subsets: int, subset_size: int
) -> dict[str, Any]:
    """FID/KID between two random halves of the real test images (both unseen by the feature net)."""
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(test)))
    half_a, half_b = test[order[: len(test) // 2]], test[order[len(test) // 2 :]]
    out = _feature_metrics(net, half_a, half_b, subsets=subsets, subset_size=subset_size, seed=seed)
    return out | {"sets": f"two halves of the real test images ({len(half_a)} vs {len(half_b)})"}


def _scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {"accuracy": accuracy_score(y_true, y_pred), "f1_macro": f1_score(y_true, y_pred, average="macro")}


def _downstream(
    kind: str, train: tuple[Tensor, np.ndarray], test: tuple[Tensor, np.ndarray], *, epochs: int, seed: int
) -> dict[str, float]:
    """Accuracy and macro F1 on ``test`` of a ``kind`` classifier fitted on ``train``."""
    (x_tr, y_tr), (x_te, y_te) = train, test
    if kind == "cnn":
        n_classes = int(max(y_tr.max(), y_te.max())) + 1
        return _scores(
            y_te,
            predict(train_feature_net(x_tr, y_tr, epochs=epochs, seed=seed, num_classes=n_classes), x_te),
        )
    model = LogisticRegression(max_iter=1000).fit(x_tr.flatten(1).numpy(), y_tr)  # pixels, DP-MERF image LR
    return _scores(y_te, model.predict(x_te.flatten(1).numpy()))


def _subsample(images: Tensor, labels: np.ndarray | None, limit: int | None, seed: int) -> tuple[Tensor, Any]:
    if limit is None or len(images) <= limit:
        return images, labels
    keep = np.sort(np.random.default_rng(seed).choice(len(images), limit, replace=False))
    return images[keep], None if labels is None else labels[keep]


def image_fidelity(
    real_train_images: np.ndarray | Tensor,
    real_test_images: np.ndarray | Tensor,
    synthetic_images: np.ndarray | Tensor,
    *,
    real_train_labels: np.ndarray,
    synthetic_labels: np.ndarray | None = None,
    real_test_labels: np.ndarray | None = None,
    feature_weights: str | None = None,
    seed: int = 0,
    epochs: int = 5,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    downstream: Sequence[str] = ("cnn", "logistic_regression"),
    max_downstream_train: int | None = 10_000,
) -> dict[str, Any]:
    """FID/KID of synthetic vs real test images on small-CNN features, plus downstream accuracy.

    Args:
        real_train_images: real training images in [0, 1], ``(N, H, W)`` or ``(N, 1, H, W)``; the feature
            net is trained on them (with ``real_train_labels``) unless ``feature_weights`` is given.
        real_test_images: real held-out images; the reference set of FID/KID (PEARL: the test split).
        synthetic_images: generated images, same size.
        real_train_labels: integer labels of the real training images.
        synthetic_labels: labels of the synthetic images (enables the downstream classifiers).
        real_test_labels: labels of the real test images (feature-net accuracy and downstream scores);
            without them the feature net's accuracy is measured on a 10% split of the training images.
        feature_weights: a :func:`audits.feature_net.save_feature_net` file to use instead of training.
        seed: seed of the feature net, KID subsets and subsampling.
        epochs: training epochs of the feature net and of the downstream CNN.
        kid_subsets: KID subsets.
        kid_subset_size: KID subset size (capped by the smaller image set).
        downstream: classifiers trained on synthetic (and, for reference, real training) images:
            ``cnn`` (a :class:`FeatureNet`) and/or ``logistic_regression`` (sklearn, pixels).
        max_downstream_train: training images kept (at random) per downstream fit; ``None`` keeps all.

    Returns:
        JSON-serialisable dict: ``feature_extractor`` (description), ``fid``, ``kid_mean``, ``kid_std``,
        ``reference`` (the same metrics between two disjoint halves of the real test images: a noise floor;
        training images are not used because the feature net has seen them), ``downstream``.
    """
    unknown = sorted(set(downstream) - {"cnn", "logistic_regression"})
    if unknown:
        raise ValueError(f"Unknown downstream classifier(s) {unknown}; valid: ['cnn', 'logistic_regression']")
    train, test, syn = (as_image_batch(i) for i in (real_train_images, real_test_images, synthetic_images))
    if not (train.shape[1:] == test.shape[1:] == syn.shape[1:]):
        raise ValueError(f"image sizes differ: {train.shape[1:]}, {test.shape[1:]}, {syn.shape[1:]}")
    for name, images in (("real_train", train), ("real_test", test), ("synthetic", syn)):
        if images.min() < 0 or images.max() > 1:
            logger.warning("%s images are outside [0, 1]; FID/KID assume [0, 1] pixels", name)
    y_train = np.asarray(real_train_labels, dtype=np.int64)
    test_labels = None if real_test_labels is None else np.asarray(real_test_labels, dtype=np.int64)
    net, description = _feature_net(
        train, y_train, test, test_labels, weights=feature_weights, epochs=epochs, seed=seed
    )
    kid_args = {"subsets": kid_subsets, "subset_size": kid_subset_size, "seed": seed}
    result: dict[str, Any] = {
        "feature_extractor": description,
        "feature_dim": net.num_features,
        "n_images": {"real_train": len(train), "real_test": len(test), "synthetic": len(syn)},
        **_feature_metrics(net, test, syn, **kid_args),
        "reference": _real_floor(net, test, **kid_args),
        "downstream": {},
    }
    if synthetic_labels is None or real_test_labels is None:
        result["downstream_skipped"] = "needs synthetic_labels and real_test_labels"
        downstream = ()
    test_set = (test, test_labels)
    # the feature net is the real-data CNN reference when it was trained here on all the training images
    reuse_net = feature_weights is None and real_test_labels is not None
    reuse_net = reuse_net and (max_downstream_train is None or len(train) <= max_downstream_train)
    for kind in downstream:
        syn_set = _subsample(syn, np.asarray(synthetic_labels, dtype=np.int64), max_downstream_train, seed)
        scores = _downstream(kind, syn_set, test_set, epochs=epochs, seed=seed)
        if kind == "cnn" and reuse_net:
            real = _scores(test_set[1], predict(net, test))
        else:
            real_set = _subsample(train, y_train, max_downstream_train, seed)
            real = _downstream(kind, real_set, test_set, epochs=epochs, seed=seed)
        result["downstream"][kind] = scores | {f"real_{k}": v for k, v in real.items()}
    return json_safe(result)
