"""The audit report: ``train ... audit=default``, ``python -m audits`` on a checkpoint and on files, exit codes,
bad input (clear error, nothing written), the policy format, and a self-contained HTML page."""

import hashlib
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from audits.__main__ import main
from audits.checks import REGISTRY
from audits.html import PRIVATE_BANNER
from audits.policy import CHECKS, PolicyError, load_policy
from audits.report import FROM_REAL_ROWS
from lightning_dp.data.datamodule import PrivateDataModule
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.privacy.mechanisms import noise_generator
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

SECTIONS = ("verdicts", "inputs", "ledger", *CHECKS, "run")
FAST = {"checks": {"membership": {"attacks": ["dcr"], "max_auc": 1.0}}}  # one quick check that passes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny DP-MERF run on breast cancer with the audit at the end, and the run's rows as CSV files."""
    out = tmp_path_factory.mktemp("run")
    result = train(make_cfg(out, "privacy.noise_seed=0", "audit=default"))
    dm = PrivateDataModule(name="breast_cancer")
    dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=1e-5), generator=noise_generator(0))
    dm.train_frame.to_csv(out / "real.csv", index=False)
    dm.holdout.to_csv(out / "holdout.csv", index=False)
    return result, out


def _policy(tmp_path: Path, policy: dict) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return str(path)


def _cli(run, tmp_path: Path, *extra: str, synthetic: str | None = None) -> tuple[int, Path]:
    result, out = run
    dest = tmp_path / "audit"
    argv = [
        synthetic or result["synthetic"],
        "--real",
        str(out / "real.csv"),
        "--holdout",
        str(out / "holdout.csv"),
        "--out",
        str(dest),
        *extra,
    ]
    return main(argv), dest


def _no_report(dest: Path) -> bool:
    return not (dest / "report.json").exists() and not (dest / "report.html").exists()


def test_train_with_audit_writes_both_report_files(run):
    result, out = run
    assert result["report"] == str(out / "report.html")
    report = json.loads((out / "report.json").read_text())
    assert set(report["checks"]) == set(CHECKS) and all(
        c["status"] == "ran" for c in report["checks"].values()
    )
    assert report["passed"] == all(v["passed"] for v in report["verdicts"])
    assert len(report["verdicts"]) == 9  # 3 attacks, 2 disclosures, α-LMDP, utility, 2 fidelity thresholds
    ledger = json.loads((out / "ledger.json").read_text())
    assert (
        report["ledger"]["releases"] == ledger["releases"]
        and report["ledger"]["epsilon"] == ledger["epsilon"]
    )
    assert report["config"]["privacy"]["noise_seed"] == 0
    synthetic = report["inputs"]["synthetic"]
    assert synthetic["sha256"] == hashlib.sha256(Path(result["synthetic"]).read_bytes()).hexdigest()
    assert report["inputs"]["real"]["rows"] == 458 and report["inputs"]["holdout"]["rows"] == 111  # keyed-hash split
    assert report["candidates"] == {"members": 55, "non_members": 55, "reference": 56}
    assert {"torch", "pytorch-lightning", "scikit-learn"} <= set(report["versions"])
    assert report["checks"]["utility"]["summary"]["label"] == "diagnosis"
    for attack in report["checks"]["membership"]["attacks"].values():
        assert (
            0.0 <= attack["auc"] <= 1.0 and attack["roc"]["fpr"][0] == 0.0 and attack["roc"]["tpr"][-1] == 1.0
        )


def test_html_is_self_contained_and_has_every_section(run):
    _, out = run
    page = (out / "report.html").read_text()
    assert not re.search(
        r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", page.replace("data:image/png;base64,", "")
    )
    assert "<script" not in page and "<link" not in page and "@import" not in page
    # ROC curves, presence sweep, attribute columns, utility bars, marginals: all inline PNGs
    assert re.findall(r'src="([^"]{0,22})', page) == ["data:image/png;base64,"] * 5
    for section in SECTIONS:
        assert f'id="{section}"' in page and f'href="#{section}"' in page, section
    assert "dp_merf/embedding/class_counts" in page  # the ledger table


def test_report_json_opens_with_its_privacy_label(run):
    _, out = run
    text = (out / "report.json").read_text()
    report = json.loads(text)
    assert list(report)[0] == "privacy" and text.startswith('{\n "privacy": {')
    privacy = report["privacy"]
    assert privacy["contains_private_information"] is True and privacy["dp"] is False
    assert privacy["dp_artefacts"] == ["synthetic data", "checkpoint", "ledger.json"]
    assert privacy["private_inputs"] == [
        "REAL: the private training rows",
        "HOLDOUT: real rows not trained on",
    ]
    assert list(privacy["from_real_rows"]) == [
        "inputs",
        "candidates",
        *(f"checks.{name}" for name in CHECKS),
        "verdicts",
    ]
    statement = privacy["statement"]
    for words in (
        "computed from the real private rows, REAL (training) and HOLDOUT",
        "It is NOT differentially private and is not covered by the run's (ε, δ).",
        "exact row counts and SHA-256 hashes of REAL and HOLDOUT",
        "membership-attack scores on REAL and HOLDOUT rows",
        "distances from REAL and HOLDOUT rows",
        "histograms of REAL's columns",
        "Handle it like the private data itself: access-controlled, not published.",
        "Only the synthetic data, the checkpoint and ledger.json are covered by the run's (ε, δ).",
    ):
        assert words in statement, words
    assert all(what in statement for what in privacy["from_real_rows"].values())


def test_every_check_says_what_it_computes_from_real_rows():
    assert {f"checks.{name}" for name in REGISTRY} <= set(FROM_REAL_ROWS)


def test_html_opens_with_the_private_banner_before_any_number(run):
    _, out = run
    page = (out / "report.html").read_text()
    statement = json.loads((out / "report.json").read_text())["privacy"]["statement"]
    assert PRIVATE_BANNER == "Contains private information — not differentially private"
    first_number = min(page.index(tag) for tag in ('<div class="meta">', "<table", "<figure"))
    assert page.index(PRIVATE_BANNER) < page.index(html.escape(statement)) < first_number
    assert page.index("<h1>") < page.index('id="privacy"')
    # the one-line reminder sits in the fidelity section, right above the histograms of real columns
    marginals = page.index('alt="Marginals of REAL vs synthetic rows')
    reminder = page.index('<p class="private-note">')
    assert page.count('<p class="private-note">') == 1
    assert page.index('id="fidelity"') < reminder < marginals
    assert page.index("<figure", reminder) == page.rindex("<figure", 0, marginals)  # the next figure
    assert "Private: histograms of the real training rows (REAL), not differentially private." in page


def test_cli_on_a_checkpoint_samples_it_and_reports_its_ledger(run, tmp_path):
    result, _ = run
    dest = tmp_path / "audit"
    code = main(
        [
            result["checkpoint"],
            "--real",
            "breast_cancer",
            "--holdout",
            "breast_cancer",
            "--out",
            str(dest),
            "--num-rows",
            "300",
            "--seed",
            "1",
            "--policy",
            _policy(tmp_path, {"checks": ["membership"]}),
        ]
    )
    report = json.loads((dest / "report.json").read_text())
    assert code == 0 and report["passed"] and report["verdicts"] == []  # defaults only: report, no thresholds
    assert list(report["privacy"]["from_real_rows"]) == [
        "inputs",
        "candidates",
        "checks.membership",
        "verdicts",
    ]
    assert (
        report["inputs"]["synthetic"]["rows"] == 300
        and report["inputs"]["synthetic"]["kind"] == "checkpoint sample"
    )
    ckpt = torch.load(result["checkpoint"], weights_only=True)["lightning_dp"]
    assert [r["name"] for r in report["ledger"]["releases"]] == [
        r["name"] for r in ckpt["ledger"]["releases"]
    ]
    assert report["config"]["model"]["name"] == "dp_merf" and report["seed"] == 1
    assert (
        report["inputs"]["checkpoint"]["sha256"]
        == hashlib.sha256(Path(result["checkpoint"]).read_bytes()).hexdigest()
    )
    assert report["inputs"]["real"]["rows"] == 458  # the run's split, from its config


@pytest.mark.parametrize("max_auc,code", [(1.0, 0), (0.01, 1)])
def test_exit_code_says_whether_the_policy_passed(run, tmp_path, max_auc, code):
    policy = {"checks": {"membership": {"attacks": ["dcr"], "max_auc": max_auc}}}
    got, dest = _cli(run, tmp_path, "--policy", _policy(tmp_path, policy))
    report = json.loads((dest / "report.json").read_text())
    assert got == code and report["passed"] == (code == 0)
    assert [v["criterion"] for v in report["verdicts"]] == ["max_auc"]


def _renamed(run, tmp_path):
    df = (
        pd.read_csv(run[0]["synthetic"])
        .rename(columns={"mean radius": "radius"})
        .drop(columns=["worst area"])
    )
    df.to_csv(tmp_path / "bad.csv", index=False)
    return str(tmp_path / "bad.csv")


def _unknown_model(run, tmp_path):
    ckpt = torch.load(run[0]["checkpoint"], weights_only=True)
    ckpt["lightning_dp"]["config"]["model"]["name"] = "gan9000"
    torch.save(ckpt, tmp_path / "foreign.ckpt")
    return str(tmp_path / "foreign.ckpt")


@pytest.mark.parametrize(
    "case,match",
    [
        ("columns", r"lacks \['mean radius', 'worst area'\] and has extra \['radius'\]"),
        ("empty_holdout", "HOLDOUT has 0 rows"),
        ("unknown_model", "unknown model 'gan9000'; valid models: dp_merf"),
        (
            "unknown_check",
            "unknown check\\(s\\) \\['privacy_vibes'\\]; valid checks: membership, presence_disclosure",
        ),
        ("shadow", "'shadow' needs a shadow-training function"),
        ("missing_file", "does not exist"),
    ],
)
def test_bad_input_fails_clearly_with_exit_2_and_writes_nothing(run, tmp_path, capsys, case, match):
    result, out = run
    extra, synthetic = ["--policy", _policy(tmp_path, FAST)], None
    if case == "columns":
        synthetic = _renamed(run, tmp_path)
    elif case == "empty_holdout":
        (tmp_path / "empty.csv").write_text(",".join(pd.read_csv(out / "holdout.csv").columns) + "\n")
        extra += ["--holdout", str(tmp_path / "empty.csv")]
    elif case == "unknown_model":
        synthetic = _unknown_model(run, tmp_path)
    elif case == "unknown_check":
        extra = ["--policy", _policy(tmp_path, {"checks": {"membership": {}, "privacy_vibes": {}}})]
    elif case == "shadow":
        extra = ["--policy", _policy(tmp_path, {"checks": {"membership": {"attacks": ["dcr", "shadow"]}}})]
    else:
        synthetic = str(tmp_path / "nope.csv")
    code, dest = _cli(run, tmp_path, *extra, synthetic=synthetic)
    assert code == 2
    assert re.search(match, capsys.readouterr().err)
    assert _no_report(dest)


def test_an_error_during_the_checks_leaves_no_partial_report(run, tmp_path, monkeypatch, capsys):
    import audits.checks as checks

    def broken(*args, **kwargs):
        raise RuntimeError("simulated crash in the fidelity check")

    spec = checks.REGISTRY["fidelity"]
    monkeypatch.setitem(checks.REGISTRY, "fidelity", checks.CheckSpec(broken, spec.title))
    code, dest = _cli(run, tmp_path, "--policy", _policy(tmp_path, {"checks": ["membership", "fidelity"]}))
    assert code == 3 and "simulated crash" in capsys.readouterr().err
    assert _no_report(dest) and (not dest.exists() or not any(dest.iterdir()))  # no temporary files either


def test_python_m_audits_in_a_new_process(run, tmp_path):
    policy = _policy(tmp_path, {"checks": {"membership": {"max_acu": 0.6}}})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "audits",
            run[0]["synthetic"],
            "--real",
            "x.csv",
            "--holdout",
            "y.csv",
            "--out",
            str(tmp_path / "audit"),
            "--policy",
            policy,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "unknown option(s) ['max_acu']; valid: attacks, n_bootstrap, max_auc" in proc.stderr


def test_policy_defaults_and_forms():
    default = load_policy()
    assert list(default["checks"]) == list(CHECKS) and default["max_candidates"] == 1000
    assert default["checks"]["membership"] == {
        "attacks": ["dcr", "dcr_ratio", "domias"],
        "n_bootstrap": 200,
        "max_auc": 0.6,
    }
    assert (
        default["checks"]["utility"]["metric"] == "roc_auc"
        and default["checks"]["utility"]["min_score"] == 0.6
    )
    listed = load_policy({"checks": ["fidelity", "membership"]})
    assert list(listed["checks"]) == ["membership", "fidelity"]  # the report's order, not the policy's
    assert listed["checks"]["fidelity"]["max_mean_tv"] is None
    with pytest.raises(PolicyError, match="max_auc must be a number"):
        load_policy({"checks": {"membership": {"max_auc": "low"}}})
    with pytest.raises(PolicyError, match="unknown top-level key"):
        load_policy({"checks": ["membership"], "sed": 1})
    with pytest.raises(PolicyError, match="alpha must be in"):
        load_policy({"checks": {"lmdp_mmd": {"alpha": 1.5}}})


def test_files_without_a_schema_infer_types_and_skip_utility_without_a_label(run, tmp_path):
    policy = _policy(tmp_path, {"checks": {"lmdp_mmd": {"n_permutations": 50}, "utility": {"min_roc": 0.5}}})
    code, dest = _cli(run, tmp_path, "--policy", policy)
    report = json.loads((dest / "report.json").read_text())
    assert code == (0 if report["passed"] else 1) and report["ledger"] is None and report["config"] is None
    assert report["columns"]["categorical"] == ["diagnosis"] and len(report["columns"]["numeric"]) == 30
    assert (
        report["checks"]["utility"]["status"] == "skipped"
        and "no label" in report["checks"]["utility"]["reason"]
    )
    assert "checks.utility" not in report["privacy"]["from_real_rows"]  # skipped: nothing of it in the report
    assert "classifiers trained on" not in report["privacy"]["statement"]
    assert report["checks"]["lmdp_mmd"]["columns"] == report["columns"]["numeric"]
    assert [v["check"] for v in report["verdicts"]] == ["lmdp_mmd"]
    code, dest = _cli(run, tmp_path / "labelled", "--policy", policy, "--label", "diagnosis")
    report = json.loads((dest / "report.json").read_text())
    assert (
        report["checks"]["utility"]["status"] == "ran" and report["checks"]["utility"]["metric"] == "roc_auc"
    )
    assert [v["check"] for v in report["verdicts"]] == ["lmdp_mmd", "utility"]
