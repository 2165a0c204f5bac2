"""GEM against its peers AIM and MST (``dpmm``) on the same data, split, evaluator and machine.

Every system runs in its own subprocess (one thread), timed by wall clock with its peak resident memory
(``ru_maxrss`` of the child). GEM is ``train.py experiment=gem_<data>``; AIM and MST run from ``dpmm`` in a
separate virtual environment that this script creates (``bench/.peers-venv``, ``pip install dpmm==0.1.9``; never a
dependency of the project) on the very rows GEM trains on, with the schema's public bounds and categories as their
domain and uniform bins on those bounds, so neither spends budget on preprocessing. Each synthetic table
(``--num-rows``) is scored with the 10-classifier train-on-synthetic/test-on-real protocol (``audits.utility.tstr``,
preset ``pearl``: ROC-AUC from hard labels and from scores, averaged over the classifiers) and the average 2-way
marginal total variation against the real held-out rows (``audits.fidelity.two_way_marginal_error`` / 2, numeric
columns in 10 real-quantile bins).

``--validate`` trains on 80% of the training split and scores on the other 20% (the test split is never read):
for choosing settings. Without it, the UCI test split is the reference.

    python bench/peers.py --data adult --systems gem aim mst --seeds 0 1 2 [--aim-rounds 48] [--validate]
                          [--set model.module.bins=16 ...] [--results runs.jsonl]
    python bench/peers.py --merge runs.jsonl      # the table of every run recorded in the file(s)

``--results`` appends one JSON line per system and seed (figures, wall time, peak memory, the overrides, the split,
the host, its core count and load average at the start): a long bench can run as several calls (e.g. AIM alone,
then GEM's seeds), and ``--merge`` prints their table; the lines say what machine state each was taken in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PEERS_VENV = ROOT / "bench" / ".peers-venv"
DPMM = "dpmm==0.1.9"
MISSING = "<missing>"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class TimedOut(RuntimeError):
    """A system ran past ``--timeout``: recorded as not finished."""


def run_child(cmd: list[str], *, log: Path, timeout: float | None = None) -> tuple[float, float, float]:
    """Run ``cmd`` (one thread), return (wall seconds, peak RSS in MiB, CPU seconds: user + system, the figure
    that a busy shared machine changes least); raise with the log's tail on failure,
    :class:`TimedOut` (after killing it) past ``timeout`` seconds."""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if timeout is not None and time.perf_counter() - start > timeout:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise TimedOut(f"{' '.join(cmd[:4])} ... did not finish in {timeout:.0f} s")
            time.sleep(0.5)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed; see {log}:\n" + "".join(log.read_text().splitlines(True)[-15:]))
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def peers_python() -> Path:
    """The peers' interpreter, creating ``bench/.peers-venv`` with dpmm on first use."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", DPMM], check=True)
    return python


def data_overrides(data: str, validate: bool, folder: Path) -> list[str]:
    from bench.reproduce import compose_cfg, validation_overrides

    if data == "wide":  # generated rows: the validation rows are a fresh draw (seed 2), the test rows seed 1
        from bench.wide_table import write

        train, test, schema = write(folder / "wide", train_rows=30000, test_rows=10000, test_seed=2 if validate else 1)
        return ["experiment=gem_wide", f"data.path={train}", f"data.test_path={test}", f"data.schema={schema}"]
    base = [f"experiment=gem_{data}"]
    return base + (validation_overrides(compose_cfg(base), folder) if validate else [])


def real_rows(overrides: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, Any]:
    """The training rows GEM sees and the held-out reference (the data module's own splits; nothing released)."""
    from bench.reproduce import compose_cfg
    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.privacy import mechanisms as mech
    from lightning_dp.privacy.ledger import PrivacyLedger

    cfg = compose_cfg(overrides)
    dm = PrivateDataModule(**cfg.data)
    dm.prepare(PrivacyLedger(target_epsilon=1e6, delta=1e-5), generator=mech.noise_generator(0), private_use=True)
    return dm.train_frame, dm.holdout, dm.encoder.schema


def peer_inputs(train: pd.DataFrame, schema: Any, folder: Path) -> tuple[Path, Path]:
    """The training rows as the peers read them (missing categories as a category) and their public domain."""
    frame, columns = train.copy(), {}
    for c in schema.columns:
        if c.type == "categorical":
            cats = list(c.categories) + ([MISSING] if c.missing else [])
            frame[c.name] = frame[c.name].astype(object).where(frame[c.name].notna(), MISSING).astype(str)
            columns[c.name] = {"categories": cats}
        else:
            columns[c.name] = {"lower": float(c.bounds[0]), "upper": float(c.bounds[1]), "integer": bool(c.integer)}
    path, domain = folder / "peers_train.csv", folder / "peers_domain.json"
    frame.to_csv(path, index=False)
    domain.write_text(json.dumps({"columns": columns}))
    return path, domain


def as_categories(column: pd.Series, categories: list[str]) -> pd.Series:
    """A categorical column of a synthetic CSV in the schema's category strings, NaN where missing.

    ``read_csv`` turns numeric-looking categories into numbers (``0``, or ``0.0`` when the column also holds a
    missing value) while the real frames hold the schema's strings (``"0"``): compared as they are, every category
    of such a column mismatches (Cervical's 0/1 columns). A value equal as a number to a category becomes that
    category; ``<missing>`` (the peers' token) and NaN become NaN; anything else keeps its string.
    """
    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    by_number = {number(cat): cat for cat in reversed(categories) if number(cat) is not None}

    def one(v: Any) -> Any:
        if v is None or (isinstance(v, float) and np.isnan(v)) or str(v) == MISSING:
            return np.nan
        text = str(v)
        return text if text in categories else by_number.get(number(text), text)

    return column.astype(object).map(one).astype(object)


def score(synth: pd.DataFrame, test: pd.DataFrame, schema: Any, seed: int) -> dict[str, float]:
    from audits.fidelity import two_way_marginal_error
    from audits.utility import tstr

    cats = [c.name for c in schema.columns if c.type == "categorical"]
    for c in schema.columns:
        if c.type == "categorical":
            synth[c.name] = as_categories(synth[c.name], [str(v) for v in c.categories])
    tv = float(two_way_marginal_error(test, synth[test.columns], categorical=cats)["mean"] / 2)
    if synth[schema.label].nunique(dropna=True) < 2:  # no classifier can be trained: each would predict one class
        print(f"  the synthetic label holds one class only: ROC 0.5 (a constant predictor's), seed {seed}", flush=True)
        return {"roc_hard": 0.5, "roc_score": 0.5, "tv2": tv, "one_class": True}
    res = tstr(synth[test.columns], test, label=schema.label, classifiers="pearl", seed=seed,
               categorical=[c for c in cats if c != schema.label])
    avg = res.summary["average"]
    return {"roc_hard": float(avg["roc_auc_hard"]), "roc_score": float(avg["roc_auc"]), "tv2": tv}


def run_system(system: str, seed: int, args: argparse.Namespace, overrides: list[str], peer_files: tuple[Path, Path],
               folder: Path) -> tuple[pd.DataFrame, float, float, float]:
    out = folder / f"{system}_{seed}"
    out.mkdir(parents=True, exist_ok=True)
    if system == "gem":
        cmd = [sys.executable, "train.py", *overrides, f"seed={seed}", f"output_dir={out / 'run'}",
               f"num_samples={args.num_rows}", f"privacy.epsilon={args.epsilon}", f"privacy.delta={args.delta}",
               "trainer.enable_progress_bar=false", *args.set]
        wall, rss, cpu = run_child(cmd, log=out / "log.txt", timeout=args.timeout)
        return pd.read_csv(out / "run" / "synthetic.csv"), wall, rss, cpu
    train_csv, domain = peer_files
    cmd = [str(peers_python()), "bench/peers_worker.py", "--model", system, "--train", str(train_csv), "--domain",
           str(domain), "--epsilon", str(args.epsilon), "--delta", str(args.delta), "--num-rows", str(args.num_rows),
           "--seed", str(seed), "--bins", str(args.peer_bins), "--out", str(out / "synthetic.csv")]
    if system == "aim" and args.aim_rounds:
        cmd += ["--rounds", str(args.aim_rounds)]
    wall, rss, cpu = run_child(cmd, log=out / "log.txt", timeout=args.timeout)
    return pd.read_csv(out / "synthetic.csv"), wall, rss, cpu


def fmt(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def machine_state() -> dict[str, Any]:
    """Where and under what load a figure was taken (stated beside merged results)."""
    return {"host": platform.node(), "cpus": os.cpu_count(), "load1": round(os.getloadavg()[0], 2),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def append_result(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, appended and flushed (a kill loses at most the line being written)."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def print_table(records: list[dict[str, Any]], real: dict[str, float] | None) -> None:
    """The markdown table: real rows, then each system's mean ± std over its seeds."""
    rows: dict[str, dict[str, list[float]]] = {}
    unfinished = {r["label"]: r["timeout"] for r in records if "timeout" in r}
    for r in records:
        if "timeout" in r:
            continue
        for k in ("roc_hard", "roc_score", "tv2", "wall", "cpu", "rss"):
            if k in r:  # CPU time: records from before it was recorded lack it
                rows.setdefault(r["label"], {}).setdefault(k, []).append(r[k])
    print("\n| system | seeds | ROC hard | ROC score | 2-way TV | wall s | CPU s | peak MiB |\n"
          "|---|---|---|---|---|---|---|---|")
    if real:
        print(f"| real training rows | | {real['roc_hard']:.3f} | {real['roc_score']:.3f} | {real['tv2']:.3f} | | | |")
    for label, v in rows.items():
        print(f"| {label} | {len(v['wall'])} | {fmt(v['roc_hard'])} | {fmt(v['roc_score'])} | {fmt(v['tv2'])} | "
              f"{fmt(v['wall'], 0)} | {fmt(v['cpu'], 0) if 'cpu' in v else '–'} | {fmt(v['rss'], 0)} |")
    for label, timeout in unfinished.items():
        if label not in rows:
            print(f"| {label} | | did not finish in {timeout:.0f} s | | | > {timeout:.0f} | | |")


def merge(paths: list[str]) -> None:
    records = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    real = next((r for r in reversed(records) if r["system"] == "real"), None)
    runs = [r for r in records if r["system"] != "real"]
    for r in records:
        where = f"{r['split']}; {r['machine']['host']} ({r['machine']['cpus']} cores, load {r['machine']['load1']}) " \
                f"at {r['machine']['utc']}"
        what = f"seed {r['seed']}" if r["system"] != "real" else "real rows"
        what += f" (did not finish in {r['timeout']:.0f} s)" if "timeout" in r else ""
        print(f"  {r['label']} {what}: {where}; overrides {r.get('overrides') or 'none'}")
    print_table(runs, real)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--merge":
        merge(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="adult", choices=["adult", "cervical", "wide"],
                        help="wide: bench/wide_table.py's 43-column claims-like rows (30,000 training, 10,000 test)")
    parser.add_argument("--systems", nargs="+", default=["gem", "aim", "mst"], choices=["gem", "aim", "mst"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--peer-seeds", nargs="+", type=int, default=None, help="AIM's and MST's seeds (default: --seeds)")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--num-rows", type=int, default=11000)
    parser.add_argument("--aim-rounds", type=int, default=48, help="AIM's T (0: dpmm's default, 16 per column)")
    parser.add_argument("--peer-bins", type=int, default=32)
    parser.add_argument("--validate", action="store_true", help="score on a validation carve of the training split")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for GEM's train.py")
    parser.add_argument("--skip-real", action="store_true", help="do not score the real training rows")
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=None, help="stop a system after this many seconds "
                        "(recorded as not finished)")
    parser.add_argument("--results", default=None, help="append each run's figures to this JSON-lines file")
    args = parser.parse_args()
    results = Path(args.results) if args.results else None
    label = {"gem": "GEM (ours)", "aim": f"AIM-{args.aim_rounds or 'default'} (dpmm)", "mst": "MST (dpmm)"}

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        overrides = data_overrides(args.data, args.validate, folder / "validation")
        train, test, schema = real_rows(overrides)
        peer_files = peer_inputs(train, schema, folder) if set(args.systems) - {"gem"} else (Path(), Path())
        where = "validation carve (20% of the training split)" if args.validate else "test split"
        print(f"== {args.data}: {len(train):,} training rows, {len(test):,} real rows scored ({where}); "
              f"{args.num_rows:,} synthetic rows; ε = {args.epsilon:g}, δ = {args.delta:g}; seeds {args.seeds}; "
              f"one thread per system; GEM overrides {args.set or 'none'}", flush=True)
        split = f"{args.data}, {where}, ε = {args.epsilon:g}, δ = {args.delta:g}, {args.num_rows} rows"
        real = None if args.skip_real else score(train.copy(), test, schema, 0)
        if real and results:
            append_result(results, {"system": "real", "label": "real training rows", "seed": 0, "split": split,
                                    **real, "machine": machine_state()})
        if real:
            print(f"  real training rows: ROC hard {real['roc_hard']:.3f}, score {real['roc_score']:.3f}, "
                  f"2-way TV {real['tv2']:.3f}", flush=True)
        records: list[dict[str, Any]] = []
        for system in args.systems:
            for seed in args.seeds if system == "gem" or args.peer_seeds is None else args.peer_seeds:
                state = machine_state()
                try:
                    synth, wall, rss, cpu = run_system(system, seed, args, overrides, peer_files, folder)
                except TimedOut as err:
                    print(f"  {system} seed {seed}: {err}", flush=True)
                    if results:
                        append_result(results, {"system": system, "label": label[system], "seed": seed, "split": split,
                                                "timeout": args.timeout, "machine": state})
                    continue
                s = score(synth, test, schema, seed)
                record = {"system": system, "label": label[system], "seed": seed, "split": split, **s, "wall": wall,
                          "cpu": cpu, "rss": rss, "overrides": args.set if system == "gem" else [], "machine": state}
                records.append(record)
                if results:
                    append_result(results, record)
                print(f"  {system} seed {seed}: ROC hard {s['roc_hard']:.3f}, score {s['roc_score']:.3f}, 2-way TV "
                      f"{s['tv2']:.3f}; {wall:.0f} s wall, {cpu:.0f} s CPU, peak {rss:.0f} MiB", flush=True)
        print_table(records, real)


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
