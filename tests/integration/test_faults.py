"""Faults: the ledger on disk is never behind a release, a kill loses no budget, resume never goes back.

Kill tests fork the test process (torch and Lightning already imported), run the real ``train()`` in the
child and SIGKILL it at a random moment, then resume in another child, as a user would after a crash.
"""

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from lightning_dp.privacy.ledger import ReleaseNotSavedError
from lightning_dp.resume import ResumeError
from lightning_dp.train import train
from tests.conftest import make_cfg

GAN = ["model=dp_gan", "model.module.batch_size=64", "data.batch_size=64"]


def _ledger(out: Path) -> dict:
    return json.loads((out / "ledger.json").read_text())


def _counts(ledger: dict) -> dict[str, int]:
    return {r["name"]: r["count"] for r in ledger["releases"]}


def test_the_ledger_on_disk_is_written_before_each_steps_noise_is_used(tmp_path, monkeypatch, single_thread):
    import lightning_dp.callbacks.dp_sgd as dp_sgd

    seen = []
    real_noise = dp_sgd.mech.gaussian_noise

    def spy(value, **kwargs):  # the noise of a DP-SGD step (drawn in the gradient's dtype): already on disk?
        if "draw_dtype" in kwargs and kwargs["draw_dtype"] is None:
            seen.append(_counts(_ledger(tmp_path)).get("dp_sgd/discriminator", 0))
        return real_noise(value, **kwargs)

    monkeypatch.setattr(dp_sgd.mech, "gaussian_noise", spy)
    train(make_cfg(tmp_path, *GAN, "trainer.max_epochs=1"))
    steps = _counts(_ledger(tmp_path))["dp_sgd/discriminator"]
    per_step = len(seen) // steps  # one draw per parameter tensor
    assert [seen[i * per_step] for i in range(steps)] == list(range(1, steps + 1))


def test_a_release_that_cannot_be_saved_is_refused_and_not_recorded(tmp_path, monkeypatch):
    from lightning_dp.privacy.ledger import PrivacyLedger, Release

    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)

    def full_disk(_):
        raise OSError(28, "No space left on device")

    ledger.persist = full_disk
    with pytest.raises(ReleaseNotSavedError, match="No space left on device"):
        ledger.record(Release(name="x", mechanism="gaussian", sensitivity=1.0, noise_multiplier=5.0))
    assert ledger.releases == []
    with pytest.raises(ReleaseNotSavedError), ledger.durable():  # a one-shot block: values and ledger, or nothing
        ledger.record(Release(name="y", mechanism="gaussian", sensitivity=1.0, noise_multiplier=5.0))
    assert ledger.releases == []


def test_a_durable_block_holds_its_log_lines_until_saved(caplog):
    import logging

    from lightning_dp.privacy.ledger import PrivacyLedger, Release

    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    order = []
    ledger.commit = lambda: order.append("commit")
    ledger.persist = lambda _: order.append("persist")
    handler = logging.Handler()
    handler.emit = lambda record: order.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        with ledger.durable():
            ledger.record(Release(name="y", mechanism="gaussian", sensitivity=1.0, noise_multiplier=5.0))
            logging.getLogger("lightning_dp.test").warning("the noisy value is 42")
    finally:
        logging.getLogger().removeHandler(handler)
    assert order == ["commit", "persist", "the noisy value is 42"]


def test_resume_reloads_the_runs_own_config_and_refuses_privacy_changes(tmp_path, single_thread):
    import yaml

    from tests.unit.test_data import toy_frame, toy_schema

    toy_frame(n=600).to_csv(tmp_path / "rows.csv", index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(toy_schema().to_dict()))
    run = tmp_path / "run"
    first = train(make_cfg(run, "data=csv", f"data.path={tmp_path / 'rows.csv'}",
                           f"data.schema={tmp_path / 'schema.yaml'}", "privacy.epsilon=2"))
    spent = _ledger(run)
    # the command line of a resume names only what changes (train.py passes Hydra's overrides)
    resumed = train(make_cfg(run, "resume=last", "trainer.max_epochs=2"), overrides=["resume=last",
                                                                                     "trainer.max_epochs=2"])
    assert resumed["epsilon"] == first["epsilon"] and _ledger(run)["releases"] == spent["releases"]
    assert torch.load(resumed["checkpoint"], weights_only=True)["global_step"] == 10
    with pytest.raises(ResumeError, match="privacy.epsilon cannot change"):
        train(make_cfg(run, "resume=last", "privacy.epsilon=5"), overrides=["resume=last", "privacy.epsilon=5"])
    with pytest.raises(ResumeError, match="would change: data.name"):  # from Python: the whole config is compared
        train(make_cfg(run, "resume=last"))


def test_a_resume_of_a_finished_dp_sgd_run_adds_no_step(tmp_path, single_thread):
    train(make_cfg(tmp_path, *GAN, "trainer.max_epochs=1"))
    before = _counts(_ledger(tmp_path))
    result = train(make_cfg(tmp_path, *GAN, "trainer.max_epochs=3", "resume=last"))
    assert _counts(_ledger(tmp_path)) == before and result["epsilon"] <= 1.0


def test_bad_settings_are_refused_before_any_release(tmp_path):
    from lightning_dp.preflight import ConfigError

    for override, match in [("num_samples=-5", "num_samples must be"), ("privacy.epsilon=1e9", "privacy.epsilon"),
                            ("data.batch_size=0", "data.batch_size"), ("audit=default", None)]:
        out = tmp_path / override.replace("=", "_")
        if match is None:  # an image data set with the (tabular) audit
            with pytest.raises(ConfigError, match="reports on tabular data"):
                train(make_cfg(out, "data=digits", override))
        else:
            with pytest.raises(ConfigError, match=match):
                train(make_cfg(out, override))
        assert not out.exists() or not any(out.iterdir())


# ---------------------------------------------------------------------------------------------- kills
def _fork(fn) -> int:
    pid = os.fork()
    if pid == 0:  # the child: run, then leave without running the parent's cleanup
        code = 0
        try:
            torch.set_num_threads(1)
            fn()
        except BaseException:  # noqa: BLE001 - the exit code tells the parent; the traceback the reader
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return pid


def _wait(pid: int, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise TimeoutError("the forked run did not finish")


def _kill_and_resume(out: Path, overrides: list[str], delay: float) -> tuple[float, dict, dict]:
    """Start a run, SIGKILL it after ``delay`` s, read the ledger on disk, resume to the end."""
    pid = _fork(lambda: train(make_cfg(out, *overrides)))
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    at_kill = _ledger(out) if (out / "ledger.json").exists() else {"epsilon": 0.0, "releases": []}
    started = any((out / n).exists() for n in ("ledger.json", ".prefit.json", "checkpoints/last.ckpt"))
    resume = [*overrides, "resume=last"] if started else overrides
    assert _wait(_fork(lambda: train(make_cfg(out, *resume)))) == 0
    return at_kill["epsilon"], at_kill, _ledger(out)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    # fixed noise: every run has the reference's DP count, hence its sample rate and planned steps
    [*GAN, "trainer.max_epochs=6", "callbacks.checkpoint.every_n_steps=5", "privacy.noise_seed=0"],  # DP-SGD
    ["trainer.max_epochs=2", "privacy.noise_seed=0"],  # DP-MERF: the row count, the one-shot embedding, free steps
], ids=["dp_sgd", "one_shot"])
def test_kill_9_at_random_moments_loses_no_budget_and_never_goes_back(tmp_path, overrides, single_thread):
    start = time.monotonic()
    assert _wait(_fork(lambda: train(make_cfg(tmp_path / "reference", *overrides)))) == 0
    duration = time.monotonic() - start
    reference = _ledger(tmp_path / "reference")
    ref_counts = _counts(reference)
    rng = random.Random(0)
    for k in range(20):
        out = tmp_path / f"kill{k}"
        eps_at_kill, at_kill, final = _kill_and_resume(out, overrides, rng.uniform(0.0, duration))
        counts = _counts(final)
        assert final["epsilon"] >= eps_at_kill - 1e-12  # never goes back
        assert all(counts.get(name, 0) >= c for name, c in _counts(at_kill).items())
        for name, c in ref_counts.items():  # one-shot releases once; DP-SGD steps continue to the budget
            assert abs(counts[name] - c) <= (1 if name.startswith("dp_sgd/") else 0), (k, name, counts[name], c)
        assert final["epsilon"] <= 1.0 + 1e-9
        assert abs(final["epsilon"] - reference["epsilon"]) < 0.02, (k, final["epsilon"], reference["epsilon"])
        assert (out / "synthetic.csv").exists()
