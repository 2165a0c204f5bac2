"""The budget registry on SQLite and on a real PostgreSQL server: claims, records, leases, tags, and races."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import numpy as np
import pytest
from sqlalchemy import text

from lightning_dp.budget.registry import (
    DatasetBudgetError,
    Registry,
    RegistryError,
    RunBusyError,
    TamperedError,
)
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger, Release
from tests.budget_helpers import BACKENDS, registry_url


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path):
    with registry_url(request.param, tmp_path) as u:
        yield u


def _ledger(target: float = 1.0) -> PrivacyLedger:
    return PrivacyLedger(target_epsilon=target, delta=1e-5)


def _spend(ledger: PrivacyLedger, sigma: float, name: str = "count") -> None:
    ledger.record(Release(name=name, mechanism="gaussian", sensitivity=1.0, noise_multiplier=sigma))


ROWS = np.arange(100, dtype=np.uint64)


def test_rows_in_any_order_are_one_data_set_and_a_name_joins_versions(url):
    reg = Registry(url)
    fp = reg.fingerprint(ROWS, kind="tabular")
    assert fp == reg.fingerprint(ROWS[::-1], kind="tabular")
    assert fp != reg.fingerprint(ROWS[1:], kind="tabular")
    assert fp != reg.fingerprint(ROWS, kind="image")
    first = reg.dataset_for(fp, name="clinic", budget=3.0)
    assert (first.name, first.budget_epsilon) == ("clinic", 3.0)
    assert reg.dataset_for(fp) == first  # known rows: the name and budget are the registry's
    v2 = reg.dataset_for(reg.fingerprint(ROWS[1:], kind="tabular"), name="clinic")
    assert v2 == first and reg.versions(first) == 2
    with pytest.raises(RegistryError, match="under another data set name than 'other'"):
        reg.dataset_for(fp, name="other")
    with pytest.raises(RegistryError, match="python -m lightning_dp.budget set NAME 5"):
        reg.dataset_for(fp, budget=5.0)


def test_the_fingerprint_is_keyed(url, tmp_path, monkeypatch):
    a = Registry(url).fingerprint(ROWS, kind="tabular")
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY_KEY", "a key of my own")
    b = Registry(str(tmp_path / "other.sqlite")).fingerprint(ROWS, kind="tabular")
    assert a != b  # without the key, a fingerprint tells nothing about the rows


def test_claims_refuse_a_run_that_does_not_fit_and_an_ended_run_is_charged_its_spend(url, tmp_path):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), budget=1.5)
    a = _ledger(1.0)
    lease_a = reg.open_run(run_id="a", dataset=ds, ledger=a, output_dir=tmp_path / "a")
    a.register = lambda led: reg.record(lease_a, led)
    _spend(a, 8.0)  # ε ≈ 0.5 of a's claim of 1
    with pytest.raises(DatasetBudgetError, match=r"other runs hold ε = 1\b.*ε = 0.5 left"):
        reg.open_run(run_id="b", dataset=ds, ledger=_ledger(1.0), output_dir=tmp_path / "b")
    reg.close_run(lease_a)
    row = reg.run("a")
    assert not row.active and row.charge == pytest.approx(a.spent) and 0.3 < a.spent < 0.6
    assert reg.run("b") is None  # the refused run left nothing
    reg.open_run(run_id="b", dataset=ds, ledger=_ledger(1.5 - a.spent - 1e-6), output_dir=tmp_path / "b")


def test_a_record_must_extend_the_last_and_stay_within_a_lowered_budget(url, tmp_path):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), name="d", budget=2.0)
    led = _ledger(1.0)
    lease = reg.open_run(run_id="r", dataset=ds, ledger=led, output_dir=tmp_path)
    led.register = lambda x: reg.record(lease, x)
    _spend(led, 10.0)
    _spend(led, 10.0)
    assert reg.run("r").state["releases"][0]["count"] == 2 and reg.run("r").seq == 3
    with pytest.raises(RegistryError, match="fewer releases"):
        reg.record(lease, _ledger(1.0))
    reg.set_budget("d", 0.5, reason="the owner lowers it")
    with pytest.raises(DatasetBudgetError, match="above its budget"):
        _spend(led, 10.0)
    assert led.releases[0].count == 2 and reg.run("r").state["releases"][0]["count"] == 2  # nothing recorded
    with pytest.raises(RegistryError, match="raise only increases"):
        reg.set_budget("d", 0.4, reason="x", only_raise=True)
    actions = [e["action"] for e in reg.events(ds)]
    assert actions == ["create_dataset", "start_run", "set_budget"]


def test_one_process_per_run_and_a_dead_holder_is_taken_over(url, tmp_path):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), budget=5.0)
    first = reg.open_run(run_id="r", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "x")
    with pytest.raises(RunBusyError, match="one process at a time"):
        reg.open_run(run_id="r", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "y")
    with pytest.raises(RunBusyError, match="is writing to"):
        reg.open_run(run_id="other", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "x")
    with reg.engine.begin() as conn:  # the holder died (a pid that is not running on this host)
        conn.execute(text("UPDATE ldp_runs SET pid = 2147483000 WHERE run_id = 'r'"))
    second = reg.open_run(run_id="r", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "x")
    with pytest.raises(RunBusyError, match="taken over"):
        reg.record(first, _ledger())
    assert reg.heartbeat(second) and not reg.heartbeat(first)


def test_edited_rows_and_files_are_detected(url, tmp_path):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), name="d", budget=2.0)
    led = _ledger()
    led.run_id, led.seal = "r", reg.seal
    lease = reg.open_run(run_id="r", dataset=ds, ledger=led, output_dir=tmp_path)
    led.register = lambda x: reg.record(lease, x)
    _spend(led, 10.0)
    state = led.state_dict()
    reg.check_seal(state, "the checkpoint")
    led.save_json(str(tmp_path / "ledger.json"))  # ledger.json's view carries the same tag
    reg.check_seal(PrivacyLedger.state_from_json(json.loads((tmp_path / "ledger.json").read_text())), "ledger.json")
    emptied = {**state, "releases": []}
    with pytest.raises(TamperedError, match="does not match its integrity tag"):
        reg.check_seal(emptied, "the checkpoint")
    with reg.engine.begin() as conn:
        conn.execute(text("UPDATE ldp_runs SET state = :s WHERE run_id = 'r'"), {"s": json.dumps(emptied)})
        conn.execute(text("UPDATE ldp_datasets SET budget_epsilon = 100 WHERE name = 'd'"))
    with pytest.raises(TamperedError, match="run r was changed outside lightning-dp"):
        reg.run("r")
    with pytest.raises(TamperedError, match="data set 'd' was changed outside lightning-dp"):
        reg.dataset("d")


def test_a_key_from_the_environment_must_be_the_registrys(url, monkeypatch):
    Registry(url)
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY_KEY", "guess")
    with pytest.raises(RegistryError, match="keeps its own key"):
        Registry(url)


def test_a_password_is_refused_in_the_saved_setting_and_an_unknown_database_is_named():
    from lightning_dp.budget.registry import resolve_url

    with pytest.raises(RegistryError, match="PGPASSWORD"):
        resolve_url("postgresql://u:secret@db/x")
    assert resolve_url("postgresql://u:secret@db/x", saved=False).startswith("postgresql+psycopg://u:secret@")
    with pytest.raises(RegistryError, match="unknown database 'mysql'"):
        resolve_url("mysql://db/x")


def test_an_unreachable_server_is_one_line_after_the_timeout():
    import time

    start = time.monotonic()
    with pytest.raises(RegistryError, match="failed to open .*Nothing was released"):
        Registry("postgresql://nobody@127.0.0.1:1/none", connect_timeout_s=2)
    assert time.monotonic() - start < 10


def _race(url: str, run_id: str, start, results) -> None:
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"))
    led = _ledger(1.0)
    start.wait()
    try:
        lease = reg.open_run(run_id=run_id, dataset=ds, ledger=led, output_dir=f"/tmp/race/{run_id}")
    except DatasetBudgetError:
        results.put((run_id, 0.0))
        return
    led.register = lambda x: reg.record(lease, x)
    while True:  # releases until the run's own target stops it, each recorded under the data set's lock
        try:
            _spend(led, 12.0)
        except BudgetExceededError as err:
            assert not isinstance(err, DatasetBudgetError)
            break
    reg.close_run(lease)
    results.put((run_id, led.spent))


@pytest.mark.parametrize("n", [8])
def test_processes_racing_for_the_last_of_a_budget_stay_within_it(url, n):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), budget=2.5)
    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(url, f"run{i}", start, results)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    spent = dict(results.get(timeout=5) for _ in range(n))
    assert all(p.exitcode == 0 for p in procs)
    assert sum(1 for v in spent.values() if v > 0) == 2  # runs of ε ≈ 1 each in 2.5: exactly two proceed
    runs = reg.runs(ds)
    assert len(runs) == 2 and sum(r.charge for r in runs) <= 2.5
    assert sum(r.epsilon_spent for r in runs) == pytest.approx(sum(spent.values()))


def test_the_command_line_shows_exports_and_logs_budget_changes(url, tmp_path, capsys):
    import csv
    import io

    from lightning_dp.budget.__main__ import main

    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), name="clinic", budget=2.0)
    led = _ledger(1.0)
    lease = reg.open_run(run_id="r1", dataset=ds, ledger=led, output_dir=tmp_path)
    led.register = lambda x: reg.record(lease, x)
    _spend(led, 10.0)
    reg.close_run(lease)
    assert main(["--registry", url, "show", "clinic"]) == 0
    shown = capsys.readouterr().out
    assert "budget ε = 2" in shown and "run r1  ended" in shown and "count" in shown
    assert main(["--registry", url, "export", "clinic", "--format", "csv"]) == 0
    (row,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert (row["run_id"], row["release"], row["count"]) == ("r1", "count", "1")
    assert float(row["epsilon_alone"]) == pytest.approx(led.spent)
    assert main(["--registry", url, "raise", "clinic", "1", "--reason", "x"]) == 2
    assert "raise only increases" in capsys.readouterr().err
    assert main(["--registry", url, "raise", "clinic", "3", "--reason", "owner approved"]) == 0
    capsys.readouterr()
    assert main(["--registry", url, "export", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["datasets"][0]["budget_epsilon"] == 3.0
    events = reg.events(reg.dataset("clinic"))
    assert events[-1]["action"] == "raise_budget" and events[-1]["reason"] == "owner approved"
    assert events[-1]["before"] == 2.0 and events[-1]["after"] == 3.0


def _version(reg: Registry, rows: np.ndarray, **kwargs):
    digests = np.asarray(rows, dtype=np.uint64)
    return reg.dataset_for(reg.fingerprint(digests, kind="tabular"), sketch=reg.sketch(digests), **kwargs)


def test_a_changed_file_is_charged_to_the_data_set_it_changes(url):
    reg = Registry(url)
    d = np.arange(3000, 6000)
    first = _version(reg, d)
    assert _version(reg, np.append(d, 99_999)) == first  # D plus one row: the same data set, not a fresh budget
    assert _version(reg, d[: len(d) // 2]) == first  # half of D: all its rows are D's
    assert _version(reg, d[::-1][:2000]) == first and reg.versions(first) == 4
    other = _version(reg, np.arange(10_000, 12_000))  # other rows: another data set
    assert other != first and len(reg.datasets()) == 2
    with pytest.raises(RegistryError, match="2 registered data sets.*Nothing was released"):
        _version(reg, np.concatenate([d, np.arange(10_000, 12_000)]))  # mostly both: which budget is the owner's call
    with pytest.raises(RegistryError, match="another registered data set than 'fresh'.*--separate"):
        _version(reg, np.append(d, 12_345), name="fresh")  # a new name does not escape the budget either
    assert [ds.name for ds in reg.datasets() if ds.name == "fresh"] == []
    reg.set_budget("fresh", 2.0, reason="a separate study, approved", create=True, separate=True)
    assert _version(reg, np.append(d, 12_345), name="fresh").name == "fresh"  # the owner's explicit declaration
    events = [e["action"] for ds in reg.datasets() for e in reg.events(ds)]
    assert events.count("new_version") == 4


def test_registered_only_refuses_new_rows_but_not_a_registered_data_set(url):
    reg = Registry(url)
    d = np.arange(500)
    known = _version(reg, d)
    reg.set_policy(registered_only=True, reason="owner's rule")
    assert reg.policy()["registered_only"]
    with pytest.raises(RegistryError, match="registered data sets only.*set NAME EPSILON --create"):
        _version(reg, np.arange(1000, 1500))
    with pytest.raises(RegistryError, match="no data set 'clinic'"):
        _version(reg, np.arange(1000, 1500), name="clinic")
    reg.set_budget("clinic", 3.0, reason="registered by the owner", create=True)
    assert _version(reg, np.arange(1000, 1500), name="clinic").name == "clinic"
    assert _version(reg, np.append(d, 777)) == known  # a changed file of a registered data set is charged to it
    with pytest.raises(RegistryError, match="in \\(0, 1\\)"):
        reg.set_policy(overlap_threshold=1.5, reason="x")


def test_the_data_sets_delta_budget_bounds_the_sum_of_its_runs_delta(url, tmp_path):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), budget=100.0, budget_delta=2.5e-5)
    assert ds.budget_delta == 2.5e-5
    lease_a = reg.open_run(run_id="a", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "a")
    lease_b = reg.open_run(run_id="b", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "b")  # Σδ = 2e-5
    with pytest.raises(DatasetBudgetError, match="δ budget of the unnamed data set.* is 2.5e-05.*δ = 2e-05.*Nothing was released"):
        reg.open_run(run_id="c", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "c")
    b = _ledger()
    b.register = lambda led: reg.record(lease_b, led)
    _spend(b, 8.0)
    reg.close_run(lease_a)  # ended without a release: it holds no δ
    reg.close_run(lease_b)  # ended after one: it keeps its δ
    assert reg.run("a").delta_charge == 0 and reg.run("b").delta_charge == 1e-5
    reg.open_run(run_id="c", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "c")
    with pytest.raises(RegistryError, match="raise only increases"):
        reg.set_budget(ds.name, 100.0, reason="x", only_raise=True, delta=1e-5)
    _, raised = reg.set_budget(ds.name, 100.0, reason="more runs", only_raise=True, delta=1e-4)
    assert raised.budget_delta == 1e-4
    reg.open_run(run_id="d", dataset=ds, ledger=_ledger(), output_dir=tmp_path / "d")


def test_rows_registered_without_a_sketch_get_one_when_a_run_sees_them_again(url):
    reg = Registry(url)
    d = np.arange(2000, dtype=np.uint64)
    first = reg.dataset_for(reg.fingerprint(d, kind="tabular"))  # as a schema-1 registry registered them
    assert _version(reg, np.append(d, 5)) != first  # nothing to compare with yet: a new data set
    assert _version(reg, d) == first  # a run on the same rows again: their sketch is kept now
    with pytest.raises(RegistryError, match="2 registered data sets"):
        _version(reg, np.append(d, 7))  # mostly both D's data set and the D-plus-one data set registered above


def test_a_throwaway_registry_is_fresh_and_never_the_users(tmp_path, monkeypatch):
    from lightning_dp.budget import throwaway_registry
    from lightning_dp.budget.registry import default_budget, default_delta, resolve_url

    monkeypatch.setenv("LIGHTNING_DP_REGISTRY", str(tmp_path / "users.sqlite"))
    for key in ("LIGHTNING_DP_DEFAULT_BUDGET", "LIGHTNING_DP_DEFAULT_DELTA"):
        monkeypatch.setenv(key, os.environ.get(key, ""))  # restored after the test
    path = throwaway_registry()
    assert resolve_url(None) == f"sqlite:///{path}" and "users" not in str(path) and not path.exists()
    assert default_budget() >= 1e9 and default_delta() > 0.99
    assert throwaway_registry() != path  # each call a new one


def test_a_schema_1_registry_is_migrated_in_place(url):
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), name="old", budget=3.0)
    with reg.engine.begin() as conn:  # back to what schema 1 wrote (no sketches, no δ budget, the old tag)
        conn.execute(text("DROP TABLE ldp_sketches"))
        conn.execute(text("ALTER TABLE ldp_datasets DROP COLUMN budget_delta"))
        conn.execute(text("ALTER TABLE ldp_datasets DROP COLUMN separate"))
        conn.execute(text("UPDATE ldp_meta SET value = '1' WHERE name = 'schema_version'"))
        conn.execute(text("UPDATE ldp_datasets SET tag = :tag"), {"tag": reg._dataset_tag(ds.id, "old", 3.0)})
    reg.close()
    reg = Registry(url)
    (old,) = reg.datasets()  # its tag still checks
    assert (old.name, old.budget_epsilon, old.separate) == ("old", 3.0, False) and 0 < old.budget_delta < 1
    _, raised = reg.set_budget("old", 4.0, reason="after the upgrade", delta=1e-4)
    assert (raised.budget_epsilon, raised.budget_delta) == (4.0, 1e-4) and reg.datasets() == [raised]
    assert _version(reg, ROWS) == raised  # its rows now get a sketch


def test_budget_list_does_not_load_torch(tmp_path):
    """`python -m lightning_dp.budget list` reads the database only: it starts in about a second, not the 11-17 s of
    importing torch and Opacus (the accountant is loaded by `show` and `export`, which recompute each release's ε)."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'budget.sqlite'}"
    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), name="clinic", budget=3.0)
    ledger = _ledger(1.0)
    _spend(ledger, 5.0)
    reg.record(reg.open_run(run_id="r", dataset=ds, ledger=ledger, output_dir=tmp_path / "r"), ledger)
    code = ("import runpy, sys; sys.argv = ['budget', '--registry', sys.argv[1], 'list']\n"
            "try:\n    runpy.run_module('lightning_dp.budget', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch' in sys.modules, 'opacus' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "False False" and any(line.startswith("clinic") for line in lines)


def test_a_registry_of_the_previous_release_gains_the_values_table_and_keeps_working(url, tmp_path):
    from pathlib import Path

    from lightning_dp.privacy.durable import Payload

    reg = Registry(url)
    ds = reg.dataset_for(reg.fingerprint(ROWS, kind="tabular"), name="d", budget=2.0)
    led = _ledger()
    lease = reg.open_run(run_id="r", dataset=ds, ledger=led, output_dir=tmp_path)
    _spend(led, 10.0)
    reg.record(lease, led)
    with reg.engine.begin() as conn:  # the previous release's schema: every table but ldp_payloads
        conn.execute(text("DROP TABLE ldp_payloads"))
    reg.close()
    reg = Registry(url)  # opening creates the missing table; the rows written before still check
    assert reg.run("r").state["releases"] == led.state_dict()["releases"] and reg.payload("r") is None
    _spend(led, 10.0, name="embedding")  # the run goes on under its lease
    reg.record(lease, led, Payload(Path(tmp_path), "checkpoints/last.ckpt", b"\x00bytes\xff" * 1000))
    stored = reg.payload("r")
    assert (stored.path, stored.data, stored.seq) == ("checkpoints/last.ckpt", b"\x00bytes\xff" * 1000, reg.run("r").seq)
    _spend(led, 10.0, name="step")
    reg.record(lease, led)  # a record without values keeps the stored ones
    assert reg.payload("r") == stored
    _spend(led, 10.0, name="second")
    reg.record(lease, led, Payload(Path(tmp_path), ".prefit.json", b"{}"))  # one per run: replaced
    assert reg.payload("r").data == b"{}"
    with pytest.raises(RegistryError, match="not a path inside the run folder"):
        reg.record(lease, led, Payload(Path(tmp_path), "../elsewhere", b"{}"))
    with reg.engine.begin() as conn:  # an edit outside lightning-dp
        conn.execute(text("UPDATE ldp_payloads SET data = :d"), {"d": b"{} "})
    with pytest.raises(TamperedError, match="saved values of run r .* changed outside lightning-dp"):
        reg.payload("r")
