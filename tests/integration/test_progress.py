"""Progress lines off a terminal (lightning_dp.progress), quick refusals before torch loads, and what an
interrupted run says (exit 130 for Ctrl-C, the truth about a tuning run)."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from lightning_dp.progress import Progress
from tests.conftest import ROOT, make_cfg


def test_progress_lines_at_each_stage_and_on_a_steady_interval(caplog):
    progress = Progress()
    caplog.set_level(logging.INFO, logger="lightning_dp.progress")
    with progress.session(every=1, enabled=True):
        progress.set_epsilon(lambda: "ε = 0.5 of 1")
        progress.stage("train", total=10, unit="DP-SGD steps")
        time.sleep(0.2)
        progress.update(4)
        time.sleep(1.3)  # one heartbeat, with no stage change and no step
    lines = [r.getMessage() for r in caplog.records if r.name == "lightning_dp.progress"]
    assert lines[0].startswith("progress: train | 0/10 DP-SGD steps (0%) | elapsed 0s")
    beat = lines[1]
    assert "4/10 DP-SGD steps (40%)" in beat and "ETA" in beat and beat.endswith("ε = 0.5 of 1")


def test_hidden_stage_publishes_its_start_and_end_only(caplog):
    """Tuning: the selection's length grows with the secret K, so the public stream gets a start and an end line
    (the end without time) however long it runs; the heartbeats (elapsed, ε) go to the private sink only."""
    progress = Progress()
    caplog.set_level(logging.INFO, logger="lightning_dp.progress")
    private: list[str] = []
    with progress.session(every=1, enabled=True):
        progress.set_epsilon(lambda: "ε = 1 of 1")
        with progress.hidden("tuning", done="tuning done"):
            progress.private_sink(private.append)
            progress.stage("train", total=300)  # a candidate's stage: not shown, not counted
            progress.update(100)
            progress.set_epsilon(lambda: "ε = 0.3 of 0.3")  # a candidate's ledger: ignored
            inside = progress.line()
            time.sleep(2.4)  # two heartbeats
        time.sleep(0.1)
        progress.private_sink(private.append)  # no hidden stage: ignored
    assert inside.startswith("progress: tuning | elapsed") and inside.endswith("ε = 1 of 1")
    assert "300" not in inside and "train" not in inside
    public = [r.getMessage() for r in caplog.records]
    assert [line.split(" |")[0] for line in public] == ["progress: tuning", "progress: tuning done"]
    assert public[1] == "progress: tuning done | ε = 1 of 1"  # no elapsed time: it would grow with K
    assert len(private) >= 2 and all(line.startswith("progress: tuning | elapsed") for line in private)


def test_disabled_progress_writes_nothing(caplog):
    progress = Progress()
    caplog.set_level(logging.INFO, logger="lightning_dp.progress")
    with progress.session(every=1, enabled=False):
        progress.stage("train", total=3)
    assert not caplog.records


def test_a_training_run_reports_release_and_train_stages(tmp_path, caplog, monkeypatch, single_thread):
    from lightning_dp.train import train

    monkeypatch.setenv("LIGHTNING_DP_PROGRESS", "1")
    caplog.set_level(logging.INFO, logger="lightning_dp.progress")
    train(make_cfg(tmp_path))
    lines = [r.getMessage() for r in caplog.records if r.name == "lightning_dp.progress"]
    stages = [line.split(" |")[0] for line in lines]
    assert stages[:2] == ["progress: prepare data (row count and schema releases)", "progress: release (one-shot "
                          "mechanisms: elapsed only, the rows are streamed once)"]
    train_line = next(line for line in lines if line.startswith("progress: train"))
    assert "0/5 steps (0%)" in train_line and "ε = " in train_line  # steps_per_epoch × max_epochs: public
    assert "progress: sample" in stages
    assert (tmp_path / "train.log").read_text().count("progress: train") >= 1


def _entry():
    spec = importlib.util.spec_from_file_location("train_entry_progress", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interrupted_tuning_run_says_it_cannot_be_resumed(tmp_path, capsys):
    entry = _entry()
    cfg = OmegaConf.create({"tune": {"eta": 1}, "output_dir": str(tmp_path)})
    (tmp_path / "ledger.json").write_text("{}")  # the selection's release is on disk
    with pytest.raises(SystemExit) as stop:
        entry._stopped(cfg, "Ctrl-C", entry.EXIT_SIGINT)
    err = capsys.readouterr().err
    assert stop.value.code == 130
    assert "cannot be resumed" in err and "resume=last" not in err and "candidate" in err


def test_interrupted_before_the_first_release_says_nothing_was_spent(tmp_path, capsys):
    entry = _entry()
    with pytest.raises(SystemExit) as stop:
        entry._stopped(OmegaConf.create({"output_dir": str(tmp_path)}), "Ctrl-C", entry.EXIT_SIGINT)
    assert stop.value.code == 130 and "nothing was spent" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["seed=abc"], ["privacy.noise_seed=x"], ["model=ppem", "model.sensitive=age"],
                                  ["privacy.epsilon=-1"], ["privacy.delta=abc"], ["data.batch_size=0"]])
def test_config_mistakes_are_refused_before_torch_loads(argv, tmp_path):
    args = [*argv, f"output_dir={tmp_path / 'run'}"]
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', 'train.py'); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"rc = m.cli({args!r}); print('torch' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-2:] == ["False", "2"], out.stderr
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing written (Hydra made the folder only)


def test_sample_into_a_folder_is_one_error_line(tmp_path):
    code = ("import sys; from lightning_dp.sample import main; "
            f"rc = main(['{tmp_path / 'no.ckpt'}', '--num-rows', '5', '--out', '{tmp_path}']); "
            "print('torch' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "2"], out.stderr
    assert out.stderr.count("\n") == 1 and "is a folder" in out.stderr


def test_ctrl_c_saves_and_exits_130_counting_dp_sgd_steps(tmp_path):
    env = {**os.environ, "LIGHTNING_DP_PROGRESS": "1", "LIGHTNING_DP_PROGRESS_SECONDS": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "train.py", "model=dp_gan", "trainer.max_epochs=1000", "trainer.enable_progress_bar=false",
           f"output_dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    seen = []
    for line in proc.stdout:  # wait until DP-SGD has taken steps
        seen.append(line)
        if line.startswith("progress: train") and " 0/" not in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    log = "".join(seen) + out
    assert proc.returncode == 130, err[-2000:]
    assert "DP-SGD steps" in next(line for line in seen if line.startswith("progress: train"))
    assert "stopped by Ctrl-C; the run was saved. Continue it with: " in err and "resume=last" in err
    assert "Traceback" not in err
    assert "Stopped by Ctrl-C after " in log and " DP-SGD steps; saved " in log
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
