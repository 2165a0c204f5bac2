"""Anonymeter 1.1's own singling-out and linkability risks on one synthetic set (Giomi et al., "A Unified Framework
for Quantifying Privacy Risk in Synthetic Data", 2022). Runs in ``bench/.anonymeter-venv`` (created by
bench/audit_power.py; Anonymeter pins numpy < 2 and pandas < 3.1, so it is never a dependency of the project) and
imports nothing from the project.

    python bench/anonymeter_worker.py --synthetic S.csv --real R.csv --holdout H.csv --aux A.json --out OUT.json

The CSVs hold the audit's typed rows (numbers as numbers); ``--aux`` is the pair of auxiliary column lists that our
``linkability`` check uses. Writes each risk (value and 95% interval) with the attack, baseline and control rates.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import pandas as pd
from anonymeter.evaluators import LinkabilityEvaluator, SinglingOutEvaluator


def rates(results) -> dict:
    """The attack, baseline and control success rates of an Anonymeter ``EvaluationResults``."""
    out = {"attack": results.attack_rate.value, "baseline": results.baseline_rate.value}
    out["control"] = None if results.control_rate is None else results.control_rate.value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("synthetic", "real", "holdout", "aux", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--singling-out-attacks", type=int, default=500)
    parser.add_argument("--linkability-attacks", type=int, default=1000)
    args = parser.parse_args()
    syn, real, holdout = (pd.read_csv(p) for p in (args.synthetic, args.real, args.holdout))
    with open(args.aux) as f:
        aux = tuple(json.load(f))
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "attack as good as baseline" on honest sets: the rates below say it
        t0 = time.time()
        so = SinglingOutEvaluator(
            ori=real, syn=syn, control=holdout, n_attacks=args.singling_out_attacks, n_cols=3, seed=args.seed
        ).evaluate(mode="multivariate")
        risk = so.risk(confidence_level=0.95)
        out["singling_out"] = {
            "risk": risk.value,
            "interval": list(risk.ci),
            **rates(so.results()),
            "queries": len(so.queries()),
            "seconds": round(time.time() - t0, 1),
        }
        t0 = time.time()
        n = min(args.linkability_attacks, len(real), len(holdout))
        link = LinkabilityEvaluator(
            ori=real, syn=syn, control=holdout, aux_cols=aux, n_attacks=n, n_neighbors=1
        ).evaluate(n_jobs=1)
        risk = link.risk(confidence_level=0.95)
        out["linkability"] = {
            "risk": risk.value,
            "interval": list(risk.ci),
            **rates(link.results()),
            "attacks": n,
            "seconds": round(time.time() - t0, 1),
        }
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
