"""A wide claims-like table (43 columns with the label) for bench/peers.py: where AIM's model-size limit and run time bite.

The claims-like rows of tests/integration/test_claims_fidelity.py, widened: a policy type, a region and three
latent customer factors drive 20 categorical columns (3–12 categories, each also copying its left neighbour
now and then, so neighbouring pairs depend on each other), 20 continuous ones (money in cents with a spike at 0
and a log-normal tail, integers such as ages and counts, one column missing exactly when the policy is not
``vehicle`` like ``vehicle_age``), and a binary label ``fraud`` whose log-odds are a sum of a few columns'
effects. Seeded rows of one fixed distribution: the seed draws the rows, never the table's parameters (the
categorical columns' weights come from ``PARAMETER_SEED``), so rows of different seeds are training and held-out rows
of the same population. The schema declares only public facts (bounds, categories, integer, decimals, missing).

    python bench/wide_table.py --rows 30000 --seed 0 --out wide.csv --schema wide.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

POLICIES = ["home", "vehicle", "travel"]
N_CAT, N_NUM = 20, 20
CAT_SIZES = [3, 4, 5, 6, 8, 10, 12, 4, 3, 7, 5, 9, 6, 4, 11, 3, 8, 5, 6, 12]
PARAMETER_SEED = 26  # the table's parameters (the categorical columns' weights on the latent factors)


def wide_schema() -> dict[str, Any]:
    """The public schema: 22 categorical columns (policy, region, cat_00..cat_19), 20 continuous, the label."""
    cols: list[dict[str, Any]] = [
        {"name": "policy", "type": "categorical", "categories": POLICIES},
        {"name": "region", "type": "categorical", "categories": [f"r{i}" for i in range(10)]},
    ]
    for j, k in enumerate(CAT_SIZES):
        cols.append({"name": f"cat_{j:02d}", "type": "categorical", "categories": [f"c{i}" for i in range(k)],
                     **({"missing": True} if j % 7 == 3 else {})})
    for j in range(N_NUM):
        kind = j % 4
        if kind == 0:  # money in cents, 0 for about a third
            cols.append({"name": f"amount_{j:02d}", "type": "continuous", "bounds": [0, 50000], "decimals": 2})
        elif kind == 1:  # an age-like integer
            cols.append({"name": f"years_{j:02d}", "type": "continuous", "bounds": [0, 99], "integer": True})
        elif kind == 2:  # a small count
            cols.append({"name": f"count_{j:02d}", "type": "continuous", "bounds": [0, 20], "integer": True,
                         **({"missing": True} if j == 2 else {})})
        else:  # a real-valued score
            cols.append({"name": f"score_{j:02d}", "type": "continuous", "bounds": [-5, 5], "decimals": 3})
    cols.append({"name": "fraud", "type": "categorical", "categories": ["no", "yes"]})
    return {"label": "fraud", "missing_values": [""], "columns": cols}


def wide_table(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` seeded rows of the wide table (module docstring)."""
    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(PARAMETER_SEED)
    policy = rng.choice(3, n, p=[0.35, 0.5, 0.15])
    region = rng.choice(10, n, p=np.arange(1, 11) / 55)
    z = rng.normal(size=(n, 3)) + np.stack([policy - 1.0, region / 5 - 1, (policy == 1) * 0.8], 1)
    out: dict[str, Any] = {"policy": np.array(POLICIES)[policy], "region": np.array([f"r{i}" for i in range(10)])[region]}
    logit = -2.2 + 0.8 * z[:, 0] - 0.6 * z[:, 2] + 0.5 * (policy == 2)
    prev = None
    for j, k in enumerate(CAT_SIZES):
        w = weights.normal(size=(3, k)) * 1.2
        scores = z @ w + rng.gumbel(size=(n, k))
        codes = scores.argmax(1)
        if prev is not None:
            copy = rng.random(n) < 0.3
            codes = np.where(copy, prev % k, codes)
        prev = codes
        if j in (1, 6, 14):
            logit += 0.7 * (codes == 0) - 0.4 * (codes == k - 1)
        col = np.array([f"c{i}" for i in range(k)], dtype=object)[codes]
        if j % 7 == 3:
            col = np.where(rng.random(n) < 0.1 + 0.1 * (policy == 2), None, col)
        out[f"cat_{j:02d}"] = col
    for j in range(N_NUM):
        kind, f = j % 4, z[:, j % 3]
        if kind == 0:
            amount = np.exp(rng.normal(6.5 + 0.5 * f + 0.6 * (policy == 1), 0.8))
            zero = rng.random(n) < 1 / (1 + np.exp(0.3 + f))
            values = np.where(zero, 0.0, np.round(np.clip(amount, 0.01, 50000), 2))
            if j == 0:
                logit += 0.5 * np.log1p(values) / 8 - 0.3 * zero
        elif kind == 1:
            values = np.clip(np.round(45 + 12 * f + rng.normal(0, 8, n)), 0, 99).astype(float)
        elif kind == 2:
            values = np.minimum(rng.poisson(np.exp(1.0 + 0.4 * f)), 20).astype(float)
            if j == 2:
                values[policy != 1] = np.nan
                logit += 0.1 * np.nan_to_num(values)
        else:
            values = np.round(np.clip(0.9 * f + rng.normal(0, 0.6, n), -5, 5), 3)
        out[wide_schema()["columns"][2 + N_CAT + j]["name"]] = values
    out["fraud"] = np.where(rng.random(n) < 1 / (1 + np.exp(-logit)), "yes", "no")
    return pd.DataFrame(out)


def write(folder: Path, *, train_rows: int, test_rows: int, test_seed: int) -> tuple[Path, Path, Path]:
    """Training rows (seed 0), held-out rows (``test_seed``) and the schema under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    train, test, schema = folder / "wide_train.csv", folder / f"wide_test_{test_seed}.csv", folder / "wide.yaml"
    wide_table(train_rows, seed=0).to_csv(train, index=False)
    wide_table(test_rows, seed=test_seed).to_csv(test, index=False)
    schema.write_text(yaml.safe_dump(wide_schema(), sort_keys=False))
    return train, test, schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--schema", required=True)
    args = parser.parse_args()
    wide_table(args.rows, seed=args.seed).to_csv(args.out, index=False)
    Path(args.schema).write_text(yaml.safe_dump(wide_schema(), sort_keys=False))


if __name__ == "__main__":
    main()
