"""PPEM on real data: does the KSD penalty give α-LMDP on x′ while x* keeps its fidelity? (``ppem_lmdp``)

For each data set (``adult``: x′ = age, hours-per-week; ``cervical``: x′ = Age; the experiments
``ppem_adult``/``ppem_cervical``) it trains PPEM through ``train.py`` with the penalty (λ_α = 10) and without it
(λ_α = 0, the same run otherwise), optionally with DP-SGD on top (``--dp``), then audits each checkpoint with
``python -m audits CKPT --real D --holdout D``. Per run:

* the α-LMDP tests (the paper's Def. 2.2: α-LMDP holds when a level-α test REJECTS "real x′ ~ model"): p-values
  of the KSD U-statistic (multinomial bootstrap), V-statistic (wild bootstrap) and Ŝ_{l,n} (χ²₁) against the
  marginal energy's score, and of the MMD test of real x′ against generated x′;
* the fidelity of the non-sensitive columns x*: the mean KS statistic (numeric) and total variation
  (categorical) of the x* columns against REAL, and the TSTR ROC-AUC on HOLDOUT (mean over the audit's
  classifiers), with the gap to the run without the penalty;
* ε spent and whether the run makes a DP claim;
* how robust the KSD verdicts are to the audit's own randomness (the U/V tests' 1,000-row subsample and bootstrap,
  the dequantisation noise, the linear test's pairing): each KSD test again under ``--audit-seeds`` audit seeds,
  with the audit's code (:func:`audits.lmdp_checks.ksd_section`), as "rejections/seeds (median p)".

    python bench/ppem.py [--data adult cervical] [--epochs-adult 10] [--epochs-cervical 100] [--dp]
                         [--seed 0] [--out DIR] [--audit-seeds 10] [--reuse] [--set KEY=VALUE ...]
    python bench/reproduce.py --table ppem_lmdp [--quick] [--write docs/results.md]

The second renders the table of ``bench/paper_tables.yaml`` (seeds, epochs, the fidelity margin) with
:func:`section`. ``--reuse`` keeps a run (and its audit) already in ``--out`` instead of training it again.
Each run is a subprocess of the real entry points, so the figures are those a user gets.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bias_mitigation import reproduce_module  # noqa: E402  (the shared bench helpers)
from bench.mmd_gan_ae import AUDIT_EXIT_OK, _run  # noqa: E402

SENSITIVE = {"adult": ["age", "hours-per-week"], "cervical": ["Age"]}
KSD_TESTS = {"ksd_u": "U", "ksd_v": "V", "ksd_linear": "Ŝ_{l,n}"}
# x* fidelity: (row key, label, margin key, +1 if a larger value is worse / −1 if a smaller one is)
FIDELITY = (("x*_mean_ks", "KS", "ks", 1), ("x*_mean_tv", "TV", "tv", 1), ("tstr_roc", "TSTR ROC", "tstr", -1))


def summarise(report: dict, sensitive: list[str]) -> dict:
    """The figures of one audited run (see the module docstring)."""
    checks = report["checks"]
    ksd = checks["lmdp_ksd"]["tests"]
    columns = checks["fidelity"]["columns"]
    rest = {name: c for name, c in columns.items() if name not in sensitive}
    # a column generated all-missing has no KS/TV (None): left out of the means
    ks = [c["ks"] for c in rest.values() if c["type"] == "numeric" and c.get("ks") is not None]
    tv = [c["tv"] for c in rest.values() if c["type"] != "numeric" and c.get("tv") is not None]
    return {
        **{f"p_{name}": ksd[name]["p_value"] for name in KSD_TESTS},
        **{f"reject_{name}": bool(ksd[name]["reject"]) for name in KSD_TESTS},  # the audit's decision
        "p_mmd": checks["lmdp_mmd"]["p_value"],
        "x*_mean_ks": sum(ks) / len(ks) if ks else float("nan"),
        "x*_mean_tv": sum(tv) / len(tv) if tv else float("nan"),
        "tstr_roc": checks["utility"]["value"],
        "n_real": report["inputs"]["real"]["rows"], "n_holdout": report["inputs"]["holdout"]["rows"],
    }


def ksd_over_seeds(checkpoint: Path, data: str, seeds: int) -> dict[str, tuple[int, int, float]]:
    """Each KSD test of the audit under ``seeds`` audit seeds: ``{test: (rejections, seeds, median p)}``."""
    from audits.inputs import load_inputs
    from audits.lmdp_checks import ksd_section

    logging.getLogger("audits.lmdp").setLevel(logging.ERROR)  # the subsample warning, once per test and seed
    inputs = load_inputs(checkpoint, real=data, holdout=data, num_rows=100)  # x′ of REAL and the model's score
    runs = [ksd_section(inputs, statistics=["u", "v", "linear"], alpha=0.05, n_bootstrap=500, max_samples=1000,
                        seed=s)["tests"] for s in range(seeds)]
    return {name: (sum(bool(r[name]["reject"]) for r in runs), seeds,
                   float(statistics.median(r[name]["p_value"] for r in runs))) for name in runs[0]}


def train_and_audit(data: str, weight: float, *, seed: int, epochs: int, dp: bool, extra: list[str],
                    folder: Path, audit_seeds: int, reuse: bool) -> dict[str, Any]:
    """One run: ``train.py experiment=ppem_<data>`` at penalty weight ``weight``, its audit and the figures.

    With ``reuse``, a folder whose audit is done is read instead of trained again (times from ``times.json``).
    """
    checkpoint = folder / "checkpoints" / "last.ckpt"
    times = folder / "times.json"
    if not (reuse and (folder / "audit" / "report.json").exists()):
        cmd = [sys.executable, "train.py", f"experiment=ppem_{data}", f"model.mechanisms.0.weight={weight}",
               f"trainer.max_epochs={epochs}", f"seed={seed}", f"output_dir={folder}",
               "trainer.enable_progress_bar=false", *(["privacy=dp_sgd"] if dp else []), *extra]
        for stale in folder.glob("ksd_over_*_seeds.json"):  # of an earlier model in this folder
            stale.unlink()
        train_s, _ = _run(cmd)
        audit_s, _ = _run([sys.executable, "-m", "audits", str(checkpoint), "--real", data, "--holdout", data,
                           "--out", str(folder / "audit"), "--seed", str(seed)], ok=AUDIT_EXIT_OK)
        times.write_text(json.dumps({"train_s": train_s, "audit_s": audit_s}))
    report = json.loads((folder / "audit" / "report.json").read_text())
    ledger = json.loads((folder / "ledger.json").read_text())
    return {"data": data, "seed": seed, "λ_α": weight, **summarise(report, SENSITIVE[data]),
            "ε": ledger["epsilon"], "dp_claim": ledger["dp_claim"],
            **(json.loads(times.read_text()) if times.exists() else {"train_s": math.nan, "audit_s": math.nan}),
            "over_seeds": cached_over_seeds(folder, data, audit_seeds)}


def cached_over_seeds(folder: Path, data: str, seeds: int) -> dict[str, tuple[int, int, float]]:
    """:func:`ksd_over_seeds` of the run in ``folder``, kept in ``ksd_over_<seeds>_seeds.json`` (it is seeded)."""
    if not seeds:
        return {}
    cache = folder / f"ksd_over_{seeds}_seeds.json"
    if not cache.exists():
        cache.write_text(json.dumps(ksd_over_seeds(folder / "checkpoints" / "last.ckpt", data, seeds)))
    return {name: tuple(value) for name, value in json.loads(cache.read_text()).items()}


# ------------------------------------------------------------------------------------------- the table
def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def _robust(cell: tuple[int, int, float]) -> str:
    rejections, seeds, median = cell
    return f"{rejections}/{seeds} ({_p(median)})"


def rejects_all(row: dict[str, Any]) -> bool:
    """Every KSD test of the audit rejects (α-LMDP holds by Def. 2.2), and in every audit seed if repeated."""
    audit = all(row[f"reject_{name}"] for name in KSD_TESTS)
    return audit and all(r == s for r, s, _ in row["over_seeds"].values())


def rejects_none(row: dict[str, Any]) -> bool:
    """No KSD test of the audit rejects: none detects a difference between the model's x′ and real x′."""
    return not any(row[f"reject_{name}"] for name in KSD_TESTS)


def seed_pairs(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(seed, run with the penalty, run without it) for each seed of ``rows``."""
    return [(s, *(next(r for r in rows if r["seed"] == s and (r["λ_α"] > 0) == w) for w in (True, False)))
            for s in sorted({r["seed"] for r in rows})]


def margin_verdict(differences: dict[str, float], margin: dict[str, float] | None) -> str:
    """" (within the margin)" / " (OUTSIDE the margin)" for penalty − none ``differences`` by row key; "" without."""
    if not margin:
        return ""
    within = all(sign * differences[key] <= margin[m] for key, _, m, sign in FIDELITY)
    return f" ({'within' if within else 'OUTSIDE'} the margin)"


def data_table(rows: list[dict[str, Any]], margin: dict[str, float] | None) -> tuple[str, list[str]]:
    """The Markdown table of one data set's runs and its per-seed comparison lines (against ``margin`` if given:
    ``{ks, tv, tstr}``)."""
    header = ["seed", "λ_α", *(f"KSD {t} p" for t in KSD_TESTS.values()), "MMD p",
              *(f"{t}: rejections over audit seeds (median p)" for t in KSD_TESTS.values()),
              "x* mean KS ↓", "x* mean TV ↓", "TSTR ROC", "train min"]
    cells = [[str(r["seed"]), f"{r['λ_α']:g}", *(_p(r[f"p_{n}"]) for n in KSD_TESTS), _p(r["p_mmd"]),
              *(_robust(r["over_seeds"][n]) if r["over_seeds"] else "–" for n in KSD_TESTS),
              *(f"{r[key]:.3f}" for key, *_ in FIDELITY), f"{r['train_s'] / 60:.1f}"] for r in rows]
    comparisons = []
    pairs = seed_pairs(rows)
    for seed, on, off in pairs:
        d = {key: on[key] - off[key] for key, *_ in FIDELITY}
        holds = ("α-LMDP holds (every KSD test rejects" + (", in the audit and under every audit seed)"
                                                             if on["over_seeds"] else " in the audit)")
                 if rejects_all(on) else "α-LMDP does NOT hold (some KSD test does not reject)")
        comparisons.append(
            f"seed {seed}: with the penalty {holds}; without it "
            f"{'no KSD test rejects' if rejects_none(off) else 'some KSD test rejects'} in the audit; x* penalty − "
            f"none: {', '.join(f'{label} {d[key]:+.3f}' for key, label, *_ in FIDELITY)}{margin_verdict(d, margin)}")
    if len(pairs) > 1:
        comparisons.append(mean_difference(pairs, margin))
    return reproduce_module().markdown_table(header, cells), comparisons


def mean_difference(pairs: list[tuple[int, dict[str, Any], dict[str, Any]]], margin: dict[str, float] | None) -> str:
    """Penalty − none on x*, averaged over the seeds' pairs (:func:`seed_pairs`), with the standard error."""
    means, parts = {}, []
    for key, label, *_ in FIDELITY:
        diffs = [on[key] - off[key] for _, on, off in pairs]
        means[key], se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))
        parts.append(f"{label} {means[key]:+.3f} (± {se:.3f} s.e.)")
    seeds = ", ".join(str(s) for s, *_ in pairs)
    return f"mean over seeds {seeds}: x* penalty − none: {', '.join(parts)}{margin_verdict(means, margin)}"


def section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
            log: Callable[[str], None] = print) -> str:
    """Train and audit ``ppem_lmdp`` (module docstring; settings in the table's ``bench`` entry)."""
    spec = table.bench
    begin = time.perf_counter()
    out = Path(out).resolve()
    weight, margin, audit_seeds = float(spec["weight"]), spec["margin"], 2 if quick else int(spec["audit_seeds"])
    blocks, runs, spent = [], [], 0.0
    for data, cfg in spec["data"].items():
        n = 1 if quick else min(seeds, int(cfg.get("seeds", seeds)))
        epochs = int(cfg["quick_epochs" if quick else "epochs"])
        rows = []
        for seed in range(n):
            for w in (weight, 0.0):
                folder = out / f"{data}-w{w:g}-e{epochs}-s{seed}"
                row = train_and_audit(data, w, seed=seed, epochs=epochs, dp=False, extra=extra, folder=folder,
                                      audit_seeds=audit_seeds, reuse=True)
                log(f"  {data} seed {seed} λ_α = {w:g}: trained in {row['train_s']:.0f} s, audited in "
                    f"{row['audit_s']:.0f} s")
                rows.append(row)
                spent += row["train_s"] + row["audit_s"]
        text, comparisons = data_table(rows, margin)
        blocks += [f"### {data.capitalize()}: x′ = ({', '.join(SENSITIVE[data])})", "", text, "",
                   *(f"- {c}" for c in comparisons), ""]
        runs.append(f"{data.capitalize()}: `python train.py experiment=ppem_{data} model.mechanisms.0.weight=W "
                    f"trainer.max_epochs={epochs} seed=S` (W = {weight:g}, 0) then `python -m audits "
                    f"RUN/checkpoints/last.ckpt --real {data} --holdout {data} --out AUDIT --seed S`; "
                    f"{rows[0]['n_real']:,} training rows, {rows[0]['n_holdout']:,} "
                    f"held-out; seeds {', '.join(map(str, range(n)))}")
    minutes = (time.perf_counter() - begin) / 60
    lines = [
        f"## {table.name}: {table.title}{' (quick)' if quick else ''}",
        "",
        f"`{command}`  ",
        f"{date.today().isoformat()}; {minutes:.1f} min wall-clock for this call on {platform.machine()} CPU "
        f"(`train.py` and `python -m audits` subprocesses on one thread each; runs already audited in `--out` are "
        f"reused); the trainings and audits took {spent / 60:.0f} min summed.  ",
        f"Paper: {table.source}. No DP claim (`privacy=none` in the experiment configs: α-LMDP only).  ",
        f"Code: {code}; `bench/ppem.py`.  ",
        "Runs: " + "; ".join(runs) + ".  ",
        f"Margin for x* (stated with the table, `bench/paper_tables.yaml`): with the penalty, mean KS at most "
        f"{margin['ks']} and mean TV at most {margin['tv']} above the run without it, TSTR ROC at most "
        f"{margin['tstr']} below.",
        "",
        *blocks,
        "p-values: the audit's (seed = the run's seed); α = 0.05, α-LMDP holds when a test REJECTS (p ≤ α). "
        "Rejections over audit seeds: the three KSD tests again under audit seeds 0–"
        f"{audit_seeds - 1} (subsample, bootstrap, dequantisation noise, pairing), with the audit's code." if
        audit_seeds else "p-values: the audit's; α = 0.05, α-LMDP holds when a test REJECTS (p ≤ α).",
        "",
        "Notes:",
        "",
        *(f"- {n}" for n in table.notes),
        *(f"- Not reproduced: {m}" for m in table.missing),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- command line
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["adult", "cervical"], choices=sorted(SENSITIVE))
    parser.add_argument("--epochs-adult", type=int, default=10)
    parser.add_argument("--epochs-cervical", type=int, default=100)
    parser.add_argument("--dp", action="store_true", help="add privacy=dp_sgd ((1, 1e-5)-DP on top)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--set", nargs="*", default=[], help="extra train.py overrides")
    parser.add_argument("--audit-seeds", type=int, default=10, help="audit seeds of the KSD robustness check")
    parser.add_argument("--reuse", action="store_true", help="keep runs already audited in --out")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="ppem-bench-"))
    rows = []
    for data in args.data:
        epochs = args.epochs_adult if data == "adult" else args.epochs_cervical
        for weight in (10.0, 0.0):
            folder = out / f"{data}-w{weight:g}{'-dp' if args.dp else ''}-s{args.seed}"
            row = train_and_audit(data, weight, seed=args.seed, epochs=epochs, dp=args.dp, extra=args.set,
                                  folder=folder, audit_seeds=args.audit_seeds, reuse=args.reuse)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "over_seeds"}
                             | {f"{k}_seeds": _robust(v) for k, v in row["over_seeds"].items()}), flush=True)
    for data in args.data:
        text, comparisons = data_table([r for r in rows if r["data"] == data], None)
        print(f"\n{data}, ε = {max(r['ε'] for r in rows if r['data'] == data):.3g}\n{text}")
        print("\n".join(comparisons))
    print(f"runs kept in {out}")


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
