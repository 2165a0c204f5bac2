"""A release is charged to the budget registry before any file that holds it is written (SQLite and PostgreSQL).

Faults are injected between the steps of a durable block (registry charge → checkpoint/``.prefit.json`` → ledger.json):
a refusal by the registry writes nothing; a kill or a failed write after the charge over-charges, never under-charges.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_dp.budget.registry import DatasetBudgetError, Registry
from lightning_dp.errors import UserError
from lightning_dp.privacy.ledger import PrivacyLedger, Release, ReleaseNotSavedError
from lightning_dp.resume import lost_uses
from lightning_dp.train import train
from tests.budget_helpers import BACKENDS, registry_url
from tests.conftest import make_cfg

ROWS = np.arange(50, dtype=np.uint64)


@pytest.fixture(params=BACKENDS)
def registry(request, tmp_path, monkeypatch) -> Registry:
    with registry_url(request.param, tmp_path / "registry") as url:
        monkeypatch.setenv("LIGHTNING_DP_REGISTRY", url)
        reg = Registry(url)
        yield reg
        reg.close()


def _release(name: str, sigma: float) -> Release:
    return Release(name=name, mechanism="gaussian", sensitivity=1.0, noise_multiplier=sigma)


def _opened(reg: Registry, tmp_path: Path, budget: float = 2.0) -> tuple[PrivacyLedger, list[str]]:
    """A ledger registered on a fresh data set; ``calls`` lists the durable steps in the order they ran."""
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), budget=budget)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    lease = reg.open_run(run_id="r", dataset=ds, ledger=ledger, output_dir=tmp_path / "r")
    calls: list[str] = []
    ledger.register = lambda led: (calls.append("register"), reg.record(lease, led))
    ledger.persist = lambda led: calls.append("persist")
    return ledger, calls


def test_the_registry_is_charged_before_the_checkpoint_and_a_refusal_writes_nothing(registry, tmp_path):
    ledger, calls = _opened(registry, tmp_path)
    ledger.commit = lambda: calls.append("commit")
    with ledger.durable():
        ledger.record(_release("embedding", 6.0))
    assert calls == ["register", "commit", "persist"]
    # the owner lowers the budget mid-run: the next block is refused by the registry before its checkpoint is written
    registry.set_budget(registry.datasets()[0].name, ledger.spent + 0.01, reason="test")
    calls.clear()
    with pytest.raises(DatasetBudgetError, match="Nothing was released"), ledger.durable():
        ledger.record(_release("second", 8.0))
    assert calls == ["register"]  # no commit: no checkpoint holds the refused value
    assert [r["name"] for r in registry.run("r").state["releases"]] == ["embedding"]
    assert [r.name for r in ledger.releases] == ["embedding"]


def test_a_failed_checkpoint_after_the_charge_over_charges(registry, tmp_path):
    ledger, calls = _opened(registry, tmp_path)

    def full_disk() -> None:
        calls.append("commit")
        raise OSError(28, "No space left on device")

    ledger.commit = full_disk
    with pytest.raises(ReleaseNotSavedError, match="registry keeps the charge"), ledger.durable():
        ledger.record(_release("embedding", 6.0))
    assert calls == ["register", "commit"]  # ledger.json was not written
    assert ledger.releases == []  # nothing left the process
    row = registry.run("r")
    assert [r["name"] for r in row.state["releases"]] == ["embedding"] and row.epsilon_spent > 0  # still charged


def test_lost_uses_are_charged_but_not_counted_as_saved():
    charged = {"releases": [{"name": "count", "count": 1}, {"name": "emb", "count": 1}, {"name": "sgd", "count": 7}]}
    saved = {"releases": [{"name": "count", "count": 1}, {"name": "sgd", "count": 5}]}
    assert lost_uses(charged, saved) == {"emb": 1, "sgd": 2}
    assert lost_uses(charged, None) == {"count": 1, "emb": 1, "sgd": 7}
    # drawn again after the resume: two uses charged, one lost, the second saved
    again = {"releases": [*charged["releases"], {"name": "emb", "count": 1}], "lost": {"emb": 1}}
    assert lost_uses(again, again) == {"emb": 1}
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    ledger.load_state_dict({**ledger.state_dict(), "releases": [_release("emb", 4.0).__dict__], "lost": {"emb": 1}})
    assert not ledger.has("emb") and ledger.spent > 0  # drawn again, and the lost draw stays in ε
    ledger.record(_release("emb", 3.0))
    assert ledger.has("emb") and ledger.state_dict()["lost"] == {"emb": 1}


def _killed_after_charging(out: Path, name: str) -> int:
    """A dp_merf run killed (SIGKILL-like ``os._exit``) right after the registry charged the release ``name``."""
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)
            record = Registry.record

            def record_then_die(self, lease, ledger) -> None:
                record(self, lease, ledger)
                if ledger.has(name):
                    os._exit(9)  # after the charge, before the checkpoint / .prefit.json / ledger.json

            Registry.record = record_then_die
            train(make_cfg(out))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_kill_between_charge_and_checkpoint_over_charges_and_the_folder_can_start_again(registry, tmp_path):
    out = tmp_path / "run"
    assert _killed_after_charging(out, "data/num_rows") == 9
    (ds,) = registry.datasets()
    (run,) = registry.runs(ds)
    assert run.epsilon_spent > 0 and run.charge >= run.epsilon_spent  # the count is charged...
    assert not (out / ".prefit.json").exists() and not (out / "ledger.json").exists()  # ...though no file holds it
    train(make_cfg(out))  # the folder holds no run: a new one starts there, and the dead run keeps its spend
    dead = registry.run(run.run_id)
    assert not dead.active and dead.charge == pytest.approx(run.epsilon_spent)
    new_id = json.loads((out / "ledger.json").read_text())["run_id"]
    assert sum(r.charge for r in registry.runs(ds)) == pytest.approx(registry.run(new_id).epsilon_spent
                                                                     + run.epsilon_spent)


def test_a_kill_after_the_embedding_is_charged_keeps_the_charge_on_resume(registry, tmp_path, capsys):
    out = tmp_path / "run"
    assert _killed_after_charging(out, "dp_merf/embedding") == 9
    (ds,) = registry.datasets()
    (run,) = registry.runs(ds)
    charged = run.epsilon_spent
    assert charged == pytest.approx(1.0, rel=1e-3)  # the embedding took the rest of ε = 1
    on_disk = PrivacyLedger.state_from_json(json.loads((out / "ledger.json").read_text()))
    assert not any("embedding" in r["name"] for r in on_disk["releases"])  # ledger.json never ahead of the registry
    # the resumed run learns from the registry that the embedding's value is lost: it would draw it again, but the
    # lost draw still holds the whole budget, so it is refused and nothing more is released
    with pytest.raises(UserError, match="Nothing was released|already spent"):
        train(make_cfg(out, "resume=last"))
    after = registry.run(run.run_id)
    assert not after.active and after.epsilon_spent == pytest.approx(charged) and after.charge >= charged
    assert after.state["releases"] == run.state["releases"]


def test_a_lost_release_is_drawn_again_on_resume_and_both_draws_stay_charged(registry, tmp_path):
    import numpy as np
    import pandas as pd
    import yaml

    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.uniform(size=2000).round(4), "c": rng.choice(["a", "b"], 2000)}).to_csv(
        tmp_path / "rows.csv", index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"columns": [  # c's categories are a DP release
        {"name": "x", "type": "continuous", "bounds": [0, 1]}, {"name": "c", "type": "categorical"}]}))
    data = ["data=csv", f"data.path={tmp_path / 'rows.csv'}", f"data.schema={tmp_path / 'schema.yaml'}"]
    out = tmp_path / "run"
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)
            record = Registry.record

            def record_then_die(self, lease, ledger) -> None:
                record(self, lease, ledger)
                if ledger.has("data/categories"):
                    os._exit(9)

            Registry.record = record_then_die
            train(make_cfg(out, *data))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    result = train(make_cfg(out, *data, "resume=last"))  # the categories' value is lost: drawn again, charged again
    ledger = json.loads((out / "ledger.json").read_text())
    run = registry.run(ledger["run_id"])
    uses = sum(r["count"] for r in run.state["releases"] if r["name"] == "data/categories")
    assert uses == 2 and run.state["lost"] == {"data/categories": 1} and ledger["lost"] == {"data/categories": 1}
    assert run.epsilon_spent == pytest.approx(result["epsilon"]) and result["epsilon"] <= 1 + 1e-9
    assert not run.active and run.charge == pytest.approx(ledger["epsilon"])
