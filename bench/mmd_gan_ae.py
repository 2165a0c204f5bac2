"""The MMD-GAN for synthetic medical records of "Distribution Distance Measures in Generative and Privacy Models"
(Diesendruck 2019, Ch. 4) on Cervical and Adult, audited like the thesis: utility, fidelity, presence and
attribute disclosure beside its figures.

Per data set and seed, through the real entry points (subprocesses):

    python train.py model=mmd_gan_ae data=D trainer.max_epochs=E seed=S output_dir=RUN
    python -m audits RUN/checkpoints/last.ckpt --real D --holdout D --out AUDIT --seed S

and the numbers are read from ``AUDIT/report.json``. The audit samples as many rows as the real training rows
(the thesis' "same size as the raw data") and draws three equal candidate sets: members (training rows),
non-members and the baseline reference S_base (held-out rows), as in the thesis (after Choi et al. 2017):

* utility: train on synthetic, test on real (TSTR), ROC-AUC averaged over the audit's classifiers, beside the
  same classifiers trained on the real training rows (the thesis: "similar prediction performance", no number);
* fidelity: mean total variation (categorical columns), mean KS (numeric), 2-way-marginal L1 and MMD² of the
  synthetic rows against the real training rows, beside held-out real rows against them (a noise floor; the
  thesis shows marginal histograms and correlation matrices that "agree", no number);
* presence disclosure: flag a candidate iff a synthetic row lies within distance r; the largest r with
  precision > 0.55 (the thesis' rule) and the sensitivity there (thesis: r = 9.5, sensitivity 0.0005);
* attribute disclosure: half the columns known, 5 nearest synthetic rows impute the rest, correct within 5%
  (thesis: sensitivity 0.31, precision 0.72; with S_base as the reference ≈ 0.30 / 0.70).

The thesis makes no DP claim and neither do these runs (``privacy=none``: only the row count is a DP release).

    python bench/mmd_gan_ae.py [--quick] [--seeds 3] [--out DIR] [--only LABEL ...]
    python bench/reproduce.py --table mmd_gan_ae_ehr [--quick] [--write docs/results.md]

The runs, epochs and the thesis' figures are the ``mmd_gan_ae_ehr`` table of ``bench/paper_tables.yaml``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "bench" / "paper_tables.yaml"
TABLE = "mmd_gan_ae_ehr"
AUDIT_EXIT_OK = (0, 1, 4)  # pass, fail, inconclusive: a report was written
# (key, row title, thesis value or words); the key reads report.json (see :func:`metrics`)
ROWS = [
    ("tstr_roc", "Utility: TSTR ROC-AUC (score), mean over classifiers", "utility"),
    ("tstr_roc_hard", "Utility: TSTR ROC-AUC (hard)", "utility"),
    ("mean_tv", "Fidelity: mean TV, categorical columns ↓", "fidelity"),
    ("mean_ks", "Fidelity: mean KS, numeric columns ↓", "fidelity"),
    ("two_way", "Fidelity: 2-way marginal L1 ↓", "fidelity"),
    ("mmd2", "Fidelity: MMD² ↓", "fidelity"),
    ("presence_r", "Presence: r* (largest r with precision > 0.55)", "presence_r"),
    ("presence_sens", "Presence: sensitivity at r*", "presence_sensitivity"),
    ("presence_prec", "Presence: precision at r*", "presence_precision"),
    ("presence_conf", "Presence: sensitivity at the confident r* (the audit's verdict)", None),
    ("attr_sens", "Attribute: sensitivity (5 NN, half known, 5%)", "attribute_sensitivity"),
    ("attr_prec", "Attribute: precision", "attribute_precision"),
    ("attr_medgan_sens", "Attribute, medGAN's binary definition: sensitivity", None),
    ("attr_medgan_prec", "Attribute, medGAN's binary definition: precision", None),
    ("membership_auc", "Membership: DCR attack ROC-AUC (not in the thesis)", None),
]


def load_table(path: Path = REGISTRY) -> Any:
    """The ``mmd_gan_ae_ehr`` table as ``bench/reproduce.py`` loads it."""
    import importlib.util

    name = "bench_reproduce"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "reproduce.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name].load_tables(path)[TABLE]


def data_name(overrides: list[str]) -> str:
    """The ``data=`` of a run's overrides."""
    return next(o.split("=", 1)[1] for o in overrides if o.startswith("data="))


def _run(cmd: list[str], *, ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    """Run a subprocess on one thread; (seconds, output). Raises RuntimeError with the output's tail on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    begin = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - begin
    if proc.returncode not in ok:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{tail}")
    return seconds, proc.stdout


def source_digest() -> str:
    """A digest of the code and configs a run executes (lightning_dp/, audits/, configs/): a cached result is
    reused only when it is unchanged, so a rerun after a model change trains afresh."""
    digest = hashlib.sha256()
    for path in sorted(p for d in ("lightning_dp", "audits", "configs") for p in (ROOT / d).rglob("*")
                       if p.suffix in (".py", ".yaml") and p.is_file()):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def train_and_audit(overrides: list[str], seed: int, folder: Path) -> dict[str, Any]:
    """One seed: ``train.py`` then ``python -m audits`` on its checkpoint; the report and the timings (reused from
    ``folder/result.json`` when a call with the same overrides and the same :func:`source_digest` left one
    there)."""
    data = data_name(overrides)
    run, audit = folder / "run", folder / "audit"
    cached, source = folder / "result.json", source_digest()
    if cached.is_file():
        result = json.loads(cached.read_text())
        if result.get("overrides") == overrides and result.get("source") == source:
            return result
    for stale in (run, audit):  # the bench's own folders, from a call with other overrides or older code
        shutil.rmtree(stale, ignore_errors=True)
    train_s, _ = _run([sys.executable, "train.py", *overrides, f"seed={seed}", f"output_dir={run}",
                       "trainer.enable_progress_bar=false"])
    audit_s, _ = _run([sys.executable, "-m", "audits", str(run / "checkpoints" / "last.ckpt"), "--real", data,
                       "--holdout", data, "--out", str(audit), "--seed", str(seed)], ok=AUDIT_EXIT_OK)
    report = json.loads((audit / "report.json").read_text())
    result = {"report": report, "train_s": train_s, "audit_s": audit_s, "overrides": overrides, "source": source}
    cached.write_text(json.dumps(result))
    return result


def metrics(report: dict[str, Any]) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """(ours, baseline) from an audit report; the baseline is what the same check gives with real rows in place
    of the synthetic ones: real-trained classifiers, held-out rows against the training rows, S_base."""
    checks = report["checks"]
    util, fid = checks["utility"]["summary"], checks["fidelity"]
    pres, attr = checks["presence_disclosure"], checks["attribute_disclosure"]
    ours = {
        "tstr_roc": util["average"].get("roc_auc"),
        "tstr_roc_hard": util["average"].get("roc_auc_hard"),
        "mean_tv": fid["summary"]["mean_tv"], "mean_ks": fid["summary"]["mean_ks"],
        "two_way": fid["summary"]["two_way_marginal"], "mmd2": fid["summary"]["mmd2"],
        "presence_r": pres["r_star"], "presence_sens": pres["sensitivity_at_r_star"],
        "presence_prec": pres["precision_at_r_star"], "presence_conf": pres["sensitivity_at_confident_r_star"],
        "attr_sens": attr["sensitivity"], "attr_prec": attr["precision"],
        "attr_medgan_sens": (attr.get("medgan") or {}).get("sensitivity"),
        "attr_medgan_prec": (attr.get("medgan") or {}).get("precision"),
        "membership_auc": checks["membership"]["attacks"]["dcr"]["auc"],
    }
    ref, pbase, abase = fid["holdout_reference"], pres["baseline"], attr["baseline"]
    base = {
        "tstr_roc": util["real_average"].get("roc_auc"),
        "tstr_roc_hard": util["real_average"].get("roc_auc_hard"),
        "mean_tv": ref["mean_tv"], "mean_ks": ref["mean_ks"], "two_way": ref["two_way_marginal"],
        "mmd2": ref["mmd2"],
        "presence_r": pbase["r_star"], "presence_sens": pbase["sensitivity_at_r_star"],
        "presence_prec": pbase["precision_at_r_star"], "presence_conf": pbase["sensitivity_at_confident_r_star"],
        "attr_sens": abase["sensitivity"], "attr_prec": abase["precision"],
        "attr_medgan_sens": (abase.get("medgan") or {}).get("sensitivity"),
        "attr_medgan_prec": (abase.get("medgan") or {}).get("precision"),
        "membership_auc": None,
    }
    return ours, base


def fmt(values: list[float | None]) -> str:
    """Mean ± sd over seeds (``n/a`` where the check gave no number, e.g. no r reached precision > 0.55)."""
    vals = [float(v) for v in values if v is not None and np.isfinite(v)]
    missing = len(values) - len(vals)
    if not vals:
        return "n/a"
    text = f"{vals[0]:.4g}" if len(vals) == 1 else f"{np.mean(vals):.4g} ± {np.std(vals, ddof=1):.2g}"
    return text + (f" ({missing} n/a)" if missing else "")


def thesis_cell(paper: dict[str, Any], key: str | None) -> str:
    """The thesis' figure for a row of one of its columns, its words where it gives no number, else "–"."""
    value = paper.get(key) if key else None
    return "–" if value is None else str(value)


def collect(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path,
            log: Callable[[str], None], only: list[str] | None = None) -> dict[str, Any]:
    """Train and audit every run of the table (or those labelled ``only``) for seeds 0..seeds−1: per run label, the
    metrics per seed."""
    quick_overrides = table.bench.get("quick_overrides", {})
    results: dict[str, Any] = {}
    for index, run in enumerate(table.runs):
        if only and run.label not in only:
            continue
        shorter = list(quick_overrides.get(run.label, [])) if quick else []
        replaced = {o.split("=", 1)[0] for o in shorter}
        overrides = [*(o for o in run.overrides if o.split("=", 1)[0] not in replaced), *shorter, *extra]
        per_seed = []
        for seed in range(seeds):
            folder = out / f"run{index}_{data_name(overrides)}_seed{seed}"
            res = train_and_audit(overrides, seed, folder)
            per_seed.append({**res, "metrics": metrics(res["report"])})
            log(f"  {run.label} seed {seed}: trained in {res['train_s']:.0f} s, audited in {res['audit_s']:.0f} s")
        results[run.label] = {"overrides": overrides, "seeds": per_seed}
    return results


def section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
            log: Callable[[str], None] = print, only: list[str] | None = None) -> str:
    """Train and audit the table's runs; its Markdown section, ours beside the thesis' Ch. 4 figures."""
    import torch

    begin = time.perf_counter()
    results = collect(table, seeds=seeds, quick=quick, extra=extra, out=out, log=log, only=only)
    minutes = (time.perf_counter() - begin) / 60
    thesis = table.paper[table.runs[0].paper]
    baseline = table.paper.get(table.bench["baseline_row"], {})
    header = ["metric", "thesis (EHR)", "thesis baseline"]
    for label in results:
        header += [f"{label}: ours", "baseline"]
    rows, previous = [], None
    for key, title, paper_key in ROWS:
        cells = [title, *(("″", "″") if paper_key is not None and paper_key == previous else
                          (thesis_cell(thesis, paper_key), thesis_cell(baseline, paper_key)))]
        previous = paper_key
        for res in results.values():
            cells += [fmt([s["metrics"][0][key] for s in res["seeds"]]),
                      fmt([s["metrics"][1][key] for s in res["seeds"]])]
        rows.append(cells)
    runs = []
    for label, res in results.items():
        first = res["seeds"][0]["report"]
        train_s = [s["train_s"] for s in res["seeds"]]
        runs.append(
            f"{label}: `python train.py {' '.join(res['overrides'])} seed=S` then `python -m audits "
            f"RUN/checkpoints/last.ckpt --real {data_name(res['overrides'])} --holdout {data_name(res['overrides'])} "
            f"--out AUDIT --seed S`; {first['inputs']['real']['rows']:,} training rows, "
            f"{first['inputs']['holdout']['rows']:,} held-out, {first['candidates']['members']} candidates per set; "
            f"training {np.mean(train_s):.0f} s per seed (incl. start-up and sampling), audit "
            f"{np.mean([s['audit_s'] for s in res['seeds']]):.0f} s")
    mode = " (quick)" if quick else ""
    lines = [
        f"## {table.name}: {table.title}{mode}",
        "",
        f"`{command}`  ",
        f"{seeds} seed(s) ({', '.join(map(str, range(seeds)))}) per data set; {date.today().isoformat()}; "
        f"{minutes:.1f} min wall-clock on {platform.machine()} CPU (subprocesses on 1 thread, {torch.get_num_threads()} "
        "here); training, the audit's sample and its candidate sets are seeded by the seed.  ",
        f"Thesis: {table.source}. No DP claim (the thesis makes none; `privacy=none`: only the row count is a DP "
        "release).  ",
        f"Code: {code}; `bench/mmd_gan_ae.py`.  ",
        "Runs: " + "; ".join(runs) + ".",
        "",
        markdown(header, rows),
        "",
        "Mean ± sd over seeds. Baseline columns: the same check with real rows in place of the synthetic ones "
        "(utility: classifiers trained on the real training rows; fidelity: held-out rows against the training rows; "
        "disclosure: the held-out reference set S_base as the attacker's source, the thesis' baseline). \"n/a\": a seed "
        "without that number (utility: its synthetic rows have a single label class, so no classifier can be fitted; "
        "presence: no r reached precision > 0.55; medGAN: no 0/1-coded unknown column, or no positive imputed).",
        "",
        "Notes:",
        "",
        *(f"- {n}" for n in table.notes),
        *(f"- Not reproduced: {m}" for m in table.missing),
    ]
    return "\n".join(lines) + "\n"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="seeds per data set (default: the table's)")
    parser.add_argument("--quick", action="store_true", help="fewer epochs (the table's quick_overrides), 1 seed")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs and reports here (and reuse them)")
    parser.add_argument("--only", nargs="+", default=None, help="only the runs with these labels")
    args = parser.parse_args()
    table = load_table()
    seeds = args.seeds or (1 if args.quick else table.seeds)
    command = "python bench/mmd_gan_ae.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        # the bench's runs spend the data sets' budgets in a registry of their own (never the user's default one)
        os.environ.setdefault("LIGHTNING_DP_REGISTRY", str(out / "budget.sqlite"))
        os.environ.setdefault("LIGHTNING_DP_DEFAULT_BUDGET", "1000")
        from bench_reproduce import code_version  # loaded by load_table

        print(section(table, seeds=seeds, quick=args.quick, extra=[], out=out, command=command.strip(),
                      code=code_version(), only=args.only))


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
