"""GEM's scaling: the measurement pass (exact 1- and 2-way marginals over streamed rows) and one fitting step.

For each (rows, columns) a fresh subprocess (one thread) draws categorical rows chunk by chunk (8 levels a column,
each column copying its left neighbour with probability 1/2, so pairs are dependent), counts every 1-way and 2-way
marginal the way ``AdaptiveMarginals`` does (``privacy.marginals.pair_counts``: one Gram matrix of the one-hot rows
per chunk of 65,536 rows),
then times what a round costs a ``GEM`` module: the model's answers to every workload marginal (the selection's
input, 4,096 draws) and one training step (batch 1,024) fitted to the 1-way marginals and ``--pairs`` pairs per
column (4: about what a run measures), in the layout its cost estimate picks and in both (the measured blocks, one
dense product: ``models/gem_fit.py``). It prints wall times and the child's peak resident memory: the pass should be
linear in rows, memory flat in rows (rows are never held whole), the round's cost independent of rows.

    python bench/gem_scaling.py [--rows 10000 100000 1000000] [--columns 15 40 100] [--pairs 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 65536
LEVELS = 8


def time_steps(module: Any, device: str) -> float:
    """Seconds a training step, the last five of six (the first builds the plan)."""
    import torch

    opt = torch.optim.Adam(module.generator.parameters(), lr=1e-3)
    for step in range(6):
        if step == 1:
            t0 = time.perf_counter()
        loss = module.training_step(None, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if device != "cpu":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / 5


def child(rows: int, columns: int, pairs: int, device: str) -> dict[str, float]:
    import torch

    from lightning_dp.models.gem import GEM
    from lightning_dp.nets.marginal_nets import ProductGenerator
    from lightning_dp.privacy import marginals as mg

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    levels = [LEVELS] * columns
    cliques = [(c,) for c in range(columns)] + mg.workload(columns)[0]
    gram = torch.zeros(LEVELS * columns, LEVELS * columns, dtype=torch.float64, device=device)
    start = time.perf_counter()
    for lo in range(0, rows, CHUNK):
        n = min(CHUNK, rows - lo)
        codes = torch.randint(LEVELS, (n, columns), generator=gen)
        copy = torch.rand(n, columns, generator=gen) < 0.5
        for c in range(1, columns):
            codes[:, c] = torch.where(copy[:, c], codes[:, c - 1], codes[:, c])
        gram += mg.pair_counts(codes.to(device), levels)
    totals = [mg.clique_from_pairs(gram.cpu(), c, levels) for c in cliques]
    measure = time.perf_counter() - start
    module = GEM(ProductGenerator(level_sizes=levels), n_continuous=0, block_sizes=levels[:-1], num_classes=LEVELS,
                 bins=LEVELS, entropy_weight=0.001, entropy_units="proportions").to(device)  # model=gem's default term
    module.log = lambda *args, **kwargs: None
    module.num_rows.fill_(float(rows))
    measured = cliques[: columns + pairs * columns]  # the 1-way marginals and the first pairs·C pairs
    for clique, total in zip(measured, totals):
        module.add_measurement(clique, total, 1.0)
    module.on_fit_start()  # the numeric setting of a run's fit (subnormal floats flushed) for the round's cost
    t0 = time.perf_counter()
    module.answers(module.cliques, draws=4096)
    answers = time.perf_counter() - t0
    fit = time_steps(module, device)
    layout = "dense" if module._targets[1].pairs.cells is not None else "blocks"
    both = {}
    for name, dense in (("blocks", False), ("dense", True)):
        module._targets = ((len(module.meas_sigma), module.device), module._fit_targets(dense=dense))
        both[name] = time_steps(module, device)
    module.teardown("fit")
    return {"measure_s": measure, "answers_s": answers, "fit_step_s": fit, "layout": layout,
            "blocks_step_s": both["blocks"], "dense_step_s": both["dense"], "cliques": len(cliques),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--columns", nargs="+", type=int, default=[15, 40, 100])
    parser.add_argument("--pairs", type=int, default=4, help="measured pairs per column in the fitting step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.pairs, args.device)))
        return
    print(f"GEM scaling on {args.device}, one thread; {LEVELS} levels a column; all 1- and 2-way marginals; the fit "
          f"measures {args.pairs} pairs a column")
    print("| rows | columns | marginals | measurement pass s | s per 10^6 rows | answers s | fit step ms (layout) | "
          "blocks / dense ms | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for columns in args.columns:
        for rows in args.rows:
            out = subprocess.run([sys.executable, __file__, "--child", str(rows), str(columns), "--pairs",
                                  str(args.pairs), "--device", args.device],
                                 capture_output=True, text=True, env=env, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {rows:,} | {columns} | {r['cliques']:,} | {r['measure_s']:.2f} | "
                  f"{r['measure_s'] / rows * 1e6:.2f} | {r['answers_s']:.2f} | {1000 * r['fit_step_s']:.1f} ({r['layout']}) | "
                  f"{1000 * r['blocks_step_s']:.1f} / {1000 * r['dense_step_s']:.1f} | "
                  f"{r['peak_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
