"""model=perturbed_histogram data=diabetes through the real train(): the ledger, the checkpoint, reload and resume."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lightning_dp.checkpoint import load_run
from lightning_dp.data.sources import bundled_schema
from lightning_dp.models.perturbed_histogram import PerturbedHistogram, bins_per_dimension
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

TINY = ("model=perturbed_histogram", "data=diabetes", "privacy.noise_seed=0")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train(make_cfg(tmp_path_factory.mktemp("ph"), *TINY, "privacy.epsilon=100"))


def test_run_releases_one_laplace_histogram_on_the_runs_ledger(run):
    ledger = json.loads(Path(run["ledger"]).read_text())
    assert [r["name"] for r in ledger["releases"]] == ["data/num_rows", "perturbed_histogram/counts"]
    counts = ledger["releases"][1]
    assert counts["mechanism"] == "laplace" and counts["sensitivity"] == 1.0  # add/remove
    assert (
        ledger["dp_claim"] and ledger["epsilon"] <= 100 and ledger["epsilon"] == pytest.approx(100, rel=1e-3)
    )


def test_checkpoint_holds_the_grid_of_the_released_row_count_and_reloads(run, tmp_path):
    loaded = load_run(run["checkpoint"])
    released = loaded.record["data"]["num_rows"]["value"]
    k = bins_per_dimension(released, 100.0, 11)
    assert k == 4 and loaded.model.axes.tolist() == [k] * 11
    assert loaded.model.counts.shape == (k**11,) and bool((loaded.model.counts >= 0).all())
    x, _ = loaded.model.sample(64, seed=1)
    assert x.shape == (64, 11) and bool(((x >= 0) & (x <= 1)).all())
    synthetic = pd.read_csv(run["synthetic"])
    assert list(synthetic.columns) == bundled_schema("diabetes").names and len(synthetic) == round(released)
    assert synthetic["target"].between(25, 346).all() and synthetic["bmi"].between(-0.2, 0.2).all()
    out = tmp_path / "x.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_dp.sample",
            run["checkpoint"],
            "--num-rows",
            "100",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert pd.read_csv(out).shape == (100, 11)


def test_replace_one_doubles_the_sensitivity(tmp_path):
    result = train(make_cfg(tmp_path, *TINY, "privacy.adjacency=replace_one"))
    counts = json.loads(Path(result["ledger"]).read_text())["releases"][-1]
    assert counts["name"] == "perturbed_histogram/counts" and counts["sensitivity"] == 2.0


def test_a_run_killed_after_the_release_resumes_with_the_same_histogram(tmp_path):
    real_step = PerturbedHistogram.training_step

    def killed(self, batch, batch_idx):
        raise RuntimeError("simulated kill after the release")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PerturbedHistogram, "training_step", killed)
        with pytest.raises(RuntimeError, match="simulated kill"):
            train(make_cfg(tmp_path, *TINY))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert bool(saved["released"]) and saved["counts"].numel() == math.prod(saved["axes"].tolist())
    assert PerturbedHistogram.training_step is real_step
    result = train(make_cfg(tmp_path, *TINY, "resume=last"))
    names = [r["name"] for r in json.loads(Path(result["ledger"]).read_text())["releases"]]
    assert names == ["data/num_rows", "perturbed_histogram/counts"]
    assert torch.equal(load_run(result["checkpoint"]).model.counts, saved["counts"])
