"""Leak detectors (audits/leaks.py, audits/linkage.py) and the decision rules around them (audits/verdicts.py):
exact match weights, best matches equal to brute force, power on planted copies, near copies and copied outliers,
no false alarm on fresh rows of the same population, and the α-LMDP checks never changing the verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from audits import leaks
from audits.checks import REGISTRY, Candidates, Context
from audits.inputs import AuditInputs
from audits.linkage import M_AGREE, MatchWeights, best_matches
from audits.policy import PolicyError, load_policy
from audits.report import build_report
from audits.verdicts import decide, difference_interval, wilson_interval

NUMERIC = ["income", "wealth", "age", "hours"]
CATEGORIES = {
    "job": ["a", "b", "c", "d", "e"],
    "city": [f"city{i}" for i in range(12)],
    "sex": ["f", "m"],
    "smoker": ["no", "yes"],
    "education": [f"edu{i}" for i in range(8)],
    "marital": ["single", "married", "divorced", "widowed", "separated"],
    "region": ["n", "s", "e", "w", "c"],
}


def population(n: int, seed: int) -> pd.DataFrame:
    """Rows of one population, shaped like UCI Adult: two high-resolution numbers (income, wealth), two integers
    (age, hours) and seven categories of skewed frequencies."""
    rng = np.random.default_rng(seed)
    cols = {
        "income": np.round(np.exp(rng.normal(10, 0.6, n))),
        "wealth": np.round(np.exp(rng.normal(11, 1.0, n))),
        "age": rng.integers(18, 80, n).astype(float),
        "hours": rng.integers(20, 61, n).astype(float),
    }
    for c, levels in CATEGORIES.items():
        p = np.arange(len(levels), 0, -1.0)
        cols[c] = rng.choice(levels, n, p=p / p.sum())
    return pd.DataFrame(cols)


@pytest.fixture(scope="module")
def frames():
    return population(3000, 0), population(3000, 1), population(3000, 2)  # REAL, HOLDOUT, fresh synthetic


def near_copies(rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Each row with one category changed and its age moved by 1 or 2 years."""
    rng = np.random.default_rng(seed)
    out = rows.copy().reset_index(drop=True)
    out["age"] = out["age"] + rng.choice([-2, -1, 1, 2], len(out))
    for i in range(len(out)):
        c = rng.choice(list(CATEGORIES))
        out.at[i, c] = rng.choice([v for v in CATEGORIES[c] if v != out.at[i, c]])
    return out


def planted(fresh: pd.DataFrame, leak: pd.DataFrame, seed: int) -> pd.DataFrame:
    """``fresh`` with ``len(leak)`` random rows replaced by ``leak``."""
    out = fresh.copy()
    idx = np.random.default_rng(seed).choice(len(out), len(leak), replace=False)
    out.iloc[idx] = leak.to_numpy()
    return out


# ------------------------------------------------------------------------------------------ match weights
def test_match_weights_are_the_fellegi_sunter_log_ratios():
    real = pd.DataFrame({"x": [1.0, 1.0, 2.0, 3.0], "c": ["a", "a", "a", "b"]})
    mw = MatchWeights(bins=4).fit(real, ["x"])
    coded = mw.transform(pd.DataFrame({"x": [1.0, 9.0], "c": ["b", "z"]}))
    # x = 1 agrees with 2 of 4 REAL rows, c = b with 1 of 4; an unseen value with 1/(n + 1) = 1/5
    assert coded.agree[0] == pytest.approx([math.log(M_AGREE / 0.5), math.log(M_AGREE / 0.25)])
    assert coded.agree[1, 1] == pytest.approx(math.log(M_AGREE / 0.2))
    assert coded.disagree[0] == pytest.approx([math.log(0.1 / 0.5), math.log(0.1 / 0.75)])
    w, i = best_matches(coded, mw.transform(real))
    assert i[0] == 3 and w[0] == pytest.approx(math.log(0.1 / 0.5) + math.log(M_AGREE / 0.25))


def test_best_matches_equal_brute_force(frames):
    real, holdout, _ = frames
    mw = MatchWeights(bins=50).fit(real, NUMERIC)
    q, r = mw.transform(holdout.iloc[:300]), mw.transform(real.iloc[:500])
    pair = q.disagree.sum(1)[:, None] + (
        (q.codes[:, None, :] == r.codes[None, :, :]) * (q.agree - q.disagree)[:, None, :]
    ).sum(2)  # (300, 500) every pair's weight
    w, i = best_matches(q, r, query_chunk=64)
    np.testing.assert_allclose(w, pair.max(1), atol=1e-5)  # float32 blocks
    np.testing.assert_allclose(pair[np.arange(300), i], pair.max(1), atol=1e-5)
    own = best_matches(r, r, exclude=np.arange(500))[1]
    assert not (own == np.arange(500)).any()


def test_a_near_copy_links_to_its_source_where_fresh_rows_do_not(frames):
    real, holdout, _ = frames
    mw = MatchWeights().fit(real, NUMERIC)
    ref = mw.transform(real)
    w_near, i_near = best_matches(mw.transform(near_copies(real.iloc[:200], 0)), ref)
    w_fresh, _ = best_matches(mw.transform(holdout), ref)
    assert (i_near == np.arange(200)).mean() > 0.95  # the exact income gives the source away
    assert np.mean(w_near > np.quantile(w_fresh, 0.99)) > 0.9


# ------------------------------------------------------------------------------------------ attacks
def test_copies_pass_fresh_rows_and_fail_exact_and_near_copies(frames):
    real, holdout, fresh = frames
    mw = MatchWeights().fit(pd.concat([real, holdout]), NUMERIC)
    clean = leaks.copies(fresh, real, holdout, weights=mw)
    assert clean["exact"]["interval"][0] <= 0.002 and clean["near"]["interval"][0] <= 0.005
    assert clean["near"]["control"]["rate"] == pytest.approx(0.01, abs=0.01)
    exact = leaks.copies(planted(fresh, real.iloc[:60], 0), real, holdout, weights=mw)  # 2% exact copies
    assert exact["exact"]["main"]["count"] == 60 and exact["exact"]["interval"][0] > 0.002
    near = leaks.copies(planted(fresh, near_copies(real.iloc[:150], 1), 0), real, holdout, weights=mw)  # 5%
    assert near["exact"]["main"]["count"] == 0 and near["near"]["interval"][0] > 0.005
    # the paired test: fresh rows are as often far closer to HOLDOUT as to REAL; near copies are not
    assert clean["closer"]["interval"][0] <= 0 <= clean["closer"]["interval"][1] + 0.01
    assert near["closer"]["interval"][0] > 0.002 and near["closer"]["real_ahead"] > near["closer"]["holdout_ahead"]


def test_copied_outliers_are_singled_out(frames):
    real, holdout, fresh = frames
    mw = MatchWeights().fit(real, NUMERIC)
    clean = leaks.vulnerable(fresh, real, holdout, weights=mw, k=100)
    assert clean["singled_out"]["interval"][0] <= 0.05
    top = leaks.most_unusual(mw.transform(real), 30)
    leaky = leaks.vulnerable(planted(fresh, real.iloc[top], 0), real, holdout, weights=mw, k=100)
    assert leaky["members"]["singled_out"].sum() >= 30 and leaky["singled_out"]["interval"][0] > 0.05


def test_linkability_of_real_rows_resampled(frames):
    real, holdout, fresh = frames
    mw = MatchWeights().fit(real, NUMERIC)
    cols = list(real.columns)
    aux = (cols[0::2], cols[1::2])
    args = dict(weights=mw, aux=aux)
    clean = leaks.linkability(fresh, real.iloc[:500], holdout.iloc[:500], **args)
    leaky = leaks.linkability(real.sample(3000, random_state=0), real.iloc[:500], holdout.iloc[:500], **args)
    assert clean["linked"]["interval"][0] <= 0.01 < leaky["linked"]["interval"][0]
    assert leaky["anonymeter_risk"] > 0.2


def test_singling_out_has_a_control_of_equal_size(frames):
    real, holdout, fresh = frames
    args = dict(numeric=NUMERIC, n_attacks=200)
    clean = leaks.singling_out(fresh, real, holdout.iloc[:2000], **args)
    assert clean["reference_rows"] == 2000 and 100 <= clean["queries"] <= 200  # REAL subsampled to HOLDOUT's size
    assert clean["singled_out"]["interval"][0] <= 0.05 < clean["singled_out"]["interval"][1] + 0.05
    leaky = leaks.singling_out(real.sample(3000, replace=True, random_state=0), real, holdout, **args)
    assert leaky["singled_out"]["interval"][0] > 0.05 and leaky["anonymeter_risk"] > 0.2
    main, control = leaky["singled_out"]["main"], leaky["singled_out"]["control"]
    assert leaky["anonymeter_risk"] == pytest.approx((main["rate"] - control["rate"]) / (1 - control["rate"]))


# ------------------------------------------------------------------------------------------ decision rules
def test_newcombe_interval_matches_the_paper():
    # Newcombe 1998, Table II, example (a): 56/70 - 48/80, method 10: 0.0524 to 0.3339
    lo, hi = difference_interval(56, 70, 48, 80)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)


@pytest.mark.parametrize(
    "interval,status",
    [((0.006, 0.01), "fail"), ((0.001, 0.04), "pass"), ((0.0, 0.07), "inconclusive"), ((0.003, 0.2), "fail")],
)
def test_a_pass_rules_out_a_leak_and_a_fail_confirms_one(interval, status):
    v = decide(
        "copies", "max_near_excess", "x", sum(interval) / 2, interval, 0.002, at_most=True, pass_limit=0.05
    )
    assert v.status == status
    with pytest.raises(ValueError, match="stricter"):
        decide("c", "m", "x", 0.1, (0.0, 0.2), 0.1, at_most=True, pass_limit=0.05)


def test_rule_out_must_not_be_stricter_than_its_limit():
    with pytest.raises(PolicyError, match="rule_out_near_excess must come with max_near_excess"):
        load_policy({"checks": {"copies": {"max_near_excess": 0.01, "rule_out_near_excess": 0.005}}})
    with pytest.raises(PolicyError, match="n_attacks must be an integer >= 50"):
        load_policy({"checks": {"singling_out": {"n_attacks": 10}}})
    with pytest.raises(PolicyError, match="aux_columns must be two non-empty lists"):
        load_policy({"checks": {"linkability": {"aux_columns": [["a"]]}}})


def test_the_lmdp_test_is_reported_apart_and_never_changes_the_verdict(frames):
    real, holdout, fresh = frames
    inputs = AuditInputs(synthetic=fresh, real=real, holdout=holdout, numeric=NUMERIC)
    pol = load_policy(
        {
            "checks": {
                "copies": {"max_exact_excess": 0.002, "rule_out_exact_excess": 0.05},
                "lmdp_mmd": {"n_permutations": 100},
            }
        }
    )
    report, _ = build_report(inputs, pol, progress=False)
    lmdp = [v for v in report["verdicts"] if v["check"] == "lmdp_mmd"]
    # fresh rows of the same population: the MMD test cannot tell them apart, so α-LMDP does not hold ...
    assert lmdp and lmdp[0]["status"] != "pass" and not lmdp[0]["gates"]
    assert report["checks"]["lmdp_mmd"]["role"] == "property"
    assert report["status"] == "pass"  # ... and the leak verdict is the copies check's alone


def test_the_default_policy_runs_the_leak_detectors(frames):
    default = load_policy()["checks"]
    assert default["membership"]["max_auc"] == 0.53 and default["membership"]["rule_out_auc"] == 0.65
    assert {"copies", "vulnerable_records", "singling_out", "linkability"} <= set(default)
    real, holdout, fresh = frames
    inputs = AuditInputs(synthetic=fresh, real=real, holdout=holdout, numeric=NUMERIC)
    cands = Candidates.draw(inputs, max_candidates=500, seed=0)
    res = REGISTRY["copies"].run(inputs, cands, default["copies"], Context(seed=0), lambda: None)
    assert [v.status for v in res.verdicts] == ["pass", "pass", "pass"]
    assert res.result["n_synthetic_rows"] == 3000  # every synthetic row, none subsampled away
