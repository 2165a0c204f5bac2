"""Fault matrix: the real ``train.py`` under read-only folders, a full disk, SIGTERM and kill -9.

For each fault it prints the exit code, the ε on disk (``ledger.json``), what the folder holds, and
whether ``resume=last`` then finishes the run (exit code, final ε, synthetic file). Faults on file
systems use small tmpfs mounts, so they need root (they are skipped with a note otherwise).

    python bench/faults.py            # about 10 minutes on 2 CPU cores
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_SHOT = ["trainer.enable_progress_bar=false"]
DP_SGD = ["model=dp_gan", "data.batch_size=64", "model.module.batch_size=64", "trainer.max_epochs=60",
          "trainer.enable_progress_bar=false", "callbacks.checkpoint.every_n_steps=20"]


def _mount(path: Path, *options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _start(out: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "train.py", f"output_dir={out}", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _watch(proc: subprocess.Popen, lines: list[str]) -> threading.Thread:
    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def _until(lines: list[str], marker: str, proc: subprocess.Popen, timeout: float = 600) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if any(marker in line for line in lines):
            return True
        time.sleep(0.05)
    return False


def _state(out: Path) -> tuple[str, str]:
    ledger = out / "ledger.json"
    eps = "–"
    if ledger.is_file():
        try:
            eps = f"{json.loads(ledger.read_text())['epsilon']:.4f}"
        except (OSError, ValueError, KeyError):
            eps = "unreadable"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
                   and not p.name.startswith(".write-test")) if out.is_dir() else []
    keep = [f for f in files if not f.startswith((".hydra/", "logs/"))]
    return eps, ", ".join(keep) or "nothing"


def _resume(out: Path) -> str:
    proc = subprocess.run([sys.executable, "train.py", f"output_dir={out}", "resume=last",
                           "trainer.enable_progress_bar=false"], cwd=ROOT, capture_output=True, text=True)
    eps, _ = _state(out)
    synth = "synthetic written" if any(out.glob("synthetic.*")) else "no synthetic file"
    last = (proc.stderr.strip().splitlines() or [""])[-1][:120]
    return f"exit {proc.returncode}, ε {eps}, {synth}" + (f" ({last})" if proc.returncode else "")


def _row(name: str, code: int | None, out: Path, resume: bool = True) -> None:
    """One line: the state left by the fault, then (``resume``) what ``resume=last`` makes of it."""
    eps, files = _state(out)
    after = _resume(out) if resume else "not needed: nothing was spent"
    print(f"| {name} | {code} | {eps} | {files} | {after} |", flush=True)


def fault_readonly(work: Path, checkpoints_only: bool) -> None:
    mnt = work / ("ro_ckpt" if checkpoints_only else "ro")
    out = mnt / "run" if not checkpoints_only else work / "rw_run"
    target = out / "checkpoints" if checkpoints_only else mnt
    if checkpoints_only:
        target.mkdir(parents=True, exist_ok=True)
    if not _mount(target, "size=8m", "ro"):
        print(f"| read-only {'checkpoints/' if checkpoints_only else 'output folder'} | skipped: mount needs root | | | |")
        return
    try:
        proc = subprocess.run([sys.executable, "train.py", f"output_dir={out}", *ONE_SHOT], cwd=ROOT,
                              capture_output=True, text=True)
        err = (proc.stderr.strip().splitlines() or [""])[-1][:100]
        _row(f"read-only {'checkpoints/' if checkpoints_only else 'output folder'} ({err})", proc.returncode, out,
             resume=False)
    finally:
        _umount(target)


def fault_full_disk(work: Path) -> None:
    mnt = work / "full"
    if not _mount(mnt, "size=96m"):
        print("| full disk | skipped: mount needs root | | | |")
        return
    try:
        out = mnt / "run"
        proc = _start(out, DP_SGD)
        lines: list[str] = []
        _watch(proc, lines)
        _until(lines, "DP-SGD on", proc)
        time.sleep(3)
        filler = mnt / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=200"], capture_output=True)
        code = proc.wait()
        err = next((ln.strip()[:110] for ln in reversed(lines) if ln.startswith("error:")), "")
        eps, files = _state(out)
        filler.unlink()
        print(f"| full disk during DP-SGD training ({err}) | {code} | {eps} | {files} | {_resume(out)} |", flush=True)
        if "error:" not in err:
            print("  (the run ended before the disk filled; raise trainer.max_epochs)")
    finally:
        _umount(mnt)


def fault_signal(work: Path, name: str, args: list[str], marker: str, delay: float, sig: int) -> None:
    out = work / name.replace(" ", "_")
    proc = _start(out, args)
    lines: list[str] = []
    _watch(proc, lines)
    _until(lines, marker, proc) if not marker.startswith("file:") else _until_file(out / marker[5:], proc)
    time.sleep(delay)
    proc.send_signal(sig)
    code = proc.wait()
    _row(name, code, out)


def _until_file(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not path.exists():
        time.sleep(0.05)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="faults_"))
    print("| fault | exit code | ε on disk | files in the run folder | resume=last |")
    print("|---|---|---|---|---|")
    fault_readonly(work, checkpoints_only=False)
    fault_readonly(work, checkpoints_only=True)
    fault_full_disk(work)
    fault_signal(work, "SIGTERM during DP-SGD training", DP_SGD, "DP-SGD on", 5.0, signal.SIGTERM)
    fault_signal(work, "kill -9 during the one-shot release", ONE_SHOT, "training rows", 0.0, signal.SIGKILL)
    fault_signal(work, "kill -9 during DP-SGD training", DP_SGD, "DP-SGD on", 5.0, signal.SIGKILL)
    fault_signal(work, "kill -9 during sampling", [*ONE_SHOT, "num_samples=3000000"], "max_epochs", 0.5,
                 signal.SIGKILL)
    fault_signal(work, "kill -9 during the audit", [*ONE_SHOT, "audit=default"], "file:synthetic.csv", 0.5,
                 signal.SIGKILL)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
