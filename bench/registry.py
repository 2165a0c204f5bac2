"""Overhead of the budget registry per DP-SGD step, on SQLite and PostgreSQL, against the fsync'd ledger write.

    python bench/registry.py [--steps 300] [--postgres postgresql://USER@HOST:PORT/DB]

Each DP-SGD step records one subsampled-Gaussian use in the run's ledger before its noise is used. Three ways
of making that durable are timed, step by step, on the same ledger history:

* ``ledger.json`` : today's write alone (atomic: temporary file, fsync, rename, fsync of the folder);
* ``+ SQLite``    : the registry's transaction first (lock the data set's row, check the run's lease and the
                    budget, update the run and its release row; WAL with synchronous=FULL), then ``ledger.json``;
* ``+ PostgreSQL``: the same on a PostgreSQL server (``SELECT ... FOR UPDATE``; the server's default fsync).

A second table times how a run's data set is identified before its first release: the keyed fingerprint and the
keyed bottom-k sketch of n canonical row digests, and registering a new version against V registered versions (the
overlap check reads every sketch).

Without ``--postgres`` (or ``$LIGHTNING_DP_TEST_POSTGRES``) a throwaway server is started with
``scripts/postgres.sh`` (PostgreSQL from Debian's packages) and stopped at the end. Figures are wall-clock
milliseconds per step on this machine, with the run's ε computation included in every row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_dp.budget.registry import Registry  # noqa: E402
from lightning_dp.privacy.ledger import PrivacyLedger, Release  # noqa: E402

STEP = dict(name="dp_sgd/discriminator", mechanism="subsampled_gaussian", sensitivity=1.0, noise_multiplier=1.1,
            sample_rate=0.01)


def _ledger(folder: Path) -> PrivacyLedger:
    ledger = PrivacyLedger(target_epsilon=1e6, delta=1e-5)
    ledger.record(Release(name="data/num_rows", mechanism="gaussian", sensitivity=1.0, noise_multiplier=50.0))
    ledger.persist = lambda led: led.save_json(str(folder / "ledger.json"))
    return ledger


def _time_steps(ledger: PrivacyLedger, steps: int) -> list[float]:
    for _ in range(5):  # warm-up: caches, connections, the WAL file
        ledger.record(Release(**STEP))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        ledger.record(Release(**STEP))
        times.append(time.perf_counter() - start)
    return times


def with_registry(url: str, folder: Path) -> Callable[[int], list[float]]:
    def run(steps: int) -> list[float]:
        reg = Registry(url)
        digests = np.arange(1000, dtype=np.uint64)
        dataset = reg.dataset_for(reg.fingerprint(digests, kind="tabular"), budget=1e7)
        ledger = _ledger(folder)
        lease = reg.open_run(run_id=f"bench-{time.time_ns()}", dataset=dataset, ledger=ledger, output_dir=folder)
        ledger.register = lambda led: reg.record(lease, led)
        try:
            return _time_steps(ledger, steps)
        finally:
            reg.close_run(lease)
            reg.close()

    return run


def identify_costs(url: str) -> list[str]:
    """Rows of the second table: fingerprint + sketch of n rows, then ``dataset_for`` of a new version against V."""
    rows, reg = [], Registry(url)
    rng = np.random.default_rng(0)
    try:
        for n in (10_000, 100_000, 1_000_000):
            digests = rng.integers(0, 2**63, size=n, dtype=np.uint64)
            start = time.perf_counter()
            reg.fingerprint(digests, kind="tabular"), reg.sketch(digests)
            rows.append(f"| fingerprint + sketch of {n:,} rows | {(time.perf_counter() - start) * 1e3:.1f} |")
        registered = 0
        for versions in (10, 100):
            while registered < versions:  # disjoint data sets of 5000 rows each
                digests = rng.integers(0, 2**63, size=5000, dtype=np.uint64)
                reg.dataset_for(reg.fingerprint(digests, kind="tabular"), sketch=reg.sketch(digests))
                registered += 1
            digests = rng.integers(0, 2**63, size=5000, dtype=np.uint64)
            fp, sketch = reg.fingerprint(digests, kind="tabular"), reg.sketch(digests)
            start = time.perf_counter()
            reg.dataset_for(fp, sketch=sketch)
            registered += 1
            rows.append(f"| register a new version against {versions} registered ({reg.dialect}) | "
                        f"{(time.perf_counter() - start) * 1e3:.1f} |")
    finally:
        reg.close()
    return rows


def _row(name: str, times: list[float], base: float | None) -> str:
    ms = np.array(times) * 1e3
    extra = "" if base is None else f" | {(statistics.median(times) - base) * 1e3:+.2f}"
    return (f"| {name} | {np.median(ms):.2f} | {np.percentile(ms, 95):.2f} | {ms.mean():.2f}"
            f"{extra if base is not None else ' | —'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--postgres", default=os.environ.get("LIGHTNING_DP_TEST_POSTGRES"))
    args = parser.parse_args()
    started = None
    if not args.postgres:
        started = tempfile.mkdtemp(prefix="ldp-bench-postgres.")
        args.postgres = subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "start", started], check=True,
                                       capture_output=True, text=True).stdout.strip()
    try:
        with tempfile.TemporaryDirectory(dir=ROOT) as tmp:  # the project's disk, where runs write
            folder = Path(tmp)
            results = {"ledger.json (fsync'd, today)": _time_steps(_ledger(folder), args.steps),
                       "registry on SQLite + ledger.json": with_registry(str(folder / "budget.sqlite"), folder)(args.steps),
                       "registry on PostgreSQL + ledger.json": with_registry(args.postgres, folder)(args.steps)}
            identify = identify_costs(str(folder / "identify.sqlite"))
            identify += [r for r in identify_costs(args.postgres) if "register" in r]
    finally:
        if started:
            subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "stop", started], check=False,
                           capture_output=True)
    base = statistics.median(next(iter(results.values())))
    print(f"Durable record of one DP-SGD step, {args.steps} steps each (ms per step, wall clock):\n")
    print("| how | median | p95 | mean | median overhead vs ledger.json |")
    print("|---|---|---|---|---|")
    for i, (name, times) in enumerate(results.items()):
        print(_row(name, times, None if i == 0 else base))
    print("\nIdentifying the run's data set before its first release (ms, wall clock, once per run):\n")
    print("| what | ms |")
    print("|---|---|")
    print("\n".join(identify))


if __name__ == "__main__":
    main()
