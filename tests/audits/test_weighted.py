"""Weighted evaluation of synthetic data (weighted MMD², W1, the paper's W1) and the report's weights section."""

from __future__ import annotations

import html
import json

import numpy as np
import pandas as pd
import pytest

from audits.inputs import InputError, pop_weights
from audits.report import run_audit
from audits.weighted import (
    MAX_OT_ENTRIES,
    paper_weighted_w1,
    weighted_mmd2,
    weighted_w1,
    weights_section,
)

MU = 0.7


def _gaussian_toy(d: int, n: int = 800, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p_G = N(0, I) synthetic rows, p_D = N(μ, I) real rows, and the true weights p_D/p_G of the synthetic rows."""
    rng = np.random.default_rng(seed)
    mu = np.full(d, MU)
    x = rng.normal(size=(n, d))  # (N, d) ~ p_G
    z = rng.normal(size=(n, d)) + mu  # (M, d) ~ p_D
    w = np.exp(x @ mu - mu @ mu / 2.0)  # (N,) p_D(x) / p_G(x)
    return x, z, w


def _unweighted_u_statistic(x: np.ndarray, z: np.ndarray, h: float) -> float:
    def k(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.exp(-((a[:, None, :] - b[None, :, :]) ** 2).sum(-1) / (2 * h**2))

    n, m = len(x), len(z)
    kxx, kzz = k(x, x), k(z, z)
    return float(
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kzz.sum() - np.trace(kzz)) / (m * (m - 1))
        - 2 * k(x, z).mean()
    )


def test_mmd2_with_unit_weights_is_the_unweighted_u_statistic():
    rng = np.random.default_rng(1)
    x, z = rng.normal(size=(60, 3)), rng.normal(0.3, 1.0, size=(45, 3))
    for h in (1.0, 0.5):
        expected = _unweighted_u_statistic(x, z, h)
        assert weighted_mmd2(x, z, np.ones(60), bandwidth=h) == pytest.approx(expected, rel=1e-10)
        assert weighted_mmd2(x, z, np.full(60, 3.0), bandwidth=h) == pytest.approx(expected, rel=1e-10)
    # equal sizes: the paper's formula, but for its cross pairs i = j
    n = 40
    x, z = x[:n], z[:n]
    w = rng.uniform(0.5, 2.0, n)
    w = w / w.mean()
    kxx, kzz, kxz = (np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / 2) for a, b in ((x, x), (z, z), (x, z)))
    off = ~np.eye(n, dtype=bool)
    paper = (w[:, None] * w[None] * kxx + kzz - w[:, None] * kxz - w[None] * kxz.T)[off].sum() / (n * (n - 1))
    cross_all, cross_diag = (w[:, None] * kxz).sum(), (w * np.diag(kxz)).sum()
    ours = paper + 2 * (cross_all - cross_diag) / (n * (n - 1)) - 2 * cross_all / n**2
    assert weighted_mmd2(x, z, w) == pytest.approx(ours, rel=1e-9)


@pytest.mark.parametrize("d", [1, 2])
def test_true_importance_weights_bring_the_synthetic_rows_closer(d):
    x, z, w = _gaussian_toy(d)
    ones = np.ones(len(x))
    mmd_plain, mmd_weighted = weighted_mmd2(x, z, ones), weighted_mmd2(x, z, w)
    w1_plain, w1_weighted = weighted_w1(x, z, ones), weighted_w1(x, z, w)
    assert mmd_weighted < 0.5 * mmd_plain
    assert w1_weighted < 0.75 * w1_plain
    # the paper's variant equals W1 for uniform weights, and is smaller still with the weights
    assert paper_weighted_w1(x, z, ones) == pytest.approx(w1_plain, rel=1e-9)
    assert paper_weighted_w1(x, z, w) < w1_plain


def test_w1_of_identical_samples_is_zero_and_of_shifted_normals_is_the_shift():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(500, 1))
    assert weighted_w1(x, x, np.ones(500)) == pytest.approx(0.0, abs=1e-9)
    a, b = rng.normal(size=(1500, 1)), rng.normal(1.0, 1.0, size=(1500, 1))
    assert weighted_w1(a, b, np.ones(1500)) == pytest.approx(1.0, abs=0.1)
    # N·M above MAX_OT_ENTRIES: deterministic subsamples of max_points per side
    a, b = rng.normal(size=(2500, 1)), rng.normal(1.0, 1.0, size=(2500, 1))
    assert MAX_OT_ENTRIES < 2500 * 2500
    first = weighted_w1(a, b, np.ones(2500), max_points=600, seed=3)
    assert first == weighted_w1(a, b, np.ones(2500), max_points=600, seed=3)
    assert first == pytest.approx(1.0, abs=0.15)


def test_the_papers_w1_collapses_with_collapsed_weights():
    x, z, _ = _gaussian_toy(2, n=300)
    collapsed = np.full(300, 1e-12)
    collapsed[0] = 1.0
    # only the heavy row's cost counts: about its distance to the nearest real row
    assert paper_weighted_w1(x, z, collapsed) < 0.2 * weighted_w1(x, z, np.ones(300))
    assert weighted_w1(x, z, collapsed) > 0.5  # the proper distance sees a single point


def test_bad_arrays_are_refused():
    x = np.zeros((5, 2))
    with pytest.raises(ValueError, match="one per synthetic row"):
        weighted_mmd2(x, x, np.ones(4))
    with pytest.raises(ValueError, match="non-negative"):
        weighted_w1(x, x, -np.ones(5))
    with pytest.raises(ValueError, match="one d"):
        weighted_w1(x, np.zeros((5, 3)), np.ones(5))


# ----------------------------------------------------------------------------------------- the report
def _frame(x: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    y = rng.random(len(x)) < 1.0 / (1.0 + np.exp(-(x[:, 0] - x[:, 1])))
    colour = np.where(x[:, 0] > 0.5, "red", "blue")
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "colour": colour, "y": np.where(y, "yes", "no")})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """REAL and HOLDOUT from p_D = N(μ, I), synthetic rows from p_G = N(0, I) with their true weights."""
    tmp = tmp_path_factory.mktemp("weighted")
    rng = np.random.default_rng(0)
    x, _, w = _gaussian_toy(2, n=600, seed=4)
    _frame(rng.normal(size=(400, 2)) + MU, rng).to_csv(tmp / "real.csv", index=False)
    _frame(rng.normal(size=(300, 2)) + MU, rng).to_csv(tmp / "holdout.csv", index=False)
    _frame(x, rng).assign(weight=w).to_csv(tmp / "synthetic.csv", index=False)
    return tmp


POLICY = {
    "checks": {
        "utility": {"label": "y", "classifiers": ["logistic_regression", "gaussian_nb"], "n_bootstrap": 100}
    }
}


def test_report_has_a_weights_section_and_never_uses_the_weight_as_a_feature(files, tmp_path):
    report, paths = run_audit(
        files / "synthetic.csv",
        real=str(files / "real.csv"),
        holdout=str(files / "holdout.csv"),
        out=tmp_path / "audit",
        policy=POLICY,
        progress=False,
    )
    on_disk = json.loads((tmp_path / "audit" / "report.json").read_text())
    w = on_disk["weights"]
    assert w == report["weights"] and w["n"] == 600 and w["weight_column"] == "weight"
    # the weight is not a feature anywhere
    assert "weight" not in report["columns"]["all"] and "weight" not in w["features"]
    assert w["features"] == ["a", "b", "colour", "y"]
    assert report["checks"]["utility"]["status"] == "ran"
    assert "weight" not in report["checks"]["utility"]["summary"]["categorical"]
    assert report["inputs"]["synthetic"]["weight_column"] == "weight"
    # diagnostics of the weights
    d = w["diagnostics"]
    assert 0 < d["kish_ess"] < 600 and d["kish_ess_fraction"] == pytest.approx(d["kish_ess"] / 600)
    assert np.isfinite(d["psis_k"]) and d["psis_verdict"] in ("good", "acceptable", "unreliable")
    assert w["unreliable"] == (d["psis_k"] > 0.7) and 0 < w["sandwich_ess"] < 600
    # utility with and without the weights: the same classifiers
    u = w["utility"]
    assert u["status"] == "ran" and u["metric"] == "roc_auc" and u["label"] == "y"
    assert u["classifiers"] == ["logistic_regression", "gaussian_nb"] and set(u["per_model"]) == set(
        u["classifiers"]
    )
    assert 0 <= u["unweighted"] <= 1 and 0 <= u["weighted"] <= 1
    # distances to HOLDOUT: the true weights bring the synthetic rows closer
    dist = w["distances"]
    assert dist["against"] == "HOLDOUT" and dist["n_synthetic"] == 600 and dist["n_real"] == 300
    assert dist["mmd2"]["weighted"] < dist["mmd2"]["unweighted"]
    assert dist["w1"]["weighted"] < dist["w1"]["unweighted"]
    # the PSIS verdict never gates; the report says what it computed from real rows
    psis = [v for v in report["verdicts"] if v["check"] == "weights_psis"]
    assert len(psis) == 1 and psis[0]["gates"] is False and psis[0]["value"] == pytest.approx(d["psis_k"])
    assert "weights" in report["privacy"]["from_real_rows"]
    assert report["summary"][-1].startswith(f"{psis[0]['status'].upper()} weights_psis: PSIS k̂")
    page = html.unescape((tmp_path / "audit" / "report.html").read_text())
    assert 'id="weights"' in page and 'href="#weights"' in page and "Kish ESS" in page
    assert "Histogram of the synthetic rows' log importance weights" in page


def test_heavy_tailed_weights_are_flagged(files):
    real = pd.read_csv(files / "real.csv")
    holdout = pd.read_csv(files / "holdout.csv")
    synthetic = pd.read_csv(files / "synthetic.csv").drop(columns=["weight"])
    heavy = np.random.default_rng(5).pareto(1.0, len(synthetic)) + 1.0  # k = 1
    section = weights_section(synthetic, heavy, real, holdout, categorical=["colour", "y"], max_points=200)
    assert section["unreliable"] and section["diagnostics"]["psis_verdict"] == "unreliable"
    assert "do not release the weighted data" in section["message"].lower()
    assert section["utility"]["status"] == "skipped"  # no label given
    assert section["distances"]["n_synthetic"] == 200


def test_pop_weights():
    syn = pd.DataFrame({"a": ["1", "2"], "weight": ["0.5", "2"]})
    rows, w = pop_weights(syn, ["a"])
    assert list(rows.columns) == ["a"] and w.tolist() == [0.5, 2.0]
    rows, w = pop_weights(syn, ["a", "weight"])  # REAL has a weight column: a feature, kept
    assert w is None and list(rows.columns) == ["a", "weight"]
    with pytest.raises(InputError, match=r"'-1' on line 3 is not"):
        pop_weights(syn.assign(weight=["1", "-1"]), ["a"], kind="csv")
    with pytest.raises(InputError, match="is 0: no row has weight"):
        pop_weights(syn.assign(weight=["0", "0"]), ["a"])
