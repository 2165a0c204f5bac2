"""KSD estimators (lightning_dp.kernels.stein) vs straightforward numpy, same data, same run.

Data: n rows of a d-dimensional standard normal with its exact score s(x) = −x, RBF Stein kernel with a
fixed bandwidth (the linear-pairs median of that sample, computed once, so the median heuristic's cost is
not mixed into the statistics; ``median_bandwidth`` is timed on its own rows). Statistics:

* ``linear``: the normalised linear statistic Ŝ_{l,n} = (B−1)(Σu_i)²/(B Σu_i²), B = ⌊n/2⌋ ("Privacy-
  Preserving Energy-Based Generative Models for Marginal Distribution Protection", eq. 17), torch
  ``ksd_linear_normalized`` vs a plain Python loop over the B pairs computing the Stein kernel per pair with
  numpy. If the loop would take longer than ``--loop-budget`` seconds (estimated from its first 10,000
  pairs) it runs on that prefix only and its time is extrapolated linearly (note "extrapolated").
* ``U`` / ``V``: the quadratic statistics Σ_{i≠j} u/(n(n−1)) and Σ_{i,j} u/n², torch ``ksd_u_statistic`` /
  ``ksd_v_statistic`` vs a numpy double sum vectorised per row block (the same s(x)ᵀs(y), s(x)ᵀr, ‖r‖²
  expansion through BLAS). Both process blocks of about ``--block-elems`` kernel entries (torch
  ``chunk_size = block_elems // n`` rows), so their working memory is O(block_elems), flat in n; a fixed
  ``chunk_size`` would make it O(chunk_size · n). They are measured at max-quadratic-n / 4, / 2 and
  max-quadratic-n (plus any ``--sizes`` below it); above, both times are the last measured time per pair
  times n² (note "extrapolated (O(n²))"): n = 1e6 is 1e12 kernel evaluations, and even n = 1e5 takes
  minutes per statistic on a 2-core CPU (≈ 20 ns per pair).

Reading the output: ``torch s`` / ``numpy s`` are wall seconds, the best of 2 to 5 runs (runs stop after
1 s in all); ``speed-up`` = numpy s / torch s (the goal is >= 10× for ``linear`` at n = 1e6); ``rel. err``
= |torch − numpy| / |numpy| of the statistic's value (for an extrapolated loop, on the prefix both ran);
``torch MiB`` is the peak extra memory of one call (CPU: growth of the resident-set high-water mark
VmHWM, the figure ``getrusage`` reports as ru_maxrss, in a fresh process per figure so that earlier
calls' heap fragmentation is not counted; page-granular, includes allocator slack; CUDA:
``torch.cuda.max_memory_allocated`` above the allocation before the call); ``numpy MiB`` is the
``tracemalloc`` peak (for the loop, over its first 10,000 pairs: it frees each pair's temporaries);
``torch per`` is torch seconds per row (``linear``: constant if the cost is linear in n) or per pair (U/V).
On a shared CPU keep ``--threads 1``: with more, OpenMP threads spin while a core is taken. On CPU the
torch U/V times include page faults: glibc hands each block's freed (chunk, n) temporaries back to the OS,
so every block faults its pages in again (a third or more of the time is system time);
``MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824`` in the environment keeps them
mapped and shows the compute-bound figures.

Usage:
    python bench/ksd.py [--sizes 1e4 1e5 1e6] [--max-quadratic-n 1e4] [--dim 5] [--device cpu|cuda]
        [--threads 1] [--block-elems 1048576] [--loop-budget 60]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import multiprocessing as mp
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import Tensor

from lightning_dp.kernels.stein import (
    ksd_linear_normalized,
    ksd_u_statistic,
    ksd_v_statistic,
    median_bandwidth,
)

PREFIX_PAIRS = 10_000
# name -> torch call (samples, scores, bandwidth, chunk rows)
TORCH_CALLS: dict[str, Callable[[Tensor, Tensor, float, int], Tensor]] = {
    "median (linear)": lambda x, s, h, c: median_bandwidth(x, pairs="linear"),
    "median (all)": lambda x, s, h, c: median_bandwidth(x, pairs="all"),
    "linear": lambda x, s, h, c: ksd_linear_normalized(x, s, bandwidth=h),
    "U": lambda x, s, h, c: ksd_u_statistic(x, s, bandwidth=h, chunk_size=c),
    "V": lambda x, s, h, c: ksd_v_statistic(x, s, bandwidth=h, chunk_size=c),
}


@dataclass
class Row:
    """One line of the table."""

    n: int
    statistic: str
    torch_s: float
    numpy_s: float | None = None
    rel_err: float | None = None
    torch_mib: float | None = None
    numpy_mib: float | None = None
    per: str = ""
    note: str = ""


def sample(n: int, dim: int) -> np.ndarray:
    """The seeded (n, d) standard-normal sample every measurement uses."""
    return np.random.default_rng(0).standard_normal((n, dim))


def numpy_linear_loop(x: np.ndarray, score: np.ndarray, h: float, pairs: int | None = None) -> float:
    """Ŝ_{l,n} (eq. 17) by a plain loop over the pairs (x_{2i−1}, x_{2i}), one RBF Stein kernel at a time.

    u = k·[s(x)ᵀs(y) + (s(x)ᵀr − rᵀs(y))/h + D/h − ‖r‖²/h²], k = exp(−‖r‖²/(2h)), r = x − y.
    """
    dim = x.shape[1]
    b = x.shape[0] // 2 if pairs is None else pairs
    total, total_sq = 0.0, 0.0
    for i in range(b):
        xa, xb, sa, sb = x[2 * i], x[2 * i + 1], score[2 * i], score[2 * i + 1]
        r = xa - xb  # (D,)
        r2 = r @ r
        u = np.exp(-r2 / (2 * h)) * (sa @ sb + (sa @ r - r @ sb) / h + dim / h - r2 / (h * h))
        total += u
        total_sq += u * u
    return float((b - 1) * total**2 / (b * total_sq + 1e-12))


def numpy_stein_sum(x: np.ndarray, score: np.ndarray, h: float, block_rows: int) -> float:
    """Σ_{i,j} u(x_i, x_j) over row blocks of ``block_rows``, each a (block_rows, n) numpy array."""
    dim = x.shape[1]
    x_sq, xs = (x * x).sum(1), (x * score).sum(1)  # (n,), (n,)
    total = 0.0
    for s in range(0, x.shape[0], block_rows):
        xb, sb = x[s : s + block_rows], score[s : s + block_rows]  # (c, D)
        sxsy = sb @ score.T  # (c, n)
        sxr = xs[s : s + block_rows, None] - sb @ x.T  # s(x_i)ᵀ(x_i − x_j), (c, n)
        rsy = xb @ score.T - xs[None, :]  # (x_i − x_j)ᵀs(x_j), (c, n)
        r2 = np.maximum(x_sq[s : s + block_rows, None] + x_sq[None, :] - 2 * (xb @ x.T), 0.0)  # (c, n)
        total += float((np.exp(-r2 / (2 * h)) * (sxsy + (sxr - rsy) / h + dim / h - r2 / (h * h))).sum())
    return total


def numpy_u(x: np.ndarray, score: np.ndarray, h: float, block_rows: int) -> float:
    """U-statistic: the double sum minus its diagonal u(x_i, x_i) = ‖s(x_i)‖² + D/h, over n(n−1)."""
    n, dim = x.shape
    diag = float((score * score).sum() + n * dim / h)
    return (numpy_stein_sum(x, score, h, block_rows) - diag) / (n * (n - 1))


def numpy_v(x: np.ndarray, score: np.ndarray, h: float, block_rows: int) -> float:
    """V-statistic: the double sum over n²."""
    return numpy_stein_sum(x, score, h, block_rows) / x.shape[0] ** 2


def _rss_kib(field: str) -> int:
    """A field of /proc/self/status (VmRSS: resident now, VmHWM: resident high-water mark), in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def _reset_rss_peak() -> int:
    """Return free heap to the OS, reset VmHWM to the current RSS (Linux >= 4.0) and return it, in KiB."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_kib("VmRSS")


def _cpu_peak_worker(name: str, n: int, dim: int, h: float, chunk: int, threads: int, out: mp.Queue) -> None:
    """In a fresh process: VmHWM growth (MiB) of one torch call on the seeded sample."""
    torch.set_num_threads(threads)
    x = torch.from_numpy(sample(n, dim))
    s = -x
    TORCH_CALLS[name](x[:8], s[:8], h, 4)  # lazy initialisation is not the call's working memory
    base = _reset_rss_peak()
    TORCH_CALLS[name](x, s, h, chunk)
    out.put((_rss_kib("VmHWM") - base) / 1024)


def torch_peak_mib(name: str, x: Tensor, s: Tensor, h: float, chunk: int) -> float:
    """Peak extra memory of one torch call: CUDA allocator peak, or VmHWM growth in a fresh CPU process."""
    if x.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        TORCH_CALLS[name](x, s, h, chunk)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    args = (name, x.shape[0], x.shape[1], h, chunk, torch.get_num_threads(), queue)
    proc = ctx.Process(target=_cpu_peak_worker, args=args)
    proc.start()
    peak = queue.get()
    proc.join()
    return peak


def best_time(fn: Callable[[], float], sync: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """(best wall seconds, value) over 2 to 5 runs, stopping once 1 s has been spent."""
    best, value, spent, runs = math.inf, math.nan, 0.0, 0
    while runs < 5 and (runs < 2 or spent < 1.0):
        sync()
        t0 = time.perf_counter()
        value = fn()
        sync()
        dt = time.perf_counter() - t0
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best, value


def measure_torch(name: str, x: Tensor, s: Tensor, h: float, chunk: int = 1) -> tuple[float, float, float]:
    """(seconds, peak extra MiB, value) of one of :data:`TORCH_CALLS`."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    seconds, value = best_time(lambda: float(TORCH_CALLS[name](x, s, h, chunk)), sync)
    return seconds, torch_peak_mib(name, x, s, h, chunk), value


def measure_numpy(
    fn: Callable[[], float], mem_fn: Callable[[], float] | None = None
) -> tuple[float, float, float]:
    """(seconds, tracemalloc peak MiB, value); memory from ``mem_fn`` (default ``fn``) in an untimed run."""
    gc.collect()
    tracemalloc.start()
    (mem_fn or fn)()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    seconds, value = best_time(fn)
    return seconds, peak, value


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def linear_rows(n: int, dim: int, device: torch.device, loop_budget: float) -> list[Row]:
    """Timings of the median heuristic and of Ŝ_{l,n} (torch and the numpy loop) at one n."""
    x_np = sample(n, dim)
    s_np = -x_np
    x = torch.from_numpy(x_np).to(device)
    s = -x
    b = n // 2
    rows = []
    for pairs, note in (("linear", "B consecutive pairs"), ("all", "all pairs of the first 1000 rows")):
        t, mem, _ = measure_torch(f"median ({pairs})", x, s, 1.0)
        per = f"{t / n * 1e9:.1f} ns/row" if pairs == "linear" else ""
        rows.append(Row(n, f"median ({pairs})", t, torch_mib=mem, per=per, note=note))
    h = float(median_bandwidth(x, pairs="linear"))

    t_torch, mem_torch, v_torch = measure_torch("linear", x, s, h)
    prefix = min(b, PREFIX_PAIRS)
    t0 = time.perf_counter()
    v_prefix = numpy_linear_loop(x_np, s_np, h, prefix)
    estimate = (time.perf_counter() - t0) * b / prefix
    mem_fn = lambda: numpy_linear_loop(x_np, s_np, h, prefix)  # noqa: E731
    if estimate <= loop_budget:
        t_np, mem_np, v_np = measure_numpy(lambda: numpy_linear_loop(x_np, s_np, h), mem_fn)
        err, note = _rel(v_torch, v_np), ""
    else:
        t_pre, mem_np, _ = measure_numpy(mem_fn)
        t_np = t_pre * b / prefix
        v_torch_prefix = float(ksd_linear_normalized(x[: 2 * prefix], s[: 2 * prefix], bandwidth=h))
        err = _rel(v_torch_prefix, v_prefix)
        note = f"numpy extrapolated from {prefix:,} pairs"
    per = f"{t_torch / n * 1e9:.1f} ns/row"
    rows.append(Row(n, "linear", t_torch, t_np, err, mem_torch, mem_np, per, note))
    return rows


def quadratic_rows(n: int, dim: int, device: torch.device, block_elems: int) -> list[Row]:
    """Timings of the U- and V-statistics (torch and numpy, same row blocks) at one n."""
    x_np = sample(n, dim)
    s_np = -x_np
    x = torch.from_numpy(x_np).to(device)
    s = -x
    h = float(median_bandwidth(x, pairs="linear"))
    chunk = max(1, min(n, block_elems // n))
    rows = []
    for name, numpy_fn in (("U", numpy_u), ("V", numpy_v)):
        t_t, m_t, v_t = measure_torch(name, x, s, h, chunk)
        t_n, m_n, v_n = measure_numpy(lambda f=numpy_fn: f(x_np, s_np, h, chunk))
        per = f"{t_t / n**2 * 1e9:.1f} ns/pair"
        note = f"blocks of {chunk} rows; a dense (n, n) float64 is {n * n * 8 / 2**20:,.0f} MiB"
        rows.append(Row(n, name, t_t, t_n, _rel(v_t, v_n), m_t, m_n, per, note))
    return rows


def extrapolated_quadratic(n: int, measured: Row) -> Row:
    """A U/V row at n from the time per pair of a measured row (no values, no memory)."""
    scale = (n / measured.n) ** 2
    assert measured.numpy_s is not None
    note = f"extrapolated (O(n²)) from n={measured.n:,}"
    return Row(
        n, measured.statistic, measured.torch_s * scale, measured.numpy_s * scale, per=measured.per, note=note
    )


def _fmt(v: float | None, width: int, spec: str, suffix: str = "") -> str:
    """``v`` formatted and right-aligned in ``width`` characters, or "-" for a missing figure."""
    return f"{'-' if v is None else format(v, spec) + suffix:>{width}}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    p.add_argument("--max-quadratic-n", type=float, default=1e4)
    p.add_argument("--dim", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--block-elems", type=int, default=2**20)
    p.add_argument("--loop-budget", type=float, default=60.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)  # numpy's BLAS gets the same threads as torch
    device = torch.device(args.device)
    sizes = sorted(int(v) for v in args.sizes)
    q_max = int(args.max_quadratic_n)
    q_sizes = sorted({q_max // 4, q_max // 2, q_max, *(v for v in sizes if v <= q_max)})

    start = time.perf_counter()
    rows: list[Row] = []
    for n in sizes:
        rows += linear_rows(n, args.dim, device, args.loop_budget)
    measured: dict[str, Row] = {}
    for n in q_sizes:
        for row in quadratic_rows(n, args.dim, device, args.block_elems):
            rows.append(row)
            measured[row.statistic] = row
    for n in (v for v in sizes if v > q_max):
        rows += [extrapolated_quadratic(n, measured[name]) for name in ("U", "V")]

    mem = "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM growth, fresh process each"
    print(
        f"KSD, d={args.dim} standard normal, score -x, RBF with the linear-pairs median bandwidth; torch "
        f"{torch.__version__} on {device} ({torch.get_num_threads()} threads), numpy {np.__version__}"
    )
    print(f"torch memory: {mem}; numpy memory: tracemalloc peak; U/V blocks of ~{args.block_elems:,} entries")
    header = (
        f"{'n':>9}  {'statistic':<15}{'torch s':>11}{'numpy s':>11}{'speed-up':>10}{'rel. err':>10}"
        f"{'torch MiB':>11}{'numpy MiB':>11}{'torch per':>15}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        speed = None if r.numpy_s is None else r.numpy_s / r.torch_s
        line = (
            f"{r.n:>9,}  {r.statistic:<15}{r.torch_s:>11.4g}{_fmt(r.numpy_s, 11, '.4g')}"
            f"{_fmt(speed, 10, '.1f', 'x')}{_fmt(r.rel_err, 10, '.1e')}"
            f"{_fmt(r.torch_mib, 11, '.1f')}{_fmt(r.numpy_mib, 11, '.2f')}{r.per:>15}  {r.note}"
        )
        print(line.rstrip())
    print(f"total bench time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
