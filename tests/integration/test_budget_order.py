"""A release is charged to the budget registry before any file that holds it is written (SQLite and PostgreSQL).

Faults are injected between the steps of a durable block (values serialised → registry charge with those bytes →
checkpoint/``.prefit.json`` written → ledger.json): a refusal by the registry writes nothing; after a kill or a failed
write after the charge, the resumed run writes the values the registry kept with the charge (the same draw, charged
once) instead of drawing them again.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from sqlalchemy import update

from lightning_dp.budget import tables
from lightning_dp.budget.registry import DatasetBudgetError, Registry, TamperedError
from lightning_dp.launch import read_prefit
from lightning_dp.privacy.durable import Payload
from lightning_dp.privacy.ledger import PrivacyLedger, Release, ReleaseNotSavedError
from lightning_dp.resume import lost_uses, restore_values, resume_state
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


def _opened(reg: Registry, tmp_path: Path, budget: float = 2.0) -> tuple[PrivacyLedger, list[str], object]:
    """A ledger registered on a fresh data set; ``calls`` lists the durable steps in the order they ran."""
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), budget=budget)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    lease = reg.open_run(run_id="r", dataset=ds, ledger=ledger, output_dir=tmp_path / "r")
    calls: list[str] = []
    ledger.register = lambda led, payload=None: (calls.append("register"), reg.record(lease, led, payload))
    ledger.persist = lambda led: calls.append("persist")
    return ledger, calls, lease


def _commit(calls: list[str], folder: Path, data: bytes) -> Callable[[], Payload]:
    """A durable block's commit: its values as the bytes of ``folder/values.bin``; ``calls`` gets "commit", "write"."""
    class Traced(Payload):
        def write(self) -> None:
            calls.append("write")
            super().write()

    def commit() -> Payload:
        calls.append("commit")
        return Traced(folder, "values.bin", data)

    return commit


def test_the_values_are_charged_with_their_bytes_before_they_are_written_and_a_refusal_writes_nothing(registry,
                                                                                                     tmp_path):
    ledger, calls, lease = _opened(registry, tmp_path)
    folder = tmp_path / "r"
    ledger.commit = _commit(calls, folder, b"the noisy embedding")
    with ledger.durable():
        ledger.record(_release("embedding", 6.0))
    # serialised in memory, charged with those bytes in one transaction, then written, then ledger.json
    assert calls == ["commit", "register", "write", "persist"]
    stored = registry.payload("r")
    assert (stored.path, stored.data) == ("values.bin", b"the noisy embedding")
    assert (folder / "values.bin").read_bytes() == stored.data
    ledger.commit = None
    ledger.record(_release("step", 60.0))  # a charge without values (a DP-SGD step) leaves the stored ones
    assert registry.payload("r") == stored
    # the owner lowers the budget mid-run: the next block is refused by the registry before its values are written
    registry.set_budget(registry.datasets()[0].name, ledger.spent + 0.01, reason="test")
    calls.clear()
    ledger.commit = _commit(calls, folder, b"a refused draw")
    with pytest.raises(DatasetBudgetError, match="Nothing was released"), ledger.durable():
        ledger.record(_release("second", 8.0))
    assert calls == ["commit", "register"]  # no write: no file and no registry row holds the refused value
    assert registry.payload("r") == stored and (folder / "values.bin").read_bytes() == b"the noisy embedding"
    assert [r["name"] for r in registry.run("r").state["releases"]] == ["embedding", "step"]
    assert [r.name for r in ledger.releases] == ["embedding", "step"]
    registry.close_run(lease, outcome="stopped (KeyboardInterrupt)")  # a stopped run keeps them for its resume
    assert registry.payload("r") == stored


def test_a_run_that_ends_normally_drops_its_stored_values(registry, tmp_path):
    ledger, calls, lease = _opened(registry, tmp_path)
    ledger.commit = _commit(calls, tmp_path / "r", b"values")
    with ledger.durable():
        ledger.record(_release("embedding", 6.0))
    assert registry.payload("r").data == b"values"
    registry.close_run(lease)  # outcome "ended": every value is in the run's files
    assert registry.payload("r") is None and registry.run("r").epsilon_spent == pytest.approx(ledger.spent)


def test_a_failed_write_after_the_charge_keeps_the_charge_and_the_values(registry, tmp_path):
    ledger, calls, _ = _opened(registry, tmp_path)
    (tmp_path / "a file").write_text("")
    ledger.commit = _commit(calls, tmp_path / "a file", b"values")  # its folder is a file: the write fails (OSError)
    with pytest.raises(ReleaseNotSavedError, match="registry keeps the charge and the values"), ledger.durable():
        ledger.record(_release("embedding", 6.0))
    assert calls == ["commit", "register", "write"]  # ledger.json was not written
    assert ledger.releases == []  # nothing left the process
    row = registry.run("r")
    assert [r["name"] for r in row.state["releases"]] == ["embedding"] and row.epsilon_spent > 0  # still charged...
    assert registry.payload("r").data == b"values"  # ...with the values a resume writes


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


def _killed(out: Path, kill: Callable[[], None], *overrides: str) -> int:
    """A dp_merf run (``overrides``) in a child process that ``kill()`` arranges to die (SIGKILL-like ``os._exit``)."""
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)
            kill()
            train(make_cfg(out, *overrides))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _after_the_charge(name: str) -> Callable[[], None]:
    """Die right after the registry's transaction that charged the release ``name``, before any file is written."""
    def install() -> None:
        record = Registry.record

        def record_then_die(self, lease, ledger, payload=None) -> None:
            record(self, lease, ledger, payload)
            if ledger.has(name):
                os._exit(9)

        Registry.record = record_then_die

    return install


def _at_the_rename(filename: str, *, after: bool = False) -> Callable[[], None]:
    """Die at the first rename of a temporary file into ``filename``: just before it (the temporary file is complete
    and fsync'd, and stays behind), or just after it (``after``)."""
    def install() -> None:
        replace = os.replace

        def replace_and_die(src, dst, **kwargs) -> None:
            if Path(dst).name == filename and not after:
                os._exit(9)
            replace(src, dst, **kwargs)
            if Path(dst).name == filename:
                os._exit(9)

        os.replace = replace_and_die

    return install


def test_a_kill_between_charge_and_checkpoint_over_charges_and_the_folder_can_start_again(registry, tmp_path):
    out = tmp_path / "run"
    assert _killed(out, _after_the_charge("data/num_rows")) == 9
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


def _run_id(out: Path) -> str:
    return json.loads((out / "ledger.json").read_text())["run_id"]


def _embedding_charged_not_written(registry: Registry, out: Path) -> tuple[dict, dict]:
    """After a kill inside DP-MERF's one-shot block: the registry's record, and the checkpoint it holds (loaded)."""
    run_id = _run_id(out)
    charged, stored = registry.run(run_id).state, registry.payload(run_id)
    assert stored.path == "checkpoints/last.ckpt" and not (out / "checkpoints" / "last.ckpt").exists()
    on_disk = PrivacyLedger.state_from_json(json.loads((out / "ledger.json").read_text()))
    assert not any("embedding" in r["name"] for r in on_disk["releases"])  # ledger.json never ahead of the registry
    held = torch.load(io.BytesIO(stored.data), weights_only=True)
    assert {k: v for k, v in held["lightning_dp"]["ledger"].items() if k != "integrity"} == charged  # the charged state
    assert bool(held["state_dict"]["released"]) and held["state_dict"]["target"].abs().sum() > 0  # and its draw
    return charged, held


def _resumed_from_the_charge(registry: Registry, out: Path, reference: dict, charged: dict, held: dict) -> None:
    """The run in ``out`` resumes to its end from the values charged before the kill: no redraw, no new charge."""
    result = train(make_cfg(out, "resume=last"))
    ledger = json.loads((out / "ledger.json").read_text())
    after = registry.run(ledger["run_id"])
    assert result["epsilon"] == pytest.approx(reference["epsilon"], rel=1e-12) and result["epsilon"] <= 1.0
    assert not after.active and after.epsilon_spent == pytest.approx(reference["epsilon"], rel=1e-12)
    assert after.state["releases"] == charged["releases"]  # each release once, as charged
    assert "lost" not in ledger and "lost" not in after.state
    final = torch.load(result["checkpoint"], weights_only=True)["state_dict"]
    assert torch.equal(final["target"], held["state_dict"]["target"])  # the charged draw (random noise: a redraw differs)
    assert registry.payload(ledger["run_id"]) is None  # ended normally: every value is in its files


@pytest.mark.parametrize("kill", ["after_the_charge", "before_the_rename"])
def test_a_kill_between_the_embeddings_charge_and_its_checkpoint_resumes_from_the_charged_values(registry, tmp_path,
                                                                                                kill):
    # DP-MERF's one-shot block (bandwidth moments, then the embedding calibrated to the rest of ε = 1) is charged with
    # the checkpoint's bytes, and the run dies before last.ckpt is in place: the resume writes those bytes and goes on
    # (before: the block was lost and drawn again, bandwidth_moments 0.9999 → 1.002, refused: the kill -9 test's failure)
    reference = train(make_cfg(tmp_path / "reference"))
    out = tmp_path / "run"
    die = _after_the_charge("dp_merf/embedding") if kill == "after_the_charge" else _at_the_rename("last.ckpt")
    assert _killed(out, die) == 9
    charged, held = _embedding_charged_not_written(registry, out)
    orphans = list((out / "checkpoints").glob(".last.ckpt.*.tmp"))
    if kill == "before_the_rename":  # a complete copy of the draw is on disk, unrenamed: the same bytes, not a second draw
        assert [p.read_bytes() for p in orphans] == [registry.payload(_run_id(out)).data]
    else:
        assert orphans == []
    _resumed_from_the_charge(registry, out, reference, charged, held)


def test_a_resume_killed_again_at_the_same_point_still_resumes(registry, tmp_path):
    reference = train(make_cfg(tmp_path / "reference"))
    out = tmp_path / "run"
    assert _killed(out, _after_the_charge("dp_merf/embedding")) == 9
    charged, held = _embedding_charged_not_written(registry, out)
    # the resume dies just before it renames the last.ckpt it writes from the registry's bytes into place
    assert _killed(out, _at_the_rename("last.ckpt"), "resume=last") == 9
    again, held_again = _embedding_charged_not_written(registry, out)
    assert again == charged and torch.equal(held_again["state_dict"]["target"], held["state_dict"]["target"])
    _resumed_from_the_charge(registry, out, reference, charged, held)


def test_stored_values_are_not_used_when_the_files_hold_them(registry, tmp_path):
    reference = train(make_cfg(tmp_path / "reference"))
    out = tmp_path / "run"
    assert _killed(out, _at_the_rename("last.ckpt", after=True)) == 9  # last.ckpt is in place, ledger.json is not
    last = out / "checkpoints" / "last.ckpt"
    stored = registry.payload(_run_id(out))
    assert stored.data == last.read_bytes()
    before = last.stat()
    assert restore_values(registry, out, resume_state(out, last)) is None  # as far as the stored values: untouched
    assert (last.stat().st_ino, last.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    held = torch.load(io.BytesIO(stored.data), weights_only=True)
    charged = {k: v for k, v in held["lightning_dp"]["ledger"].items() if k != "integrity"}
    _resumed_from_the_charge(registry, out, reference, charged, held)


def test_edited_stored_values_are_refused(registry, tmp_path):
    out = tmp_path / "run"
    assert _killed(out, _after_the_charge("dp_merf/embedding")) == 9
    run_id = _run_id(out)
    stored = registry.payload(run_id)
    flipped = stored.data[:-1] + bytes([stored.data[-1] ^ 1])
    for edit in ({"data": flipped}, {"path": ".prefit.json"}, {"seq": stored.seq + 1}):  # in the database, by hand
        with registry.engine.begin() as conn:
            conn.execute(update(tables.payloads).where(tables.payloads.c.run_id == run_id).values(**edit))
        with pytest.raises(TamperedError, match="changed outside lightning-dp"):
            train(make_cfg(out, "resume=last"))
        assert not (out / "checkpoints" / "last.ckpt").exists()  # nothing was written from them
        with registry.engine.begin() as conn:
            conn.execute(update(tables.payloads).where(tables.payloads.c.run_id == run_id).values(
                data=stored.data, path=stored.path, seq=stored.seq))
    assert registry.payload(run_id) == stored


def test_a_kill_between_the_categories_charge_and_prefit_json_resumes_from_the_charged_values(registry, tmp_path):
    import pandas as pd
    import yaml

    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.uniform(size=2000).round(4), "c": rng.choice(["a", "b"], 2000)}).to_csv(
        tmp_path / "rows.csv", index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"columns": [  # c's categories are a DP release
        {"name": "x", "type": "continuous", "bounds": [0, 1]}, {"name": "c", "type": "categorical"}]}))
    data = ["data=csv", f"data.path={tmp_path / 'rows.csv'}", f"data.schema={tmp_path / 'schema.yaml'}"]
    out = tmp_path / "run"
    assert _killed(out, _after_the_charge("data/categories"), *data) == 9
    run_id = _run_id(out)
    charged, stored = registry.run(run_id).state, registry.payload(run_id)
    held = json.loads(stored.data)
    assert stored.path == ".prefit.json" and {k: v for k, v in held["ledger"].items() if k != "integrity"} == charged
    assert [r["name"] for r in read_prefit(out)["ledger"]["releases"]] == ["data/num_rows"]  # the file lacks them
    result = train(make_cfg(out, *data, "resume=last"))  # .prefit.json written from the registry's bytes: no redraw
    ledger = json.loads((out / "ledger.json").read_text())
    run = registry.run(ledger["run_id"])
    uses = sum(r["count"] for r in run.state["releases"] if r["name"] == "data/categories")
    assert uses == 1 and "lost" not in run.state and "lost" not in ledger
    assert run.state["releases"][:len(charged["releases"])] == charged["releases"]
    assert read_prefit(out)["data"] == held["data"]  # the charged categories (and count), not a second draw
    assert run.epsilon_spent == pytest.approx(result["epsilon"]) and result["epsilon"] <= 1 + 1e-9
    assert not run.active and run.charge == pytest.approx(ledger["epsilon"])
