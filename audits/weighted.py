"""Evaluation of importance-weighted synthetic data: weighted MMD² and Wasserstein-1, and the report's weights
section.

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary Tale"
(B.1): synthetic rows x_i carry importance weights w_i ≈ p_D(x_i)/p_G(x_i), and the synthetic sample is compared
with real rows z_j as the weighted measure Σ_i (w_i/Σw) δ_{x_i}. Inputs of the distance functions are numeric
arrays (N, d) and (M, d), already encoded and scaled by the caller.

* :func:`weighted_mmd2`: the weighted unbiased MMD² with the Gaussian kernel; w ≡ 1 gives the plain U-statistic.
* :func:`weighted_w1`: exact optimal transport between the weighted synthetic measure and the uniform measure on
  the real rows (POT's ``ot.emd2``), a proper weighted Wasserstein-1 distance.
* :func:`paper_weighted_w1`: the paper's variant ("weighting the distance matrix"), for comparison with its
  tables only: it is not a distance between the weighted measures and falls to about 0 when the weights
  collapse onto a few rows.
* :func:`weights_section`: what ``report.json``'s ``"weights"`` key holds when the synthetic file has a
  :data:`WEIGHT_COLUMN`: TSTR utility with and without the weights, the distances above with and without them
  (against HOLDOUT, the paper's test split), Kish's ESS and the PSIS k̂ of the weights.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from audits.distances import TabularEncoder
from audits.fidelity import mmd2
from audits.inputs import WEIGHT_COLUMN
from audits.utility import METRICS, json_safe, tstr
from lightning_dp.weighting.postprocess import PSIS_THRESHOLD, sandwich_ess, summarise

log = logging.getLogger(__name__)

# above this many N·M cost-matrix entries, exact OT runs on subsamples of max_points rows per side
MAX_OT_ENTRIES = 4_000_000
PSIS_WARNING = (
    "The importance weights are unreliable (PSIS k̂ = {k:.3g} > {limit:g}): the synthetic data miss parts of the "
    "real distribution, so a few rows carry most of the weight. Do not release the weighted data; improve the "
    "generator instead."
)


# ----------------------------------------------------------------------------------------- distances
def _arrays(synthetic: Any, real: Any, weights: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked float64 copies: (N, d) and (M, d) with the same d, and (N,) weights of mean one."""
    x, z = np.asarray(synthetic, dtype=np.float64), np.asarray(real, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x
    z = z[:, None] if z.ndim == 1 else z
    if x.ndim != 2 or z.ndim != 2 or x.shape[1] != z.shape[1]:
        raise ValueError(
            f"synthetic and real must be (N, d) and (M, d) with one d; got {x.shape} and {z.shape}"
        )
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(x),):
        raise ValueError(f"weights must have shape ({len(x)},), one per synthetic row; got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    return x, z, w * len(w) / w.sum()


def weighted_mmd2(synthetic: Any, real: Any, weights: Any, *, bandwidth: float = 1.0) -> float:
    """The weighted unbiased MMD² of B.1, with k(a, b) = exp(−‖a − b‖² / (2 h²)), h = ``bandwidth``.

    Weights are normalised to mean one (Σ w = N), so w ≡ 1 gives the plain unbiased estimator. What is computed,
    for N synthetic rows x and M real rows z (sizes may differ):

        Σ_{i≠j} w_i w_j k(x_i, x_j) / (N(N−1)) + Σ_{i≠j} k(z_i, z_j) / (M(M−1)) − 2 Σ_{i,j} w_i k(x_i, z_j) / (NM),

    a U-statistic within each sample and the mean over all cross pairs. For N = M it equals the paper's
    Σ_{i≠j}[w_i w_j k(x_i,x_j) + k(z_i,z_j) − w_i k(x_i,z_j) − w_j k(x_j,z_i)] / (N(N−1)) except that the paper
    leaves out the cross pairs i = j (the difference vanishes as N grows). Memory is O(N² + M² + NM): subsample
    large samples first.

    Args:
        synthetic: (N, d) encoded synthetic rows, N ≥ 2.
        real: (M, d) encoded real rows, M ≥ 2.
        weights: (N,) non-negative importance weights of the synthetic rows (any scale).
        bandwidth: h; 1 is the paper's "standard normal kernel".

    Returns:
        MMD² (may be slightly negative, being unbiased).
    """
    x, z, w = _arrays(synthetic, real, weights)
    if len(x) < 2 or len(z) < 2:
        raise ValueError(f"the unbiased MMD² needs at least 2 rows per side; got {len(x)} and {len(z)}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    return mmd2(x, z, bandwidth=float(bandwidth), weights=w)


def _subsample(
    x: np.ndarray, z: np.ndarray, w: np.ndarray, max_points: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both sides cut to at most ``max_points`` rows (uniformly, seeded) when N·M > :data:`MAX_OT_ENTRIES`.

    A uniform subsample of the synthetic rows with their weights is again a weighted sample of the same measure.
    """
    if len(x) * len(z) <= MAX_OT_ENTRIES:
        return x, z, w
    rng = np.random.default_rng(seed)
    keep_x = np.sort(rng.choice(len(x), min(len(x), max_points), replace=False))
    keep_z = np.sort(rng.choice(len(z), min(len(z), max_points), replace=False))
    log.info(
        "W1: %d x %d rows subsampled to %d x %d (seed %d)", len(x), len(z), len(keep_x), len(keep_z), seed
    )
    if w[keep_x].sum() <= 0:
        raise ValueError("the subsample of synthetic rows holds only zero weights; raise max_points")
    return x[keep_x], z[keep_z], w[keep_x]


def _cost(x: np.ndarray, z: np.ndarray) -> np.ndarray:
    import ot

    return ot.dist(x, z, metric="euclidean")  # (N, M)


def _emd2(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> float:
    import ot

    return float(ot.emd2(a, b, cost, numItermax=10_000_000))


def weighted_w1(synthetic: Any, real: Any, weights: Any, *, max_points: int = 2000, seed: int = 0) -> float:
    """Wasserstein-1 between Σ_i (w_i/Σw) δ_{x_i} and the uniform measure on the real rows, Euclidean cost.

    Exact OT (``ot.emd2``). When the cost matrix would have more than :data:`MAX_OT_ENTRIES` entries, both sides
    are first subsampled to at most ``max_points`` rows, uniformly with a ``seed``-ed generator (deterministic;
    the synthetic rows keep their weights), so the value is then an estimate from the subsamples.

    Args:
        synthetic: (N, d) encoded synthetic rows.
        real: (M, d) encoded real rows.
        weights: (N,) non-negative importance weights (any scale).
        max_points: rows per side kept when subsampling.
        seed: seed of the subsample.

    Returns:
        W1 ≥ 0 (0 for identical samples with uniform weights).
    """
    x, z, w = _subsample(*_arrays(synthetic, real, weights), max_points, seed)
    return _emd2(w / w.sum(), np.full(len(z), 1.0 / len(z)), _cost(x, z))


def paper_weighted_w1(
    synthetic: Any, real: Any, weights: Any, *, max_points: int = 2000, seed: int = 0
) -> float:
    """The paper's weighted "WST" (B.1: "computed by weighting the distance matrix"), for comparison with its
    tables only.

    The Euclidean cost matrix is multiplied row-wise by the weights normalised to mean one, C_ij = w_i ‖x_i − z_j‖,
    and exact OT is solved between UNIFORM marginals. This is not a distance between the weighted synthetic
    measure and the real one: when the weights collapse onto a few rows, the other rows cost nothing to move and
    the value falls to the few heavy rows' distances to their nearest real rows, near 0 (the paper's
    0.0000–0.0001 entries), however poor the weighted sample. Use :func:`weighted_w1` to judge the weights. The
    paper does not say how it normalised the weights here; with mean-one weights, uniform weights give the plain
    W1. Subsampling as in :func:`weighted_w1`.

    Args:
        synthetic: (N, d) encoded synthetic rows.
        real: (M, d) encoded real rows.
        weights: (N,) non-negative importance weights (any scale).
        max_points: rows per side kept when subsampling.
        seed: seed of the subsample.

    Returns:
        The paper-style value (≥ 0).
    """
    x, z, w = _subsample(*_arrays(synthetic, real, weights), max_points, seed)
    w = w * len(w) / w.sum()  # mean one within the (sub)sample
    return _emd2(np.full(len(x), 1.0 / len(x)), np.full(len(z), 1.0 / len(z)), w[:, None] * _cost(x, z))


# ----------------------------------------------------------------------------------------- report section
def _utility(
    synthetic: pd.DataFrame,
    weights: np.ndarray,
    holdout: pd.DataFrame,
    *,
    label: str | None,
    categorical: Sequence[str],
    classifiers: Sequence[str] | str,
    metric: str | None,
    seed: int,
) -> dict[str, Any]:
    """TSTR on HOLDOUT with the same classifiers fitted without and with ``sample_weight``."""
    if label is None:
        return {"status": "skipped", "reason": "no label: name it in utility.label or pass --label"}
    cats = [c for c in categorical if c != label]
    common = {"label": label, "classifiers": classifiers, "categorical": cats, "seed": seed}
    plain = tstr(synthetic, holdout, **common)
    weighted = tstr(synthetic, holdout, sample_weight=weights, **common)
    task = plain.summary["task"]
    metric = metric or ("roc_auc" if task == "binary" else plain.summary["primary_metric"])
    if metric not in METRICS[task]:
        raise ValueError(
            f"utility.metric {metric!r} does not apply to a {task} label; valid: {list(METRICS[task])}."
        )
    per_model = {
        name: {
            "unweighted": plain.summary["per_model"].get(name, {}).get(metric),
            "weighted": weighted.summary["per_model"].get(name, {}).get(metric),
        }
        for name in plain.summary["models"]
    }
    return {
        "status": "ran",
        "label": label,
        "task": task,
        "metric": metric,
        "classifiers": list(plain.summary["models"]),
        "unweighted": plain.summary["average"][metric],
        "weighted": weighted.summary["average"][metric],
        "per_model": per_model,
        "averages": {"unweighted": plain.summary["average"], "weighted": weighted.summary["average"]},
        "n_test_rows": plain.summary["n_rows"]["real_test"],
        # e.g. "<model>: does not accept sample_weight; fitted unweighted"
        "warnings": weighted.summary["warnings"],
    }


def _sandwich(x: np.ndarray, frame: pd.DataFrame, weights: np.ndarray, label: str | None) -> float | None:
    """A.6.1's N_eff of a weighted logistic regression of a binary label, else None."""
    if label is None:
        return None
    y = frame[label]
    keep = y.notna().to_numpy()
    classes = sorted(y[keep].unique().tolist(), key=str)
    if len(classes) != 2 or weights[keep].sum() <= 0:
        return None
    return sandwich_ess(x[keep], (y[keep] == classes[-1]).to_numpy(dtype=int), weights[keep])


def weights_section(
    synthetic: pd.DataFrame,
    weights: np.ndarray,
    real: pd.DataFrame,
    holdout: pd.DataFrame,
    *,
    label: str | None = None,
    categorical: Sequence[str] = (),
    classifiers: Sequence[str] | str = "bias_mitigation",
    metric: str | None = None,
    seed: int = 0,
    max_points: int = 2000,
    bandwidth: float = 1.0,
) -> dict[str, Any]:
    """The report's ``"weights"`` section: how the synthetic rows' importance weights change what they are worth.

    Args:
        synthetic: synthetic rows in REAL's columns, without the weight column.
        weights: (N,) non-negative weights of those rows, as the sampler wrote them (any scale).
        real: REAL (the encoder of the distances is fitted on it).
        holdout: HOLDOUT: the distances are measured against it, and TSTR scored on it (the paper's test split).
        label: the label column (None: no utility and no N_eff).
        categorical: categorical columns.
        classifiers: TSTR classifiers (a preset or names; the report passes the utility check's).
        metric: TSTR metric (default: roc_auc for a binary label, else the task's primary metric).
        seed: seed of the classifiers and of the distances' subsample.
        max_points: rows per side kept for the distances (MMD², W1), drawn once so that the weighted and
            unweighted numbers compare the same rows.
        bandwidth: Gaussian kernel bandwidth of MMD² on the min-max encoded features (1: the paper's).

    Returns:
        A JSON-safe dict: ``diagnostics`` (:func:`~lightning_dp.weighting.postprocess.summarise` of log w:
        ``kish_ess``, ``psis_k``, ``psis_verdict``, ...), ``sandwich_ess`` (A.6.1, a binary label only),
        ``psis_threshold``, ``unreliable`` (k̂ > threshold), ``utility`` (per model and on average, without and
        with the weights), ``distances`` (MMD², W1 and the paper's W1, each unweighted and weighted),
        ``features`` (the columns compared: never the weight column).
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (len(synthetic),):
        raise ValueError(f"{len(weights)} weights for {len(synthetic)} synthetic rows")
    with np.errstate(divide="ignore"):
        log_w = np.log(weights)  # a weight of 0 is log w = -inf
    diagnostics = summarise(log_w)
    k_hat = diagnostics["psis_k"]
    columns = list(real.columns)
    encoder = TabularEncoder(scaling="minmax", categorical_columns=list(categorical)).fit(real[columns])
    x_syn = encoder.transform(synthetic[columns])  # (N, D)
    x_test = encoder.transform(holdout[columns])  # (M, D)
    rng = np.random.default_rng(seed)
    keep_x = np.sort(rng.choice(len(x_syn), min(len(x_syn), max_points), replace=False))
    keep_z = np.sort(rng.choice(len(x_test), min(len(x_test), max_points), replace=False))
    xs, zs, ws = x_syn[keep_x], x_test[keep_z], weights[keep_x]
    ones = np.ones(len(xs))
    distances: dict[str, Any] = {
        "against": "HOLDOUT",
        "encoding": "min-max scaled numerics, one-hot categoricals (fitted on REAL), the label included",
        "n_synthetic": len(xs),
        "n_real": len(zs),
        "bandwidth": bandwidth,
        "kernel": "gaussian exp(-||a-b||^2 / (2 h^2))",
        "subsample_seed": seed,
    }
    if ws.sum() > 0 and len(xs) >= 2 and len(zs) >= 2:
        for name, fn in (("mmd2", weighted_mmd2), ("w1", weighted_w1), ("paper_w1", paper_weighted_w1)):
            kwargs = {"bandwidth": bandwidth} if name == "mmd2" else {"max_points": max_points, "seed": seed}
            distances[name] = {"unweighted": fn(xs, zs, ones, **kwargs), "weighted": fn(xs, zs, ws, **kwargs)}
        distances["kish_ess_of_subsample"] = float(ws.sum() ** 2 / (ws**2).sum())
    else:
        distances["skipped"] = "the subsample of synthetic rows holds only zero weights"
    utility = _utility(
        synthetic,
        weights,
        holdout,
        label=label,
        categorical=categorical,
        classifiers=classifiers,
        metric=metric,
        seed=seed,
    )
    x_features = np.delete(x_syn, encoder.feature_indices([label]), axis=1) if label else x_syn
    section = {
        "weight_column": WEIGHT_COLUMN,
        "n": len(weights),
        "zero_weights": int((weights == 0).sum()),
        "diagnostics": diagnostics,
        "sandwich_ess": _sandwich(x_features, synthetic, weights, label),
        "psis_threshold": PSIS_THRESHOLD,
        "unreliable": not k_hat <= PSIS_THRESHOLD,
        "message": PSIS_WARNING.format(k=k_hat, limit=PSIS_THRESHOLD) if not k_hat <= PSIS_THRESHOLD else "",
        "utility": utility,
        "distances": distances,
        "features": columns,
        "notes": (
            "Weights are normalised to mean one inside each statistic. Kish ESS = (Σw)²/Σw². PSIS k̂ (Vehtari et "
            "al.): below 0.5 good, 0.5–0.7 acceptable, above 0.7 unreliable; the paper gives no threshold. "
            "sandwich_ess is A.6.1's N_eff for a weighted logistic regression of the label (the paper's Eq. 17, "
            "corrected). paper_w1 multiplies the cost matrix by the weights (the paper's tables) and falls to "
            "about 0 for collapsed weights: judge the weights by w1."
        ),
    }
    return json_safe(section)


def log_weight_figure(weights: np.ndarray, *, k_hat: float | None = None) -> Figure:
    """Histogram of the log weights (log of weights normalised to mean one; zero weights left out)."""
    w = np.asarray(weights, dtype=np.float64)
    positive = w[w > 0]
    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.add_subplot()
    ax.hist(np.log(positive * len(w) / w.sum()), bins=min(60, max(10, len(positive) // 20)), color="#4c72b0")
    ax.axvline(0.0, color="grey", linestyle=":", label="w = 1 (mean weight)")
    title = "log importance weights (mean one)"
    ax.set(
        xlabel="log w",
        ylabel="synthetic rows",
        title=title if k_hat is None else f"{title}, PSIS k̂ = {k_hat:.3g}",
    )
    ax.legend(fontsize="small")
    return fig


def section_options(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The utility check's label, classifiers and metric from a policy (``checks`` or ``expectations``), so that
    the weights section scores the same classifiers; the paper's four (``bias_mitigation``) when it has none."""
    opts = policy.get("checks", {}).get("utility") or policy.get("expectations", {}).get("utility") or {}
    return {
        "label": opts.get("label"),
        "classifiers": opts.get("classifiers") or "bias_mitigation",
        "metric": opts.get("metric"),
    }
