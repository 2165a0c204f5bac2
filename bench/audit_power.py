"""Power and false alarms of the audit's privacy verdict on planted leaks (issue 28), on UCI Adult.

Per seed, DP-MERF and PEARL are trained ONCE each at (ε, δ) = (1, 1e-5) (``experiment=dp_merf_adult`` and
``experiment=pearl_adult trainer.max_epochs=4``, i.e. 4,000 of the paper's 8,000 generator steps as in
docs/results.md ``pearl_adult``, ``seed=S``, through ``lightning_dp.train.train``; their synthetic files are
cached), and
the leaks are derived from DP-MERF's synthetic rows:

* ``exact 1%``: 1% of the rows replaced by exact copies of random REAL rows;
* ``near 5%``: 5% replaced by near copies of random REAL rows: one numeric column moved by N(0, (0.05 sd)²)
  (integers rounded, at least one step) and one categorical column changed to another of REAL's categories;
* ``50 outliers``: 50 rows replaced by the 50 most unusual REAL rows (highest self-information, the audit's own
  public rule: the targeted attacker's choice);
* ``REAL resampled``: REAL drawn with replacement (no privacy at all; no generator).

Each set is audited with the default policy's gating checks (``audits/policies/default.yaml``; the utility and
fidelity expectations and the α-LMDP property never change the verdict, so they are left out here) at two sizes:
``full`` (REAL = Adult's 32,561 training rows, HOLDOUT = its 16,281 test rows, every synthetic row) and ``small``
(1,000 random REAL rows, 1,000 HOLDOUT rows, 1,000 synthetic rows with the leaks planted from the small REAL).
Verdict counts over seeds per cell, the failing checks, and the median statistics are printed as a markdown table
(docs/results.md, section ``audit_power``).

    flock /tmp/ldp-heavy.lock python bench/audit_power.py --seeds 0 1 2 3 4 [--sizes full small] [--cache DIR]

One thread (``torch.set_num_threads(1)``); every training and audit result is cached in ``--cache`` so that a
rerun adds seeds without redoing any.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
ANONYMETER_VENV = ROOT / "bench" / ".anonymeter-venv"
ANONYMETER = "anonymeter==1.1.0"
CELLS = ("dp_merf", "pearl", "exact_1pct", "near_5pct", "outliers_50", "real_resampled")
LABELS = {
    "dp_merf": "DP-MERF at ε = 1 (should pass)",
    "pearl": "PEARL at ε = 1 (should pass)",
    "exact_1pct": "DP-MERF + 1% exact copies",
    "near_5pct": "DP-MERF + 5% near copies",
    "outliers_50": "DP-MERF + 50 most unusual rows copied",
    "real_resampled": "REAL resampled",
}
SMALL = 1000
STATS = {  # column -> (check, criterion); the verdict's value
    "exact": ("copies", "max_exact_excess"),
    "near": ("copies", "max_near_excess"),
    "closer": ("copies", "max_closer_excess"),
    "singling out": ("singling_out", "max_risk_excess"),
    "singled out": ("vulnerable_records", "max_singled_out_excess"),
    "linked": ("linkability", "max_linked_excess"),
}


def train_synthetic(model: str, seed: int, cache: Path) -> Path:
    """The synthetic file of ``experiment={model}_adult`` with ``seed`` (trained once, cached)."""
    from hydra import compose, initialize_config_dir

    from lightning_dp.train import train

    folder = cache / f"{model}_s{seed}"
    done = folder / "synthetic.csv"
    if done.exists():
        return done
    overrides = [
        f"experiment={model}_adult",
        f"seed={seed}",
        f"output_dir={folder}",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        *(["trainer.max_epochs=4"] if model == "pearl" else []),  # 4,000 steps, as docs/results.md pearl_adult
    ]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    t0 = time.time()
    result = train(cfg)
    (folder / "train_seconds.txt").write_text(f"{time.time() - t0:.1f}\n")
    return Path(result["synthetic"])


def near_copies(
    rows: pd.DataFrame, real: pd.DataFrame, numeric: list[str], rng: np.random.Generator
) -> pd.DataFrame:
    """Each row with one numeric column jittered and one categorical column changed (module docstring)."""
    out = rows.copy().reset_index(drop=True)
    categorical = [c for c in real.columns if c not in numeric]
    levels = {c: real[c].dropna().unique() for c in categorical}
    sd = real[numeric].std()
    for i in range(len(out)):
        j = numeric[rng.integers(len(numeric))]
        step = rng.normal(0, 0.05 * sd[j])
        if float(out.at[i, j]) == round(float(out.at[i, j])):  # an integer column: move by at least one
            step = np.sign(step or 1) * max(1, round(abs(step)))
        out.at[i, j] = float(out.at[i, j]) + step
        c = categorical[rng.integers(len(categorical))]
        choices = [v for v in levels[c] if v != out.at[i, c]]
        out.at[i, c] = choices[rng.integers(len(choices))]
    return out


def plant(cell: str, base: pd.DataFrame, real: pd.DataFrame, numeric: list[str], seed: int) -> pd.DataFrame:
    """The synthetic set of ``cell`` from the DP-MERF rows ``base`` and REAL (module docstring)."""
    from audits.leaks import most_unusual
    from audits.linkage import MatchWeights

    rng = np.random.default_rng(seed + 1000)
    n = len(base)
    if cell == "real_resampled":
        return real.iloc[rng.choice(len(real), n, replace=True)].reset_index(drop=True)
    if cell == "exact_1pct":
        leak = real.iloc[rng.choice(len(real), n // 100, replace=False)]
    elif cell == "near_5pct":
        leak = near_copies(real.iloc[rng.choice(len(real), n // 20, replace=False)], real, numeric, rng)
    elif cell == "outliers_50":
        leak = real.iloc[most_unusual(MatchWeights().fit(real, numeric).transform(real), 50)]
    else:
        return base
    out = base.copy()
    idx = rng.choice(n, len(leak), replace=False)
    for j, c in enumerate(out.columns):
        out[c] = out[c].astype(object)
        out.iloc[idx, j] = leak[c].to_numpy()
    return out


def audit(
    synthetic: pd.DataFrame, real: pd.DataFrame, holdout: pd.DataFrame, numeric: list[str], seed: int
) -> dict:
    """The default policy's gating checks on the three frames: the status, the verdicts and the wall time."""
    from audits.inputs import AuditInputs
    from audits.policy import load_policy
    from audits.report import build_report

    policy = load_policy()
    policy["expectations"] = {}
    for name in ("lmdp_mmd", "lmdp_ksd"):
        policy["checks"].pop(name, None)
    syn = synthetic.copy()
    for c in syn.columns:
        syn[c] = pd.to_numeric(syn[c]) if c in numeric else syn[c].astype(object).where(syn[c].notna(), None)
    inputs = AuditInputs(synthetic=syn, real=real, holdout=holdout, numeric=numeric, label="income")
    t0 = time.time()
    report, _ = build_report(inputs, policy, seed=seed, progress=False)
    verdicts = [
        {k: v[k] for k in ("check", "criterion", "description", "value", "interval", "status")}
        for v in report["verdicts"]
    ]
    linkability = report["checks"].get("linkability", {})
    return {
        "status": report["status"],
        "verdicts": verdicts,
        "seconds": round(time.time() - t0, 1),
        "anonymeter_risk": linkability.get("anonymeter_risk"),
        "singling_out_risk": report["checks"].get("singling_out", {}).get("anonymeter_risk"),
    }


def frames() -> tuple[pd.DataFrame, pd.DataFrame, list[str], object]:
    """Adult's training (REAL) and test (HOLDOUT) rows in the audit's types, the numeric columns, the schema."""
    from audits.inputs import normalise
    from lightning_dp.data.sources import load_adult

    src = load_adult()
    out, numeric = normalise(src.train.iloc[:2], src.train, src.test, schema=src.schema, label="income")
    return out["real"], out["holdout"], numeric, src.schema


def typed_synthetic(path: Path, real: pd.DataFrame, holdout: pd.DataFrame, schema: object) -> pd.DataFrame:
    from audits.inputs import normalise

    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    out, _ = normalise(raw, real.iloc[:2], holdout.iloc[:60], schema=schema, label="income")
    return out["synthetic"]


def anonymeter_python() -> Path:
    """Anonymeter's interpreter, creating ``bench/.anonymeter-venv`` on first use (Anonymeter 1.1 pins numpy < 2
    and pandas < 3.1: never a dependency of the project, never installed in its environment)."""
    python = ANONYMETER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ANONYMETER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", ANONYMETER], check=True)
    return python


def anonymeter(synthetic: pd.DataFrame, real: pd.DataFrame, holdout: pd.DataFrame, seed: int) -> dict:
    """Anonymeter's own singling-out and linkability risks (bench/anonymeter_worker.py in its venv, one thread),
    with the auxiliary columns of our ``linkability`` check (alternate columns)."""
    cols = list(real.columns)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, frame in (("s", synthetic), ("r", real), ("h", holdout)):
            frame.to_csv(d / f"{name}.csv", index=False)
        (d / "aux.json").write_text(json.dumps([cols[0::2], cols[1::2]]))
        cmd = [str(anonymeter_python()), str(ROOT / "bench" / "anonymeter_worker.py"), "--seed", str(seed)]
        for flag, name in (("synthetic", "s.csv"), ("real", "r.csv"), ("holdout", "h.csv"), ("aux", "aux.json")):
            cmd += [f"--{flag}", str(d / name)]
        subprocess.run([*cmd, "--out", str(d / "out.json")], check=True, env=env, cwd=tmp)
        return json.loads((d / "out.json").read_text())


def run(seeds: list[int], sizes: list[str], cache: Path, anonymeter_sizes: list[str] = ()) -> list[dict]:
    real, holdout, numeric, schema = frames()
    rows = []
    for seed in seeds:  # seed by seed: every seed's cells are done before the next seed's trainings
        base = {
            m: typed_synthetic(train_synthetic(m, seed, cache), real, holdout, schema)
            for m in ("dp_merf", "pearl")
        }
        for size in sizes:
            rng = np.random.default_rng(seed)
            if size == "small":
                r = real.iloc[np.sort(rng.choice(len(real), SMALL, replace=False))].reset_index(drop=True)
                h = holdout.iloc[np.sort(rng.choice(len(holdout), SMALL, replace=False))].reset_index(
                    drop=True
                )
                b = {m: f.iloc[:SMALL].reset_index(drop=True) for m, f in base.items()}
            else:
                r, h, b = real, holdout, base
            for cell in CELLS:
                key = cache / f"audit_{cell}_{size}_s{seed}.json"
                res = json.loads(key.read_text()) if key.exists() else None
                if res is not None and (size not in anonymeter_sizes or "anonymeter" in res):
                    rows.append(res)
                    continue
                syn = b["pearl"] if cell == "pearl" else plant(cell, b["dp_merf"], r, numeric, seed)
                if res is None:
                    res = {"cell": cell, "size": size, "seed": seed, **audit(syn, r, h, numeric, seed)}
                    logging.warning("%s %s seed %d: %s (%.0f s)", cell, size, seed, res["status"], res["seconds"])
                if size in anonymeter_sizes:
                    res["anonymeter"] = anonymeter(syn, r, h, seed)
                    logging.warning("%s %s seed %d: Anonymeter %s", cell, size, seed, res["anonymeter"])
                key.write_text(json.dumps(res))
                rows.append(res)
    return rows


def _value(res: dict, check: str, criterion: str, agg=max) -> float | None:
    values = [v["value"] for v in res["verdicts"] if v["check"] == check and v["criterion"] == criterion]
    values = [v for v in values if v is not None]
    return agg(values) if values else None


def redecide(res: dict, policy: dict) -> dict:
    """``res`` with every verdict decided again from its stored value and interval under ``policy``'s limits (the
    decision is a function of those alone: :func:`audits.verdicts.decide`), and the overall status with it, so that
    audits cached under earlier limits are tabled under the current ones. Verdicts on criteria the policy no
    longer has, or stored without an interval, keep their status."""
    from audits.verdicts import decide

    verdicts = []
    for v in res["verdicts"]:
        opts = policy["checks"].get(v["check"], {})
        limit = opts.get(v["criterion"])
        name = v["criterion"].removeprefix("max_")
        if limit is not None and v["interval"] is not None and v["value"] is not None:
            status = decide(
                v["check"], v["criterion"], v["description"], v["value"], v["interval"], limit,
                at_most=True, pass_limit=opts.get(f"rule_out_{name}"),
            ).status
            v = {**v, "status": status}
        verdicts.append(v)
    statuses = [v["status"] for v in verdicts]
    status = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    return {**res, "verdicts": verdicts, "status": status}


def table(rows: list[dict], sizes: list[str]) -> str:
    """Markdown: per cell and size, verdict counts over seeds, the checks that failed, median statistics (verdicts
    decided under the current default policy: :func:`redecide`)."""
    from audits.policy import load_policy

    policy = load_policy()
    rows = [redecide(r, policy) for r in rows]
    head = (
        "| synthetic set | size | seeds | pass | fail | inconclusive | failed checks (seeds) | exact excess | near excess "
        "| closer excess | singled out excess (targeted) | singling out excess (Anonymeter risk) "
        "| linked excess (Anonymeter risk) | Anonymeter 1.1: singling out / linkability risk "
        "| max membership AUC | audit s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for cell in CELLS:
        for size in sizes:
            mine = [r for r in rows if r["cell"] == cell and r["size"] == size]
            if not mine:
                continue
            counts = Counter(r["status"] for r in mine)
            failed = Counter(
                f"{v['check']}.{v['criterion']}" for r in mine for v in r["verdicts"] if v["status"] == "fail"
            )
            incon = Counter(
                f"{v['check']}.{v['criterion']}"
                for r in mine
                for v in r["verdicts"]
                if v["status"] == "inconclusive"
            )

            def med(check: str, criterion: str, mine: list[dict] = mine) -> str:
                vals = [x for x in (_value(r, check, criterion) for r in mine) if x is not None]
                return f"{np.median(vals):.4f}" if vals else "–"

            risk = [r["anonymeter_risk"] for r in mine if r.get("anonymeter_risk") is not None]
            so_risk = [r["singling_out_risk"] for r in mine if r.get("singling_out_risk") is not None]
            theirs = [r["anonymeter"] for r in mine if "anonymeter" in r]
            if theirs:
                so = np.median([a["singling_out"]["risk"] for a in theirs])
                li = np.median([a["linkability"]["risk"] for a in theirs])
                anon = f"{so:.3f} / {li:.3f} ({len(theirs)} seeds)"
            else:
                anon = "–"
            which = ", ".join(f"{k} ({n})" for k, n in failed.most_common()) or "–"
            if incon:
                which += "; inconclusive: " + ", ".join(f"{k} ({n})" for k, n in incon.most_common())
            lines.append(
                f"| {LABELS[cell]} | {size} | {len(mine)} | {counts['pass']} | {counts['fail']} | "
                f"{counts['inconclusive']} | {which} | {med(*STATS['exact'])} | {med(*STATS['near'])} | "
                f"{med(*STATS['closer'])} | {med(*STATS['singled out'])} | {med(*STATS['singling out'])} "
                f"({np.median(so_risk) if so_risk else float('nan'):.3f}) | {med(*STATS['linked'])} "
                f"({np.median(risk):.3f}) | {anon} | {med('membership', 'max_auc')} | "
                f"{np.median([r['seconds'] for r in mine]):.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--sizes", nargs="+", default=["full", "small"], choices=["full", "small"])
    parser.add_argument("--cache", default=str(ROOT / "outputs" / "audit_power"))
    parser.add_argument("--table-only", action="store_true", help="print the table of the cached audits only")
    parser.add_argument(
        "--anonymeter", nargs="*", default=[], choices=["full", "small"],
        help="sizes at which Anonymeter 1.1 itself also runs (in bench/.anonymeter-venv)",
    )
    args = parser.parse_args()
    if args.table_only:
        rows = [json.loads(p.read_text()) for p in sorted(Path(args.cache).glob("audit_*.json"))]
        print(table([r for r in rows if r["seed"] in args.seeds], args.sizes))
        return
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = run(args.seeds, args.sizes, cache, args.anonymeter)
    print(table(rows, args.sizes))


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    main()
