"""train(cfg) end to end on the bundled data set: artefacts, sampling in a new process, resume, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from pytorch_lightning import Callback

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.data.schema import DataError
from lightning_dp.data.sources import bundled_schema
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = make_cfg(out, "privacy.noise_seed=0")
    return cfg, train(cfg)


def test_run_writes_every_artefact_and_spends_exactly_the_target(run):
    cfg, result = run
    out = Path(result["output_dir"])
    for name in ("config.yaml", "ledger.json", "versions.json", "checkpoints/last.ckpt", "synthetic.csv"):
        assert (out / name).is_file(), name
    assert OmegaConf.load(out / "config.yaml").privacy.epsilon == cfg.privacy.epsilon
    ledger = json.loads(Path(result["ledger"]).read_text())
    assert ledger["target_epsilon"] == 1.0 and ledger["delta"] == 1e-5
    assert ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=0.01)
    names = [r["name"] for r in ledger["releases"]]
    assert names == [
        "data/num_rows",
        "dp_merf/embedding/bandwidth_moments",
        "dp_merf/embedding",
        "dp_merf/embedding/class_counts",
    ]
    for r in ledger["releases"]:
        assert {"mechanism", "sensitivity", "noise_multiplier", "count", "epsilon_alone"} <= set(r)
    ckpt = torch.load(result["checkpoint"], weights_only=True)
    assert ckpt["lightning_dp"]["ledger"]["releases"][2]["name"] == "dp_merf/embedding"
    assert ckpt["lightning_dp"]["data"]["num_rows"]["source"] == "dp"


def test_synthetic_csv_has_the_users_columns(run):
    _, result = run
    df = pd.read_csv(result["synthetic"])
    schema = bundled_schema("breast_cancer")
    released = torch.load(result["checkpoint"], weights_only=True)["lightning_dp"]["data"]["num_rows"]["value"]
    assert list(df.columns) == schema.names and len(df) == round(released)  # the DP count, never the exact n
    assert set(df["diagnosis"]) <= {"malignant", "benign"}
    for c in schema.features:
        lo, hi = c.bounds
        assert df[c.name].between(lo, hi).all()


def test_sample_in_a_new_process(run, tmp_path):
    _, result = run
    out = tmp_path / "synth.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_dp.sample",
            result["checkpoint"],
            "--num-rows",
            "1234",
            "--out",
            str(out),
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(out)
    assert df.shape == (1234, 31)
    assert df.dtypes.drop("diagnosis").map(lambda t: np.issubdtype(t, np.floating)).all()
    assert set(df["diagnosis"]) <= {"malignant", "benign"}


def test_resume_keeps_the_ledger_and_releases_nothing(run, tmp_path):
    cfg, result = run
    before = json.loads(Path(result["ledger"]).read_text())
    cfg2 = make_cfg(cfg.output_dir, "resume=last", "trainer.max_epochs=2")
    again = train(cfg2)
    after = json.loads(Path(again["ledger"]).read_text())
    assert after["epsilon"] == before["epsilon"]
    assert [(r["name"], r["count"]) for r in after["releases"]] == [
        (r["name"], r["count"]) for r in before["releases"]
    ]
    assert torch.load(again["checkpoint"], weights_only=True)["global_step"] == 10


class Crash(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 3:
            raise RuntimeError("simulated crash: node lost")


def test_interrupted_run_resumes_from_the_checkpoint_written_after_the_release(tmp_path, monkeypatch):
    import lightning_dp.train as train_mod

    real_trainer = train_mod.pl.Trainer

    def trainer_with_crash(*args, callbacks=(), **kwargs):
        return real_trainer(*args, callbacks=[*callbacks, Crash()], **kwargs)

    monkeypatch.setattr(train_mod.pl, "Trainer", trainer_with_crash)
    cfg = make_cfg(tmp_path, "trainer.max_epochs=2")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg)
    monkeypatch.undo()
    spent = json.loads((tmp_path / "ledger.json").read_text())
    assert spent["epsilon"] == pytest.approx(1.0, rel=0.01)
    with pytest.raises(FileExistsError, match="resume=last"):
        train(make_cfg(tmp_path))
    resumed = train(make_cfg(tmp_path, "resume=last", "trainer.max_epochs=2"))
    after = json.loads((tmp_path / "ledger.json").read_text())
    assert after["releases"] == spent["releases"]
    assert resumed["epsilon"] == spent["epsilon"]
    assert torch.load(resumed["checkpoint"], weights_only=True)["global_step"] == 10


@pytest.mark.parametrize(
    "override,error,match",
    [
        ("privacy.epsilon=0", ValueError, "privacy.epsilon must be"),
        ("privacy.epsilon=-1", ValueError, "privacy.epsilon must be"),
        ("privacy.delta=1", ValueError, "privacy.delta must be"),
        ("privacy.delta=0.01", ValueError, "not below 1/n"),
        ("model.name=gan9000", ValueError, "Unknown model 'gan9000'; valid: dp_merf"),
        ("data.name=nope", ValueError, "Unknown data set 'nope'"),
        ("resume=/nonexistent.ckpt", CheckpointError, "does not exist"),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, override, error, match):
    with pytest.raises(error, match=match):
        train(make_cfg(tmp_path, override))
    assert not (tmp_path / "synthetic.csv").exists() and not (tmp_path / "checkpoints").exists()


def test_corrupt_checkpoint(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\x80\x04 not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        train(make_cfg(tmp_path / "run", f"resume={bad}"))


def test_csv_with_missing_values_reproduces_their_rate(tmp_path):
    import yaml

    from tests.unit.test_data import toy_frame, toy_schema

    df = toy_frame(n=3000, seed=2)
    df.to_csv(tmp_path / "rows.csv", index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(toy_schema().to_dict()))
    cfg = make_cfg(
        tmp_path / "run",
        "data=csv",
        f"data.path={tmp_path / 'rows.csv'}",
        f"data.schema={tmp_path / 'schema.yaml'}",
        "trainer.max_epochs=4",
        "model.module.steps_per_epoch=50",
        "privacy.epsilon=10",
        "num_samples=4000",
    )
    result = train(cfg)
    synth = pd.read_csv(result["synthetic"])
    assert list(synth.columns) == ["age", "income", "city", "label"]
    assert synth["income"].isna().mean() == pytest.approx(0.3, abs=0.08)
    assert set(synth["city"].dropna()) <= {"a", "b", "c"}


def test_csv_with_a_bad_cell_names_it(tmp_path):
    import yaml

    from tests.unit.test_data import toy_frame, toy_schema

    df = toy_frame(n=300)
    df.loc[17, "age"] = "n/a"
    df.to_csv(tmp_path / "rows.csv", index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(toy_schema().to_dict()))
    with pytest.raises(DataError, match="on lines 19"):  # row index 17 is line 19 of the file (header = line 1)
        train(
            make_cfg(
                tmp_path / "run",
                "data=csv",
                f"data.path={tmp_path / 'rows.csv'}",
                f"data.schema={tmp_path / 'schema.yaml'}",
            )
        )
    assert not (tmp_path / "run" / "ledger.json").exists()


def test_unlabelled_csv_trains_an_unconditional_model(tmp_path):
    import yaml

    from tests.unit.test_data import toy_frame, toy_schema

    df = toy_frame(n=500).drop(columns=["label"])
    df.to_csv(tmp_path / "rows.csv", index=False)
    schema = toy_schema().to_dict()
    schema["label"] = None
    schema["columns"] = [c for c in schema["columns"] if c["name"] != "label"]
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    result = train(
        make_cfg(
            tmp_path / "run",
            "data=csv",
            f"data.path={tmp_path / 'rows.csv'}",
            f"data.schema={tmp_path / 'schema.yaml'}",
        )
    )
    synth = pd.read_csv(result["synthetic"])
    assert list(synth.columns) == ["age", "income", "city"]
    ledger = json.loads(Path(result["ledger"]).read_text())
    assert ledger["epsilon"] <= 1.0


def test_sampling_with_a_seed_is_reproducible(run, tmp_path):
    from lightning_dp.sample import sample_checkpoint

    _, result = run
    a = pd.read_csv(sample_checkpoint(result["checkpoint"], 300, tmp_path / "a.csv", seed=7))
    b = pd.read_csv(sample_checkpoint(result["checkpoint"], 300, tmp_path / "b.csv", seed=7))
    c = pd.read_csv(sample_checkpoint(result["checkpoint"], 300, tmp_path / "c.csv", seed=8))
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
