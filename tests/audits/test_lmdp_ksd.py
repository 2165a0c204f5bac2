"""The α-LMDP KSD section of the audit ("Privacy-Preserving Energy-Based Generative Models for Marginal
Distribution Protection", Def. 2.2): the check on an energy model's score, its policy, its place in the report,
and the report of a run that makes no differential-privacy claim."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from audits import lmdp, lmdp_checks, policy
from audits.checks import REGISTRY, Candidates, CheckResult, Context
from audits.html import NO_DP_BANNER, PRIVATE_BANNER
from audits.inputs import AuditInputs, frame_source, sensitive_score_of
from audits.policy import PolicyError, load_policy
from audits.report import DP_ARTEFACTS, NO_DP_CLAIM, build_report, write_report
from lightning_dp.privacy.ledger import PrivacyLedger

pytestmark = pytest.mark.usefixtures("single_thread")

ALPHA = 0.05
SIGMA = 0.1  # the sensitive columns are N(0.5, SIGMA²) in model space: H0 holds for the model with that score
BOUNDS = {"x1": (-5.0, 15.0), "x2": (0.0, 100.0), "age": (0.0, 100.0)}
SENSITIVE = ["x1", "x2"]
DATA_SEED = (
    1  # a fixed draw; over seeds each test rejects the true score at its level α (3, 2, 3 of 60 draws)
)
REASONS = [{"name": "ppem/energy", "note": "trained without DP: α-LMDP protects the x′ marginal only"}]


class FakeEnergy(nn.Module):
    """E(x) = ‖x − μ‖² / (2σ²) over model space, whose score −∇E is that of N(μ, σ²I); computed with autograd."""

    sensitive_columns = SENSITIVE

    def __init__(self, mean: tuple[float, float]) -> None:
        super().__init__()
        self.mean = nn.Parameter(torch.tensor(mean))

    def sensitive_score(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)  # (n, 2)
        energy = ((x - self.mean) ** 2).sum() / (2 * SIGMA**2)
        (grad,) = torch.autograd.grad(energy, x)
        return -grad


def _user_space(u: np.ndarray, column: str) -> np.ndarray:
    lo, hi = BOUNDS[column]
    return lo + (hi - lo) * u


def _frame(
    rng: np.random.Generator, n: int, missing: int = 0, center: tuple[float, float] = (0.5, 0.5)
) -> pd.DataFrame:
    u = rng.normal(center, SIGMA, size=(n, 2))  # (n, 2) in model space
    frame = pd.DataFrame(
        {
            "x1": _user_space(u[:, 0], "x1"),
            "x2": _user_space(u[:, 1], "x2"),
            "age": rng.uniform(20, 70, size=n),
            "label": rng.choice(["a", "b"], size=n),
        }
    )
    frame.loc[: missing - 1, "x2"] = np.nan  # rows with a missing x′ are dropped
    return frame


def _inputs(
    mean: tuple[float, float] | None = (0.5, 0.5),
    *,
    checkpoint: bool = True,
    ledger: dict | None = None,
    bounds: dict | None = None,
) -> AuditInputs:
    rng = np.random.default_rng(DATA_SEED)
    real, holdout = _frame(rng, 400, missing=5), _frame(rng, 120)
    synthetic = _frame(rng, 300, center=mean or (0.5, 0.5))  # the model's x′ marginal
    sources = {
        "synthetic": frame_source("rows sampled from fake.ckpt", synthetic, kind="checkpoint sample"),
        "real": frame_source("REAL", real),
        "holdout": frame_source("HOLDOUT", holdout),
    }
    if checkpoint:
        sources["checkpoint"] = {"path": "fake.ckpt", "model": "ppem" if mean else "dp_merf"}
    sensitive = sensitive_score_of(FakeEnergy(mean), "ppem") if mean and checkpoint else None
    return AuditInputs(
        synthetic=synthetic,
        real=real,
        holdout=holdout,
        numeric=["x1", "x2", "age"],
        label="label",
        sources=sources,
        ledger=ledger,
        bounds=BOUNDS if bounds is None else bounds,
        sensitive=sensitive,
    )


def _run(name: str, inputs: AuditInputs, **options: object) -> CheckResult:
    opts = load_policy({"checks": {name: options}})["checks"][name]
    cands = Candidates.draw(inputs, max_candidates=1000, seed=0)
    return REGISTRY[name].run(inputs, cands, opts, Context(seed=0), lambda: None)


def _ledger(**claim: object) -> dict:
    return {**PrivacyLedger(target_epsilon=1.0, delta=1e-5).to_dict(), **claim}


# ----------------------------------------------------------------------------------------- the check
def test_the_true_score_is_not_rejected_so_alpha_lmdp_does_not_hold():
    with torch.no_grad():  # the score differentiates the energy: the check enables gradients itself
        res = _run("lmdp_ksd", _inputs((0.5, 0.5)))
    out = res.result
    assert res.skipped is None and out["columns"] == SENSITIVE and out["n_rows"] == 395  # 5 rows miss x2
    assert out["bounds"] == {"x1": [-5.0, 15.0], "x2": [0.0, 100.0]} and out["model"] == "ppem"
    assert list(out["tests"]) == ["ksd_u", "ksd_v", "ksd_linear"]
    for name, test in out["tests"].items():
        assert test["p_value"] > ALPHA and test["reject"] is False, (name, test["p_value"])
        assert test["n"] == 395  # max_samples = 1000 caps nothing here
        assert test["details"]["bandwidth"] > 0
    assert out["alpha_lmdp_holds"] is False
    assert [(v.criterion, v.status, v.limit) for v in res.verdicts] == [("alpha", "fail", ALPHA)] * 3
    linear = res.verdicts[2]
    assert linear.interval == (linear.value, linear.value) and linear.method.startswith("exact")
    assert res.verdicts[0].method == "Clopper–Pearson interval of the bootstrap p-value (500 draws)"
    json.dumps(out, allow_nan=False)


def test_a_shifted_score_is_rejected_so_alpha_lmdp_holds():
    res = _run("lmdp_ksd", _inputs((0.6, 0.5)), statistics=["u", "v", "linear", "linear_z"])
    tests = res.result["tests"]
    assert all(t["reject"] and t["p_value"] <= 0.001 for t in tests.values()), tests
    assert res.result["alpha_lmdp_holds"] is True
    assert [v.status for v in res.verdicts] == ["pass"] * 4
    # a bootstrap p-value of 0 of 500 draws: its Clopper–Pearson upper bound 1 − 0.025^(1/500) is below α
    assert tests["ksd_u"]["p_value"] == 0.0
    assert tests["ksd_u"]["p_value_interval"][1] == pytest.approx(1 - 0.025 ** (1 / 500))


def test_max_samples_caps_the_quadratic_tests_only():
    res = _run("lmdp_ksd", _inputs(), statistics=["u", "linear"], max_samples=100, n_bootstrap=200)
    assert res.result["tests"]["ksd_u"]["n"] == 100 and res.result["tests"]["ksd_linear"]["n"] == 395


def test_only_a_model_with_a_sensitive_score_has_one():
    assert sensitive_score_of(nn.Linear(2, 2)) is None
    model = FakeEnergy((0.5, 0.5)).train()
    sensitive = sensitive_score_of(model, "ppem")
    assert sensitive.columns == SENSITIVE and sensitive.model == "ppem" and not model.training
    x = torch.tensor([[0.5, 0.4], [0.7, 0.5]], dtype=torch.float64)
    with torch.no_grad():
        score = sensitive.score(x)  # the model's float32, back in the input's dtype, detached
    assert score.dtype == torch.float64 and not score.requires_grad
    torch.testing.assert_close(score, torch.tensor([[0.0, 10.0], [-20.0, 0.0]], dtype=torch.float64))


def test_the_data_are_mapped_to_model_space_with_the_public_bounds():
    frame = pd.DataFrame({"x1": [-10.0, 5.0, 15.0, np.nan], "x2": [50.0, 200.0, 0.0, 1.0]})
    x = lmdp_checks.model_space(frame, SENSITIVE, BOUNDS)
    np.testing.assert_allclose(x, [[0.0, 0.5], [0.5, 1.0], [1.0, 0.0]])  # clipped; the row with a NaN dropped


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        (lambda: _inputs(checkpoint=False), "the synthetic data came as a file"),
        (lambda: _inputs(None), "dp_merf is not an energy model"),
    ],
)
def test_without_an_energy_model_the_check_does_not_apply(inputs, reason):
    res = _run("lmdp_ksd", inputs())
    assert res.skipped.startswith("does not apply: ") and reason in res.skipped
    assert res.applies is False and res.verdicts == [] and res.result == {}
    report, _ = build_report(inputs(), load_policy({"checks": ["lmdp_ksd"]}), progress=False)
    check = report["checks"]["lmdp_ksd"]
    assert check["status"] == "skipped" and check["applies"] is False
    # no verdict at all: neither a pass nor an inconclusive threshold; with nothing else, nothing was decided
    assert report["verdicts"] == [] and report["status"] == "inconclusive"
    assert report["summary"] == [f"SKIP lmdp_ksd (property, not a leak test): {res.skipped}"]
    assert "checks.lmdp_ksd" not in report["privacy"]["from_real_rows"]


def test_a_sensitive_column_without_bounds_is_inconclusive():
    inputs = _inputs(bounds={"x1": BOUNDS["x1"]})
    report, _ = build_report(inputs, load_policy({"checks": ["lmdp_ksd"]}), progress=False)
    assert "['x2'] have no public bounds" in report["checks"]["lmdp_ksd"]["reason"]
    assert [(v["check"], v["status"]) for v in report["verdicts"]] == [("lmdp_ksd", "inconclusive")]


def test_the_mmd_test_defaults_to_the_models_sensitive_columns():
    res = _run("lmdp_mmd", _inputs())
    assert (
        res.result["columns"] == SENSITIVE and res.result["columns_from"] == "the model's sensitive columns"
    )
    res = _run("lmdp_mmd", _inputs(None))  # not an energy model: every numeric column, as before
    assert res.result["columns"] == ["x1", "x2", "age"]
    res = _run("lmdp_mmd", _inputs(), columns=["age"])
    assert res.result["columns"] == ["age"]


# ----------------------------------------------------------------------------------------- policy
def test_policy_defaults_and_names():
    default = load_policy()["checks"]
    assert default["lmdp_ksd"] == {
        "statistics": ["u", "v", "linear"],
        "alpha": 0.05,
        "n_bootstrap": 500,
        "max_samples": 1000,
    }
    assert list(default)[-2:] == ["lmdp_mmd", "lmdp_ksd"]  # beside the MMD test, a property like it
    assert policy.KSD_STATISTICS == lmdp.KSD_STATISTICS == tuple(lmdp_checks.KSD_TESTS)
    assert load_policy({"checks": {"lmdp_ksd": {"statistics": "linear"}}})["checks"]["lmdp_ksd"][
        "statistics"
    ] == ["linear"]
    # the linear tests need no bootstrap: few draws are fine with them alone
    load_policy({"checks": {"lmdp_ksd": {"statistics": ["linear"], "alpha": 0.001}}})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"alpha": 1.5}, r"lmdp_ksd\.alpha must be in \(0, 1\), got 1\.5"),
        ({"alpha": 0}, r"lmdp_ksd\.alpha must be in \(0, 1\)"),
        ({"statistics": ["u", "w"]}, r"statistics must be a non-empty list .*valid: u, v, linear, linear_z"),
        ({"statistics": []}, r"statistics must be a non-empty list"),
        ({"statistics": ["u", "u"]}, r"statistics must be a non-empty list of distinct KSD tests"),
        ({"n_bootstrap": 50}, r"lmdp_ksd\.n_bootstrap must be an integer >= 100"),
        (
            {"n_bootstrap": 150, "alpha": 0.01},
            r"lmdp_ksd\.n_bootstrap must be >= 368 for α = 0\.01 at confidence",
        ),
        ({"max_samples": 2}, r"lmdp_ksd\.max_samples must be an integer >= 4 or null"),
        (
            {"kernel": "imq"},
            r"unknown option\(s\) \['kernel'\]; valid: statistics, alpha, n_bootstrap, max_samples",
        ),
    ],
)
def test_policy_errors_say_what_to_change(options, match):
    with pytest.raises(PolicyError, match=match):
        load_policy({"checks": {"lmdp_ksd": options}})


# ----------------------------------------------------------------------------------------- report
def _write(tmp_path: Path, inputs: AuditInputs) -> tuple[dict, str]:
    pol = load_policy({"checks": {"lmdp_mmd": {"n_permutations": 100}, "lmdp_ksd": {"n_bootstrap": 200}}})
    report, figures = build_report(inputs, pol, progress=False)
    paths = write_report(report, figures, tmp_path / "audit")
    return json.loads(Path(paths["json"]).read_text()), html.unescape(Path(paths["html"]).read_text())


def test_the_report_holds_the_ksd_section_beside_the_mmd_test(tmp_path):
    report, page = _write(tmp_path, _inputs((0.6, 0.5), ledger=_ledger()))
    assert [(v["check"], v["status"]) for v in report["verdicts"]] == [("lmdp_mmd", "pass")] + [
        ("lmdp_ksd", "pass")
    ] * 3
    assert report["checks"]["lmdp_mmd"]["columns"] == SENSITIVE
    assert set(report["checks"]["lmdp_ksd"]["tests"]) == {"ksd_u", "ksd_v", "ksd_linear"}
    assert report["summary"][1].startswith(
        "PASS lmdp_ksd (property, not a leak test): α-LMDP: p-value of the KSD U-statistic Ŝ_u test (multinomial bootstrap) of real x′"
    )
    assert "KSD statistics, p-values" in report["privacy"]["from_real_rows"]["checks.lmdp_ksd"]
    section = page[page.index('id="lmdp_ksd"') : page.index('id="run"')]
    for words in ("linear-time Ŝ_{l,n}", "χ²₁", "PPEM, Lemma 3.1", "multinomial bootstrap", "α-LMDP holds"):
        assert words in section, words
    assert "PASS here means the test found that the model's marginal does not fit the real one" in section


def test_a_run_without_a_dp_claim_says_so_in_both_files(tmp_path):
    report, page = _write(tmp_path, _inputs(ledger=_ledger(dp_claim=False, no_dp_claim=REASONS)))
    privacy, guarantee = report["privacy"], report["guarantee"]
    assert privacy["run_dp_claim"] is False and privacy["no_dp_claim"] == REASONS
    assert privacy["dp_artefacts"] == []
    for text in (privacy["statement"], guarantee["statement"]):
        assert f"{NO_DP_CLAIM}. Its ledger says why: ppem/energy: trained without DP: α-LMDP" in text
        assert "its synthetic data and its checkpoint are NOT differentially private releases" in text
    assert "are covered by the run's (ε, δ)" not in privacy["statement"]
    assert guarantee["dp_claim"] is False and guarantee["epsilon"] is None and guarantee["delta"] is None
    # at the top of the page: right after the private banner, before the guarantee and any table
    banner = page.index(NO_DP_BANNER)
    assert (
        page.index(PRIVATE_BANNER) < banner < page.index("What this run guarantees.") < page.index("<table")
    )
    assert "trained without DP: α-LMDP protects the x′ marginal only" in page[banner:]
    assert "Covered by an (ε, δ): nothing, the run makes no differential-privacy claim." in page
    assert "Covered by the run's (ε, δ)" not in page and "changes the probability" not in page


@pytest.mark.parametrize("claim", [{}, {"dp_claim": True}])
def test_a_dp_run_keeps_its_dp_statement(tmp_path, claim):
    report, page = _write(tmp_path, _inputs(ledger=_ledger(**claim)))
    privacy = report["privacy"]
    assert privacy["run_dp_claim"] is True and privacy["no_dp_claim"] == []
    assert privacy["dp_artefacts"] == list(DP_ARTEFACTS)
    assert NO_DP_CLAIM not in privacy["statement"] and NO_DP_CLAIM not in page and NO_DP_BANNER not in page
    assert report["guarantee"]["dp_claim"] is True and report["guarantee"]["epsilon"] == 0.0
    assert "Covered by the run's (ε, δ): synthetic data, checkpoint, ledger.json." in page


def test_files_without_a_ledger_make_no_claim_either_way(tmp_path):
    report, page = _write(tmp_path, _inputs(checkpoint=False))
    assert report["privacy"]["run_dp_claim"] is None and report["guarantee"]["dp_claim"] is None
    assert NO_DP_BANNER not in page and report["checks"]["lmdp_ksd"]["status"] == "skipped"


def test_dequantisation_and_the_vacuity_caveat_follow_the_model():
    from dataclasses import replace

    from audits.html import _lmdp_ksd

    plain = _run("lmdp_ksd", _inputs(), statistics=["linear"]).result
    assert not plain["dequantisation"] and plain["energy_is_density"] is True and "caveat" not in plain
    inputs = _inputs()
    inputs.sensitive = replace(inputs.sensitive, jitter=[0.05, 0.0], density=False)  # an EBGAN energy, x1 integer
    out = _run("lmdp_ksd", inputs, statistics=["linear"]).result
    assert "x1 0.05" in out["dequantisation"] and "x2" not in out["dequantisation"]
    assert out["tests"]["ksd_linear"]["statistic"] != plain["tests"]["ksd_linear"]["statistic"]  # REAL's x′ jittered
    again = _run("lmdp_ksd", inputs, statistics=["linear"]).result
    assert again["tests"]["ksd_linear"]["statistic"] == out["tests"]["ksd_linear"]["statistic"]  # seeded
    assert out["energy_is_density"] is False and "with or without the α-LMDP penalty" in out["caveat"]
    page = _lmdp_ksd(out)
    assert "Caveat" in page and "the Gaussian noise the model was trained with" in page
    assert "Caveat" not in _lmdp_ksd(plain)
