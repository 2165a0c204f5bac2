"""Verdicts of an audit policy: each threshold is decided on a confidence interval of its statistic.

A threshold ``statistic ≤ limit`` (a risk) is decided as follows, with the two-sided interval ``[lo, hi]`` at the
policy's confidence (0.95 by default):

* ``pass``: ``hi ≤ limit``, the whole interval is within the limit;
* ``fail``: ``lo > limit``, the whole interval is beyond it, so a FAIL is a confident statement;
* ``inconclusive``: the interval contains the limit (the data cannot decide; more rows or candidates would),
  or the statistic cannot be estimated from these data at all (too few candidates, a metric that is not
  defined here).

``statistic ≥ limit`` (a score) mirrors it: pass when ``lo ≥ limit``, fail when ``hi < limit``.

A leak detector can separate the two limits (``pass_limit``, the policy's ``rule_out_*`` options): it fails when
the whole interval is beyond ``limit`` (a confident leak) and passes when the whole interval is within
``pass_limit`` (the data rule out a leak of that size); between them the data cannot decide. Its false-alarm
rate is at most (1 − confidence)/2 when the true value is at ``limit``, and its power against a leak of a given
size is measured (``bench/audit_power.py``; the policy's comments give the figures). When the true
value sits exactly at the limit, each wrong decision has probability at most (1 − confidence)/2; further from the
limit, less. Two independent audits of the same release can therefore only disagree between pass and fail if
one of them errs, which is what keeps verdicts stable over repeated runs. An interval that excludes its own point
estimate (a resampling interval of a biased statistic can) is widened to include it, so a verdict never passes a
point estimate that is beyond the limit, nor fails one within it.

A policy's overall status (:func:`overall_status`) is ``fail`` if any gating verdict fails, ``pass`` if there is
at least one gating verdict and all of them pass, and ``inconclusive`` otherwise (a verdict could not be decided,
or nothing was decided at all: no thresholds, or every check skipped). Verdicts of utility expectations
(``gates=False``) are reported with the same statuses but never change the policy's status.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import norm, rankdata

from audits.empirical_dp import clopper_pearson

STATUSES = ("pass", "fail", "inconclusive")
CONFIDENCE = 0.95  # two-sided confidence of every verdict's interval (the policy's ``confidence``)
MIN_CANDIDATES = 25  # below this many member (or non-member) candidates the privacy checks are inconclusive


@dataclass
class Verdict:
    """One policy threshold, decided on an interval of its statistic.

    Attributes:
        check: the check's name (``membership``, ...).
        criterion: the policy option (``max_auc``, ...).
        description: what the statistic is, in words.
        value: the point estimate, or None when it could not be estimated.
        op: ``≤`` (a risk) or ``≥`` (a score).
        limit: the policy's threshold.
        status: ``pass``, ``fail`` or ``inconclusive``.
        interval: ``[lo, hi]`` at ``confidence``, or None when not estimable.
        confidence: two-sided confidence of ``interval``.
        method: how the interval was computed (``DeLong``, ``bootstrap (500 draws) ...``).
        reason: one sentence saying why the status is what it is.
        gates: True when the verdict counts towards the policy's status; False for a utility expectation.
    """

    check: str
    criterion: str
    description: str
    value: float | None
    op: str
    limit: float
    status: str
    interval: tuple[float, float] | None
    confidence: float
    method: str
    reason: str
    gates: bool = True

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; ``passed`` (``status == "pass"``) is kept for readers of format version 2."""
        out = asdict(self)
        out["interval"] = (
            None if self.interval is None else [float(self.interval[0]), float(self.interval[1])]
        )
        out["passed"] = self.passed
        return out


def _num(x: float) -> str:
    return f"{x:.4g}"


def decide(
    check: str,
    criterion: str,
    description: str,
    value: float | None,
    interval: tuple[float, float] | None,
    limit: float,
    *,
    at_most: bool,
    confidence: float = CONFIDENCE,
    method: str = "",
    not_estimable: str = "",
    gates: bool = True,
    pass_limit: float | None = None,
) -> Verdict:
    """A :class:`Verdict` from a point value, its interval and the limit (see the module docstring).

    Args:
        check, criterion, description: what is decided.
        value: the point estimate; None (or NaN) makes the verdict inconclusive.
        interval: ``(lo, hi)``; None makes the verdict inconclusive.
        limit: the threshold.
        at_most: True for ``value ≤ limit`` (a risk), False for ``value ≥ limit`` (a score).
        confidence: the interval's two-sided confidence.
        method: how the interval was computed.
        not_estimable: the reason when ``value`` or ``interval`` is None.
        gates: whether the verdict counts towards the policy's status.
        pass_limit: the limit the whole interval must be within to pass (a leak the data rule out); None for
            ``limit`` itself. It must not be stricter than ``limit``.

    Returns:
        The verdict with its status and a one-sentence reason.
    """
    ok = float(limit) if pass_limit is None else float(pass_limit)
    if (ok < limit) if at_most else (ok > limit):
        raise ValueError(f"pass_limit {ok} is stricter than the limit {limit}")
    op = "≤" if at_most else "≥"
    common = {
        "check": check,
        "criterion": criterion,
        "description": description,
        "op": op,
        "limit": float(limit),
        "confidence": confidence,
        "method": method,
        "gates": gates,
    }
    finite = value is not None and math.isfinite(float(value))
    if not finite or interval is None or not all(math.isfinite(float(b)) for b in interval):
        reason = not_estimable or "the statistic could not be estimated from these data"
        return Verdict(
            value=float(value) if finite else None,
            status="inconclusive",
            interval=None,
            reason=f"Not estimable: {reason}.",
            **common,
        )
    lo, hi = sorted(float(b) for b in interval)
    lo, hi = min(lo, float(value)), max(hi, float(value))  # a resampled interval may miss a biased estimate
    pct, shown = f"{confidence:.0%}", f"[{_num(lo)}, {_num(hi)}]"
    if at_most:
        status = "fail" if lo > limit else "pass" if hi <= ok else "inconclusive"
    else:
        status = "fail" if hi < limit else "pass" if lo >= ok else "inconclusive"
    if status == "fail":
        reason = f"The whole {pct} interval {shown} is beyond the limit {op} {_num(limit)}."
    elif status == "pass" and ok == limit:
        reason = f"The whole {pct} interval {shown} is within the limit {op} {_num(limit)}."
    elif status == "pass":
        reason = (
            f"The whole {pct} interval {shown} is within {op} {_num(ok)}: a leak of that size is ruled out (it "
            f"fails beyond {_num(limit)})."
        )
    elif ok == limit:
        reason = (
            f"The {pct} interval {shown} contains the limit {_num(limit)}: these data cannot decide "
            "(more rows or candidates would)."
        )
    else:
        reason = (
            f"The {pct} interval {shown} neither lies beyond {_num(limit)} (a confident leak) nor within "
            f"{_num(ok)} (a leak of that size ruled out): these data cannot decide (more rows or candidates would)."
        )
    return Verdict(value=float(value), status=status, interval=(lo, hi), reason=reason, **common)


def undecided(
    check: str,
    criterion: str,
    description: str,
    limit: float,
    reason: str,
    *,
    at_most: bool,
    confidence: float = CONFIDENCE,
    value: float | None = None,
    gates: bool = True,
) -> Verdict:
    """An inconclusive verdict with a given reason (a skipped check, too few candidates)."""
    return Verdict(
        check,
        criterion,
        description,
        value,
        "≤" if at_most else "≥",
        float(limit),
        "inconclusive",
        None,
        confidence,
        "",
        reason,
        gates,
    )


def overall_status(verdicts: Sequence[Verdict | dict[str, Any]]) -> tuple[str, str]:
    """The policy's status and a one-sentence reason, from its gating verdicts (see the module docstring)."""
    gating = [v if isinstance(v, dict) else v.to_dict() for v in verdicts]
    gating = [v for v in gating if v["gates"]]
    statuses = [v["status"] for v in gating]
    if "fail" in statuses:
        names = ", ".join(f"{v['check']} {v['criterion']}" for v in gating if v["status"] == "fail")
        return (
            "fail",
            f"{statuses.count('fail')} of {len(statuses)} thresholds failed with confidence ({names}).",
        )
    if not statuses:
        return "inconclusive", (
            "Nothing was decided: the policy sets no thresholds, or the checks that set them were skipped."
        )
    if "inconclusive" in statuses:
        names = ", ".join(f"{v['check']} {v['criterion']}" for v in gating if v["status"] == "inconclusive")
        return "inconclusive", (
            f"{statuses.count('inconclusive')} of {len(statuses)} thresholds could not be decided ({names}); "
            "none failed."
        )
    return "pass", f"All {len(statuses)} thresholds passed with confidence."


# ------------------------------------------------------------------------------------------ intervals
def z_value(confidence: float) -> float:
    """The normal quantile of a two-sided interval at ``confidence`` (1.96 at 0.95)."""
    return float(norm.ppf(0.5 + confidence / 2.0))


def percentile_interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Percentile interval of bootstrap draws (NaN draws dropped); None when fewer than 20 are finite."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if draws.size < 20:
        return None
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(draws, [a, 1.0 - a])
    return float(lo), float(hi)


def delong_auc(scores: np.ndarray, labels: np.ndarray, confidence: float = CONFIDENCE) -> dict[str, float]:
    """ROC-AUC with DeLong's variance and a normal interval clipped to [0, 1].

    DeLong, DeLong and Clarke-Pearson (1988), "Comparing the areas under two or more correlated receiver
    operating characteristic curves": the AUC is a two-sample U-statistic whose variance is
    ``var(V10)/m + var(V01)/n`` with the structural components ``V10_i = P(score_i > score of a negative)`` and
    ``V01_j = P(score of a positive > score_j)`` (ties count 1/2), computed here from mid-ranks.

    Args:
        scores: shape (N,), higher = member.
        labels: shape (N,), 1 for members, 0 for non-members.
        confidence: two-sided confidence of the interval.

    Returns:
        ``{"auc", "se", "lo", "hi"}``.
    """
    scores, pos = np.asarray(scores, dtype=float), np.asarray(labels) == 1
    x, y = scores[pos], scores[~pos]
    m, n = len(x), len(y)
    ranks = rankdata(np.concatenate([x, y]))  # mid-ranks in the pooled sample
    v10 = (ranks[:m] - rankdata(x)) / n  # (m,) share of negatives below each positive
    v01 = 1.0 - (ranks[m:] - rankdata(y)) / m  # (n,) share of positives above each negative
    auc = float(v10.mean())
    var = (v10.var(ddof=1) / m if m > 1 else 0.0) + (v01.var(ddof=1) / n if n > 1 else 0.0)
    se = math.sqrt(max(var, 0.0))
    z = z_value(confidence)
    return {"auc": auc, "se": se, "lo": max(0.0, auc - z * se), "hi": min(1.0, auc + z * se)}


def permutation_p_interval(
    exceed: int, n_permutations: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Clopper–Pearson interval of a permutation test's exact p-value from ``exceed`` of ``n_permutations``
    random permutations whose statistic reached the observed one (the Monte Carlo error of the p-value)."""
    return clopper_pearson(int(exceed), int(n_permutations), confidence=confidence)


def wilson_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's score interval of a proportion (Wilson 1927); ``(0, 1)`` without trials."""
    if trials <= 0:
        return 0.0, 1.0
    z, p = z_value(confidence), successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_interval(
    k1: int, n1: int, k2: int, n2: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Interval of ``k1/n1 − k2/n2`` for two independent proportions: Newcombe's hybrid score interval (Newcombe
    1998, "Interval estimation for the difference between independent proportions", method 10), built from the
    two Wilson intervals; it keeps its coverage at proportions near 0, where the leak rates live."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, confidence)
    l2, u2 = wilson_interval(k2, n2, confidence)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
