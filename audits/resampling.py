"""Bootstrap intervals of the audit statistics that have no closed-form variance.

What is resampled is what a repeated audit would draw afresh: the candidates (members and non-members, the same
draw for the synthetic source and the held-out baseline, so that their difference is paired), the test rows of
the utility classifiers, and the rows of REAL and of the synthetic data for fidelity.

The source rows that the disclosure attacks search (the synthetic sample and the held-out reference set) are held
fixed: a nearest-neighbour statistic is not bootstrappable over the rows it searches (a draw repeats rows and
thins the rest, which moves every distance; Abadie and Imbens 2008, "On the failure of the bootstrap for matching
estimators"). Their intervals are therefore conditional on the sources, which is what the verdict is about: the
synthetic rows that were released.

The presence statistic is resampled differently from the others: its confident r* is an exact binomial test over
distinct candidates, which a bootstrap draw that repeats a candidate would fool (seven copies of four close members
look like seven independent ones). Its draws keep each candidate at most once: a random ``1 − 1/e ≈ 63%`` of each
side, the share of distinct rows in a bootstrap draw (subsampling, Politis, Romano and Wolf 1999, "Subsampling").
Fewer candidates make the confident rule less likely to trigger, so its interval can fall below the full-sample
estimate; :func:`audits.verdicts.decide` then widens it to include the estimate.

Intervals are percentile intervals of the draws, except for fidelity, whose plug-in distances (KS, TV, ...) are
biased upwards by sampling; there the *basic* bootstrap interval ``[2θ̂ − q_hi, 2θ̂ − q_lo]`` corrects that bias
(Davison and Hinkley 1997, "Bootstrap Methods and their Application", §5.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from audits.disclosure import sensitivity_at_star
from audits.fidelity import _numeric, discretise, range_query_masks
from audits.utility import METRICS, score_predictions
from audits.verdicts import CONFIDENCE, percentile_interval

SUBSAMPLE = 1.0 - np.exp(-1.0)  # share of candidates kept by each draw of the presence interval
MAX_FIDELITY_ROWS = (
    50_000  # the fidelity bootstrap resamples at most this many rows per side (a random subset)
)


# ------------------------------------------------------------------------------------------ disclosure
def presence_interval(
    distances: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    precision_target: float,
    n_bootstrap: int,
    seed: int,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Subsampling interval of the presence risk above baseline: the sensitivity at the confident r* on the
    synthetic source minus that at the baseline's own confident r* (:mod:`audits.disclosure`).

    Args:
        distances: per source (``synthetic``, ``baseline``), the members' and non-members' distances to their
            closest source row (:func:`audits.disclosure.presence_disclosure`'s ``distances``).
        precision_target: the precision the confident r* must exceed.
        n_bootstrap: number of draws.
        seed: their seed.
        confidence: of the interval and of the confident r*.

    Returns:
        ``{"interval": (lo, hi) or None, "draws": number of draws, "method": str}``.
    """
    rng = np.random.default_rng(seed)
    n_in, n_out = len(distances["synthetic"][0]), len(distances["synthetic"][1])
    m_in, m_out = max(1, round(SUBSAMPLE * n_in)), max(1, round(SUBSAMPLE * n_out))
    draws = np.empty(n_bootstrap)
    for b in range(n_bootstrap):
        rows_in, rows_out = rng.choice(n_in, m_in, replace=False), rng.choice(n_out, m_out, replace=False)
        sens = [
            sensitivity_at_star(d_in[rows_in], d_out[rows_out], precision_target, confidence)
            for d_in, d_out in (distances["synthetic"], distances["baseline"])
        ]
        draws[b] = sens[0] - sens[1]
    return {
        "interval": percentile_interval(draws, confidence),
        "draws": n_bootstrap,
        "method": f"subsampling ({n_bootstrap} draws of 63% of the candidates, sources fixed), percentile",
    }


def attribute_interval(
    per_member: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    n_bootstrap: int,
    seed: int,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Bootstrap interval, over the member candidates, of the attribute-disclosure risk above baseline: the share
    of (member, unknown column) pairs imputed correctly from the synthetic source minus that from the baseline.

    Args:
        per_member: per source (``synthetic``, ``baseline``), each member's number of correctly imputed and of
            valid unknown values (:func:`audits.disclosure.attribute_disclosure`'s ``per_member``).
        n_bootstrap: number of draws.
        seed: their seed.
        confidence: of the interval.

    Returns:
        ``{"interval": (lo, hi) or None, "draws": number of draws, "method": str}``.
    """
    rng = np.random.default_rng(seed)
    (syn, valid), (base, _) = per_member["synthetic"], per_member["baseline"]
    diff = np.asarray(syn, dtype=float) - np.asarray(base, dtype=float)  # (n,)
    valid = np.asarray(valid, dtype=float)
    n = len(diff)
    draws = np.empty(n_bootstrap)
    for b in range(n_bootstrap):
        rows = rng.integers(0, n, n)
        draws[b] = diff[rows].sum() / max(valid[rows].sum(), 1.0)
    return {
        "interval": percentile_interval(draws, confidence),
        "draws": n_bootstrap,
        "method": f"bootstrap ({n_bootstrap} draws) of the member candidates, sources fixed, percentile",
    }


# ------------------------------------------------------------------------------------------ utility
def utility_interval(
    predictions: dict[str, dict[str, dict[str, Any]]],
    *,
    task: str,
    metric: str,
    pos_label: Any,
    n_bootstrap: int,
    seed: int,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Bootstrap intervals, over the real test rows, of the mean ``metric`` of the classifiers trained on
    synthetic rows and of the real-trained minus synthetic-trained gap (paired: the same rows for both).

    Args:
        predictions: :attr:`audits.utility.UtilityResult.predictions` (``synthetic`` and optionally ``real``).

    Returns:
        ``{"score": (lo, hi) or None, "gap": (lo, hi) or None, "draws", "method"}``.
    """
    if metric not in METRICS[task]:
        raise ValueError(f"metric {metric!r} does not apply to a {task} label; valid: {list(METRICS[task])}.")
    syn, real = predictions.get("synthetic", {}), predictions.get("real", {})
    any_model = next(iter(syn.values()), None) or next(iter(real.values()), None)
    if any_model is None:
        return {"score": None, "gap": None, "draws": 0, "method": ""}
    n = len(any_model["y_true"])
    rng = np.random.default_rng(seed)

    def mean_metric(models: dict[str, dict[str, Any]], rows: np.ndarray) -> float:
        values = []
        for p in models.values():
            scores = None if p["scores"] is None else np.asarray(p["scores"])[rows]
            got = score_predictions(
                np.asarray(p["y_true"])[rows],
                np.asarray(p["prediction"])[rows],
                task=task,
                pos_label=pos_label,
                scores=scores,
            )
            values.append(got[metric])
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values)]
        return float(values.mean()) if values.size else np.nan

    score_draws, gap_draws = np.empty(n_bootstrap), np.empty(n_bootstrap)
    for b in range(n_bootstrap):
        rows = rng.integers(0, n, n)
        score_draws[b] = mean_metric(syn, rows) if syn else np.nan
        gap_draws[b] = mean_metric(real, rows) - score_draws[b] if real else np.nan
    return {
        "score": percentile_interval(score_draws, confidence),
        "gap": percentile_interval(gap_draws, confidence),
        "draws": n_bootstrap,
        "method": f"bootstrap ({n_bootstrap} draws) of the real test rows, percentile",
    }


# ------------------------------------------------------------------------------------------ fidelity
def _ks_w1(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Two-sample KS statistic and Wasserstein-1 distance of two sorted 1-D samples (scipy's definitions)."""
    both = np.sort(np.concatenate([x, y]))
    gap = np.abs(
        np.searchsorted(x, both, side="right") / len(x) - np.searchsorted(y, both, side="right") / len(y)
    )
    return float(gap.max()), float((gap[:-1] * np.diff(both)).sum())


def _cap(frame: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    if len(frame) <= MAX_FIDELITY_ROWS:
        return frame
    return frame.iloc[np.sort(rng.choice(len(frame), MAX_FIDELITY_ROWS, replace=False))]


def fidelity_interval(
    real: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    categorical: Sequence[str],
    keys: Sequence[str],
    n_bootstrap: int,
    seed: int,
    n_range_queries: int,
    n_bins: int = 10,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Basic bootstrap intervals (rows of REAL and of the synthetic data resampled independently) of the
    fidelity summaries named in ``keys``: ``mean_tv``, ``mean_ks``, ``mean_w1``, ``two_way_marginal``,
    ``range_query_error`` (the definitions of :func:`audits.fidelity.tabular_fidelity`).

    Returns:
        ``{"intervals": {key: (lo, hi) or None}, "draws", "method"}``.
    """
    rng = np.random.default_rng(seed)
    real, synthetic = _cap(real, rng), _cap(synthetic, rng)
    cols = list(real.columns)
    cats = [c for c in cols if c in set(categorical)]
    nums = [c for c in cols if c not in set(cats)]
    want = set(keys)
    coded = {}
    if want & {"mean_tv", "two_way_marginal"}:
        coded = {
            c: discretise(real[c], synthetic[c], categorical=c in cats, n_bins=n_bins)
            for c in (cols if "two_way_marginal" in want else cats)
        }
    scaled = {}
    for c in nums if want & {"mean_ks", "mean_w1"} else []:
        x, y = _numeric(real[c]), _numeric(synthetic[c])
        fx, fy = np.isfinite(x), np.isfinite(y)
        if fx.any() and fy.any():
            low, span = x[fx].min(), np.ptp(x[fx]) or 1.0
            scaled[c] = ((x - low) / span, fx, (y - low) / span, fy)
    masks = None
    if "range_query_error" in want:
        queries = range_query_masks(real, synthetic, categorical=cats, n_queries=n_range_queries, seed=seed)
        pairs = list(queries)
        masks = (
            np.stack([r for r, _ in pairs]).astype(np.float32),  # (Q, n_real)
            np.stack([s for _, s in pairs]).astype(np.float32),  # (Q, n_synthetic)
        )

    def stats(ir: np.ndarray, js: np.ndarray) -> dict[str, float]:
        out: dict[str, float] = {}
        if "mean_tv" in want:
            tv = []
            for c in cats:
                r, s, levels = coded[c]
                p = np.bincount(r[ir], minlength=levels) / len(ir)
                q = np.bincount(s[js], minlength=levels) / len(js)
                tv.append(0.5 * np.abs(p - q).sum())
            out["mean_tv"] = float(np.mean(tv)) if tv else np.nan
        if want & {"mean_ks", "mean_w1"}:
            ks, w1 = [], []
            for x, fx, y, fy in scaled.values():
                xs, ys = x[ir][fx[ir]], y[js][fy[js]]
                if len(xs) and len(ys):
                    a, b = _ks_w1(np.sort(xs), np.sort(ys))
                    ks.append(a)
                    w1.append(b)
            out["mean_ks"] = float(np.mean(ks)) if ks else np.nan
            out["mean_w1"] = float(np.mean(w1)) if w1 else np.nan
        if "two_way_marginal" in want:
            errors = []
            for a, b in combinations(cols, 2):
                (ra, sa, ka), (rb, sb, kb) = coded[a], coded[b]
                p = np.bincount(ra[ir] * kb + rb[ir], minlength=ka * kb) / len(ir)
                q = np.bincount(sa[js] * kb + sb[js], minlength=ka * kb) / len(js)
                errors.append(np.abs(p - q).sum())
            out["two_way_marginal"] = float(np.mean(errors)) if errors else np.nan
        if masks is not None:
            cr = np.bincount(ir, minlength=masks[0].shape[1]).astype(np.float32)
            cs = np.bincount(js, minlength=masks[1].shape[1]).astype(np.float32)
            answers = masks[0] @ cr / len(ir) - masks[1] @ cs / len(js)  # (Q,)
            out["range_query_error"] = float(np.abs(answers).mean())
        return out

    n_r, n_s = len(real), len(synthetic)
    point = stats(np.arange(n_r), np.arange(n_s))
    draws: dict[str, list[float]] = {key: [] for key in keys}
    for _ in range(n_bootstrap):
        got = stats(rng.integers(0, n_r, n_r), rng.integers(0, n_s, n_s))
        for key in keys:
            draws[key].append(got.get(key, np.nan))
    intervals = {}
    for key in keys:
        q = percentile_interval(np.asarray(draws[key]), confidence)
        intervals[key] = (
            None
            if q is None or not np.isfinite(point.get(key, np.nan))
            else (max(0.0, 2 * point[key] - q[1]), max(0.0, 2 * point[key] - q[0]))
        )
    capped = max(n_r, n_s) >= MAX_FIDELITY_ROWS
    return {
        "intervals": intervals,
        "draws": n_bootstrap,
        "method": f"bootstrap ({n_bootstrap} draws) of REAL's and the synthetic rows"
        + (f" (at most {MAX_FIDELITY_ROWS:,} of each)" if capped else "")
        + ", basic (bias-corrected)",
    }
