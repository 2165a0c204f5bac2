"""The audit report: ``train ... audit=default`` (``audit_run``), ``python -m audits`` on a checkpoint and on files,
exit codes, bad input (clear error, nothing written), the policy format, and a self-contained HTML page. The
many ways input can be bad are in test_bad_input.py."""

import hashlib
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from audits import utility
from audits.__main__ import EXIT_CODES, main
from audits.checks import REGISTRY
from audits.html import CAPTIONS, PRIVATE_BANNER
from audits.policy import CHECKS, METRIC_NAMES, MODEL_NAMES, PRESET_NAMES, PolicyError, load_policy
from audits.report import FROM_REAL_ROWS, audit_run
from audits.verdicts import overall_status
from lightning_dp.data.datamodule import PrivateDataModule
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.privacy.mechanisms import noise_generator
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

SECTIONS = ("verdicts", "inputs", "ledger", *CHECKS, "run")
STATUSES = {"pass", "fail", "inconclusive"}
FAST = {"checks": {"membership": {"attacks": ["dcr"], "max_auc": 1.0}}}  # one quick check that passes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny DP-MERF run on breast cancer audited as ``train.py audit=default`` does (``audit_run`` after
    ``train``), and the run's rows as CSV files."""
    out = tmp_path_factory.mktemp("run")
    cfg = make_cfg(out, "privacy.noise_seed=0", "audit=default")
    result = train(cfg)
    result["audit"] = audit_run(
        cfg.audit,
        datamodule=result["datamodule"],
        result=result,
        ledger=result["privacy_ledger"],
        config=result["config"],
    )
    dm = PrivateDataModule(name="breast_cancer")
    dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=1e-5), generator=noise_generator(0))
    dm.train_frame.to_csv(out / "real.csv", index=False)
    dm.holdout.to_csv(out / "holdout.csv", index=False)
    return result, out


def _check_status(report: dict, name: str) -> str:
    statuses = {v["status"] for v in report["verdicts"] if v["check"] == name}
    return "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"


def _policy(tmp_path: Path, policy: dict) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return str(path)


def _cli_args(run, tmp_path: Path, *extra: str, synthetic: str | None = None) -> list[str]:
    result, out = run
    return [
        synthetic or result["synthetic"],
        "--real",
        str(out / "real.csv"),
        "--holdout",
        str(out / "holdout.csv"),
        "--out",
        str(tmp_path / "audit"),
        *extra,
    ]


def _cli(run, tmp_path: Path, *extra: str, synthetic: str | None = None) -> tuple[int, Path]:
    return main(_cli_args(run, tmp_path, *extra, synthetic=synthetic)), tmp_path / "audit"


def _no_report(dest: Path) -> bool:
    return not (dest / "report.json").exists() and not (dest / "report.html").exists()


def test_train_with_audit_writes_both_report_files(run):
    result, out = run
    audit = result["audit"]
    assert set(audit) == {"report", "json", "status", "reason", "summary"}
    assert audit["report"] == str(out / "report.html") and audit["json"] == str(out / "report.json")
    report = json.loads((out / "report.json").read_text())
    assert set(report["checks"]) == set(CHECKS) and all(
        c["status"] == "ran" for name, c in report["checks"].items() if name != "lmdp_ksd"
    )
    # DP-MERF is not an energy model: the KSD tests do not apply and set no verdict
    ksd = report["checks"]["lmdp_ksd"]
    assert ksd["status"] == "skipped" and ksd["applies"] is False and "not an energy model" in ksd["reason"]
    assert audit["status"] == report["status"] in STATUSES and audit["summary"] == report["summary"]
    assert (report["status"], report["status_reason"]) == overall_status(report["verdicts"])
    # 3 attacks, 2 disclosures, 3 copies, 1 vulnerable records, 1 singling out, 1 linkability, α-LMDP, utility,
    # 2 fidelity thresholds
    assert len(report["verdicts"]) == 15
    # the 11 leak thresholds decide; α-LMDP is a property and utility and fidelity are expectations (reported,
    # never deciding)
    assert [v["gates"] for v in report["verdicts"]] == [True] * 11 + [False] * 4
    assert report["checks"]["lmdp_mmd"]["role"] == "property"
    for v in report["verdicts"]:
        assert v["status"] in STATUSES and v["confidence"] == 0.95 and v["reason"].endswith(".")
        assert v["interval"] is None or v["interval"][0] <= v["interval"][1]
    # one line per check, starting with its status: "PASS membership: ...", "FAIL fidelity (expectation): ..."
    assert len(audit["summary"]) == len(CHECKS)
    for line, name in zip(audit["summary"], CHECKS):
        role = {"utility": " (expectation)", "fidelity": " (expectation)"}.get(name, "")
        role = " (property, not a leak test)" if name.startswith("lmdp") else role
        tag = "SKIP" if name == "lmdp_ksd" else _check_status(report, name).upper()
        assert line.startswith(f"{tag} {name}{role}: "), line
    ledger = json.loads((out / "ledger.json").read_text())
    assert (
        report["ledger"]["releases"] == ledger["releases"]
        and report["ledger"]["epsilon"] == ledger["epsilon"]
    )
    assert report["config"]["privacy"]["noise_seed"] == 0
    synthetic = report["inputs"]["synthetic"]
    assert synthetic["sha256"] == hashlib.sha256(Path(result["synthetic"]).read_bytes()).hexdigest()
    assert (
        report["inputs"]["real"]["rows"] == 458 and report["inputs"]["holdout"]["rows"] == 111
    )  # keyed-hash split
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
    assert re.findall(r'src="([^"]{0,22})', page) == ["data:image/png;base64,"] * 7  # + copies, vulnerable
    for section in SECTIONS:
        assert f'id="{section}"' in page and f'href="#{section}"' in page, section
    assert "dp_merf/embedding/class_counts" in page  # the ledger table


def test_html_says_what_the_numbers_mean(run):
    _, out = run
    page = html.unescape((out / "report.html").read_text())
    report = json.loads((out / "report.json").read_text())
    eps = report["ledger"]["epsilon"]
    # near the top, after the private banner: what (ε, δ) guarantees, and that the audit is evidence, not proof
    guarantee = page.index("What this run guarantees.")
    assert page.index(PRIVATE_BANNER) < guarantee < page.index('id="verdicts"')
    assert (
        "For any one person, whether their row was in the training data changes the probability of any output "
        f"of this run (the synthetic data, the checkpoint) by at most a factor e^ε = {np.exp(eps):.3g} "
        f"(ε = {eps:.4g}), except with probability δ = 1e-05." in page
    )
    assert "This audit is empirical evidence about one release, not a proof" in page
    # α-LMDP: passing means the test detected a difference
    assert "PASS here means the test detected a difference" in page
    # ε is the privacy budget only: the presence threshold is the distance threshold r
    presence = page[page.index('id="presence_disclosure"') : page.index('id="attribute_disclosure"')]
    assert "distance threshold r" in presence and "ε" not in presence
    captions = " ".join(CAPTIONS.values())
    assert "distance threshold r" in captions and "ε" not in captions
    # negative risk above baseline, and the ledger's composition
    assert (
        page.count(
            "A negative risk above baseline means the attack did worse with the synthetic data than with "
            "held-out real rows: no evidence of disclosure."
        )
        == 2
    )
    ledger = page[page.index('id="ledger"') :]
    assert "releases compose in Rényi DP (Mironov 2017), so the total ε" in ledger
    assert "is less than the sum of the per-release ε" in ledger
    # every verdict with its status, interval and reason; utility expectations apart
    assert "Utility expectations" in page and "do not change the privacy verdict" in page
    for v in report["verdicts"]:
        assert v["reason"] in page


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
        *(f"checks.{name}" for name in CHECKS if name != "lmdp_ksd"),  # skipped: not an energy model
        "verdicts",
    ]
    assert privacy["run_dp_claim"] is True and privacy["no_dp_claim"] == []
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
    # defaults only: numbers, no thresholds. Nothing was decided, so the policy is inconclusive (exit 4), not a
    # pass: a pass needs at least one threshold passed with confidence
    assert code == 4 and report["status"] == "inconclusive" and report["verdicts"] == []
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


@pytest.mark.parametrize("max_auc,code", [(1.0, 0), (0.01, 1), ("value", 4)])
def test_exit_code_says_whether_the_policy_passed(run, tmp_path, capsys, max_auc, code):
    policy = {"checks": {"membership": {"attacks": ["dcr"], "max_auc": 1.0}}}
    if max_auc == "value":  # the limit at the AUC itself lies inside its interval: inconclusive
        main([*_cli_args(run, tmp_path / "first"), "--policy", _policy(tmp_path, policy)])
        max_auc = json.loads((tmp_path / "first" / "audit" / "report.json").read_text())["verdicts"][0][
            "value"
        ]
        capsys.readouterr()
    policy["checks"]["membership"]["max_auc"] = max_auc
    got, dest = _cli(run, tmp_path, "--policy", _policy(tmp_path, policy))
    report = json.loads((dest / "report.json").read_text())
    status = {0: "pass", 1: "fail", 4: "inconclusive"}[code]
    assert got == code == EXIT_CODES[report["status"]] and report["status"] == status
    assert report["passed"] == (code == 0)  # format 2's field, kept
    assert [v["criterion"] for v in report["verdicts"]] == ["max_auc"]
    out = capsys.readouterr().out
    assert f"policy {status.upper()}: " in out and out.startswith(
        f"{status.upper()} membership: dcr attack ROC-AUC"
    )


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
    assert "unknown option(s) ['max_acu']; valid: attacks, n_bootstrap, max_auc, rule_out_auc" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_policy_defaults_and_forms():
    default = load_policy()
    # privacy checks decide the verdict; utility and fidelity are utility expectations (see the YAML's comments)
    assert list(default["checks"]) == [
        "membership",
        "presence_disclosure",
        "attribute_disclosure",
        "copies",
        "vulnerable_records",
        "singling_out",
        "linkability",
        "lmdp_mmd",
        "lmdp_ksd",
    ]
    assert list(default["expectations"]) == ["utility", "fidelity"]
    assert default["max_candidates"] == 1000 and default["confidence"] == 0.95
    assert default["checks"]["membership"] == {
        "attacks": ["dcr", "dcr_ratio", "domias"],
        "n_bootstrap": 200,
        "max_auc": 0.53,
        "rule_out_auc": 0.65,
    }
    assert (
        default["expectations"]["utility"]["metric"] == "roc_auc"
        and default["expectations"]["utility"]["min_score"] == 0.6
    )
    assert default["expectations"]["fidelity"]["max_mean_ks"] == 0.3
    listed = load_policy({"checks": ["fidelity", "membership"]})
    assert list(listed["checks"]) == ["membership", "fidelity"]  # the report's order, not the policy's
    assert listed["checks"]["fidelity"]["max_mean_tv"] is None and listed["expectations"] == {}
    with pytest.raises(PolicyError, match=r"\['utility'\] listed both under 'checks' and 'expectations'"):
        load_policy({"checks": ["utility"], "expectations": ["utility"]})
    with pytest.raises(
        PolicyError, match="unknown; valid metrics: accuracy, f1_macro, f1_weighted, mse, prc"
    ):
        load_policy({"checks": {"utility": {"metric": "auroc", "min_score": 0.6}}})
    with pytest.raises(PolicyError, match="n_permutations must be >= 72 for α = 0.05 at confidence 0.95"):
        load_policy({"checks": {"lmdp_mmd": {"n_permutations": 50}}})
    with pytest.raises(PolicyError, match="max_candidates must be >= 25"):
        load_policy({"checks": ["membership"], "max_candidates": 10})
    with pytest.raises(
        PolicyError, match="max_auc must be a finite number"
    ):  # finite: .inf or .nan decide nothing
        load_policy({"checks": {"membership": {"max_auc": "low"}}})
    with pytest.raises(PolicyError, match="unknown top-level key"):
        load_policy({"checks": ["membership"], "sed": 1})
    with pytest.raises(PolicyError, match="alpha must be in"):
        load_policy({"checks": {"lmdp_mmd": {"alpha": 1.5}}})


def test_policy_names_match_the_utility_registry():
    assert set(METRIC_NAMES) == {m for names in utility.METRICS.values() for m in names}
    assert set(MODEL_NAMES) == set(utility.CLASSIFIERS) | set(utility.REGRESSORS)
    assert set(PRESET_NAMES) == set(utility.PRESETS) | set(utility.REGRESSION_PRESETS)


def test_files_without_a_schema_infer_types_and_skip_utility_without_a_label(run, tmp_path):
    policy = _policy(tmp_path, {"checks": {"lmdp_mmd": {"n_permutations": 100}, "utility": {"min_roc": 0.5}}})
    code, dest = _cli(run, tmp_path, "--policy", policy)
    report = json.loads((dest / "report.json").read_text())
    # utility is skipped (no label) but sets a threshold: that threshold is inconclusive, and so is the policy
    assert code == 4 and report["status"] == "inconclusive"
    assert report["ledger"] is None and report["config"] is None
    assert report["columns"]["categorical"] == ["diagnosis"] and len(report["columns"]["numeric"]) == 30
    assert (
        report["checks"]["utility"]["status"] == "skipped"
        and "no label" in report["checks"]["utility"]["reason"]
    )
    assert "checks.utility" not in report["privacy"]["from_real_rows"]  # skipped: nothing of it in the report
    assert "classifiers trained on" not in report["privacy"]["statement"]
    assert report["checks"]["lmdp_mmd"]["columns"] == report["columns"]["numeric"]
    assert [(v["check"], v["status"]) for v in report["verdicts"]][1:] == [("utility", "inconclusive")]
    assert (
        report["verdicts"][1]["reason"]
        == "The check did not run: no label: name it in utility.label, pass --label, or use a checkpoint."
    )
    code, dest = _cli(run, tmp_path / "labelled", "--policy", policy, "--label", "diagnosis")
    report = json.loads((dest / "report.json").read_text())
    assert code == EXIT_CODES[report["status"]]
    assert (
        report["checks"]["utility"]["status"] == "ran" and report["checks"]["utility"]["metric"] == "roc_auc"
    )
    assert [v["check"] for v in report["verdicts"]] == ["lmdp_mmd", "utility"]
