"""Benchmark: chunked DCR (audits.distances) vs scikit-learn's brute-force NearestNeighbors, same run.

Each method runs in a fresh subprocess that builds the same seeded data; the table reports wall time and
the *extra* peak resident memory of the computation (peak RSS after minus peak RSS before, from
``resource.getrusage``; tracemalloc would miss torch's allocator). A dense n_query × n_ref float64 distance
matrix, for comparison, would need n_query · n_ref · 8 bytes (20 GB at 50,000 × 50,000).

Usage:
    python bench/distances.py [--n-query 50000] [--n-ref 50000] [--dim 100] [--k 1] [--threads 2]

Methods: ``chunked-float64`` and ``chunked-float32`` (numpy BLAS blocks; the selection precision),
``chunked-float64-torch`` (torch blocks), ``sklearn-brute`` (``NearestNeighbors(algorithm="brute")``, whose
``kneighbors`` is itself chunked, so it runs at full size).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from typing import Any

import numpy as np


def _data(n_query: int, n_ref: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n_query, dim)), rng.normal(size=(n_ref, dim))


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _worker(method: str, args: dict[str, Any], out: mp.Queue) -> None:
    import torch

    torch.set_num_threads(args["threads"])
    from sklearn.neighbors import NearestNeighbors
    from threadpoolctl import threadpool_limits

    from audits.distances import nearest_neighbors

    q, r = _data(args["n_query"], args["n_ref"], args["dim"])
    before = _peak_mib()
    t0 = time.perf_counter()
    with threadpool_limits(args["threads"]):
        if method.startswith("chunked"):
            dtype = np.float32 if "float32" in method else np.float64
            backend = "torch" if method.endswith("torch") else "numpy"
            d, i = nearest_neighbors(q, r, k=args["k"], dtype=dtype, backend=backend)
        else:
            nn = NearestNeighbors(n_neighbors=args["k"], algorithm="brute").fit(r)
            d, i = nn.kneighbors(q)
    seconds = time.perf_counter() - t0
    out.put({"method": method, "seconds": seconds, "extra_peak_mib": _peak_mib() - before, "d": d, "i": i})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-query", type=int, default=50_000)
    p.add_argument("--n-ref", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--methods",
        nargs="+",
        default=["chunked-float64", "chunked-float32", "chunked-float64-torch", "sklearn-brute"],
    )
    args = vars(p.parse_args())
    ctx = mp.get_context("spawn")
    rows = []
    for method in args["methods"]:
        queue: mp.Queue = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(method, args, queue))
        proc.start()
        rows.append(queue.get())
        proc.join()
    dense_gib = args["n_query"] * args["n_ref"] * 8 / 2**30
    print(
        f"{args['n_query']:,} queries x {args['n_ref']:,} references x {args['dim']} features, k={args['k']}, "
        f"{args['threads']} threads (a dense float64 distance matrix would take {dense_gib:.1f} GiB)"
    )
    ref = rows[0]
    print(f"{'method':<24}{'seconds':>10}{'extra peak MiB':>16}{'same idx':>10}{'max |Δd|':>12}")
    for row in rows:
        same = float((row["i"] == ref["i"]).mean())
        diff = float(np.abs(row["d"] - ref["d"]).max())
        print(
            f"{row['method']:<24}{row['seconds']:>10.2f}{row['extra_peak_mib']:>16.1f}{same:>10.4f}{diff:>12.2e}"
        )


if __name__ == "__main__":
    main()
