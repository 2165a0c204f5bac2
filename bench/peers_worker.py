"""One peer system (AIM or MST from ``dpmm``) on one CSV: run by bench/peers.py inside bench/.peers-venv.

This file imports nothing from lightning_dp: the peers' dependencies (dpmm pins pandas, scikit-learn) live in
their own virtual environment and never in the project's.

    bench/.peers-venv/bin/python bench/peers_worker.py --model aim --train T.csv --domain D.json --epsilon 1 \
        --delta 1e-5 --rounds 48 --num-rows 11000 --seed 0 --out S.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["aim", "mst"], required=True)
    parser.add_argument("--train", required=True, help="validated training rows (CSV)")
    parser.add_argument("--domain", required=True, help="JSON {column: {lower, upper} | {categories}} (public)")
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--delta", type=float, required=True)
    parser.add_argument("--rounds", type=int, default=None, help="AIM's T (null: 16 per column)")
    parser.add_argument("--bins", type=int, default=32, help="uniform bins on the public bounds")
    parser.add_argument("--num-rows", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from dpmm.pipelines import AIMPipeline, MSTPipeline

    spec = json.loads(Path(args.domain).read_text())
    df = pd.read_csv(args.train, keep_default_na=False, na_values=[""])
    for col, info in spec["columns"].items():
        if "categories" in info:
            df[col] = pd.Categorical(df[col].astype(str), categories=info["categories"])
        else:
            df[col] = df[col].astype(float)
    domain = {col: ({"categories": info["categories"]} if "categories" in info
                    else {"lower": info["lower"], "upper": info["upper"]}) for col, info in spec["columns"].items()}
    gen_kwargs = {"rounds": args.rounds} if args.model == "aim" and args.rounds else {}
    cls = AIMPipeline if args.model == "aim" else MSTPipeline
    # uniform bins on the public bounds: the binning spends no budget, all of ε goes to the model (as ours)
    pipe = cls(epsilon=args.epsilon, delta=args.delta, binner_type="uniform", proc_epsilon=None, n_bins=args.bins,
               gen_kwargs=gen_kwargs)
    pipe.set_random_state(np.random.RandomState(args.seed))
    pipe.fit(df, domain)
    synth = pipe.generate(n_records=args.num_rows)
    for col, info in spec["columns"].items():
        if info.get("integer"):
            synth[col] = np.round(synth[col].astype(float))
    synth.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
