"""model=support_points data=diabetes through the real train(): artefacts, ledger, reload, and no leak of Y*."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lightning_dp.callbacks.private_support_points import PrivateSupportPoints
from lightning_dp.checkpoint import AtomicCheckpointIO, load_run
from lightning_dp.data.sources import bundled_schema
from lightning_dp.errors import ConfigError
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

TINY = ("model=support_points", "data=diabetes", "privacy.noise_seed=0", "model.module.num_points=5",
        "model.module.num_steps=20", "callbacks.checkpoint.every_n_steps=1", "model.mechanisms.0.num_chains=3",
        "model.mechanisms.0.trace_every=50")
MIXING = ("model.mechanisms.0.burn_in=2000", "model.mechanisms.0.thin=500", "model.mechanisms.0.draws=20")


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)


@pytest.fixture(scope="module")
def run(tmp_path_factory, single_thread):
    """One tiny run, with every checkpoint it writes and the optimised (non-private) points Y* captured."""
    saved, optimised = [], []
    real_save, real_release = AtomicCheckpointIO.save_checkpoint, PrivateSupportPoints._release

    def save(self, checkpoint, path, storage_options=None):
        saved.append(checkpoint)
        return real_save(self, checkpoint, path, storage_options)

    def release(self, module):
        optimised.append(module.points.detach().clone())
        return real_release(self, module)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AtomicCheckpointIO, "save_checkpoint", save)
        mp.setattr(PrivateSupportPoints, "_release", release)
        cfg = make_cfg(tmp_path_factory.mktemp("sp"), *TINY, *MIXING)
        result = train(cfg)
    return cfg, result, saved, optimised[0]


def test_run_writes_its_artefacts_and_spends_the_target(run):
    _, result, _, _ = run
    out = Path(result["output_dir"])
    for name in ("config.yaml", "ledger.json", "checkpoints/last.ckpt", "synthetic.csv", "support_points_mcmc.json"):
        assert (out / name).is_file(), name
    ledger = json.loads((out / "ledger.json").read_text())
    assert [r["name"] for r in ledger["releases"]] == ["data/num_rows", "support_points/points",
                                                       "support_points/bandwidth"]
    assert [r["mechanism"] for r in ledger["releases"][1:]] == ["exponential", "laplace"]
    assert ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=1e-3)
    diag = json.loads((out / "support_points_mcmc.json").read_text())
    assert diag["mixed"] and diag["rhat"] <= 1.1 and diag["trace_length"] == 500 * 19 // 50 + 1
    assert all(0.15 < a < 0.5 for a in diag["acceptance"]) and len(diag["acceptance"]) == 3
    assert diag["between_variance"] >= 0 and diag["within_variance"] > 0


def test_checkpoint_reloads_and_samples(run, tmp_path):
    _, result, _, _ = run
    loaded = load_run(result["checkpoint"])
    x, y = loaded.model.sample(64, seed=1)
    assert x.shape == (64, 11) and bool(((x >= 0) & (x <= 1)).all())
    synthetic = pd.read_csv(result["synthetic"])
    released = loaded.record["data"]["num_rows"]["value"]
    assert list(synthetic.columns) == bundled_schema("diabetes").names and len(synthetic) == round(released)
    assert synthetic["target"].between(25, 346).all() and synthetic["age"].between(-0.2, 0.2).all()
    out = tmp_path / "x.csv"
    proc = subprocess.run([sys.executable, "-m", "lightning_dp.sample", result["checkpoint"], "--num-rows", "100",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert pd.read_csv(out).shape == (100, 11)


def test_no_checkpoint_holds_the_optimised_points_or_their_optimizer_state(run):
    _, result, saved, optimised = run
    assert len(saved) >= 3  # at the start, after steps, at the release, at the end
    for checkpoint in saved:
        for tensor in _tensors(checkpoint):
            if tensor.is_floating_point() and tensor.shape[-1:] == (11,):
                rows = tensor.reshape(-1, 11).float()
                rows = rows[~rows.isnan().any(1)]  # the placeholder before the release is NaN
                assert len(rows) == 0 or torch.cdist(optimised.float(), rows).min() > 1e-4
        assert all(state["state"] == {} for state in checkpoint.get("optimizer_states", []))
    final = torch.load(result["checkpoint"], weights_only=True)["state_dict"]
    assert int(final["release_state"]) == 1 and not torch.isnan(final["points"]).any()


def test_unmixed_chains_release_all_the_same_and_only_the_private_file_says_so(tmp_path, single_thread, capsys):
    """Whether the chains mixed is a function of the rows and on no ledger: it must not decide what leaves the run."""
    stuck = ("model.mechanisms.0.burn_in=0", "model.mechanisms.0.thin=50", "model.mechanisms.0.draws=5",
             "model.mechanisms.0.trace_every=10", "model.mechanisms.0.init_step=1e-5")
    result = train(make_cfg(tmp_path, *TINY, *stuck))
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert [r["name"] for r in ledger["releases"]] == ["data/num_rows", "support_points/points",
                                                       "support_points/bandwidth"]
    diagnostics = json.loads((tmp_path / "support_points_mcmc.json").read_text())
    assert not diagnostics["mixed"] and diagnostics["privacy"].startswith("PRIVATE")
    final = torch.load(result["checkpoint"], weights_only=True)["state_dict"]
    assert int(final["release_state"]) == 1 and not torch.isnan(final["points"]).any()
    text = (tmp_path / "train.log").read_text() + capsys.readouterr().err
    assert "R̂ =" not in text and "did not mix" not in text and "not mixed" not in text


def test_a_run_killed_during_the_chains_resumes_and_releases_against_reoptimised_points(tmp_path, single_thread):
    optimised = []
    real_release = PrivateSupportPoints._release

    def killed(self, module):
        optimised.append(module.points.detach().clone())
        raise RuntimeError("simulated kill during the chains")

    def release(self, module):
        optimised.append(module.points.detach().clone())
        return real_release(self, module)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PrivateSupportPoints, "_release", killed)
        with pytest.raises(RuntimeError, match="simulated kill"):
            train(make_cfg(tmp_path, *TINY, *MIXING))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert torch.isnan(saved["state_dict"]["points"]).all()
    assert [r["name"] for r in json.loads((tmp_path / "ledger.json").read_text())["releases"]] == ["data/num_rows"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PrivateSupportPoints, "_release", release)
        result = train(make_cfg(tmp_path, *TINY, *MIXING, "resume=last"))
    start = 0.1 + 0.8 * torch.rand(5, 11, generator=torch.Generator().manual_seed(0))  # the public initial points
    assert not torch.allclose(optimised[0], start, atol=1e-2)
    assert torch.allclose(optimised[1], optimised[0], atol=1e-4)  # the same 20 full-batch steps from the same start
    names = [r["name"] for r in json.loads(Path(result["ledger"]).read_text())["releases"]]
    assert names == ["data/num_rows", "support_points/points", "support_points/bandwidth"]


def test_bad_chain_settings_are_refused_before_any_release(tmp_path):
    cfg = make_cfg(tmp_path, *TINY, "model.mechanisms.0.draws=1", "model.mechanisms.0.thin=10")
    with pytest.raises(ConfigError, match="split-R̂ needs at least 4"):
        train(cfg)
    assert not (tmp_path / "ledger.json").exists() and not (tmp_path / ".prefit.json").exists()


def test_the_thesis_nominal_sensitivity_is_refused_under_dp_and_waives_the_claim_otherwise(tmp_path):
    """sensitivity=support_set rests on an unproved bound: a DP run refuses it before any release; with
    privacy=none the run trains and its ledger says it makes no DP claim."""
    nominal = "model.mechanisms.0.sensitivity=support_set"
    with pytest.raises(ConfigError, match="privacy=none"):
        train(make_cfg(tmp_path / "dp", *TINY, *MIXING, nominal))
    assert not (tmp_path / "dp" / "ledger.json").exists()
    train(make_cfg(tmp_path / "none", *TINY, *MIXING, nominal, "privacy=none"))
    ledger = json.loads((tmp_path / "none" / "ledger.json").read_text())
    assert ledger["dp_claim"] is False and ledger["no_dp_claim"][0]["name"] == "PrivateSupportPoints"
