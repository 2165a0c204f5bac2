"""Attacks with power where synthetic data leak: copies of training rows, the most vulnerable records, and linkage.

Every attack here has a *control*: the same attack run on HOLDOUT rows (real rows the generator never saw), so
that what a generator does to any row of the population (typical rows that resemble many real ones) is not
mistaken for what it does to its training rows. Each statistic is an *excess*: a rate on REAL (or on the
synthetic rows' links to REAL) minus the same rate on the control, with Newcombe's interval for a difference of
two proportions (:func:`audits.verdicts.difference_interval`). Rows are compared by record-linkage match weights
(:mod:`audits.linkage`), which see a near copy with one category changed; a distance does not (see there).

* :func:`copies`: every synthetic row (the FULL set, never subsampled) is matched against REAL. Exact copies: the
  share of synthetic rows equal to a REAL row on every column, minus the share of HOLDOUT rows that are.
  Near copies: the share of synthetic rows whose best match weight to REAL exceeds τ, minus the same share of
  HOLDOUT rows, where τ is the ``1 − null_rate`` quantile of the best weights of the other half of HOLDOUT
  (so a fresh row from the population exceeds τ with probability ``null_rate``, and the excess of an honest
  generator, whose rows are no closer to REAL than fresh rows are, is ≤ 0).
* :func:`vulnerable`: the ``k`` most unusual REAL rows and, as control, the ``k`` most unusual HOLDOUT rows, by a
  fixed rule (the self-information ``Σ_j −log u_j(x_j)`` of their values among REAL's: rare values, a rare
  combination of them), are always examined (targeted, not averaged over random candidates, following Stadler
  et al., "Synthetic Data – Anonymisation Groundhog Day", 2022). A record is *singled out* when its best
  synthetic match equals it on all but at most ``max_differences`` columns (numbers: the same quantile bin) and
  matches it better than every other real row (REAL and HOLDOUT but itself) does: a synthetic row closer to it
  than real rows sit to each other. (Without the first condition a fresh row beats the real rows for about a
  third of unusual records, as many rows being drawn: too common to see copies.)
* :func:`linkability`: Anonymeter's linkability attack (Giomi et al., "A Unified Framework for Quantifying
  Privacy Risk in Synthetic Data", 2022), our implementation of its definition: the columns split into two sets
  of auxiliary information; a target is linked when its best synthetic match on the first set is the same
  synthetic row as on the second. Targets are the member candidates; the control the non-member candidates.
  Anonymeter's risk ``(r_main − r_control) / (1 − r_control)`` is reported beside the excess.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from audits.linkage import Coded, MatchWeights, best_matches
from audits.verdicts import CONFIDENCE, difference_interval


def excess(k_main: int, n_main: int, k_control: int, n_control: int, confidence: float) -> dict[str, Any]:
    """``k_main/n_main − k_control/n_control`` with its Newcombe interval, and the counts."""
    lo, hi = difference_interval(k_main, n_main, k_control, n_control, confidence)
    return {
        "value": k_main / n_main - k_control / n_control,
        "interval": [lo, hi],
        "main": {"count": int(k_main), "of": int(n_main), "rate": k_main / n_main},
        "control": {"count": int(k_control), "of": int(n_control), "rate": k_control / n_control},
    }


def row_hashes(frame: pd.DataFrame) -> np.ndarray:
    """(N,) a 64-bit hash of each row's values (numbers as float64, categories as text, missing alike)."""
    cols = {}
    for c in frame.columns:
        s = frame[c]
        cols[c] = (
            s.astype(float) if pd.api.types.is_numeric_dtype(s) else s.astype(object).where(s.notna(), None)
        )
    return pd.util.hash_pandas_object(pd.DataFrame(cols), index=False).to_numpy()


def copies(
    synthetic: pd.DataFrame,
    real: pd.DataFrame,
    holdout: pd.DataFrame,
    *,
    weights: MatchWeights,
    null_rate: float = 0.01,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Exact and near copies of REAL among ALL synthetic rows, against HOLDOUT as the control (module docstring).

    Returns:
        ``{"exact": excess, "near": excess + {"tau", "null_rate"}, "weights": {"synthetic", "holdout"}}`` where
        the last holds each row's best match weight to REAL (for the report's figure).
    """
    h_real = row_hashes(real)
    exact_syn = int(np.isin(row_hashes(synthetic), h_real).sum())
    exact_hold = int(np.isin(row_hashes(holdout), h_real).sum())
    ref = weights.transform(real)
    w_syn, _ = best_matches(weights.transform(synthetic), ref)
    w_hold, _ = best_matches(weights.transform(holdout), ref)
    order = np.random.default_rng(seed).permutation(len(holdout))
    calib, control = order[: len(order) // 2], order[len(order) // 2 :]
    tau = float(np.quantile(w_hold[calib], 1.0 - null_rate, method="higher"))
    near = excess(
        int((w_syn > tau).sum()), len(w_syn), int((w_hold[control] > tau).sum()), len(control), confidence
    )
    return {
        "exact": excess(exact_syn, len(synthetic), exact_hold, len(holdout), confidence),
        "near": {**near, "tau": tau, "null_rate": null_rate, "calibration_rows": len(calib)},
        "weights": {"synthetic": w_syn, "holdout": w_hold[control]},
    }


def most_unusual(coded: Coded, k: int) -> np.ndarray:
    """Indices of the ``k`` rows of highest self-information (ties by index: a fixed, data-only rule)."""
    info = coded.self_information()
    return np.lexsort((np.arange(len(info)), -info))[:k]


def vulnerable(
    synthetic: pd.DataFrame,
    real: pd.DataFrame,
    holdout: pd.DataFrame,
    *,
    weights: MatchWeights,
    k: int = 100,
    max_differences: int = 2,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """The ``k`` most unusual REAL rows against the ``k`` most unusual HOLDOUT rows: how many of each are singled
    out by a synthetic row (module docstring).

    Returns:
        ``{"k", "singled_out": excess, "members": {...}, "control": {...}}``, per side the examined rows' best
        weights to a synthetic row and to another real row.
    """
    r, h, s = weights.transform(real), weights.transform(holdout), weights.transform(synthetic)
    k = int(min(k, len(real), len(holdout)))
    pool = Coded(
        *(
            np.concatenate([a, b])
            for a, b in zip((r.codes, r.agree, r.disagree), (h.codes, h.agree, h.disagree))
        )
    )
    sides = {}
    for name, coded, offset in (("members", r, 0), ("control", h, len(r))):
        idx = most_unusual(coded, k)
        target = coded.subset(idx)
        w_syn, i_syn = best_matches(target, s)
        w_real, _ = best_matches(target, pool, exclude=idx + offset)
        differences = (target.codes != s.codes[i_syn]).sum(
            1
        )  # columns where the best synthetic match differs
        sides[name] = {
            "self_information": target.self_information(),
            "to_synthetic": w_syn,
            "to_other_real": w_real,
            "differences": differences,
            "singled_out": (w_syn > w_real) & (differences <= max_differences),
        }
    out = excess(
        int(sides["members"]["singled_out"].sum()),
        k,
        int(sides["control"]["singled_out"].sum()),
        k,
        confidence,
    )
    return {"k": k, "singled_out": out, **sides}


def linkability(
    synthetic: pd.DataFrame,
    targets: pd.DataFrame,
    control: pd.DataFrame,
    *,
    weights: MatchWeights,
    aux: tuple[list[str], list[str]],
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Anonymeter's linkability on ``targets`` (members) with ``control`` (non-members): module docstring.

    Returns:
        ``{"linked": excess, "anonymeter_risk", "aux_columns"}``.
    """
    cols = weights.columns
    sets = [[cols.index(c) for c in part] for part in aux]
    s = weights.transform(synthetic)
    rng = np.random.default_rng(seed)
    noise = [rng.uniform(0, 1e-6, len(synthetic)) for _ in sets]  # ties broken at random, apart per set
    counts = []
    for frame in (targets, control):
        t = weights.transform(frame)
        first, second = (
            best_matches(t.columns(c), s.columns(c), tie_noise=n)[1] for c, n in zip(sets, noise)
        )
        counts.append(int((first == second).sum()))
    out = excess(counts[0], len(targets), counts[1], len(control), confidence)
    r_main, r_ctrl = out["main"]["rate"], out["control"]["rate"]
    risk = (r_main - r_ctrl) / (1.0 - r_ctrl) if r_ctrl < 1 else 0.0
    return {"linked": out, "anonymeter_risk": risk, "aux_columns": [list(a) for a in aux]}
