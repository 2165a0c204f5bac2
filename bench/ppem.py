"""PPEM on real data: does the KSD penalty give α-LMDP on x′ while x* keeps its fidelity?

For each data set (``adult``: x′ = age, hours-per-week; ``cervical``: x′ = Age; the experiments
``ppem_adult``/``ppem_cervical``) it trains PPEM through ``train.py`` with the penalty (λ_α = 10) and without it
(λ_α = 0, the same run otherwise), optionally with DP-SGD on top (``--dp``), then audits each checkpoint with
``python -m audits CKPT --real D --holdout D``. It prints, per run:

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

``--reuse`` keeps a run (and its audit) already in ``--out`` instead of training it again.

Each run is a subprocess of the real entry points, so the figures are those a user gets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENSITIVE = {"adult": ["age", "hours-per-week"], "cervical": ["Age"]}


def run(cmd: list[str]) -> float:
    """Run ``cmd`` from the project root; its wall time in seconds (raises with its output on failure)."""
    start = time.time()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1, 4):  # the audit exits 1/4 when its policy fails/is inconclusive
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.time() - start


def summarise(report: dict, sensitive: list[str]) -> dict:
    """The figures of one audited run (see the module docstring)."""
    checks = report["checks"]
    ksd = checks["lmdp_ksd"]["tests"]
    columns = checks["fidelity"]["columns"]
    rest = {name: c for name, c in columns.items() if name not in sensitive}
    ks = [c["ks"] for c in rest.values() if c["type"] == "numeric"]
    tv = [c["tv"] for c in rest.values() if c["type"] != "numeric" and "tv" in c]
    return {
        "p_ksd_u": ksd["ksd_u"]["p_value"], "p_ksd_v": ksd["ksd_v"]["p_value"],
        "p_ksd_linear": ksd["ksd_linear"]["p_value"], "p_mmd": checks["lmdp_mmd"]["p_value"],
        "x*_mean_ks": sum(ks) / len(ks) if ks else float("nan"),
        "x*_mean_tv": sum(tv) / len(tv) if tv else float("nan"),
        "tstr_roc": checks["utility"]["value"],
    }


def ksd_over_seeds(checkpoint: Path, data: str, seeds: int) -> dict[str, str]:
    """Each KSD test of the audit under ``seeds`` audit seeds: ``{test: "rejections/seeds (median p)"}``."""
    import statistics

    from audits.inputs import load_inputs
    from audits.lmdp_checks import ksd_section

    inputs = load_inputs(checkpoint, real=data, holdout=data, num_rows=100)  # x′ of REAL and the model's score
    runs = [ksd_section(inputs, statistics=["u", "v", "linear"], alpha=0.05, n_bootstrap=500, max_samples=1000,
                        seed=s)["tests"] for s in range(seeds)]
    return {f"{name}_seeds": f"{sum(r[name]['reject'] for r in runs)}/{seeds} "
                             f"({statistics.median(r[name]['p_value'] for r in runs):.3g})" for name in runs[0]}


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
            tag = f"{data}-w{weight:g}{'-dp' if args.dp else ''}-s{args.seed}"
            run_dir = out / tag
            cmd = [sys.executable, "train.py", f"experiment=ppem_{data}", f"model.mechanisms.0.weight={weight}",
                   f"trainer.max_epochs={epochs}", f"seed={args.seed}", f"output_dir={run_dir}",
                   "trainer.enable_progress_bar=false", *(["privacy=dp_sgd"] if args.dp else []), *args.set]
            checkpoint = run_dir / "checkpoints" / "last.ckpt"
            reused = args.reuse and (run_dir / "audit" / "report.json").exists()
            train_s = float("nan") if reused else run(cmd)
            audit_s = float("nan") if reused else run(
                [sys.executable, "-m", "audits", str(checkpoint), "--real", data, "--holdout", data,
                 "--out", str(run_dir / "audit"), "--seed", str(args.seed)])
            report = json.loads((run_dir / "audit" / "report.json").read_text())
            ledger = json.loads((run_dir / "ledger.json").read_text())
            row = {"data": data, "λ_α": weight, **summarise(report, SENSITIVE[data]), "ε": ledger["epsilon"],
                   "dp_claim": ledger["dp_claim"], "train_s": train_s, "audit_s": audit_s,
                   **(ksd_over_seeds(checkpoint, data, args.audit_seeds) if args.audit_seeds else {})}
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = list(rows[0])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    for data in args.data:
        on, off = (next(r for r in rows if r["data"] == data and r["λ_α"] == w) for w in (10.0, 0.0))
        print(f"{data}: penalty − no penalty: x* mean KS {on['x*_mean_ks'] - off['x*_mean_ks']:+.3f}, "
              f"x* mean TV {on['x*_mean_tv'] - off['x*_mean_tv']:+.3f}, TSTR ROC {on['tstr_roc'] - off['tstr_roc']:+.3f}")
    print(f"runs kept in {out}")


if __name__ == "__main__":
    main()
