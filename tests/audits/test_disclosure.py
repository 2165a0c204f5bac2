"""Presence and attribute disclosure reproduce small toy examples computed by hand."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from audits.disclosure import attribute_disclosure, presence_curve, presence_disclosure, presence_star

pytestmark = pytest.mark.usefixtures("single_thread")

# ---------------------------------------------------------------------------------------------- presence
# 1-D toy (already numeric, so no encoder): synthetic {0, 10}
#   members      0.1, 3.0, 10.5  -> DCR 0.1, 3.0, 0.5
#   non-members  1.0, 6.0, 20.0  -> DCR 1.0, 4.0, 10.0
# r      TP FP  sensitivity  precision
# 0.2     1  0      1/3        1
# 0.6     2  0      2/3        1
# 1.5     2  1      2/3        2/3
# 3.5     3  1      1          3/4
# 5.0     3  2      1          3/5   <- largest r with precision > 0.55
# baseline S_base = {3.25}: member DCR 3.15, 0.25, 7.25; non-member DCR 2.25, 2.75, 16.75
# r      TP FP  sensitivity  precision
# 0.2     0  0      0          NaN (nothing flagged)
# 0.6     1  0      1/3        1
# 1.5     1  0      1/3        1     <- r* of the baseline
# 3.5     2  2      2/3        1/2
# 5.0     2  2      2/3        1/2
SYN = np.array([[0.0], [10.0]])
MEM = np.array([[0.1], [3.0], [10.5]])
NON = np.array([[1.0], [6.0], [20.0]])
GRID = [0.2, 0.6, 1.5, 3.5, 5.0]


def test_presence_sweep_by_hand():
    res = presence_disclosure(SYN, MEM, NON, thresholds=GRID, baseline=np.array([[3.25]]))
    np.testing.assert_allclose(res["sensitivity"], [1 / 3, 2 / 3, 2 / 3, 1, 1])
    np.testing.assert_allclose(res["precision"], [1, 1, 2 / 3, 3 / 4, 3 / 5])
    assert res["n_flagged"] == [1, 2, 3, 4, 5]
    assert res["r_star"] == 5.0
    assert res["sensitivity_at_r_star"] == 1.0
    assert res["precision_at_r_star"] == pytest.approx(0.6)
    base = res["baseline"]
    np.testing.assert_allclose(base["sensitivity"], [0, 1 / 3, 1 / 3, 2 / 3, 2 / 3])
    np.testing.assert_allclose(base["precision"], [np.nan, 1, 1, 1 / 2, 1 / 2])
    assert base["r_star"] == 1.5
    assert res["risk_above_baseline"]["sensitivity"] == pytest.approx(1 - 1 / 3)
    assert res["risk_above_baseline"]["precision"] == pytest.approx(0.6 - 1.0)
    json.dumps(res)  # report-ready


def test_presence_default_sweep_is_every_observed_distance():
    # distances 0.1, 0.5, 1.0, 3.0, 4.0, 10.0: precision 1, 1, 2/3, 3/4, 3/5, 1/2 -> r* = 4.0
    res = presence_disclosure(SYN, MEM, NON)
    np.testing.assert_allclose(res["thresholds"], [0.1, 0.5, 1.0, 3.0, 4.0, 10.0])
    np.testing.assert_allclose(res["precision"], [1, 1, 2 / 3, 3 / 4, 3 / 5, 1 / 2])
    assert res["r_star"] == 4.0 and res["baseline"] is None


def test_presence_no_threshold_reaches_the_precision_target():
    curve = presence_curve(np.array([5.0]), np.array([1.0]), np.array([0.5, 2.0, 6.0]))
    assert np.isnan(curve["precision"][0]) and curve["precision"][1:] == [0.0, 0.5]
    res = presence_disclosure(np.array([[0.0]]), np.array([[5.0]]), np.array([[1.0]]))
    assert res["r_star"] is None and res["sensitivity_at_r_star"] == 0.0


def test_presence_on_dataframes_uses_the_encoder():
    mem = pd.DataFrame({"x": [0.0, 1.0], "c": ["a", "b"]})
    non = pd.DataFrame({"x": [2.0, 3.0], "c": ["a", "b"]})
    syn = mem.copy()  # memorised: members at DCR 0
    # x is z-scored over the 4 candidates (mean 1.5, std √1.25), a category mismatch costs √2:
    # n1 = (2, a) is closest to (1, b): √(1/1.25 + 2) = √2.8; n2 = (3, b) to (1, b): 2/√1.25 = √3.2
    # r = 0: precision 1; r = √2.8: 2/3 > 0.55; r = √3.2: 1/2  ->  r* = √2.8, sensitivity 1
    res = presence_disclosure(syn, mem, non)
    np.testing.assert_allclose(res["thresholds"], [0.0, np.sqrt(2.8), np.sqrt(3.2)])
    assert res["r_star"] == pytest.approx(np.sqrt(2.8)) and res["sensitivity_at_r_star"] == 1.0
    with pytest.raises(ValueError, match=r"missing \['c'\]"):
        presence_disclosure(syn[["x"]], mem, non)


# --------------------------------------------------------------------------------------------- attribute
# Known: age (numeric, min-max over the real candidates 30..70 -> /40) and sex (one-hot, mismatch = √2).
# Unknown: bp (numeric) and smoker (categorical).
MEMBERS = pd.DataFrame(
    {"age": [30, 50, 70], "sex": ["F", "M", "F"], "bp": [120.0, 140, 100], "smoker": ["no", "yes", "no"]}
)
NON_MEMBERS = pd.DataFrame({"age": [40, 50], "sex": ["F", "M"], "bp": [130.0, 150], "smoker": ["no", "no"]})
SYNTHETIC = pd.DataFrame(
    {
        "age": [31, 49, 69, 60],
        "sex": ["F", "M", "M", "F"],
        "bp": [123.0, 150, 101, 98],
        "smoker": ["no", "yes", "yes", "yes"],
    }
)

BASELINE = pd.DataFrame({"age": [30, 70], "sex": ["F", "M"], "bp": [100.0, 140], "smoker": ["yes", "no"]})
KW = {"known_columns": ["age", "sex"], "numeric_columns": ["age", "bp"]}


def test_attribute_disclosure_relative_tolerance_k1():
    # nearest synthetic on (age, sex): m1->s1 (d .025), m2->s2 (.025), m3->s4 (.25; s3 has the other sex)
    #   m1: bp 123 vs 120, |3| <= 6 ok;  smoker no = no ok
    #   m2: bp 150 vs 140, 10 > 7 miss;   smoker yes = yes ok
    #   m3: bp 98 vs 100, 2 <= 5 ok;      smoker yes != no miss      -> members 4/6 correct
    #   n1 -> s1: bp 123 vs 130, 7 > 6.5 miss; smoker ok;  n2 -> s2: bp 150 ok; smoker miss -> 2 correct
    # precision = 4 / (4 + 2)
    # baseline: m1->b1 (bp 100 miss, smoker miss), m2->b2 (.5 vs 1.5: bp 140 ok, smoker miss),
    #   m3->b1 (1.0 vs √2: bp 100 ok, smoker miss) -> 2/6; n1->b1 nothing, n2->b2 (bp 140 vs 150 miss,
    #   smoker no ok) -> 1; precision 2/3
    res = attribute_disclosure(SYNTHETIC, MEMBERS, **KW, non_members=NON_MEMBERS, baseline=BASELINE, k=1)
    assert res["unknown_columns"] == ["bp", "smoker"]
    assert res["sensitivity"] == pytest.approx(4 / 6)
    assert res["precision"] == pytest.approx(4 / 6)
    assert res["per_column_sensitivity"] == pytest.approx({"bp": 2 / 3, "smoker": 2 / 3})
    assert res["baseline"]["sensitivity"] == pytest.approx(2 / 6)
    assert res["baseline"]["precision"] == pytest.approx(2 / 3)
    assert res["risk_above_baseline"] == pytest.approx({"sensitivity": 1 / 3, "precision": 0.0})
    json.dumps(res)


def test_attribute_disclosure_range_tolerance_k1():
    # bp range over members ∪ non-members = 150 - 100 = 50 -> tolerance 2.5
    #   members: bp m1 3 miss, m2 10 miss, m3 2 ok; smoker ok, ok, miss -> 3/6
    #   non-members: bp n1 7 miss, n2 0 ok; smoker ok, miss -> 2 -> precision 3/5
    #   baseline members: bp m2 0 ok, m3 0 ok -> 2/6; non-members: smoker n2 -> 1 -> precision 2/3
    res = attribute_disclosure(
        SYNTHETIC, MEMBERS, **KW, non_members=NON_MEMBERS, baseline=BASELINE, k=1, tolerance_mode="range"
    )
    assert res["sensitivity"] == pytest.approx(3 / 6)
    assert res["precision"] == pytest.approx(3 / 5)
    assert res["baseline"]["sensitivity"] == pytest.approx(2 / 6)
    assert res["risk_above_baseline"]["precision"] == pytest.approx(3 / 5 - 2 / 3)


def test_attribute_disclosure_k2_mean_and_vote():
    # m1: s1 (.025), s4 (.75): bp (123 + 98)/2 = 110.5 vs 120 miss; smoker tie no/yes -> nearest "no" ok
    # m2: s2 (.025), s3 (.475): bp 125.5 vs 140 miss; smoker yes, yes ok
    # m3: s4 (.25), s1 (.975): bp 110.5 vs 100 miss; smoker tie yes/no -> nearest "yes" miss
    res = attribute_disclosure(SYNTHETIC, MEMBERS, **KW, k=2)
    assert res["per_column_sensitivity"] == pytest.approx({"bp": 0.0, "smoker": 2 / 3})
    assert res["precision"] is None and res["baseline"] is None and res["k"] == 2


def test_attribute_disclosure_medgan_binary_metrics_and_nan():
    mem = pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "flag": [1, 1, 0, np.nan]})
    syn = pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "flag": [1, 0, 1, 0]})
    # imputed 1, 0, 1 for true 1, 1, 0 (the NaN row is skipped): TP 1, FN 1, FP 1
    res = attribute_disclosure(syn, mem, known_columns=["x"], numeric_columns=["x", "flag"], k=1)
    assert res["n_pairs"] == 3 and res["sensitivity"] == pytest.approx(1 / 3)
    assert res["medgan"] == {"columns": ["flag"], "sensitivity": 0.5, "precision": 0.5}


def test_attribute_disclosure_validates_columns():
    with pytest.raises(ValueError, match=r"missing \['smoker'\], extra \['smokes'\]"):
        attribute_disclosure(SYNTHETIC.rename(columns={"smoker": "smokes"}), MEMBERS, **KW)
    with pytest.raises(ValueError, match="proper subset"):
        attribute_disclosure(SYNTHETIC, MEMBERS, known_columns=list(MEMBERS.columns), numeric_columns=[])
    with pytest.raises(ValueError, match="tolerance_mode"):
        attribute_disclosure(SYNTHETIC, MEMBERS, **KW, tolerance_mode="absolute")


# ------------------------------------------------------------------------------------- confident r*
def test_the_confident_rule_needs_precision_above_target_with_confidence():
    # 8 members very close (0.1 .. 0.8); then 20 members at 10, 11, ... and 28 non-members at 10.5, 11.5, ...
    # Point rule: precision stays above 0.55 out to r = 31.5, where all 28 members and 22 non-members are flagged
    # (28/50 = 0.56): sensitivity 1, although beyond r = 0.8 members and non-members simply alternate.
    # Confident rule (95%): P(Binomial(flagged, 0.55) >= TP) < 0.025. At r = 11: 10 members of 11 flagged,
    # P(X >= 10 | 11) = 0.014: yes. At r = 12: 11 of 13, P = 0.035: no, nor anywhere beyond.
    d_in = np.r_[np.arange(1, 9) / 10, 10 + np.arange(20.0)]
    d_out = 10.5 + np.arange(28.0)
    assert presence_star(d_in, d_out, 0.55) == pytest.approx((31.5, 1.0, 0.56))
    assert presence_star(d_in, d_out, 0.55, confidence=0.95) == pytest.approx((11.0, 10 / 28, 10 / 11))
    assert binom.sf(9, 11, 0.55) < 0.025 < binom.sf(10, 13, 0.55)
    # 4 of 4 close members are not enough evidence (0.55^4 = 0.09 > 0.025): no confident r*, sensitivity 0
    few_in, few_out = np.r_[0.1, 0.2, 0.3, 0.4, 5.0], np.r_[5.0, 6.0, 7.0, 8.0, 9.0]
    assert presence_star(few_in, few_out, 0.55, 0.95) == (None, 0.0, None)
    assert presence_star(few_in, few_out, 0.55) == pytest.approx((8.0, 1.0, 5 / 9))  # point rule: 5 of 9


def test_presence_and_attribute_hand_back_what_the_intervals_resample():
    distances: dict = {}
    res = presence_disclosure(SYN, MEM, NON, baseline=np.array([[3.25]]), distances=distances)
    np.testing.assert_allclose(distances["synthetic"][0], [0.1, 3.0, 0.5])
    np.testing.assert_allclose(distances["baseline"][1], [2.25, 2.75, 16.75])
    assert res["confident_r_star"] is None and res["risk_above_baseline"]["confident_sensitivity"] == 0.0
    per_member: dict = {}
    attribute_disclosure(
        SYNTHETIC, MEMBERS, **KW, non_members=NON_MEMBERS, baseline=BASELINE, k=1, per_member=per_member
    )
    np.testing.assert_array_equal(per_member["synthetic"][0], [2, 1, 1])  # see the k = 1 example above
    np.testing.assert_array_equal(per_member["baseline"][0], [0, 1, 1])
    np.testing.assert_array_equal(per_member["synthetic"][1], [2, 2, 2])
