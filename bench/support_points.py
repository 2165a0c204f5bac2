"""Benchmark: private support points' MH chains, energy-distance evaluations, and the memory of the data pass.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019), Ch. 5, as implemented in
``lightning_dp/privacy/energy_mh.py`` and ``lightning_dp/callbacks/private_support_points.py``:

* MH steps/s of ``run_chains`` for n support points in d dimensions against a reference of n points (Algorithm 1:
  the reference is the optimised support set), ``--chains`` chains advanced together (one step moves one
  point in each chain);
* energy-distance evaluations/s: the incremental ``Δe`` of one single-point move (``delta_energy``, O(n)) and the
  full ``e(Y, R)`` (``energy_distance``, O(n²));
* the peak memory of the release's one pass over the data (the DP KDE bandwidth: the rows' log-likelihood on
  the bandwidth grid, streamed in chunks), for N rows, each N in a fresh subprocess. On CPU the extra peak
  resident memory of the pass (``VmHWM`` reset through ``/proc/self/clear_refs`` after the rows exist, minus the
  resident memory then); on CUDA ``torch.cuda.max_memory_allocated`` beyond the rows. Flat in N means the pass
  holds O(chunk · n · grid) memory, not O(N).

Usage:
    python bench/support_points.py [--device cpu|cuda] [--n 500] [--d 10] [--rows 1e4 1e5 1e6] [--threads 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import time
from pathlib import Path
from typing import Any


def _timed(fn: Any, *, min_seconds: float, sync: Any) -> tuple[int, float]:
    """Calls of ``fn`` until ``min_seconds`` have passed: (calls, seconds)."""
    fn()  # warm-up
    sync()
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            fn()
        calls += 10
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return calls, elapsed


def speed(args: argparse.Namespace) -> list[tuple[str, str]]:
    """MH steps/s and energy evaluations/s, as (what, figure) lines."""
    import torch

    from lightning_dp.kernels.energy import energy_distance
    from lightning_dp.privacy.energy_mh import ChainSettings, delta_energy, run_chains
    from lightning_dp.privacy.sensitivity import energy_sensitivity

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    n, d, k = args.n, args.d, args.chains
    ref = torch.rand(n, d, generator=gen, dtype=torch.float64).to(dev)  # the optimised support set, (n, d)
    beta = 1000.0 / (2 * energy_sensitivity(n_ref=n, d=d, p=1.0))
    trace_every = max(args.steps // 8, 1)
    settings = ChainSettings(
        burn_in=args.steps // 2,
        thin=trace_every,
        draws=args.steps // (2 * trace_every) + 1,
        num_chains=k,
        trace_every=trace_every,
    )
    run_chains(
        ref,
        n=n,
        beta=beta,
        p=1.0,
        settings=ChainSettings(burn_in=50, thin=10, draws=6, num_chains=k, trace_every=10),
        generator=gen,
    )  # warm-up
    sync()
    start = time.perf_counter()
    run_chains(ref, n=n, beta=beta, p=1.0, settings=settings, generator=gen)
    sync()
    seconds = time.perf_counter() - start
    steps = settings.num_steps
    lines = [
        (
            f"MH steps/s, run_chains ({k} chains, n = {n}, d = {d}, p = 1, {steps:,} steps incl. "
            f"{settings.trace_length} full energies for R̂)",
            f"{steps / seconds:,.0f} ({k * steps / seconds:,.0f} chain-steps/s)",
        )
    ]
    points = torch.rand(k, n, d, generator=gen, dtype=torch.float64).to(dev)  # (K, n, d)
    cross = torch.cdist(points, ref.expand(k, n, d), p=1).sum(-1)  # (K, n)
    proposal = torch.rand(k, d, generator=gen, dtype=torch.float64).to(dev)  # (K, d)
    for label, pts, prop, cr in (
        ("1 chain", points[:1], proposal[:1], cross[:1]),
        (f"{k} chains batched", points, proposal, cross),
    ):
        calls, secs = _timed(
            lambda p=pts, q=prop, c=cr: delta_energy(p, 3, q, c, ref, 1.0),
            min_seconds=args.min_seconds,
            sync=sync,
        )
        lines.append(
            (f"incremental Δe evaluations/s (delta_energy, O(n), {label})", f"{calls * len(pts) / secs:,.0f}")
        )
    for label, pts in (("1 set", points[:1]), (f"{k} sets batched", points)):
        calls, secs = _timed(
            lambda p=pts: energy_distance(p, ref, 1.0), min_seconds=args.min_seconds, sync=sync
        )
        lines.append(
            (
                f"full e(Y, R) evaluations/s (energy_distance, O(n²), {label})",
                f"{calls * len(pts) / secs:,.0f}",
            )
        )
    return lines


def _clear_peak() -> bool:
    """Reset this process's peak resident memory (Linux ``clear_refs``); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _memory_worker(rows: int, args: dict[str, Any], out: mp.Queue) -> None:
    """One release data pass over ``rows`` rows in a fresh process: its seconds and extra peak memory."""
    import torch

    torch.set_num_threads(args["threads"])
    from lightning_dp.callbacks.private_support_points import PrivateSupportPoints
    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.models.support_points import SupportPoints
    from lightning_dp.privacy import mechanisms as mech
    from lightning_dp.privacy.ledger import PrivacyLedger

    dev = torch.device(args["device"])
    gen = torch.Generator().manual_seed(rows)
    dm = PrivateDataModule(name="diabetes")  # only its private_batches: the rows are set here, not loaded
    dm.x = torch.rand(rows, args["d"], generator=gen)  # (N, d) float32, as the data module holds them
    dm.y = torch.zeros(rows, dtype=torch.long)
    module = SupportPoints(n_continuous=args["d"], num_points=args["mem_points"]).to(dev)
    cb = PrivateSupportPoints(
        ledger=PrivacyLedger(target_epsilon=1.0, delta=1e-5), datamodule=dm, chunk_size=args["chunk"]
    )
    release = cb._bandwidth_release()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    resettable = _clear_peak()
    rss = _status_kib("VmRSS")
    start = time.perf_counter()
    cb._release_bandwidth(
        module, release, mech.noise_generator(0)
    )  # the pass the release makes over the rows
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    extra = (_status_kib("VmHWM") - rss) / 1024 if resettable else float("nan")
    result = {"rows": rows, "seconds": seconds, "extra_rss_mib": extra, "data_mib": dm.x.numel() * 4 / 2**20}
    if dev.type == "cuda":
        result["extra_cuda_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    out.put(result)


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    results = []
    for rows in args.rows:
        queue: mp.Queue = ctx.Queue()
        proc = ctx.Process(target=_memory_worker, args=(int(rows), vars(args), queue))
        proc.start()
        results.append(queue.get())
        proc.join()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--n", type=int, default=500, help="support points (and reference points) of the chains")
    p.add_argument("--d", type=int, default=10, help="dimensions")
    p.add_argument("--chains", type=int, default=5, help="chains advanced together (the thesis code: 5)")
    p.add_argument("--steps", type=int, default=4000, help="MH steps timed")
    p.add_argument(
        "--min-seconds", type=float, default=2.0, help="time each energy evaluation at least this long"
    )
    p.add_argument(
        "--rows", type=float, nargs="+", default=[1e4, 1e5, 1e6], help="data sizes of the memory pass"
    )
    p.add_argument("--mem-points", type=int, default=35, help="released support points in the memory pass")
    p.add_argument(
        "--chunk", type=int, default=4096, help="rows per chunk of the data pass (the callback's default)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here.")
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.machine()} CPU"
    print(f"# private support points on {where}, {args.threads} torch thread(s), float64 chains")
    for what, figure in speed(args):
        print(f"{what:<92} {figure}")
    print(
        f"\n# the release's data pass (DP KDE bandwidth over N rows, d = {args.d}, {args.mem_points} released points, "
        f"40 bandwidths, chunks of {args.chunk} rows), each N in a fresh process"
    )
    cuda = args.device == "cuda"
    print(
        f"{'N rows':>10} {'rows MiB':>9} {'seconds':>8} {'extra peak RSS MiB':>19}"
        + (" extra peak CUDA MiB" if cuda else "")
    )
    for r in memory(args):
        line = f"{r['rows']:>10,} {r['data_mib']:>9.1f} {r['seconds']:>8.2f} {r['extra_rss_mib']:>19.1f}"
        print(line + (f" {r['extra_cuda_mib']:>19.1f}" if cuda else ""))


if __name__ == "__main__":
    main()
