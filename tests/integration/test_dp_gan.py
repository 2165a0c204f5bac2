"""DP-GAN / DP-CGAN through train(cfg): accounting per step, the budget stop, resume, and DDP on CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

GAN = ["model.module.batch_size=64", "data.batch_size=64"]


def ledger_of(path: Path) -> dict:
    return json.loads((path / "ledger.json").read_text())


def steps(ledger: dict) -> int:
    return sum(r["count"] for r in ledger["releases"] if r["name"].startswith("dp_sgd/"))


def test_dp_cgan_accounts_every_step_and_spends_the_target(tmp_path):
    result = train(make_cfg(tmp_path, "model=dp_cgan", *GAN, "trainer.max_epochs=2"))
    ledger = ledger_of(tmp_path)
    names = [r["name"] for r in ledger["releases"]]
    assert names == ["data/num_rows", "label_proportions/class_counts", "dp_sgd/discriminator"]
    ckpt = torch.load(result["checkpoint"], weights_only=True)
    n_released = ckpt["lightning_dp"]["data"]["num_rows"]["value"]  # q = L/ñ: steps per epoch from the DP count
    assert steps(ledger) == ckpt["global_step"] // 2 == 2 * round(n_released / 64)
    sgd = next(r for r in ledger["releases"] if r["name"] == "dp_sgd/discriminator")
    assert sgd["sample_rate"] == pytest.approx(64 / n_released)
    assert ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=0.02)
    synth = pd.read_csv(result["synthetic"])
    assert set(synth["diagnosis"]) <= {"malignant", "benign"} and len(synth) == round(n_released)


def test_training_stops_at_the_budget(tmp_path):
    train(
        make_cfg(
            tmp_path,
            "model=dp_cgan",
            *GAN,
            "trainer.max_epochs=100",
            "model.mechanisms.1.noise_multiplier=2.5",
        )
    )
    ledger = ledger_of(tmp_path)
    assert ledger["epsilon"] <= 1.0
    assert 0 < steps(ledger) < 100 * 7  # stopped by the ledger, not by max_epochs
    # the budget is spent: a resume takes no step, releases nothing and finishes (samples again)
    result = train(
        make_cfg(
            tmp_path,
            "model=dp_cgan",
            *GAN,
            "trainer.max_epochs=200",
            "resume=last",
            "model.mechanisms.1.noise_multiplier=2.5",
        )
    )
    assert result["epsilon"] == ledger["epsilon"]
    assert ledger_of(tmp_path) == ledger


def test_a_noise_level_that_fits_no_step_is_refused_before_training(tmp_path):
    from lightning_dp.privacy.ledger import BudgetExceededError

    with pytest.raises(BudgetExceededError, match="Not one DP-SGD step fits"):
        train(make_cfg(tmp_path, "model=dp_cgan", *GAN, "model.mechanisms.1.noise_multiplier=0.5"))


def test_resume_continues_the_spend(tmp_path):
    eps = "privacy.epsilon=10"
    train(
        make_cfg(
            tmp_path,
            "model=dp_gan",
            *GAN,
            "trainer.max_epochs=4",
            "model.mechanisms.0.noise_multiplier=3.0",
            eps,
        )
    )
    first = ledger_of(tmp_path)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    train(
        make_cfg(
            tmp_path,
            "model=dp_gan",
            *GAN,
            "trainer.max_epochs=8",
            "model.mechanisms.0.noise_multiplier=3.0",
            "resume=last",
            eps,
        )
    )
    second = ledger_of(tmp_path)
    assert steps(second) == 2 * steps(first)
    assert second["epsilon"] > first["epsilon"]
    sgd = [next(r for r in ledger["releases"] if r["name"] == "dp_sgd/discriminator") for ledger in (first, second)]
    assert sgd[0]["noise_multiplier"] == sgd[1]["noise_multiplier"] == 3.0
    assert sgd[0]["sample_rate"] == sgd[1]["sample_rate"]  # the count is not released again on resume
    assert ckpt["global_step"] == 2 * steps(first)


def test_unconditional_dp_gan_generates_the_label_too(tmp_path):
    result = train(make_cfg(tmp_path, "model=dp_gan", *GAN, "trainer.max_epochs=1"))
    synth = pd.read_csv(result["synthetic"])
    assert set(synth["diagnosis"]) <= {"malignant", "benign"}
    assert [r["name"] for r in ledger_of(tmp_path)["releases"]] == ["data/num_rows", "dp_sgd/discriminator"]


@pytest.mark.ddp
def test_two_process_ddp_on_cpu_matches_one_process(tmp_path):
    common = [
        "model=dp_cgan",
        *GAN,
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "model.module.batch_size=32",
        "privacy.noise_seed=0",  # the same DP row count, hence the same q and steps, in both runs
    ]
    runs = {}
    for name, extra in {
        "one": [],
        "ddp": ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
    }.items():
        out = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "train.py", *common, *extra, f"output_dir={out}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = ledger_of(out)
    assert runs["ddp"]["epsilon"] == runs["one"]["epsilon"]
    assert steps(runs["ddp"]) == steps(runs["one"])
    replicas = json.loads((tmp_path / "ddp" / "replicas.json").read_text())
    assert replicas["world_size"] == 2 and replicas["identical"]
