"""PPEM through the real train(): α-LMDP-only runs say they make no DP claim, DP runs account the penalty,
refusals come before any release, and a checkpoint samples by Algorithm 2."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from lightning_dp.checkpoint import load_run
from lightning_dp.errors import ConfigError
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.train import train
from tests.conftest import make_cfg

SENSITIVE = "model.sensitive=[mean radius,mean texture]"
SMALL = ["model=ppem", SENSITIVE, "model.module.hidden=[32,32]", "model.module.latent_dim=16",
         "model.module.batch_size=32", "data.batch_size=64", "trainer.max_epochs=2"]


def ledger_of(path: Path) -> dict:
    return json.loads((path / "ledger.json").read_text())


def metric_keys(path: Path) -> set[str]:
    header = next(path.glob("logs/*/metrics.csv")).read_text().splitlines()[0]
    return set(header.split(","))


def test_without_dp_the_run_says_it_makes_no_dp_claim(tmp_path, single_thread, caplog):
    result = train(make_cfg(tmp_path, *SMALL))
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is False
    assert ledger["no_dp_claim"][0]["name"] == "ppem/energy+conditional_energy"
    assert [r["name"] for r in ledger["releases"]] == ["data/num_rows"]  # no DP-SGD: nothing else released
    assert "NO DP CLAIM" in caplog.text and "NO DP CLAIM" in (tmp_path / "train.log").read_text()
    assert {"ksd/statistic", "ksd/penalty", "ksd/p_value", "ksd/rejected_fraction"} <= metric_keys(tmp_path)
    assert "NO DP CLAIM" in PrivacyLedger.from_state_dict(PrivacyLedger.state_from_json(ledger)).summary()
    synth = pd.read_csv(result["synthetic"])
    assert set(synth["diagnosis"]) <= {"malignant", "benign"} and synth["mean radius"].notna().all()
    run = load_run(result["checkpoint"])  # Algorithm 2 from the checkpoint alone
    x, y = run.model.sample(50, seed=1)
    x2, _ = run.model.sample(50, seed=1)
    assert torch.equal(x, x2) and x.shape[0] == 50 and y.max() <= 1
    assert run.model.sensitive_columns == ["mean radius", "mean texture"]
    assert run.model.sensitive_score(x[:, run.model.sensitive_index]).shape == (50, 2)


def test_with_dp_sgd_every_release_is_on_the_ledger(tmp_path, single_thread):
    train(make_cfg(tmp_path, *SMALL, "privacy=dp_sgd", "model.mechanisms.0.max_grad_norm=0.5"))
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is True and ledger["no_dp_claim"] == []
    sgd = next(r for r in ledger["releases"] if r["name"] == "dp_sgd/energy+conditional_energy")
    assert sgd["sensitivity"] == pytest.approx(1.0 + 2 * 0.5)  # C + 2·C_P: the batch-coupled KSD penalty
    assert sgd["count"] > 0 and ledger["epsilon"] <= 1.0 + 1e-9
    assert not any(k.startswith("ksd/") for k in metric_keys(tmp_path))  # raw batch statistics stay private


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.sensitive=[diagnosis]"], "categorical"),
        (["model.sensitive=[no such column]"], "not a column"),
        (["model.sensitive=[]"], "needs the sensitive columns"),
        (["privacy=default"], "privacy=dp_sgd"),  # a DP run must cover the energies
        (["privacy=dp_sgd", "model.module.generator_condition=real"], "generator_condition=generated"),
        (["model.sensitive=[mean radius,mean texture,mean perimeter,mean area]"], "at most 3"),
        (["model.module.marginal_objective=mle"], "marginal_objective"),
    ],
)
def test_refusals_come_before_any_release(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(make_cfg(tmp_path, *SMALL, *overrides))
    assert not (tmp_path / "ledger.json").exists() and not (tmp_path / ".prefit.json").exists()


def test_the_paper_s_energy_and_real_conditioning_run_without_a_claim(tmp_path, single_thread):
    result = train(make_cfg(tmp_path, *SMALL, "model.module.generator_condition=real", "trainer.max_epochs=1",
                            "model.module.marginal_objective=ebgan", "model.module.fourier=0"))
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is False and "conditional_generator" in ledger["no_dp_claim"][0]["name"]
    model = load_run(result["checkpoint"]).model
    assert not model.sensitive_is_density and model.energy.fourier_matrix is None
    assert "train/log_partition" not in metric_keys(tmp_path)


def test_the_density_objective_logs_its_public_partition_function(tmp_path, single_thread):
    result = train(make_cfg(tmp_path, *SMALL, "trainer.max_epochs=1"))
    assert {"train/log_partition", "train/g_mmd"} <= metric_keys(tmp_path)
    model = load_run(result["checkpoint"]).model
    assert model.sensitive_is_density and model.energy.fourier_matrix.shape == (2, 64)
    assert model.sensitive_jitter == [0.0, 0.0]  # breast cancer's columns are not integers


def test_a_waiver_is_never_withdrawn():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    ledger.waive("m/net", "why")
    state = ledger.state_dict()
    fresh = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    fresh.load_state_dict({**state, "no_dp_claim": {}})
    fresh.load_state_dict(state)
    assert not fresh.dp_claim
    _, best = PrivacyLedger.most_advanced([("a", state), ("b", {**state, "no_dp_claim": {}})])
    assert best["no_dp_claim"] == {"m/net": "why"}
