"""Intervals of the audit statistics: they contain the truth where it is known, exclude 0 for a real effect,
and the fast fidelity formulas equal scipy's."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp, wasserstein_distance

from audits.disclosure import attribute_disclosure, presence_disclosure
from audits.fidelity import tabular_fidelity
from audits.resampling import (
    _ks_w1,
    attribute_interval,
    fidelity_interval,
    presence_interval,
    utility_interval,
)
from audits.utility import tstr

pytestmark = pytest.mark.usefixtures("single_thread")


def _blobs(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) + shift
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "k": rng.choice(["u", "v", "w"], n)})


@pytest.fixture(scope="module")
def sets():
    members, non_members, reference = _blobs(200, 0), _blobs(200, 1), _blobs(200, 2)
    return {
        "members": members,
        "non_members": non_members,
        "reference": reference,
        "fresh": _blobs(200, 3),
        "copies": members.copy(),
    }


@pytest.mark.parametrize("source,lo,hi", [("fresh", -0.1, 0.1), ("copies", 0.5, 1.0)])
def test_presence_interval(sets, source, lo, hi):
    distances: dict = {}
    res = presence_disclosure(
        sets[source], sets["members"], sets["non_members"], baseline=sets["reference"], distances=distances
    )
    ci = presence_interval(distances, precision_target=0.55, n_bootstrap=200, seed=0)["interval"]
    point = res["risk_above_baseline"]["confident_sensitivity"]
    assert lo <= point <= hi and lo <= ci[0] <= ci[1] <= hi
    if source == "copies":  # every member has a copy: confidently flagged far beyond the baseline
        assert point == 1.0 and ci[0] > 0.5


@pytest.mark.parametrize("source", ["fresh", "copies"])
def test_attribute_interval(sets, source):
    per_member: dict = {}
    res = attribute_disclosure(
        sets[source],
        sets["members"],
        known_columns=["a", "b"],
        numeric_columns=["a", "b", "c"],
        non_members=sets["non_members"],
        baseline=sets["reference"],
        per_member=per_member,
    )
    ci = attribute_interval(per_member, n_bootstrap=300, seed=0)["interval"]
    point = res["risk_above_baseline"]["sensitivity"]
    assert ci[0] <= point <= ci[1] and ci[1] - ci[0] < 0.2
    # fresh rows impute like real rows (0 is inside); copies hold every member's own row among its neighbours
    assert (ci[0] < 0 < ci[1]) if source == "fresh" else ci[0] > 0.1


def test_utility_interval_covers_the_score_and_the_gap():
    rng = np.random.default_rng(0)

    def labelled(n: int, flip: float) -> pd.DataFrame:
        x = rng.normal(size=(n, 2))
        y = (x[:, 0] + 0.5 * rng.normal(size=n) > 0) ^ (rng.random(n) < flip)
        return pd.DataFrame({"x0": x[:, 0], "x1": x[:, 1], "y": np.where(y, "yes", "no")})

    real, test, synthetic = labelled(500, 0.0), labelled(400, 0.0), labelled(500, 0.3)
    res = tstr(
        synthetic, test, label="y", real_train=real, classifiers=["logistic_regression", "gaussian_nb"]
    )
    ci = utility_interval(
        res.predictions, task="binary", metric="roc_auc", pos_label="yes", n_bootstrap=200, seed=0
    )
    score = res.summary["average"]["roc_auc"]
    gap = res.summary["real_average"]["roc_auc"] - score
    assert ci["score"][0] <= score <= ci["score"][1] and ci["score"][1] - ci["score"][0] < 0.1
    assert ci["gap"][0] <= gap <= ci["gap"][1]
    assert (
        set(res.predictions) == {"synthetic", "real"}
        and len(res.predictions["real"]["gaussian_nb"]["y_true"]) == 400
    )


def test_fast_ks_and_w1_equal_scipy():
    rng = np.random.default_rng(0)
    x, y = np.sort(rng.normal(size=300)), np.sort(rng.normal(0.3, 1.2, size=250))
    ks, w1 = _ks_w1(x, y)
    assert ks == pytest.approx(ks_2samp(x, y).statistic) and w1 == pytest.approx(wasserstein_distance(x, y))


@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_fidelity_interval(shift):
    real, synthetic = _blobs(500, 0), _blobs(500, 1, shift=shift)
    keys = ["mean_tv", "mean_ks", "mean_w1", "two_way_marginal", "range_query_error"]
    point = tabular_fidelity(real, synthetic, categorical=["k"], n_range_queries=100, seed=0)
    got = fidelity_interval(
        real, synthetic, categorical=["k"], keys=keys, n_bootstrap=200, seed=0, n_range_queries=100
    )["intervals"]
    values = {
        "mean_tv": point["mean_tv"],
        "mean_ks": point["mean_ks"],
        "mean_w1": point["mean_w1"],
        "two_way_marginal": point["two_way_marginal"]["mean"],
        "range_query_error": point["range_query"]["mean_abs_error"],
    }
    for key in keys:
        lo, hi = got[key]
        assert 0.0 <= lo <= hi and lo <= values[key], key
    if shift:  # a shift of one standard deviation: the KS interval is far from 0
        assert got["mean_ks"][0] > 0.25
    else:  # the basic interval corrects the upward bias of plug-in distances: it reaches well below the estimate
        assert got["mean_ks"][0] < 0.5 * values["mean_ks"]
