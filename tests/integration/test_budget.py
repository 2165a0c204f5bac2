"""One budget per data set, across runs, folders and processes (SQLite and a real PostgreSQL server).

Runs are real ``train()`` calls in forked children (torch already imported), started at the same time as a user
would start them from two shells: exactly one proceeds, the other exits 2 having released nothing.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from lightning_dp.budget.registry import Registry
from lightning_dp.errors import UserError
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.resume import ResumeError
from lightning_dp.train import train
from tests.budget_helpers import BACKENDS, registry_url
from tests.conftest import make_cfg

GAN = ["model=dp_gan", "model.module.batch_size=64", "data.batch_size=64", "privacy.noise_seed=0"]


@pytest.fixture(params=BACKENDS)
def registry(request, tmp_path, monkeypatch) -> Registry:
    """A fresh registry on each backend, made the runs' registry through the environment (children inherit it)."""
    with registry_url(request.param, tmp_path / "registry") as url:
        monkeypatch.setenv("LIGHTNING_DP_REGISTRY", url)
        reg = Registry(url)
        yield reg
        reg.close()


def _fork(fn) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            torch.set_num_threads(1)
            fn()
        except UserError as err:  # what train.py prints as one error line, exit 2
            print(f"error: {err}", flush=True)
            code = 2
        except BaseException:  # noqa: BLE001 - a bug: the traceback for the reader, exit 1
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _ledger(out: Path) -> dict:
    return json.loads((out / "ledger.json").read_text())


def _state(out: Path) -> dict:
    return PrivacyLedger.state_from_json(_ledger(out))


def _runs(reg: Registry) -> list:
    return [r for ds in reg.datasets() for r in reg.runs(ds)]


def test_two_fresh_runs_into_one_folder_exactly_one_proceeds(registry, tmp_path, single_thread):
    out = tmp_path / "run"
    pids = [_fork(lambda: train(make_cfg(out, *GAN))) for _ in range(2)]
    assert sorted(_wait(p) for p in pids) == [0, 2]
    (run,) = _runs(registry)  # the refused run never reached the registry
    assert not run.active and _ledger(out)["run_id"] == run.run_id
    assert _state(out)["releases"] == run.state["releases"]  # ledger.json is the one run's, step for step


def test_a_data_set_budget_refuses_the_run_that_does_not_fit_whichever_folder(registry, tmp_path, single_thread):
    cfg = ["privacy.dataset_name=breast", "privacy.dataset_budget=1.5"]
    pids = [_fork(lambda k=k: train(make_cfg(tmp_path / f"run{k}", *cfg))) for k in range(2)]
    assert sorted(_wait(p) for p in pids) == [0, 2]
    (ds,) = registry.datasets()
    assert (ds.name, ds.budget_epsilon) == ("breast", 1.5)
    (run,) = registry.runs(ds)
    assert run.epsilon_spent <= 1.0 + 1e-9 and run.charge <= 1.5
    refused = [tmp_path / f"run{k}" for k in range(2) if not (tmp_path / f"run{k}" / "ledger.json").exists()]
    assert len(refused) == 1 and (not refused[0].exists() or not any(refused[0].iterdir()))  # nothing written
    with pytest.raises(UserError, match=r"budget of data set 'breast' is ε = 1.5 across all its runs.*lightning_dp.budget raise breast"):
        train(make_cfg(tmp_path / "third", *cfg))


def _slowly(fn, seconds: float):
    """``fn`` in a child whose training steps take ``seconds`` each (so other processes start while it trains)."""

    def run() -> None:
        from lightning_dp.callbacks.run_record import RunRecord

        step = RunRecord.on_train_batch_end
        RunRecord.on_train_batch_end = lambda *a, **k: (time.sleep(seconds), step(*a, **k))[1]
        fn()

    return run


def _steps(state: dict) -> int:
    return sum(r["count"] for r in state["releases"] if r["name"].startswith("dp_sgd/"))


def _until(condition, pid: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0)
        time.sleep(0.05)


def test_two_concurrent_resumes_exactly_one_proceeds(registry, tmp_path, single_thread):
    out = tmp_path / "run"
    overrides = [*GAN, "trainer.max_epochs=2", "callbacks.checkpoint.every_n_steps=1"]
    crashed = _fork(_slowly(lambda: train(make_cfg(out, *overrides)), 0.3))
    _until(lambda: any(_steps(r.state) >= 2 for r in _runs(registry)), crashed)
    os.kill(crashed, signal.SIGKILL)  # a DP-SGD run killed mid-way, as by a node failure
    os.waitpid(crashed, 0)
    (run,) = _runs(registry)
    first = _fork(_slowly(lambda: train(make_cfg(out, *overrides, "resume=last")), 1.0))
    _until(lambda: registry.run(run.run_id).live and registry.run(run.run_id).host is not None
           and registry.run(run.run_id).pid == first, first)  # the first resume holds the run's lease
    same_folder = _fork(lambda: train(make_cfg(out, *overrides, "resume=last")))
    other_folder = _fork(lambda: train(make_cfg(tmp_path / "copy", *overrides,
                                                f"resume={out / 'checkpoints' / 'last.ckpt'}")))
    assert _wait(same_folder) == 2 and _wait(other_folder) == 2  # refused while the first runs
    assert _wait(first) == 0
    after = registry.run(run.run_id)
    assert after.epsilon_spent <= 1.0 + 1e-9 and not after.active
    assert _state(out)["releases"] == after.state["releases"]  # the file's steps are the registry's steps
    planned = after.state["releases"]
    assert _steps(after.state) == _steps(_state(out)) and _steps(after.state) > _steps(run.state), planned
    assert not (tmp_path / "copy" / "ledger.json").exists()


def test_resume_takes_the_spend_from_the_registry_and_refuses_edited_or_unknown_records(registry, tmp_path):
    out = tmp_path / "run"
    train(make_cfg(out))
    ckpt = out / "checkpoints" / "last.ckpt"
    original = {p: p.read_bytes() for p in (out / "ledger.json", out / ".prefit.json", ckpt)}

    def restore() -> None:
        for p, data in original.items():
            p.write_bytes(data)

    # the records emptied together (checkpoint, ledger.json, .prefit.json), as in the fault sweep
    record = torch.load(ckpt, weights_only=True)
    record["lightning_dp"]["ledger"]["releases"] = []
    torch.save(record, ckpt)
    for name in ("ledger.json", ".prefit.json"):
        d = json.loads((out / name).read_text())
        (d["ledger"] if name == ".prefit.json" else d)["releases"] = []
        (out / name).write_text(json.dumps(d))
    with pytest.raises(ResumeError, match="does not match its integrity tag"):
        train(make_cfg(out, "resume=last", "trainer.max_epochs=2"))
    restore()
    # a checkpoint copied elsewhere with its run id stripped: unknown to the registry
    record = torch.load(ckpt, weights_only=True)
    del record["lightning_dp"]["ledger"]["run_id"]
    external = tmp_path / "elsewhere.ckpt"
    torch.save(record, external)
    with pytest.raises(ResumeError, match="resume_external=true"):
        train(make_cfg(tmp_path / "new", "resume=" + str(external)))
    assert not (tmp_path / "new" / "ledger.json").exists()
    result = train(make_cfg(tmp_path / "new", "resume=" + str(external), "resume_external=true"))
    runs = _runs(registry)
    assert len(runs) == 2 and {r.external_of for r in runs} == {None, str(external)}
    (ext,) = [r for r in runs if r.external_of]
    assert ext.epsilon_spent == pytest.approx(result["epsilon"]) and ext.epsilon_spent > 0.9  # charged again in full
    (ds,) = registry.datasets()
    assert sum(r.charge for r in registry.runs(ds)) == pytest.approx(2 * ext.epsilon_spent, rel=0.05)
