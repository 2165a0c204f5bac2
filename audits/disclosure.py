"""Presence and attribute disclosure (Diesendruck 2019, "Distribution Distance Measures in Generative and Privacy
Models", Ch. 4, after Choi et al. 2017; spec §3 and §6).

Both attacks are run against the synthetic set and, as the thesis does, against a held-out real set S_base
in its place (the *baseline*: what the population structure alone reveals); ``risk_above_baseline`` is the
difference of the reported numbers.

Presence disclosure (membership by a close synthetic neighbour): candidate c is flagged iff
min_s ‖c − s‖ ≤ r for a distance threshold r; sensitivity = TP / #members, precision = TP / #flagged, over a
sweep of r; the reported point is r* = the largest r with precision > 0.55 (the thesis' rule). The thesis writes
this distance threshold as ε; here it is r, so that ε only ever means the privacy budget. Choices (thesis
silent, spec §9.11): Euclidean distance after :class:`~audits.distances.TabularEncoder` with z-scored numerics
(fitted on the real candidates) and one-hot categoricals; the default sweep is every observed candidate
distance, so r* is exact; if no r reaches precision > 0.55, r* is None and the reported sensitivity is 0.

At a few dozen candidates the rule is unstable: the precision of a large r hovers around 0.5 and crosses 0.55
by chance, so r* jumps between small and large distances and the sensitivity at r* between 0 and 1 from one
draw to the next (a correct DP run failed a 0.05 limit 1 time in 10 on 55 candidates per side). The verdict of
the audit report therefore uses the same rule read as a statistical claim: the *confident* r* is the largest r
whose precision is above the target with confidence (the lower end of its Clopper–Pearson interval, i.e. an
exact binomial test of "precision ≤ target" rejected at level (1 − confidence)/2). It is reported beside the
thesis' numbers (``confident_r_star``, ``sensitivity_at_confident_r_star``, and ``confident_sensitivity`` in
``risk_above_baseline``).

Attribute disclosure: for each candidate, the ``known_columns`` are known; its k nearest synthetic
records on the known columns (min–max scaled by the real candidates' range, one-hot categoricals) impute
each unknown column: numeric = mean of the k values, categorical = majority vote (ties go to the category
of the nearest tied neighbour). Choices (spec §6.2 and §9.12):

* correctness: categorical = exact match; numeric = within ``tolerance`` (5%) *of the true value*,
  |x̂ − x| ≤ 0.05·|x| (``tolerance_mode="relative"``, the thesis' words and the spec's likely reading), or
  of the column's range over the real candidates (``"range"``); pairs whose true value is NaN are skipped;
* sensitivity = fraction of (member, unknown column) pairs imputed correctly;
* precision = among correctly imputed (candidate, column) pairs over members *and* non-members, the
  fraction that belong to members (needs ``non_members``; None otherwise);
* also always reported, the medGAN definition for binary (0/1) unknown columns, positive = 1: sensitivity
  = TP / (TP + FN), precision = TP / (TP + FP) over member pairs, the imputation being 1 iff the
  neighbours' mean is >= 0.5.

The thesis uses k = 5 and half the features known; callers choose ``known_columns``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binom

from audits.distances import TabularEncoder, distance_to_closest_record, nearest_neighbors

log = logging.getLogger(__name__)

PRECISION_TARGET = 0.55
Table = pd.DataFrame | np.ndarray


# ------------------------------------------------------------------------------------------ presence
def presence_curve(
    member_dcr: np.ndarray, non_member_dcr: np.ndarray, thresholds: np.ndarray
) -> dict[str, list[float]]:
    """Sensitivity and precision of "flag iff DCR ≤ r" for every distance threshold r in ``thresholds`` (pure).

    Args:
        member_dcr: Distance of each member candidate to the closest synthetic record.
        non_member_dcr: Same for the non-member candidates.
        thresholds: Sorted distance thresholds r.

    Returns:
        ``{"thresholds", "sensitivity", "precision", "n_flagged"}`` lists; precision is NaN where
        nothing is flagged.
    """
    tp = np.searchsorted(np.sort(member_dcr), thresholds, side="right")
    fp = np.searchsorted(np.sort(non_member_dcr), thresholds, side="right")
    flagged = tp + fp
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(flagged > 0, tp / np.maximum(flagged, 1), np.nan)
    return {
        "thresholds": [float(t) for t in thresholds],
        "sensitivity": [float(x) for x in tp / len(member_dcr)],
        "precision": [float(x) for x in precision],
        "n_flagged": [int(x) for x in flagged],
    }


def presence_star(
    d_in: np.ndarray, d_out: np.ndarray, precision_target: float, confidence: float | None = None
) -> tuple[float | None, float, float | None]:
    """``(r*, sensitivity at r*, precision at r*)`` over every observed distance (pure).

    Args:
        d_in: members' distances to the closest source row.
        d_out: non-members' distances.
        precision_target: the precision r* must exceed (0.55 in the thesis).
        confidence: None for the thesis' rule (point precision > target); else the confident rule: the
            precision exceeds the target at the lower end of its two-sided Clopper–Pearson interval.

    Returns:
        r* (None when no distance qualifies), the sensitivity there (0 when none) and the precision (None).
    """
    grid = np.unique(np.concatenate([d_in, d_out]))  # sorted; every point flags at least one candidate
    tp = np.searchsorted(np.sort(d_in), grid, side="right")
    fp = np.searchsorted(np.sort(d_out), grid, side="right")
    if confidence is None:
        ok = np.flatnonzero(tp > precision_target * (tp + fp))
    else:  # P(Binomial(flagged, target) >= tp) below (1 - confidence)/2
        ok = np.flatnonzero(binom.sf(tp - 1, tp + fp, precision_target) < (1.0 - confidence) / 2.0)
    if not ok.size:
        return None, 0.0, None
    i = ok[-1]
    return float(grid[i]), float(tp[i] / len(d_in)), float(tp[i] / (tp[i] + fp[i]))


def sensitivity_at_star(
    d_in: np.ndarray, d_out: np.ndarray, precision_target: float, confidence: float | None = None
) -> float:
    """The sensitivity of :func:`presence_star` alone (the bootstrap of :func:`audits.resampling.presence_interval`
    calls it thousands of times)."""
    return presence_star(d_in, d_out, precision_target, confidence)[1]


def _presence_one(
    source: np.ndarray,
    members: np.ndarray,
    non_members: np.ndarray,
    thresholds: np.ndarray | None,
    precision_target: float,
    confidence: float,
) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]:
    d_in = distance_to_closest_record(members, source)
    d_out = distance_to_closest_record(non_members, source)
    confident = presence_star(d_in, d_out, precision_target, confidence)
    grid = np.unique(np.r_[d_in, d_out]) if thresholds is None else np.sort(np.asarray(thresholds, float))
    curve = presence_curve(d_in, d_out, grid)
    ok = [i for i, p in enumerate(curve["precision"]) if p > precision_target]
    star = max(ok, key=lambda i: curve["thresholds"][i]) if ok else None
    return {
        **curve,
        "r_star": None if star is None else curve["thresholds"][star],
        "sensitivity_at_r_star": 0.0 if star is None else curve["sensitivity"][star],
        "precision_at_r_star": None if star is None else curve["precision"][star],
        "confident_r_star": confident[0],
        "sensitivity_at_confident_r_star": confident[1],
        "precision_at_confident_r_star": confident[2],
        "confidence": confidence,
        "n_members": len(members),
        "n_non_members": len(non_members),
        "precision_target": precision_target,
    }, (d_in, d_out)


def _risk(main: dict[str, Any], base: dict[str, Any], keys: dict[str, str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, key in keys.items():
        a, b = main.get(key), base.get(key)
        out[name] = None if a is None or b is None else float(a) - float(b)
    return out


def presence_disclosure(
    synthetic: Table,
    members: Table,
    non_members: Table,
    *,
    thresholds: Sequence[float] | np.ndarray | None = None,
    baseline: Table | None = None,
    precision_target: float = PRECISION_TARGET,
    scaling: str = "standard",
    confidence: float = 0.95,
    distances: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Presence disclosure sweep with the thesis' "largest distance threshold r with precision > 55%" report.

    Args:
        synthetic: Synthetic records (DataFrame, or an already encoded array).
        members: Training records among the candidates (S_train sample).
        non_members: Held-out candidates (S_test), ideally as many as members.
        thresholds: Distance thresholds r; default: every observed candidate DCR (exact r*).
        baseline: Held-out real set S_base run in place of the synthetic set, or None.
        precision_target: Precision that r* must exceed (0.55 in the thesis).
        scaling: Numeric scaling of the encoder for DataFrames (``"standard"`` or ``"minmax"``).
        confidence: of the confident r* (see the module docstring).
        distances: a dict that receives, per source (``synthetic``, ``baseline``), the members' and the
            non-members' distances to their closest source row (for resampling them, not for the report).

    Returns:
        Dict with the curve (``thresholds``, ``sensitivity``, ``precision``, ``n_flagged``),
        ``r_star``, ``sensitivity_at_r_star``, ``precision_at_r_star``, the same at the confident r*
        (``confident_r_star``, ...), counts, ``baseline`` (same keys, own sweep and own r*; None without a
        baseline) and ``risk_above_baseline`` (differences of the reported sensitivity and precision, and of
        the sensitivity at the confident r*: ``confident_sensitivity``).

    Raises:
        ValueError: If frames' columns differ (names the missing/extra columns) or inputs mix types.
    """
    frames = {"synthetic": synthetic, "members": members, "non_members": non_members, "baseline": baseline}
    enc = encode_all(frames, scaling=scaling)
    args = (thresholds, precision_target, confidence)
    distances = {} if distances is None else distances
    result, distances["synthetic"] = _presence_one(
        enc["synthetic"], enc["members"], enc["non_members"], *args
    )
    result["baseline"] = result["risk_above_baseline"] = None
    if baseline is not None:
        base, distances["baseline"] = _presence_one(
            enc["baseline"], enc["members"], enc["non_members"], *args
        )
        result["baseline"] = base
        keys = {
            "sensitivity": "sensitivity_at_r_star",
            "precision": "precision_at_r_star",
            "confident_sensitivity": "sensitivity_at_confident_r_star",
        }
        result["risk_above_baseline"] = _risk(result, base, keys)
    return result


def encode_all(frames: dict[str, Table | None], *, scaling: str) -> dict[str, np.ndarray]:
    """Encode the frames of a presence sweep with one encoder fitted on the candidates (members and
    non-members); arrays pass through (all must be of one kind)."""
    given = {k: v for k, v in frames.items() if v is not None}
    if all(isinstance(v, pd.DataFrame) for v in given.values()):
        enc = TabularEncoder(scaling=scaling).fit(pd.concat([frames["members"], frames["non_members"]]))
        return {k: enc.transform(v) for k, v in given.items()}
    if any(isinstance(v, pd.DataFrame) for v in given.values()):
        raise ValueError("pass either all DataFrames or all encoded arrays")
    out = {k: np.asarray(v, dtype=np.float64) for k, v in given.items()}
    if len({a.shape[1] for a in out.values()}) != 1:
        raise ValueError(
            f"arrays must have the same number of columns, got { {k: a.shape for k, a in out.items()} }"
        )
    return out


# ------------------------------------------------------------------------------------------ attribute
def _impute(source: pd.DataFrame, idx: np.ndarray, col: str, numeric: bool) -> np.ndarray:
    """Impute ``col`` from the neighbour rows ``idx`` (n, k) of ``source``."""
    if numeric:
        vals = pd.to_numeric(source[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)[idx]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN neighbours impute NaN (never correct)
            return np.nanmean(vals, axis=1)  # (n,)
    codes, uniques = pd.factorize(source[col])  # NaN -> -1
    nc = codes[idx]  # (n, k)
    # votes[i, j] = how many of row i's k neighbours share neighbour j's category
    votes = (nc[:, :, None] == nc[:, None, :]).sum(2).astype(float)  # (n, k)
    votes[nc < 0] = -1.0  # NaN neighbours never win over a category
    best = nc[np.arange(len(nc)), votes.argmax(1)]  # argmax takes the first (= nearest) tied neighbour
    return np.array([uniques[c] if c >= 0 else None for c in best], dtype=object)


def _attribute_one(
    source: pd.DataFrame,
    candidates: pd.DataFrame,
    enc: TabularEncoder,
    known: list[str],
    unknown: list[str],
    numeric: set[str],
    scale: dict[str, float],
    k: int,
    tolerance: float,
    tolerance_mode: str,
) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per (candidate, unknown column): correct (bool), valid (bool); binary (imputed, true) per column."""
    _, idx = nearest_neighbors(
        enc.transform(candidates[known]), enc.transform(source[known]), k=min(k, len(source))
    )
    correct = np.zeros((len(candidates), len(unknown)), dtype=bool)
    valid = np.zeros_like(correct)
    binary: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for j, col in enumerate(unknown):
        guess = _impute(source, idx, col, col in numeric)
        if col in numeric:
            true = pd.to_numeric(candidates[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            tol = tolerance * (np.abs(true) if tolerance_mode == "relative" else scale[col])
            valid[:, j] = ~np.isnan(true)
            correct[:, j] = valid[:, j] & (np.abs(guess - true) <= tol + 1e-12 * np.abs(true))
            if set(np.unique(true[valid[:, j]])) <= {0.0, 1.0}:
                binary[col] = (guess >= 0.5, true)
        else:
            true_obj = candidates[col].to_numpy(dtype=object)
            valid[:, j] = ~pd.isna(candidates[col]).to_numpy()
            correct[:, j] = valid[:, j] & np.array(
                [g is not None and g == t for g, t in zip(guess, true_obj)]
            )
    return correct, valid, binary


def _attribute_summary(
    member: tuple[np.ndarray, np.ndarray, dict], non_member: tuple | None, unknown: list[str]
) -> dict[str, Any]:
    correct, valid, binary = member
    n_correct = int(correct.sum())
    out: dict[str, Any] = {
        "sensitivity": n_correct / max(int(valid.sum()), 1),
        "precision": None,
        "per_column_sensitivity": {
            c: float(correct[:, j].sum() / max(valid[:, j].sum(), 1)) for j, c in enumerate(unknown)
        },
        "n_pairs": int(valid.sum()),
    }
    if non_member is not None:
        n_correct_out = int(non_member[0].sum())
        out["precision"] = n_correct / (n_correct + n_correct_out) if n_correct + n_correct_out else None
    if binary:
        guess = np.concatenate([g[~np.isnan(t)] for g, t in binary.values()])
        true = np.concatenate([t[~np.isnan(t)] for _, t in binary.values()]) == 1.0
        tp = int((guess & true).sum())
        out["medgan"] = {
            "columns": list(binary),
            "sensitivity": float(tp / true.sum()) if true.sum() else None,
            "precision": float(tp / guess.sum()) if guess.sum() else None,
        }
    else:
        out["medgan"] = None
    return out


def attribute_disclosure(
    synthetic: pd.DataFrame,
    members: pd.DataFrame,
    *,
    known_columns: Sequence[str],
    numeric_columns: Sequence[str],
    non_members: pd.DataFrame | None = None,
    baseline: pd.DataFrame | None = None,
    k: int = 5,
    tolerance: float = 0.05,
    tolerance_mode: str = "relative",
    per_member: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Attribute disclosure by kNN imputation of the unknown columns from the synthetic set.

    Args:
        synthetic: Synthetic records.
        members: Training records to attack (S_train sample).
        known_columns: Columns the attacker knows (the thesis: half of them); the rest are imputed.
        numeric_columns: Numeric columns (tolerance rule); all others are categorical (exact match).
        non_members: Held-out candidates, needed for ``precision`` (spec §6 definition).
        baseline: Held-out real set S_base used in place of the synthetic set, or None.
        k: Neighbours (5 in the thesis).
        tolerance: Relative tolerance for numeric columns (0.05 in the thesis).
        tolerance_mode: ``"relative"`` (of |true value|) or ``"range"`` (of the column's range over the
            real candidates).
        per_member: a dict that receives, per source (``synthetic``, ``baseline``), each member's number of
            correctly imputed and of valid unknown values, shapes (n,) (for resampling the members).

    Returns:
        Dict with ``sensitivity``, ``precision`` (None without non-members), ``per_column_sensitivity``,
        ``n_pairs``, ``medgan`` (binary-column metrics or None), the settings, ``baseline`` (same keys for
        S_base, or None) and ``risk_above_baseline`` (differences of sensitivity and precision).

    Raises:
        ValueError: If the columns of the frames differ, the column lists are invalid or k < 1.
    """
    if tolerance_mode not in ("relative", "range"):
        raise ValueError(f"tolerance_mode must be 'relative' or 'range', got {tolerance_mode!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    members = members.rename(columns=str)
    columns = list(members.columns)
    frames = {"synthetic": synthetic, "non_members": non_members, "baseline": baseline}
    frames = {name: None if f is None else f.rename(columns=str) for name, f in frames.items()}
    for name, f in frames.items():
        if f is not None:
            _check_same_columns(columns, f, name)
    known = [str(c) for c in known_columns]
    numeric = {str(c) for c in numeric_columns}
    if bad := [c for c in [*known, *numeric] if c not in columns]:
        raise ValueError(f"known/numeric columns not in the frames: {bad}; columns are {columns}")
    unknown = [c for c in columns if c not in set(known)]
    if not known or not unknown:
        raise ValueError("known_columns must be a non-empty proper subset of the columns")
    non = frames["non_members"]
    real = members if non is None else pd.concat([members, non], ignore_index=True)
    enc = TabularEncoder(scaling="minmax", categorical_columns=[c for c in known if c not in numeric])
    enc.fit(real[known])
    scale = {}
    for c in unknown:
        if c in numeric:
            v = pd.to_numeric(real[c], errors="coerce")
            scale[c] = float(v.max() - v.min()) if v.notna().any() else 0.0
    args = (enc, known, unknown, numeric, scale, k, tolerance, tolerance_mode)

    per_member = {} if per_member is None else per_member

    def run(source: pd.DataFrame, name: str) -> dict[str, Any]:
        mem = _attribute_one(source, members, *args)
        per_member[name] = (mem[0].sum(1), mem[1].sum(1))  # (n,) correct, (n,) valid
        out = None if non is None else _attribute_one(source, non, *args)
        return _attribute_summary(mem, out, unknown)

    result = run(frames["synthetic"], "synthetic")
    result.update(
        known_columns=known, unknown_columns=unknown, k=k, tolerance=tolerance, tolerance_mode=tolerance_mode
    )
    result["baseline"] = result["risk_above_baseline"] = None
    if frames["baseline"] is not None:
        result["baseline"] = run(frames["baseline"], "baseline")
        keys = {"sensitivity": "sensitivity", "precision": "precision"}
        result["risk_above_baseline"] = _risk(result, result["baseline"], keys)
    return result


def _check_same_columns(columns: list[str], frame: pd.DataFrame, name: str) -> None:
    """Raise a ValueError naming the missing and extra columns of ``frame`` relative to ``columns``."""
    have = list(frame.columns)
    missing = [c for c in columns if c not in set(have)]
    extra = [c for c in have if c not in set(columns)]
    if missing or extra:
        raise ValueError(
            f"{name} columns do not match the members' columns: missing {missing}, extra {extra}"
        )
