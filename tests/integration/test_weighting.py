"""Importance weights on the real path: ``train.py ... weights=ESTIMATOR`` and ``python -m lightning_dp.sample --weights``.

The weights' budget is reserved before training (the generator calibrates around it), spent at the end and saved
with the run; from a checkpoint, a request is checked against the run's own ledger before any row is read.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dp.sample import main as sample_main
from lightning_dp.train import train
from tests.conftest import make_cfg

GAN = ["model=dp_gan", "model.module.batch_size=64", "data.batch_size=64", "trainer.max_epochs=2",
       "privacy.epsilon=6"]


def ledger_of(path: Path) -> dict:
    return json.loads((path / "ledger.json").read_text())


def test_train_with_private_weights_reserves_then_spends_within_the_target(tmp_path):
    result = train(make_cfg(tmp_path, *GAN, "weights=beta_noised", "weights.epsilon=3"))
    ledger = ledger_of(tmp_path)
    names = [r["name"] for r in ledger["releases"]]
    assert "weights/beta_noised" in names and ledger["reserved"] == []
    assert ledger["epsilon"] <= 6.0 + 1e-9 and ledger["epsilon"] == pytest.approx(6.0, rel=0.02)
    alone = next(r for r in ledger["releases"] if r["name"] == "weights/beta_noised")["epsilon_alone"]
    assert alone == pytest.approx(3.0, rel=1e-3)
    synth = pd.read_csv(result["synthetic"])
    assert "weight" in synth.columns and synth["weight"].mean() == pytest.approx(1.0, rel=1e-6)
    assert (synth["weight"] > 0).all()
    summary = json.loads((tmp_path / "weights.json").read_text())
    assert summary["estimator"] == "beta_noised" and 0 < summary["kish_ess"] <= len(synth)
    ckpt = torch.load(result["checkpoint"], weights_only=True)  # the checkpoint's ledger holds the release too
    assert any(r["name"] == "weights/beta_noised" for r in ckpt["lightning_dp"]["ledger"]["releases"])


def test_discriminator_weights_cost_nothing(tmp_path):
    result = train(make_cfg(tmp_path, *GAN, "weights=discriminator"))
    ledger = ledger_of(tmp_path)
    assert not any(r["name"].startswith("weights/") for r in ledger["releases"])
    synth = pd.read_csv(result["synthetic"])
    assert synth["weight"].mean() == pytest.approx(1.0, rel=1e-6)


def test_non_private_weights_are_refused_before_anything_is_released(tmp_path):
    with pytest.raises(ValueError, match="allow_non_private"):
        train(make_cfg(tmp_path, *GAN, "weights=logreg"))
    assert not any(tmp_path.iterdir())


def test_discriminator_weights_refused_for_a_model_without_one(tmp_path):
    with pytest.raises(ValueError, match="discriminator"):
        train(make_cfg(tmp_path, "model=dp_merf", "weights=discriminator"))
    assert not any(tmp_path.iterdir())


def test_sample_spends_from_the_checkpoints_ledger_and_refuses_beyond_it(tmp_path, capsys):
    run = tmp_path / "run"
    result = train(make_cfg(run, *GAN, "privacy.epsilon=4", "model.mechanisms.0.noise_multiplier=3.0"))
    before = ledger_of(run)
    assert before["epsilon"] < 3.5  # a fixed noise multiplier leaves budget over
    out = tmp_path / "w.csv"
    code = sample_main([result["checkpoint"], "--num-rows", "200", "--out", str(out), "--weights", "beta_noised",
                        "--weights-epsilon", "0.2"])
    assert code == 0, capsys.readouterr().err
    after = ledger_of(run)
    assert after["epsilon"] > before["epsilon"] and after["epsilon"] <= 4.0
    ckpt = torch.load(result["checkpoint"], weights_only=True)
    assert ckpt["lightning_dp"]["ledger"]["releases"] == [
        {k: v for k, v in r.items() if k not in ("epsilon_alone", "epsilon_cumulative")} for r in after["releases"]]
    frame = pd.read_csv(out)
    assert len(frame) == 200 and np.isclose(frame["weight"].mean(), 1.0)
    # a request beyond the target: refused, nothing read, written or spent
    code = sample_main([result["checkpoint"], "--num-rows", "200", "--out", str(tmp_path / "x.csv"), "--weights",
                        "beta_noised", "--weights-epsilon", "50"])
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not pytest's logging
    assert len(errors) == 1 and "Nothing was read" in errors[0]
    assert not (tmp_path / "x.csv").exists() and ledger_of(run)["epsilon"] == after["epsilon"]


def test_output_perturbation_refuses_too_many_rows_with_the_largest_number(tmp_path, capsys):
    run = tmp_path / "run"
    result = train(make_cfg(run, *GAN, "privacy.epsilon=4", "model.mechanisms.0.noise_multiplier=3.0"))
    code = sample_main([result["checkpoint"], "--num-rows", "100000", "--out", str(tmp_path / "x.csv"), "--weights",
                        "output_lapl", "--weights-epsilon", "0.5"])
    assert code == 2
    assert "output" in capsys.readouterr().err.lower()
    assert not (tmp_path / "x.csv").exists()


def test_non_private_weights_from_a_checkpoint_are_labelled_private_and_leave_the_run_dp(tmp_path, capsys):
    run = tmp_path / "run"
    result = train(make_cfg(run, *GAN, "privacy.epsilon=4", "model.mechanisms.0.noise_multiplier=3.0"))
    out = tmp_path / "ref.csv"
    refused = sample_main([result["checkpoint"], "--num-rows", "100", "--out", str(out), "--weights", "logreg"])
    assert refused == 2 and not out.exists()
    code = sample_main([result["checkpoint"], "--num-rows", "100", "--out", str(out), "--weights", "logreg",
                        "--allow-non-private-weights"])
    assert code == 0 and "PRIVATE" in capsys.readouterr().out
    assert "PRIVATE" in json.loads((tmp_path / "ref.csv.weights.json").read_text())
    assert ledger_of(run)["dp_claim"] is True
