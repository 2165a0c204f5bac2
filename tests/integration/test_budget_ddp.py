"""The budget registry under DDP (two CPU processes): rank 0 alone holds the run's session and records every release;
the registry's record of the run is its ledger, step for step (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lightning_dp.budget.registry import Registry
from lightning_dp.privacy.ledger import PrivacyLedger
from tests.budget_helpers import BACKENDS, registry_url
from tests.conftest import ROOT


@pytest.mark.ddp
@pytest.mark.slow  # two processes of a DP-SGD run, about a minute on two cores
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_two_process_ddp_run_is_one_run_in_the_registry(backend, tmp_path):
    with registry_url(backend, tmp_path / "registry") as url:
        out = tmp_path / "ddp"
        env = {**os.environ, "LIGHTNING_DP_REGISTRY": url}
        proc = subprocess.run(
            [sys.executable, "train.py", "model=dp_cgan", "model.module.batch_size=32", "data.batch_size=64",
             "trainer.max_epochs=1", "trainer.enable_progress_bar=false", "privacy.noise_seed=0",
             "privacy.dataset_name=breast", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
             f"output_dir={out}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reg = Registry(url)
        try:
            (ds,) = reg.datasets()
            (run,) = reg.runs(ds)  # one run: rank 1 opened no session of its own
            ledger = json.loads((out / "ledger.json").read_text())
            assert ds.name == "breast" and run.run_id == ledger["run_id"] and not run.active
            assert run.state["releases"] == PrivacyLedger.state_from_json(ledger)["releases"]
            steps = sum(r["count"] for r in run.state["releases"] if r["name"].startswith("dp_sgd/"))
            assert steps > 0 and run.charge == pytest.approx(ledger["epsilon"]) and run.delta_charge == ledger["delta"]
            assert [e["action"] for e in reg.events(ds)] == ["create_dataset", "start_run", "end_run"]
        finally:
            reg.close()


def _sgd_steps(state: dict) -> int:
    return sum(r["count"] for r in state["releases"] if r["name"].startswith("dp_sgd/"))


@pytest.mark.ddp
@pytest.mark.slow  # a two-process DP-SGD run stopped mid-way, about a minute
def test_a_refusal_on_rank_0_stops_every_rank_at_once(tmp_path):
    import time

    url = str(tmp_path / "budget.sqlite")
    out = tmp_path / "ddp"
    proc = subprocess.Popen(
        [sys.executable, "train.py", "model=dp_cgan", "model.module.batch_size=32", "data.batch_size=64",
         "trainer.max_epochs=30", "trainer.enable_progress_bar=false", "privacy.noise_seed=0",
         "privacy.dataset_name=breast", "privacy.dataset_budget=100", "trainer=ddp", "trainer.accelerator=cpu",
         "trainer.devices=2", f"output_dir={out}"],
        cwd=ROOT, env={**os.environ, "LIGHTNING_DP_REGISTRY": url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        reg = Registry(url)
        deadline = time.monotonic() + 300
        while not any(_sgd_steps(r.state) >= 3 for ds in reg.datasets() for r in reg.runs(ds)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        (ds,) = reg.datasets()
        (run,) = reg.runs(ds)
        reg.set_budget("breast", reg.run(run.run_id).epsilon_committed * 1.0001, reason="the owner lowers it")
        _, err = proc.communicate(timeout=120)  # every rank stops (rank 1 loses its peer): no collective timeout
        assert proc.returncode == 2, err[-3000:]
        assert "error:" in err and "Nothing was released" in err
        after = reg.run(run.run_id)
        assert not after.active and after.charge <= 100
        on_disk = PrivacyLedger.state_from_json(json.loads((out / "ledger.json").read_text()))
        assert _sgd_steps(on_disk) == _sgd_steps(after.state)  # nothing on disk past the registry's record
        reg.close()
    finally:
        if proc.poll() is None:
            proc.kill()
