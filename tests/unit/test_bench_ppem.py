"""bench/ppem.py's verdicts: α-LMDP holds only when every KSD test rejects, in the audit and every audit seed."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_ppem", ROOT / "bench" / "ppem.py")
bench = sys.modules["bench_ppem"] = importlib.util.module_from_spec(spec)  # a script, not a package module
spec.loader.exec_module(bench)

MARGIN = {"ks": 0.07, "tv": 0.08, "tstr": 0.08}


def row(weight: float, p: float, *, rejections: int = 10, ks: float = 0.5, tv: float = 0.05, roc: float = 0.75):
    return {"seed": 0, "λ_α": weight, **{f"p_{name}": p for name in bench.KSD_TESTS},
            **{f"reject_{name}": p <= 0.05 for name in bench.KSD_TESTS}, "p_mmd": 0.005,
            "x*_mean_ks": ks, "x*_mean_tv": tv, "tstr_roc": roc, "train_s": 60.0,
            "over_seeds": {name: (rejections, 10, p) for name in bench.KSD_TESTS}}


def test_penalty_that_rejects_everywhere_within_the_margin():
    table, (line,) = bench.data_table([row(10, 0.0), row(0, 0.5, rejections=0)], MARGIN)
    assert "α-LMDP holds" in line and "no KSD test rejects" in line and "(within the margin)" in line
    assert "| 0 | 10 | 0.0e+00 |" in table and "10/10 (0.0e+00)" in table and "0/10 (0.5)" in table


def test_one_audit_seed_without_rejection_means_no_claim():
    _, (line,) = bench.data_table([row(10, 0.0, rejections=9), row(0, 0.5, rejections=0)], MARGIN)
    assert "α-LMDP does NOT hold" in line


def test_fidelity_lost_beyond_the_margin_is_reported():
    _, (line,) = bench.data_table([row(10, 0.0, tv=0.2), row(0, 0.01, rejections=3)], MARGIN)
    assert "some KSD test rejects" in line and "TV +0.150" in line and "(OUTSIDE the margin)" in line
    _, (line,) = bench.data_table([row(10, 0.0, roc=0.6), row(0, 0.5)], MARGIN)
    assert "TSTR ROC -0.150" in line and "OUTSIDE" in line


def test_summary_skips_columns_generated_all_missing():
    report = {"inputs": {"real": {"rows": 686}, "holdout": {"rows": 172}}, "checks": {
        "lmdp_ksd": {"tests": {name: {"p_value": 0.0, "reject": True} for name in bench.KSD_TESTS}},
        "lmdp_mmd": {"p_value": 0.5},
        "utility": {"value": 0.7},
        "fidelity": {"columns": {"Age": {"type": "numeric", "ks": 0.9}, "a": {"type": "numeric", "ks": 0.2},
                                 "b": {"type": "numeric", "ks": None}, "c": {"type": "categorical", "tv": 0.1},
                                 "d": {"type": "categorical", "tv": None}}},
    }}
    figures = bench.summarise(report, ["Age"])  # x′ = Age is not an x* column
    assert figures["x*_mean_ks"] == 0.2 and figures["x*_mean_tv"] == 0.1


def test_mean_over_seeds_judges_the_average_pair():
    rows = [dict(row(10, 0.0, roc=roc_on), seed=s) for s, roc_on in ((0, 0.60), (1, 0.80))]
    rows += [dict(row(0, 0.5), seed=s) for s in (0, 1)]
    _, lines = bench.data_table(rows, MARGIN)
    assert "OUTSIDE" in lines[0] and "within" in lines[1]  # seed 0: TSTR −0.15; seed 1: +0.05
    assert lines[2].startswith("mean over seeds 0, 1") and "TSTR ROC -0.050 (± 0.100 s.e.)" in lines[2]
    assert lines[2].endswith("(within the margin)")
