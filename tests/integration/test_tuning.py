"""Private hyperparameter selection (tune=...): one ledger release for the whole selection, never above the target."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger
from lightning_dp.train import train
from lightning_dp.tuning.selection import tnb_rdp
from lightning_dp.tuning.tune import SELECTION_NAME, TuneConfig, plan
from tests.conftest import make_cfg

SPACE = "dp_merf:\n  model.module.num_features: [100, 200]\n  model.module.bandwidth_scale: [2.0, 4.0]\n"
# γ = 0.6, η = 0: E[K] ≈ 1.3 candidates, to keep the test fast
FAST = ["tune=default", "tune.eta=0", "tune.gamma=0.6", "model.module.steps_per_epoch=2",
        "privacy.noise_seed=0", "privacy.allow_large_delta=true"]


def _space(tmp_path: Path) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return str(path)


def _cfg(tmp_path: Path, *extra: str):
    return make_cfg(tmp_path / "run", *FAST, f"tune.space={_space(tmp_path)}", *extra)


def test_tuning_run_records_one_selection_within_target(tmp_path, single_thread, caplog):
    caplog.set_level(logging.INFO)
    cfg = _cfg(tmp_path, "privacy.epsilon=8")
    result = train(cfg)
    out = Path(result["output_dir"])
    assert (out / "checkpoints" / "last.ckpt").is_file() and (out / "synthetic.csv").is_file()
    ledger = json.loads((out / "ledger.json").read_text())
    assert [r["name"] for r in ledger["releases"]] == [SELECTION_NAME]
    assert 0 < ledger["epsilon"] <= 8 * (1 + 1e-9)
    from lightning_dp.checkpoint import load_checkpoint

    record = load_checkpoint(out / "checkpoints" / "last.ckpt")["lightning_dp"]
    assert [r["name"] for r in record["ledger"]["releases"]] == [SELECTION_NAME]  # the run's ledger, not the candidate's
    summary = json.loads((out / "tuning.json").read_text())
    assert summary["score"] == "private" and summary["epsilon_selection"] == pytest.approx(ledger["epsilon"])
    assert len(pd.read_csv(out / "tuning.csv")) == 1  # only the chosen row is public
    private = (out / "tuning_private.csv").read_text().splitlines()
    assert private[0].startswith("# PRIVATE")
    assert not (out / "tuning").exists()  # unchosen candidates are not left behind
    assert "NOT covered" in (out / "train.log").read_text()


def test_a_model_with_dp_sgd_is_refused_before_anything_is_written(tmp_path):
    cfg = make_cfg(tmp_path / "run", "model=dp_gan", "tune=default")
    with pytest.raises(ValueError, match="all Gaussian"):
        train(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("epsilon", [0.01, 0.02])
def test_a_plan_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, epsilon):
    # γ = 0.02, η = 1: E[K] = 50. At ε = 0.01 the selection's fixed terms alone (log(1/γ), log E[K]) exceed it; at
    # ε = 0.02 they fit, but each candidate would get ε_c ≈ 0.005, below MIN_CANDIDATE_EPSILON
    cfg = make_cfg(tmp_path / "run", "tune=default", "tune.gamma=0.02", f"privacy.epsilon={epsilon}",
                   f"tune.space={_space(tmp_path)}")
    with pytest.raises(BudgetExceededError, match="cannot fit"):
        train(cfg)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_the_selection_is_on_the_ledger_before_the_first_candidate_trains(tmp_path, monkeypatch):
    import lightning_dp.train as train_module

    seen = []

    def first_candidate(cfg, **kwargs):  # stands in for a candidate's train(): stop the run there, as a kill would
        seen.append(json.loads((tmp_path / "run" / "ledger.json").read_text()))
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "train", first_candidate)
    with pytest.raises(KeyboardInterrupt):
        from lightning_dp.tuning.tune import tune

        tune(_cfg(tmp_path, "privacy.epsilon=8"))
    assert [r["name"] for r in seen[0]["releases"]] == [SELECTION_NAME]
    assert seen[0]["epsilon"] == pytest.approx(8.0, rel=1e-3)


def test_too_many_candidates_are_refused(tmp_path):
    from lightning_dp.errors import ConfigError

    cfg = make_cfg(tmp_path / "run", "tune=default", "tune.gamma=0.001", f"tune.space={_space(tmp_path)}")
    with pytest.raises(ConfigError, match="E\\[K\\]"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_plan_bound_matches_theorem_and_fills_the_target(tmp_path):
    cfg = _cfg(tmp_path, "privacy.epsilon=2")
    tc = TuneConfig.from_cfg(cfg)
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    p = plan(tc, ledger)
    orders = np.asarray(ledger.orders)
    from lightning_dp.privacy import mechanisms as mech

    eps = mech.rdp_to_epsilon(orders, tnb_rdp(orders, p.rho * orders, eta=0, gamma=0.6), 1e-5)
    assert eps == pytest.approx(2.0, rel=1e-4) and eps <= 2.0
    assert p.score_sigma == pytest.approx((2 * 0.1 * p.rho) ** -0.5)


def test_public_validation_score_costs_nothing(tmp_path, single_thread, caplog):
    from lightning_dp.data.sources import load_breast_cancer

    # a public validation file with the data's columns (rows of the bundled set stand in for public data)
    validation = tmp_path / "validation.csv"
    load_breast_cancer().train.head(60).to_csv(validation, index=False)
    ledger = PrivacyLedger(target_epsilon=8.0, delta=1e-5)
    p_private = plan(TuneConfig.from_cfg(_cfg(tmp_path, "privacy.epsilon=8")), ledger)
    cfg = _cfg(tmp_path, "privacy.epsilon=8", f"tune.validation={validation}")
    p_public = plan(TuneConfig.from_cfg(cfg), ledger)
    assert p_public.score_sigma is None and np.all(p_public.score_rdp() == 0)
    assert p_public.rho == pytest.approx(p_private.rho)
    assert p_public.train_epsilon > p_private.train_epsilon  # the candidates get the score's share too
    caplog.set_level(logging.INFO)
    result = train(cfg)
    out = Path(result["output_dir"])
    summary = json.loads((out / "tuning.json").read_text())
    assert summary["score"] == "public" and summary["score_sigma"] is None
    assert summary["score_budget_fraction"] == 0
    assert "charged nothing" in (out / "train.log").read_text()
    assert 0 <= summary["chosen"]["score"] <= 1


def test_the_console_and_train_log_are_silent_about_the_candidates(tmp_path, single_thread, capsys, monkeypatch):
    """K and the candidates are outside the theorem: their runs log only to the private file, and the chosen one's
    published seeds come from secret randomness, not from its index k (seed + k would lower-bound K)."""
    import importlib.util
    import sys

    from hydra.core.global_hydra import GlobalHydra

    from lightning_dp.checkpoint import load_checkpoint
    from tests.conftest import ROOT, TINY, TINY_ONE_SHOT

    spec = importlib.util.spec_from_file_location("train_entry_tuning", ROOT / "train.py")
    entry = sys.modules["train_entry_tuning"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    GlobalHydra.instance().clear()
    monkeypatch.setenv("LIGHTNING_DP_PROGRESS", "1")
    monkeypatch.setenv("LIGHTNING_DP_PROGRESS_SECONDS", "1")
    import time

    import lightning_dp.tuning.tune as tune_module

    score = tune_module._score

    def slow_score(*args, **kwargs):  # each candidate lasts > 1 s: at least one heartbeat falls in the selection
        time.sleep(1.5)
        return score(*args, **kwargs)

    monkeypatch.setattr(tune_module, "_score", slow_score)
    out = tmp_path / "run"
    # γ = 0.3, η = 1: E[K] ≈ 2.3 (the noise seed fixes K for the test)
    code = entry.cli([f"output_dir={out}", *TINY, *TINY_ONE_SHOT, "model.module.steps_per_epoch=2", "tune=default",
                      "tune.eta=1", "tune.gamma=0.3", "privacy.noise_seed=3", "privacy.allow_large_delta=true",
                      "privacy.epsilon=8", f"tune.space={_space(tmp_path)}"])
    captured = capsys.readouterr()
    console = captured.out + captured.err
    assert code == 0, console
    private_csv = pd.read_csv(out / "tuning_private.csv", comment="#")
    private_log = (out / "tuning_private.log").read_text()
    assert private_log.startswith("# PRIVATE") and "Data 'breast_cancer'" in private_log
    for text in (console, (out / "train.log").read_text()):
        assert "candidate_" not in text and "Data 'breast_cancer'" not in text and "Seed set to" not in text
        assert "model.module.num_features" not in text or "Tuning chose" in text  # only the chosen point
    # the selection's length grows with K: the console shows its start and end only, the heartbeats (one a second
    # here) are in the private log
    progress = [line.split("progress: ")[1] for line in console.splitlines() if "progress: " in line]
    start = next(i for i, line in enumerate(progress) if line.startswith("tuning: selection started"))
    assert progress[start + 1].startswith("tuning: selection done"), progress  # no line in between
    assert "elapsed" not in progress[start + 1]
    # the operator's view: the heartbeats (one a second; each candidate lasts > 1 s here, so at least one) are in the
    # private log; their routing is pinned by tests/integration/test_progress.py
    assert "progress: tuning: selection started" in private_log
    record = load_checkpoint(out / "checkpoints" / "last.ckpt")["lightning_dp"]
    chosen = private_csv[private_csv["chosen"]].iloc[0]
    assert record["config"]["seed"] == int(chosen["seed"])
    assert all(record["config"]["seed"] != 0 + k for k in range(len(private_csv) + 1))
