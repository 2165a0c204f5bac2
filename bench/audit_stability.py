"""Stability of the audit verdict over independent runs of the default job (``python train.py audit=default``).

Each run is the shipped config with ``audit=default`` (default training length, the same seed: only the privacy
noise, drawn from OS entropy, differs between runs), trained with ``lightning_dp.train.train`` and audited with
``audits.report.audit_run`` as ``train.py`` does. A verdict decided on a confidence interval should never flip
between pass and fail from one independent run to the next.

    python bench/audit_stability.py --runs 20                   # breast cancer, DP-MERF, ε = 1 (the default job)
    python bench/audit_stability.py --runs 5 --data adult       # the README's Adult example

Prints, per threshold and overall, how often its status was pass / fail / inconclusive, and how many pairs of
runs disagreed between pass and fail (the goal is 0), with the median value and interval of each statistic.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from audits.report import audit_run
from lightning_dp.train import train

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["audit=default", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def one_run(folder: Path, overrides: list[str]) -> dict:
    """Train the default job into ``folder`` and audit it; the audit's report.json and its status."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*COMMON, f"output_dir={folder}", *overrides])
    result = train(cfg)
    audit = audit_run(
        cfg.audit,
        datamodule=result["datamodule"],
        result=result,
        ledger=result["privacy_ledger"],
        config=result["config"],
    )
    return {"status": audit["status"], "report": json.loads(Path(audit["json"]).read_text())}


def flips(statuses: list[str]) -> int:
    """Pairs of runs of which one passed and the other failed."""
    return sum({a, b} == {"pass", "fail"} for a, b in combinations(statuses, 2))


def table(runs: list[dict]) -> str:
    """Counts of pass / fail / inconclusive per threshold and overall, pass-fail flips, the median value and
    interval, and the worst bound over the runs (the largest upper bound of a ``≤`` limit, the smallest lower
    bound of a ``≥`` one): how far the closest run stayed from inconclusive."""
    rows: dict[str, list[dict]] = {}
    for run in runs:
        for v in run["report"]["verdicts"]:
            attack = f" ({v['description'].split(' ')[0]})" if v["check"] == "membership" else ""
            rows.setdefault(f"{v['check']} {v['criterion']}{attack}", []).append(v)
    width = max(len(k) for k in [*rows, "overall (privacy verdict)"]) + 2
    head = (
        f"{'threshold':<{width}}{'pass':>5}{'fail':>5}{'inc.':>5}{'flips':>6}   median value [median interval]"
        "  worst bound  limit"
    )
    lines = [head, "-" * len(head)]
    for key, vs in rows.items():
        counts = Counter(v["status"] for v in vs)
        values = [v["value"] for v in vs if v["value"] is not None]
        bounds = [v["interval"] for v in vs if v["interval"] is not None]
        med = f"{np.median(values):.3g}" if values else "n/a"
        ci = (
            f"[{np.median([b[0] for b in bounds]):.3g}, {np.median([b[1] for b in bounds]):.3g}]"
            if bounds
            else ""
        )
        upper = vs[0]["op"] == "≤"
        worst = (
            (max(b[1] for b in bounds) if upper else min(b[0] for b in bounds)) if bounds else float("nan")
        )
        role = "" if vs[0]["gates"] else "  (expectation)"
        lines.append(
            f"{key:<{width}}{counts['pass']:>5}{counts['fail']:>5}{counts['inconclusive']:>5}"
            f"{flips([v['status'] for v in vs]):>6}   {f'{med} {ci}':<31}{worst:>12.3g}  {vs[0]['op']} "
            f"{vs[0]['limit']:g}{role}"
        )
    overall = [r["status"] for r in runs]
    counts = Counter(overall)
    lines.append("-" * len(head))
    lines.append(
        f"{'overall (privacy verdict)':<{width}}{counts['pass']:>5}{counts['fail']:>5}{counts['inconclusive']:>5}"
        f"{flips(overall):>6}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="independent runs of the default job")
    parser.add_argument(
        "--data", default="breast_cancer", help="data set of the job (default: the default's)"
    )
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    parser.add_argument(
        "--save", default=None, help="write every run's statuses and verdicts to this JSON file"
    )
    args = parser.parse_args()
    overrides = [] if args.data == "breast_cancer" else [f"data={args.data}"]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out or tmp)
        for i in range(args.runs):
            t0 = time.time()
            run = one_run(base / f"run{i:02d}", overrides)
            runs.append(run)
            lines = run["report"]["summary"]
            print(f"run {i + 1}/{args.runs}: {run['status'].upper()} in {time.time() - t0:.0f} s", flush=True)
            for line in lines:
                print(f"    {line[:160]}", flush=True)
    if args.save:
        slim = [{"status": r["status"], "verdicts": r["report"]["verdicts"]} for r in runs]
        Path(args.save).write_text(json.dumps(slim, indent=1))
    print(f"\n{args.runs} runs of `python train.py audit=default` (data={args.data}):\n")
    print(table(runs))


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
