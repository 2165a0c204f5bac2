"""bench/reproduce.py on a tiny table: train, score, print and write our numbers beside the paper's."""

import importlib.util
import re
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, average_precision_score, roc_auc_score

from tests.conftest import ROOT, TINY, TINY_ONE_SHOT

spec = importlib.util.spec_from_file_location("bench_reproduce", ROOT / "bench" / "reproduce.py")
rp = sys.modules["bench_reproduce"] = importlib.util.module_from_spec(spec)  # a script, not a package module
spec.loader.exec_module(rp)

PAPER_ROW = "DP-MERF (1, 1e-5)"
TINY_TABLE = rp.Table(
    name="tiny_breast",
    title="DP-MERF on breast cancer, tiny",
    source="a test table",
    kind="tabular",
    privacy=[1.0, 1e-5],
    runs=[
        rp.Run(
            label="DP-MERF",
            experiment=None,
            paper=PAPER_ROW,
            overrides=("model=dp_merf", "data=breast_cancer", *TINY, *TINY_ONE_SHOT, "privacy.noise_seed=0"),
        )
    ],
    paper={"Real": {"roc": 0.912, "prc": 0.834}, PAPER_ROW: {"roc": 0.613, "prc": 0.524}},
    compare=[("roc_auc_hard", "roc", "ROC (hard)"), ("prc_hard", "prc", "PRC (hard)")],
    extra=["roc_auc"],
    fit=["logistic_regression", "gaussian_nb"],
    average=["logistic_regression", "gaussian_nb"],
    seeds=1,
    per_classifier={PAPER_ROW: {"logistic_regression": [0.701, 0.602], "gaussian_nb": [0.503, 0.404]}},
    per_classifier_title="a per-classifier table",
    notes=["a protocol note"],
    missing=["census: no data"],
)


def cells(text: str, first: str) -> list[str]:
    """The cells of the Markdown row whose first cell is ``first``."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    logs: list[str] = []
    sections = rp.reproduce(
        [TINY_TABLE],
        seeds=1,
        quick=False,
        validate=False,
        extra=[],
        out=tmp_path_factory.mktemp("runs"),
        command="python bench/reproduce.py --table tiny",
        log=logs.append,
    )
    assert any("trained DP-MERF (seed 0)" in line for line in logs)
    return sections["tiny_breast"]


def test_table_has_our_numbers_beside_the_papers(section):
    assert section.startswith("## tiny_breast: DP-MERF on breast cancer, tiny")
    assert "`python bench/reproduce.py --table tiny`" in section
    header = cells(section, "method")
    assert header == [
        "method",
        "(ε, δ) spent",
        "ROC (hard): ours",
        "paper",
        "PRC (hard): ours",
        "paper",
        "ROC (score)",
    ]
    ours = cells(section, "DP-MERF")
    assert ours[1] == "(1.000, 1e-5)"  # the ledger spent the whole target and no more
    assert ours[3] == "0.613" and ours[5] == "0.524"  # the paper's column
    for value in (ours[2], ours[4], ours[6]):  # ours: one seed, a number in [0, 1]
        assert re.fullmatch(r"\d\.\d{3}", value) and 0 <= float(value) <= 1
    real = cells(section, "Real data (reference)")
    assert real[3] == "0.912" and float(real[2]) > 0.8  # real breast-cancer data is easy
    assert "Classifiers: logistic_regression, gaussian_nb (2 averaged)" in section
    assert "- a protocol note" in section and "- Not reproduced: census: no data" in section


def test_per_classifier_block_and_paper_average(section):
    assert "Per classifier, vs a per-classifier table:" in section
    assert cells(section, "logistic_regression")[2] == "0.701"
    assert cells(section, "average")[2] == f"{(0.701 + 0.503) / 2:.3f}"


def test_write_replaces_its_section_and_keeps_the_others(section, tmp_path):
    path = tmp_path / "results.md"
    rp.write_results(path, {"other": "## other\nkept\n"}, order=["tiny_breast", "other"])
    rp.write_results(path, {"tiny_breast": section}, order=["tiny_breast", "other"])
    rp.write_results(path, {"tiny_breast": section}, order=["tiny_breast", "other"])
    text = path.read_text()
    assert text.count("# Reproduction of the papers' headline tables") == 1
    assert text.count("## tiny_breast:") == 1 and "## other\nkept" in text
    assert text.index("## tiny_breast:") < text.index("## other")
    assert "do not edit by hand" in text


def test_prc_at_the_papers_prevalence_matches_an_undersampled_test_set():
    # our test set: 250 positives, 750 negatives; TPR = 0.6, FPR = 0.2
    y = np.r_[np.ones(250), np.zeros(750)]
    pred = np.r_[np.ones(150), np.zeros(100), np.ones(150), np.zeros(600)]
    per_seed = pd.DataFrame(
        {
            "seed": [0],
            "model": ["m"],
            "roc_auc_hard": [roc_auc_score(y, pred)],
            "accuracy": [accuracy_score(y, pred)],
            "prc_hard": [average_precision_score(y, pred)],
        }
    )
    derived = rp.with_paper_prevalence(per_seed, 0.25, 0.5)["prc_hard_at_paper_prevalence"].item()
    keep = np.r_[np.arange(250), 250 + np.r_[np.arange(50), 150 + np.arange(200)]]  # 250 negatives, FPR kept
    assert pred[250:][keep[250:] - 250].mean() == pytest.approx(0.2)
    assert derived == pytest.approx(average_precision_score(y[keep], pred[keep]))
    same = rp.with_paper_prevalence(per_seed, 0.25, 0.25)["prc_hard_at_paper_prevalence"].item()
    assert same == pytest.approx(per_seed["prc_hard"].item())


def test_validation_split_comes_from_the_training_rows_only(tmp_path):
    cfg = rp.compose_cfg(["data=breast_cancer"])
    overrides = rp.validation_overrides(cfg, tmp_path)
    fit, val = pd.read_csv(tmp_path / "fit.csv"), pd.read_csv(tmp_path / "validation.csv")
    assert (len(fit), len(val)) == (366, 92)  # 80/20 of the 458 rows the keyed-hash split trains on
    test = rp.real_data(cfg).test
    key = ["mean radius", "mean texture", "mean area"]
    assert not pd.merge(pd.concat([fit, val])[key].round(4), test[key].round(4)).shape[0]
    assert overrides[0] == "data.name=csv" and any(o.startswith("+data.test_path=") for o in overrides)


def test_registry_tables_compose_and_name_their_paper_rows():
    tables = rp.load_tables()
    assert {
        "dp_merf_adult",
        "dp_merf_cervical",
        "dp_cgan_adult",
        "pearl_adult",
        "dp_merf_mnist",
        "pearl_mnist",
        "bias_breast",
    } <= set(tables)
    for table in tables.values():
        for run in table.runs:
            assert run.paper in table.paper, (table.name, run.label)
            base = [f"experiment={run.experiment}"] if run.experiment else []  # None: the default run
            cfg = rp.compose_cfg([*base, *run.overrides])
            eps = np.atleast_1d(table.privacy[0])
            assert cfg.privacy.epsilon in eps and cfg.privacy.delta == table.privacy[1], (
                table.name,
                run.label,
            )


def test_single_class_synthetic_seeds_score_as_constant_predictions():
    test = pd.DataFrame({"x": [0.0, 1, 2, 3], "y": ["0", "0", "0", "1"]})
    data = rp.RealData("tabular", test, test, label="y", categorical=[])
    per_seed = pd.DataFrame(
        {
            "seed": [0, 1],
            "model": ["m", "m"],
            "roc_auc_hard": [0.8, np.nan],
            "prc_hard": [0.6, np.nan],
            "roc_auc": [0.9, np.nan],
            "prc": [0.7, np.nan],
            "accuracy": [0.75, np.nan],
        }
    )
    synthetic = {0: pd.DataFrame({"y": [0, 1]}), 1: pd.DataFrame({"y": [0, 0]})}
    out = rp.constant_predictions(per_seed, synthetic, data)
    assert out.loc[0, "roc_auc_hard"] == 0.8 and not out.loc[0, "single_class"]
    assert out.loc[1, ["roc_auc_hard", "roc_auc", "prc_hard", "prc", "accuracy"]].tolist() == [
        0.5,
        0.5,
        0.25,
        0.25,
        0.75,
    ]
    assert out.loc[1, "single_class"]


def test_a_bench_table_runs_its_script_and_shows_the_thesis_beside_ours(tmp_path):
    """iw_mmd_synthetic through reproduce(): bench/iw_mmd.py trains the GMMNs, the section names the command."""
    from dataclasses import replace

    table = rp.load_tables()["iw_mmd_synthetic"]
    tiny = replace(table, bench={**table.bench, "dims": [2], "estimators": ["standard", "iw"], "quick_steps": 3})
    command = "python bench/reproduce.py --table iw_mmd_synthetic --quick"
    text = rp.reproduce([tiny], seeds=2, quick=True, validate=False, extra=[], out=tmp_path, command=command,
                        log=lambda _: None)["iw_mmd_synthetic"]
    assert text.startswith("## iw_mmd_synthetic:") and "(quick)" in text.splitlines()[0]
    assert f"`{command}`" in text and "20 runs × 25,000 steps" in text
    kl = cells(text.split("KL(generated")[1], "IW-MMD")
    assert kl[2] == "0.0343 ± 0.0230" and kl[4] == "-0.0079"  # the thesis' mean ± sd and best of 20 (2D)
    assert re.fullmatch(r"-?\d+\.\d{4} ± \d+\.\d{4}", kl[1])  # ours: mean ± sd over 2 seeds
    assert "C-GAN (thesis only, not run)" in text and "IW-MMD: lower mean KL" in text
