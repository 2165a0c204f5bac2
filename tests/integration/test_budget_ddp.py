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
