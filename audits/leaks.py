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
* :func:`closer`: a paired test on every synthetic row: is its best match in REAL far better (by a likelihood
  ratio ``e^margin``) than its best match in HOLDOUT, more often than the reverse? (REAL in chunks of HOLDOUT's
  size; the null is symmetric.) It has the power the threshold test lacks on near copies of typical rows.
* :func:`vulnerable`: the ``k`` most unusual REAL rows and, as control, the ``k`` most unusual HOLDOUT rows, by a
  fixed rule (the self-information ``Σ_j −log u_j(x_j)`` of their values among REAL's: rare values, a rare
  combination of them), are always examined (targeted, not averaged over random candidates, following Stadler
  et al., "Synthetic Data – Anonymisation Groundhog Day", 2022). A record is *singled out* when its best
  synthetic match equals it on all but at most ``max_differences`` columns (numbers: the same quantile bin) and
  matches it better than every other real row (REAL and HOLDOUT but itself) does: a synthetic row closer to it
  than real rows sit to each other. (Without the first condition a fresh row beats the real rows for about a
  third of unusual records, as many rows being drawn: too common to see copies.)
* :func:`singling_out`: Anonymeter's multivariate singling out (predicates on a few columns that pick out one
  synthetic row: do they pick out one REAL row?), against HOLDOUT of the same size as control.
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
    margin: float = 8.0,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Exact and near copies of REAL among ALL synthetic rows, against HOLDOUT as the control (module docstring),
    and the paired test :func:`closer`. ``weights`` should be fitted on REAL and HOLDOUT together, so that the
    coding treats both alike (fitted on REAL alone, a value REAL lacks agrees as a rarity with HOLDOUT rows only,
    which biases :func:`closer` towards HOLDOUT).

    Returns:
        ``{"exact": excess, "near": excess + {"tau", "null_rate"}, "closer": ..., "weights": {"synthetic",
        "holdout"}}`` where the last holds each row's best match weight to REAL (for the report's figure).
    """
    h_real = row_hashes(real)
    exact_syn = int(np.isin(row_hashes(synthetic), h_real).sum())
    exact_hold = int(np.isin(row_hashes(holdout), h_real).sum())
    ref = weights.transform(real)
    s = weights.transform(synthetic)
    closer_res, w_syn = closer(s, ref, weights.transform(holdout), margin=margin, seed=seed, confidence=confidence)
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
        "closer": closer_res,
        "weights": {"synthetic": w_syn, "holdout": w_hold[control]},
    }


def closer(
    synthetic: Coded,
    real: Coded,
    holdout: Coded,
    *,
    margin: float = 8.0,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[dict[str, Any], np.ndarray]:
    """Paired test: is each synthetic row's best REAL match far better than its best HOLDOUT match more often than
    the reverse?

    REAL is split at random into ``c = round(|REAL| / |HOLDOUT|)`` disjoint chunks of ``n = min(|HOLDOUT|,
    ⌊|REAL| / c⌋)`` rows and HOLDOUT subsampled to ``n`` rows, so that every chunk and the HOLDOUT sample are sets of
    the same size from the same population. For a synthetic row x and chunk A, ``D = w_A(x) − w_H(x)`` (best match
    weights, log-likelihood ratios): under the null "the synthetic rows carry no information about which real rows
    were trained on" ``D`` is symmetric, so ``P(D > margin) = P(D < −margin)``. A copy or near copy of a row of A
    has ``D`` far above ``margin`` (its source is in A, no HOLDOUT row is that close). The statistic is the mean
    over synthetic rows of ``s(x) = mean over chunks of ([D > margin] − [D < −margin])``: the share of rows
    clearly closer to REAL minus the share clearly closer to HOLDOUT. It compares each synthetic row with its own
    neighbourhood, so that common profiles (close to many real rows of both sets) cancel, which a threshold on
    ``w_REAL`` alone (:func:`copies`' near copies) cannot do. Interval: the normal interval of a mean with one
    pseudo-row of each sign added (so that it never collapses to a point when no row is far on either side).

    Returns:
        ``(result, w_real)``: the result dict and each synthetic row's best weight to ALL of REAL (the max over
        the chunks and the rows left over), reused by :func:`copies`.
    """
    rng = np.random.default_rng(seed + 1)
    c = max(1, round(len(real) / len(holdout)))
    n = min(len(holdout), len(real) // c)
    perm = rng.permutation(len(real))
    w_h, _ = best_matches(synthetic, holdout.subset(np.sort(rng.choice(len(holdout), n, replace=False))))
    per_chunk = [best_matches(synthetic, real.subset(perm[i * n : (i + 1) * n]))[0] for i in range(c)]
    rest = perm[c * n :]
    w_real = np.max(per_chunk + ([best_matches(synthetic, real.subset(rest))[0]] if len(rest) else []), axis=0)
    ahead = sum((w > w_h + margin).astype(float) for w in per_chunk) / c
    behind = sum((w < w_h - margin).astype(float) for w in per_chunk) / c
    score = np.concatenate([ahead - behind, [1.0, -1.0]])
    value = float((ahead - behind).mean())
    half = float(_z(confidence) * score.std(ddof=1) / np.sqrt(len(score)))
    return {
        "value": value,
        "interval": [value - half, value + half],
        "real_ahead": float(ahead.sum()),
        "holdout_ahead": float(behind.sum()),
        "rows": len(ahead),
        "margin": margin,
        "chunks": c,
        "chunk_rows": n,
    }, w_real


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


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


def _columns_as_arrays(frames: list[pd.DataFrame], numeric: list[str]) -> list[dict[str, np.ndarray]]:
    """Per frame, per column: numbers as float64 (NaN missing), categories as shared integer codes (-1 missing)."""
    out: list[dict[str, np.ndarray]] = [{} for _ in frames]
    for c in frames[0].columns:
        if c in numeric:
            for o, f in zip(out, frames):
                o[c] = pd.to_numeric(f[c], errors="coerce").to_numpy(float)
        else:
            codes, _ = pd.factorize(pd.concat([f[c].astype(object) for f in frames], ignore_index=True))
            start = 0
            for o, f in zip(out, frames):
                o[c] = codes[start : start + len(f)]
                start += len(f)
    return out


def _matches(arrays: dict[str, np.ndarray], query: tuple[tuple[str, str, float], ...]) -> int:
    """How many rows satisfy every ``(column, op, value)`` of ``query`` (op: ``==``, ``<=``, ``>=``, ``na``)."""
    mask = None
    for c, op, v in query:
        x = arrays[c]
        m = (
            np.isnan(x) if op == "na" else (x <= v) if op == "<=" else (x >= v) if op == ">=" else (x == v)
        )
        mask = m if mask is None else mask & m
    return int(mask.sum())


def singling_out(
    synthetic: pd.DataFrame,
    real: pd.DataFrame,
    holdout: pd.DataFrame,
    *,
    numeric: list[str],
    n_attacks: int = 500,
    n_cols: int = 3,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Anonymeter's multivariate singling-out attack (Giomi et al. 2022, §"Singling out"), with an equal-size control.

    A *query* is built from a random synthetic row and ``n_cols`` random columns: a category must equal the row's,
    a number must be ``≤`` its value when that is at most the synthetic column's median and ``≥`` it otherwise (a
    missing value must be missing). Queries that match exactly ONE synthetic row are kept (up to ``n_attacks``
    distinct ones, at most ``50·n_attacks`` tries); a query *singles out* a set when it matches exactly one of its
    rows. Main: the share of queries singling out a random subset of REAL of HOLDOUT's size; control: the share
    singling out HOLDOUT (the larger of the two is subsampled to the smaller's size, so that the null "the
    synthetic rows carry no information about REAL" gives equal rates: the chance that a predicate picks exactly one
    row depends on the set's size). Anonymeter's risk ``(r_main − r_control) / (1 − r_control)`` is reported beside
    the excess.

    Returns:
        ``{"singled_out": excess, "anonymeter_risk", "queries", "n_cols", "reference_rows"}``.
    """
    rng = np.random.default_rng(seed)
    n = min(len(real), len(holdout))
    r = real.iloc[np.sort(rng.choice(len(real), n, replace=False))]
    h = holdout.iloc[np.sort(rng.choice(len(holdout), n, replace=False))]
    cols = list(synthetic.columns)
    syn, ref, ctl = _columns_as_arrays([synthetic, r, h], numeric)
    medians = {c: float(np.nanmedian(syn[c])) for c in numeric if np.isfinite(syn[c]).any()}
    k = min(n_cols, len(cols))
    queries: set[tuple[tuple[str, str, float], ...]] = set()
    for _ in range(50 * n_attacks):
        if len(queries) >= n_attacks:
            break
        i = int(rng.integers(len(synthetic)))
        query = []
        for c in sorted(rng.choice(cols, k, replace=False)):
            v = float(syn[c][i])
            op = "==" if c not in numeric else "na" if np.isnan(v) else "<=" if v <= medians.get(c, v) else ">="
            query.append((str(c), op, v))
        q = tuple(query)
        if q not in queries and _matches(syn, q) == 1:
            queries.add(q)
    if not queries:
        raise ValueError("singling_out: no query singles out one synthetic row (too few or identical rows).")
    hits = [sum(_matches(a, q) == 1 for q in queries) for a in (ref, ctl)]
    out = excess(hits[0], len(queries), hits[1], len(queries), confidence)
    r_main, r_ctrl = out["main"]["rate"], out["control"]["rate"]
    risk = (r_main - r_ctrl) / (1.0 - r_ctrl) if r_ctrl < 1 else 0.0
    return {"singled_out": out, "anonymeter_risk": risk, "queries": len(queries), "n_cols": k, "reference_rows": n}
