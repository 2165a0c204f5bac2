"""Verdicts decide on intervals: pass / fail only when the whole interval is on one side of the limit; the policy's
status; DeLong's AUC interval and the permutation p-value's interval against known values."""

import json

import numpy as np
import pytest

from audits.membership import roc_auc
from audits.verdicts import (
    decide,
    delong_auc,
    overall_status,
    percentile_interval,
    permutation_p_interval,
    undecided,
    z_value,
)


@pytest.mark.parametrize(
    "interval,at_most,status",
    [
        ((0.40, 0.58), True, "pass"),  # a risk: the whole interval at or below the limit
        ((0.40, 0.60), True, "pass"),  # the upper bound on the limit still passes (limit inclusive)
        ((0.55, 0.65), True, "inconclusive"),  # the limit inside the interval: the data cannot decide
        ((0.61, 0.80), True, "fail"),  # the whole interval beyond the limit: a confident FAIL
        ((0.62, 0.80), False, "pass"),  # a score: the whole interval at or above the limit
        ((0.55, 0.65), False, "inconclusive"),
        ((0.30, 0.59), False, "fail"),
    ],
)
def test_a_verdict_needs_the_whole_interval_on_one_side(interval, at_most, status):
    v = decide(
        "membership", "max_auc", "dcr attack ROC-AUC", sum(interval) / 2, interval, 0.6, at_most=at_most
    )
    assert v.status == status and v.passed == (status == "pass")
    assert v.op == ("≤" if at_most else "≥") and v.interval == interval and v.confidence == 0.95
    assert v.reason.endswith(".") and "95% interval" in v.reason
    assert ("cannot decide" in v.reason) == (status == "inconclusive")
    d = json.loads(json.dumps(v.to_dict()))
    assert d["status"] == status and d["interval"] == list(interval) and d["passed"] == (status == "pass")


@pytest.mark.parametrize("value,interval", [(None, (0.1, 0.2)), (0.5, None), (float("nan"), (0.1, 0.2))])
def test_a_statistic_that_cannot_be_estimated_is_inconclusive(value, interval):
    v = decide("x", "max_y", "y", value, interval, 0.5, at_most=True, not_estimable="57 non-members")
    assert v.status == "inconclusive" and v.interval is None
    assert v.reason == "Not estimable: 57 non-members."


def test_the_policy_status():
    ok = decide("a", "max_x", "x", 0.1, (0.0, 0.2), 0.5, at_most=True)
    bad = decide("b", "max_x", "x", 0.9, (0.8, 1.0), 0.5, at_most=True)
    unsure = decide("c", "max_x", "x", 0.5, (0.4, 0.6), 0.5, at_most=True)
    expectation = decide("d", "max_x", "x", 0.9, (0.8, 1.0), 0.5, at_most=True, gates=False)
    assert overall_status([ok, ok])[0] == "pass"
    assert overall_status([ok, unsure])[0] == "inconclusive"
    assert overall_status([ok, unsure, bad]) == (
        "fail",
        "1 of 3 thresholds failed with confidence (b max_x).",
    )
    assert overall_status([ok, expectation])[0] == "pass"  # an unmet expectation never changes the verdict
    assert overall_status([expectation])[0] == "inconclusive"  # nothing gating was decided
    assert overall_status([])[0] == "inconclusive"  # no thresholds, or every check skipped: not a pass
    skipped = undecided(
        "utility", "min_score", "score", 0.6, "The check did not run: no label.", at_most=False
    )
    assert overall_status([skipped])[0] == "inconclusive" and skipped.value is None


def test_delong_matches_a_hand_computed_example():
    # members 3, 2, 1; non-members 0, 2. Share of non-members below each member (ties 1/2): V10 = (1, 0.75, 0.5);
    # share of members above each non-member: V01 = (1, 0.5). AUC = mean(V10) = 0.75;
    # var = var(V10)/3 + var(V01)/2 = 0.0625/3 + 0.125/2 (sample variances).
    scores = np.array([3.0, 2.0, 1.0, 0.0, 2.0])
    labels = np.array([1, 1, 1, 0, 0])
    d = delong_auc(scores, labels)
    assert d["auc"] == pytest.approx(0.75) == roc_auc(scores, labels)
    assert d["se"] == pytest.approx(np.sqrt(0.0625 / 3 + 0.125 / 2))
    assert d["hi"] == 1.0 and d["lo"] == pytest.approx(0.75 - z_value(0.95) * d["se"])


def test_delong_standard_error_agrees_with_the_bootstrap():
    rng = np.random.default_rng(0)
    scores = np.r_[rng.normal(0.5, 1, 200), rng.normal(0, 1, 300)]
    labels = np.r_[np.ones(200), np.zeros(300)]
    boot = [
        roc_auc(scores[i], labels[i])
        for i in (np.r_[rng.integers(0, 200, 200), 200 + rng.integers(0, 300, 300)] for _ in range(1000))
    ]
    assert delong_auc(scores, labels)["se"] == pytest.approx(np.std(boot), rel=0.1)


def test_permutation_p_value_interval_and_percentiles():
    lo, hi = permutation_p_interval(0, 200)  # no permutation reached the observed statistic
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 200))  # 0.0183 < 0.05: decided
    assert (
        permutation_p_interval(10, 200)[0] < 0.05 < permutation_p_interval(10, 200)[1]
    )  # p near α: undecided
    assert percentile_interval(np.arange(1001.0)) == pytest.approx((25.0, 975.0))
    assert percentile_interval(np.r_[np.arange(10.0), [np.nan] * 100]) is None  # too few finite draws


def test_an_interval_that_misses_its_estimate_is_widened_to_include_it():
    # a subsampling interval of a statistic biased towards 0 can lie below the full-sample estimate
    v = decide("presence_disclosure", "max_risk_above_baseline", "risk", 0.1, (0.0, 0.04), 0.05, at_most=True)
    assert v.status == "inconclusive" and v.interval == (0.0, 0.1)
    v = decide("presence_disclosure", "max_risk_above_baseline", "risk", 0.8, (0.3, 0.7), 0.05, at_most=True)
    assert v.status == "fail" and v.interval == (0.3, 0.8)
