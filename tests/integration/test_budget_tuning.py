"""A tuning run (tune=default) is one run in the budget registry, charged the selection's ε, not its candidates'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_dp.budget.registry import DatasetBudgetError, Registry
from lightning_dp.train import train
from lightning_dp.tuning.tune import SELECTION_NAME
from tests.conftest import make_cfg

SPACE = "dp_merf:\n  model.module.num_features: [100, 200]\n"
# η = 1, γ = 0.5: E[K] = 2 candidates (the fixed noise seed draws K = 2 here), each trained at ε_c < ε
FAST = ["tune=default", "tune.eta=1", "tune.gamma=0.5", "model.module.steps_per_epoch=2", "privacy.noise_seed=5",
        "privacy.allow_large_delta=true", "privacy.epsilon=8", "tune.keep_candidates=true"]


@pytest.fixture()
def registry(tmp_path, monkeypatch) -> Registry:
    path = tmp_path / "budget.sqlite"
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY", str(path))
    reg = Registry(str(path))
    yield reg
    reg.close()


def _cfg(tmp_path: Path, *extra: str):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return make_cfg(tmp_path / "run", *FAST, f"tune.space={space}", *extra)


def test_a_tuning_run_is_one_run_charged_the_selection(registry, tmp_path, single_thread):
    result = train(_cfg(tmp_path))
    (ds,) = registry.datasets()
    (run,) = registry.runs(ds)  # the candidates opened no registry session of their own
    ledger = json.loads((Path(result["output_dir"]) / "ledger.json").read_text())
    assert [r["name"] for r in run.state["releases"]] == [SELECTION_NAME] and run.run_id == ledger["run_id"]
    assert not run.active and run.charge == pytest.approx(ledger["epsilon"]) and run.charge <= 8 * (1 + 1e-9)
    candidates = sorted((Path(result["output_dir"]) / "tuning").glob("candidate_*/ledger.json"))
    spent = [json.loads(p.read_text())["epsilon"] for p in candidates]
    assert len(spent) >= 2 and all("run_id" not in json.loads(p.read_text()) for p in candidates)
    assert sum(spent) > run.charge  # what a registry session per candidate would have charged instead
    assert [e["action"] for e in registry.events(ds)] == ["create_dataset", "start_run", "end_run"]


def test_a_tuning_run_that_does_not_fit_the_data_sets_budget_releases_nothing(registry, tmp_path):
    with pytest.raises(DatasetBudgetError, match="Nothing was released"):
        train(_cfg(tmp_path, "privacy.dataset_budget=4"))
    assert not (tmp_path / "run" / "ledger.json").exists()
    (ds,) = registry.datasets()
    assert registry.runs(ds) == []
