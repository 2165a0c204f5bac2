"""DP bounds of Adult's continuous columns at the default budget share (``dp_preprocessing.release_schema``).

Strips the declared bounds of Adult's six continuous columns, validates the training split, and releases
the bounds ``--runs`` times, each with a fresh ``PrivacyLedger(target_epsilon=1, delta=1e-5)``,
``epsilon=0.1`` (the default ``data.preprocessing_epsilon_fraction`` × ε = 1), ``num_rows`` = the row
count plus N(0, 30²) (a stand-in for the run's DP count) and a fresh OS-seeded noise generator. Prints,
per column, the true min/max and 1%/99% quantiles next to the released bounds (median and range over the
runs), how many runs failed, how many returned an inverted interval, and how many bounds fell outside
the data (below the minimum or above the maximum). Skips (exit 0) when the shared data folder is absent.

    python bench/dp_bounds.py [--runs 20] [--epsilon 0.1] [--root ../shared/data]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from lightning_dp.data.dp_preprocessing import quantile_level, release_schema
from lightning_dp.data.schema import Schema, validate
from lightning_dp.data.sources import DEFAULT_ROOT, load_adult
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger

COUNT_NOISE = 30.0  # std of the stand-in DP row count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=0.1, help="ε share for the bounds")
    parser.add_argument("--root", default=str(DEFAULT_ROOT), help="folder holding adult/")
    args = parser.parse_args()
    if not (Path(args.root) / "adult").exists():
        print(f"skipped: the Adult data set is not at {Path(args.root) / 'adult'}")
        return
    logging.getLogger("lightning_dp.data.dp_preprocessing").setLevel(logging.ERROR)  # one warning per column
    src = load_adult(root=args.root)
    continuous = [c.name for c in src.schema.columns if c.type == "continuous"]
    schema = Schema(
        columns=[dataclasses.replace(c, bounds=None) if c.type == "continuous" else c for c in src.schema.columns],
        label=src.schema.label,
        missing_values=src.schema.missing_values,
    )
    train = validate(src.train, schema, source="the Adult training data")
    released: dict[str, list[tuple[float, float]]] = {name: [] for name in continuous}
    failed, levels = 0, []
    for _ in range(args.runs):
        ledger, gen = PrivacyLedger(target_epsilon=1.0, delta=1e-5), mech.noise_generator(None)
        num_rows = float(
            mech.gaussian_noise(torch.tensor(float(len(train))), sensitivity=1.0, noise_multiplier=COUNT_NOISE,
                                generator=gen)
        )
        try:
            out = release_schema(train, schema, ledger, epsilon=args.epsilon, num_rows=num_rows, generator=gen)
        except Exception as err:  # a benchmark counts failures of any kind
            failed += 1
            print(f"run failed: {type(err).__name__}: {err}")
            continue
        levels.append(quantile_level(ledger.releases[0].epsilon, num_rows))
        for name in continuous:
            released[name].append(tuple(out[name].bounds))

    print(f"Adult training split, {len(train):,} rows; {args.runs} runs at ε = {args.epsilon:g} for the bounds of "
          f"{len(continuous)} columns (δ = 1e-5); quantile level q: median {np.median(levels):.4f}, "
          f"range [{min(levels):.4f}, {max(levels):.4f}]")
    print()
    print("| column | true min | true max | true 1% | true 99% | lower: median [range] | upper: median [range] "
          "| failed | inverted | outside data (lower / upper) |")
    print("|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for name in continuous:
        x = train[name].dropna().to_numpy(dtype=float)
        b = np.asarray(released[name], dtype=float).reshape(-1, 2)
        lo, hi = b[:, 0], b[:, 1]
        print(f"| {name} | {x.min():g} | {x.max():g} | {np.quantile(x, 0.01):g} | {np.quantile(x, 0.99):g} "
              f"| {np.median(lo):.6g} [{lo.min():.6g}, {lo.max():.6g}] "
              f"| {np.median(hi):.6g} [{hi.min():.6g}, {hi.max():.6g}] "
              f"| {failed} | {int((lo >= hi).sum())} | {int((lo < x.min()).sum())} / {int((hi > x.max()).sum())} |")


if __name__ == "__main__":
    main()
