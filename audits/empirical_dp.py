"""Empirical lower bounds on ε from membership trials on neighbouring datasets (Jagielski et al. 2020).

An (ε, δ)-DP mechanism forces every test that distinguishes "canary in" from "canary out" to satisfy
(Kairouz et al. 2015)

    FPR + e^ε · FNR ≥ 1 − δ   and   FNR + e^ε · FPR ≥ 1 − δ,

so observed error rates give ε ≥ max(log((1 − δ − FNR)/FPR), log((1 − δ − FPR)/FNR)). Rates are replaced
by their Clopper–Pearson *upper* bounds so the bound holds with probability ≥ ``confidence``; the two
one-sided bounds are each taken at level (1 − confidence)/2 (the upper end of the two-sided interval, as in
Jagielski et al.'s code), so both hold jointly by a union bound. Selecting the threshold on the same trials
that evaluate it would invalidate this; :func:`audit_mechanism` selects on the first half of the trials and
evaluates on the second half.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import beta

log = logging.getLogger(__name__)


def clopper_pearson(successes: int, trials: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval of a binomial proportion.

    Args:
        successes: Observed count k, 0 <= k <= n.
        trials: Number of trials n > 0.
        confidence: Coverage of the two-sided interval.

    Returns:
        ``(lower, upper)``; e.g. ``clopper_pearson(0, n)`` has upper = 1 − ((1 − confidence)/2)^(1/n).

    Raises:
        ValueError: If the counts or the confidence are out of range.
    """
    if not 0 <= successes <= trials or trials <= 0:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if successes == 0 else float(beta.ppf(a, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(beta.ppf(1.0 - a, successes + 1, trials - successes))
    return lo, hi


def _cp_upper(k: np.ndarray, n: int, confidence: float) -> np.ndarray:
    """Vectorised upper end of the two-sided Clopper–Pearson interval."""
    a = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore"):
        return np.where(k >= n, 1.0, beta.ppf(1.0 - a, k + 1, np.maximum(n - k, 1)))


def _epsilon_from_counts(
    fp: np.ndarray, fn: np.ndarray, n_neg: int, n_pos: int, delta: float, confidence: float
) -> np.ndarray:
    """Vectorised ε lower bound for arrays of (FP, FN) counts."""
    fpr_ub, fnr_ub = _cp_upper(fp, n_neg, confidence), _cp_upper(fn, n_pos, confidence)
    best = np.zeros(np.broadcast(fpr_ub, fnr_ub).shape)
    for num, den in ((1.0 - delta - fnr_ub, fpr_ub), (1.0 - delta - fpr_ub, fnr_ub)):
        ok = (num > 0.0) & (den > 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            best = np.where(ok, np.maximum(best, np.log(np.where(ok, num / den, 1.0))), best)
    return best


def epsilon_lower_bound(
    *,
    false_positives: int,
    false_negatives: int,
    n_negatives: int,
    n_positives: int,
    delta: float,
    confidence: float = 0.95,
) -> float:
    """ε lower bound from the error counts of one distinguishing test (Kairouz et al.; Jagielski et al. 2020).

    Args:
        false_positives: Runs *without* the canary that the test flagged as "with".
        false_negatives: Runs *with* the canary that the test flagged as "without".
        n_negatives: Number of runs without the canary.
        n_positives: Number of runs with the canary.
        delta: The mechanism's δ, in [0, 1).
        confidence: Joint confidence of the two Clopper–Pearson upper bounds.

    Returns:
        ``max(0, log((1−δ−FNR_ub)/FPR_ub), log((1−δ−FPR_ub)/FNR_ub))``, valid with probability
        >= ``confidence``.

    Raises:
        ValueError: If δ or the confidence is out of range or the counts are inconsistent.
    """
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    clopper_pearson(false_positives, n_negatives, confidence=confidence)  # validates the arguments
    clopper_pearson(false_negatives, n_positives, confidence=confidence)
    fp, fn = np.asarray(false_positives), np.asarray(false_negatives)
    return float(_epsilon_from_counts(fp, fn, n_negatives, n_positives, delta, confidence))


def _counts(
    with_scores: np.ndarray, without_scores: np.ndarray, t: np.ndarray, sign: int
) -> tuple[np.ndarray, np.ndarray]:
    """(FP, FN) of the rule "flag canary iff sign * score >= sign * t", for an array of thresholds t."""
    w, wo = np.sort(sign * with_scores), np.sort(sign * without_scores)
    st = sign * np.asarray(t, dtype=np.float64)
    fp = len(wo) - np.searchsorted(wo, st, side="left")  # without-canary runs flagged
    fn = np.searchsorted(w, st, side="left")  # with-canary runs not flagged
    return fp, fn


def select_threshold(
    with_scores: np.ndarray, without_scores: np.ndarray, *, delta: float, confidence: float = 0.95
) -> tuple[float, int, float]:
    """Sweep thresholds (and the direction of the rule) for the largest ε lower bound on these trials.

    The candidate thresholds are the midpoints between consecutive observed scores (so a threshold never
    sits on an observation), and among equally good thresholds the middle one of the run is taken: with
    separated scores the rule then lies mid-gap, not at the edge of the selection half's scores. The
    result is *optimistic* for these trials; evaluate it on fresh trials.

    Args:
        with_scores: Attack scores of runs with the canary.
        without_scores: Attack scores of runs without the canary.
        delta: The mechanism's δ.
        confidence: Confidence of the Clopper–Pearson bounds.

    Returns:
        ``(threshold, sign, epsilon)``: the rule flags the canary iff ``sign * score >= sign * threshold``.
    """
    observed = np.unique(np.r_[with_scores, without_scores])
    grid = (observed[:-1] + observed[1:]) / 2 if len(observed) > 1 else observed
    best = (float(np.median(grid)), 1, 0.0)
    for sign in (1, -1):
        fp, fn = _counts(with_scores, without_scores, grid, sign)
        eps = _epsilon_from_counts(fp, fn, len(without_scores), len(with_scores), delta, confidence)
        ties = np.flatnonzero(eps >= eps.max() - 1e-12)
        i = int(ties[len(ties) // 2])  # the middle of the best run
        if eps[i] > best[2]:
            best = (float(grid[i]), sign, float(eps[i]))
    return best


@dataclass
class EmpiricalDPResult:
    """Outcome of an empirical privacy audit.

    Attributes:
        epsilon_lower_bound: ε lower bound on the held-out half, valid with probability >= ``confidence``.
        threshold: Threshold chosen on the first half.
        sign: 1 if the rule is "score >= threshold ⇒ canary", -1 for "score <= threshold".
        false_positives: FP count on the evaluation half (runs without the canary).
        false_negatives: FN count on the evaluation half (runs with the canary).
        n_positives: Evaluation runs with the canary.
        n_negatives: Evaluation runs without the canary.
        selection_epsilon: The (optimistic) bound on the selection half, for diagnostics only.
        delta: δ used.
        confidence: Confidence used.
    """

    epsilon_lower_bound: float
    threshold: float
    sign: int
    false_positives: int
    false_negatives: int
    n_positives: int
    n_negatives: int
    selection_epsilon: float
    delta: float
    confidence: float

    def to_dict(self) -> dict[str, float | int]:
        """JSON-serialisable dict of all fields."""
        return asdict(self)


def audit_mechanism(
    run_with_canary: Callable[[int], float],
    run_without_canary: Callable[[int], float],
    *,
    trials: int,
    delta: float,
    confidence: float = 0.95,
    seed: int = 0,
) -> EmpiricalDPResult:
    """Empirical ε lower bound of a mechanism from ``trials`` runs with and ``trials`` runs without a canary.

    Run i with the canary gets seed ``seed + i``, run i without gets ``seed + trials + i``. The threshold
    and the rule's direction are chosen on runs ``[0, trials // 2)`` of each side and the bound is computed
    on the rest, so it is a valid (1 − ``confidence``)-level lower bound on the mechanism's ε at δ.

    Args:
        run_with_canary: ``seed -> score``: train/run the mechanism on D ∪ {canary}, return the attack score.
        run_without_canary: ``seed -> score`` on D.
        trials: Runs per side (>= 4).
        delta: The δ at which the mechanism claims (ε, δ)-DP.
        confidence: Confidence of the bound.
        seed: Base seed.

    Returns:
        The :class:`EmpiricalDPResult`.

    Raises:
        ValueError: If ``trials < 4`` or δ is out of range.
    """
    if trials < 4:
        raise ValueError(f"trials must be >= 4 (half selects the threshold, half evaluates), got {trials}")
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    w = np.array([float(run_with_canary(seed + i)) for i in range(trials)])
    wo = np.array([float(run_without_canary(seed + trials + i)) for i in range(trials)])
    h = trials // 2
    t, sign, sel_eps = select_threshold(w[:h], wo[:h], delta=delta, confidence=confidence)
    fp_arr, fn_arr = _counts(w[h:], wo[h:], np.array([t]), sign)
    fp, fn = int(fp_arr[0]), int(fn_arr[0])
    eps = epsilon_lower_bound(
        false_positives=fp,
        false_negatives=fn,
        n_negatives=trials - h,
        n_positives=trials - h,
        delta=delta,
        confidence=confidence,
    )
    log.info("empirical ε lower bound %.3f (selection half %.3f), FP=%d FN=%d", eps, sel_eps, fp, fn)
    return EmpiricalDPResult(
        epsilon_lower_bound=eps,
        threshold=t,
        sign=sign,
        false_positives=fp,
        false_negatives=fn,
        n_positives=trials - h,
        n_negatives=trials - h,
        selection_epsilon=sel_eps,
        delta=delta,
        confidence=confidence,
    )
