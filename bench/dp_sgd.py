"""DP-SGD step cost: plain step vs our one-pass clipper vs Opacus 1.6 (hooks, functorch, ghost).

A step is forward + backward (+ clipping and noise for the private ones) + optimizer step, timed as
the median (and min) of ``--steps`` steps after ``--warmup`` steps. "fast-clip" is our clipper alone
(clipped sum, divided by B); "fast" adds the Gaussian noise, like the Opacus rows. Methods are timed
round-robin in one process (blocks of ``--block`` steps) so that load changes hit them all alike;
ratios are to the plain step of the same run. On a shared CPU use ``--threads 1 --clock cpu``
(process CPU time): wall-clock medians with two threads are meaningless while other jobs run. Peak memory is measured per method in a fresh subprocess, after two warm-up steps (so
optimizer state is in the baseline): on CUDA ``torch.cuda.max_memory_allocated`` above what is
allocated before the steps; on CPU the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` after ``malloc_trim``) above the resident set before the steps. CPU figures
are page-granular and include allocator slack; treat differences under ~1 MiB as noise.

Usage: ``python bench/dp_sgd.py [--device cuda] [--threads 1 --clock cpu] [--steps 50] [--no-memory]``
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import multiprocessing as mp
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lightning_dp.privacy.clipping import PerSampleClipper, add_noise

SIGMA, C = 1.0, 1.0
METHODS = ("plain", "fast-clip", "fast", "opacus-hooks", "opacus-functorch", "opacus-ghost")
Step = Callable[[], None]


def mlp() -> nn.Module:
    """Tabular discriminator: 108 -> 256 -> 256 -> 1."""
    return nn.Sequential(
        nn.Linear(108, 256), nn.LeakyReLU(0.2), nn.Linear(256, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1)
    )


def convnet() -> nn.Module:
    """Image discriminator for 1x28x28: two strided convs with GroupNorm, then a linear head."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 4, stride=2, padding=1),  # (B, 16, 14, 14)
        nn.LeakyReLU(0.2),
        nn.Conv2d(16, 32, 4, stride=2, padding=1),  # (B, 32, 7, 7)
        nn.GroupNorm(8, 32),
        nn.LeakyReLU(0.2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 1),
    )


CASES = {"mlp": (mlp, (108,), 256), "conv": (convnet, (1, 28, 28), 64)}


def make_step(method: str, case: str, device: torch.device) -> Step:
    """Build a model, optimizer and batch for one method; return a closure running one step."""
    build, shape, batch = CASES[case]
    torch.manual_seed(0)
    model = build().to(device)
    x, y = torch.randn(batch, *shape, device=device), torch.randint(0, 2, (batch,), device=device).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    per_sample = nn.BCEWithLogitsLoss(reduction="none")

    if method == "plain":

        def step() -> None:
            per_sample(model(x).squeeze(1), y).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    if method.startswith("fast"):  # "fast-clip": the clipping engine alone, no noise
        clipper = PerSampleClipper(model, max_grad_norm=C)
        params = list(clipper.params)
        sigma = SIGMA if method == "fast" else 0.0

        def step() -> None:
            clipper.backward(per_sample(model(x).squeeze(1), y))
            grads = [p.grad for p in params]
            noisy = add_noise(grads, noise_multiplier=sigma, max_grad_norm=C) if sigma > 0 else grads
            for p, g in zip(params, noisy):
                p.grad = g.div_(batch)  # divided by the expected batch size
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    return _opacus_step(method, model, optimizer, x, y, batch)


def _opacus_step(
    method: str, model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor, batch: int
) -> Step:
    from opacus import PrivacyEngine

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.cpu(), y.cpu()), batch_size=batch)
    mode = method.removeprefix("opacus-")
    kwargs = {"criterion": nn.BCEWithLogitsLoss()} if mode == "ghost" else {}
    private = PrivacyEngine().make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=SIGMA,
        max_grad_norm=C,
        poisson_sampling=False,
        grad_sample_mode=mode,
        **kwargs,
    )
    model, optimizer = private[0], private[1]
    criterion = private[2] if mode == "ghost" else nn.BCEWithLogitsLoss()

    def step() -> None:
        criterion(model(x).squeeze(1), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def settle_allocator() -> None:
    """Allocate and free 16 MiB once so that glibc raises its mmap/trim thresholds (dynamic since 2.x).

    Without it, a short CPU process mmaps and page-faults every multi-MiB temporary afresh (e.g. the
    per-sample conv gradients: 2.4 ms instead of 0.7 ms here); a long training run reaches this state
    by itself. Applied once, to every method alike.
    """
    torch.empty(4 * 2**20).fill_(0.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_methods(
    case: str,
    methods: list[str],
    device: torch.device,
    steps: int,
    warmup: int,
    block: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per step of each method, measured round-robin in blocks."""
    runners, times = {}, {m: [] for m in methods}
    for m in methods:
        try:
            runners[m] = make_step(m, case, device)
            for _ in range(warmup):
                runners[m]()
        except Exception as err:  # an Opacus mode that fails here is reported, not fatal
            print(f"  {case}/{m}: unavailable ({type(err).__name__}: {str(err)[:120]})")
            runners.pop(m, None)
    while any(len(times[m]) < steps for m in runners):
        for m, run in runners.items():
            for _ in range(block):
                _sync(device)
                t0 = clock()
                run()
                _sync(device)
                times[m].append(clock() - t0)
    return {m: (statistics.median(times[m]), min(times[m])) for m in runners}


def _rss_kib(field: str) -> int:
    """A field of /proc/self/status (VmRSS: resident now, VmHWM: resident high-water mark), in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def _reset_rss_peak() -> int:
    """Return free heap to the OS, reset VmHWM to the current RSS (Linux >= 4.0) and return it."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_kib("VmRSS")


def _peak_worker(method: str, case: str, device_name: str, threads: int, steps: int, queue: mp.Queue) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    device = torch.device(device_name)
    settle_allocator()
    try:
        step = make_step(method, case, device)
        for _ in range(2):  # optimizer state, lazy inits: not part of a step's working memory
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        else:
            base = _reset_rss_peak() * 1024
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
        else:
            peak = _rss_kib("VmHWM") * 1024 - base
        queue.put(peak)
    except Exception:
        queue.put(None)


def peak_memory(method: str, case: str, device: torch.device, steps: int = 5) -> float | None:
    """Peak extra bytes of a few steps of one method, in a fresh process (None if it failed)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    args = (method, case, str(device), torch.get_num_threads(), steps, queue)
    proc = ctx.Process(target=_peak_worker, args=args)
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: process CPU time, robust to other jobs on a shared machine (use with --threads 1)",
    )
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    settle_allocator()
    methods = ["plain", *[m for m in args.methods if m != "plain"]]
    mem_kind = "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM (peak RSS) after malloc_trim"
    print(
        f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
        f"{args.clock} clock, sigma={SIGMA}, C={C}"
    )
    print(f"peak memory: {mem_kind}, above the level after 2 warm-up steps; one fresh process per method")
    header = (
        f"{'case':<6}{'method':<18}{'median ms':>10}{'x plain':>9}{'min ms':>9}{'x plain':>9}{'peak MiB':>10}"
    )
    print(header)
    print("-" * len(header))
    for case in args.cases:
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        stats = time_methods(case, methods, device, args.steps, args.warmup, args.block, clock)
        (med0, min0) = stats["plain"]
        for m, (med, fastest) in stats.items():
            peak = None if args.no_memory else peak_memory(m, case, device)
            mem = "n/a" if peak is None else f"{peak / 2**20:.1f}"
            print(
                f"{case:<6}{m:<18}{med * 1e3:>10.3f}{med / med0:>9.2f}{fastest * 1e3:>9.3f}{fastest / min0:>9.2f}{mem:>10}"
            )


if __name__ == "__main__":
    main()
