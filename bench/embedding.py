"""Benchmark the one-shot sanitized embedding (DP-MERF's features, streamed in chunks).

Prints rows/s of the class-wise feature sums against a plain matrix product of the same shape in the
same run, and the peak resident memory while streaming 100k and 1M rows (it must not grow with n).

    python bench/embedding.py [--rows 1000000] [--features 2000] [--chunk 8192] [--device cpu]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import torch

from lightning_dp.models.dp_merf import DPMERF
from lightning_dp.nets.generators import ConditionalGenerator
from lightning_dp.privacy.statistics import class_feature_sums

# Adult's model space: 6 continuous columns and these one-hot blocks (102 wide; TabularEncoder on adult.yaml).
ADULT_BLOCKS = [9, 16, 7, 15, 6, 5, 2, 42]


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


class PeakRSS:
    """Samples RSS every 2 ms in a thread; ``peak`` is the largest value seen."""

    def __enter__(self) -> PeakRSS:
        self.peak, self._stop = rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def chunks(n: int, chunk: int, n_con: int, blocks: list[int], device: str, seed: int = 0):
    """Random model-space rows generated chunk by chunk (never all n in memory)."""
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        con = torch.rand(m, n_con, generator=gen)
        hot = [torch.nn.functional.one_hot(torch.randint(0, k, (m,), generator=gen), k).float() for k in blocks]
        yield torch.cat([con, *hot], 1).to(device), torch.randint(0, 2, (m,), generator=gen).to(device)


def timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=2000)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    n_con, blocks = 6, ADULT_BLOCKS
    gen = ConditionalGenerator(n_continuous=n_con, block_sizes=blocks, num_classes=2)
    model = DPMERF(gen, n_continuous=n_con, block_sizes=blocks, num_classes=2, num_features=args.features,
                   bandwidth=0.5).to(dev)
    data = list(chunks(200_000, args.chunk, n_con, blocks, dev))  # pre-generated, so only compute is timed
    n = sum(len(x) for x, _ in data)
    omega = model.rff.omega0.clone()  # (D/2, d_con)

    with torch.no_grad():
        class_feature_sums(data[:2], model.features, 2)  # warm-up
        t_emb = timed(lambda: class_feature_sums(data, model.features, 2), sync)
        t_mm = timed(lambda: [x[:, :n_con] @ omega.T for x, _ in data], sync)
        t_mm_full = timed(lambda: [torch.cat([torch.cos(p := x[:, :n_con] @ omega.T), torch.sin(p)], 1).sum(0)
                                   for x, _ in data], sync)

    print(f"device {dev}, D = {args.features} random features, Adult layout (6 continuous + {sum(blocks)} one-hot), "
          f"chunk {args.chunk}, {torch.get_num_threads()} threads")
    print(f"{'what':<48}{'rows/s':>14}{'vs matmul':>12}")
    for name, t in [("one-shot embedding (class-wise sums of h(x))", t_emb),
                    ("plain matmul x_con @ omegaᵀ (same shape)", t_mm),
                    ("matmul + cos/sin + sum (RFF floor)", t_mm_full)]:
        print(f"{name:<48}{n / t:>14,.0f}{t / t_mm:>11.2f}x")

    print(f"\npeak resident memory while streaming (chunks generated on the fly, {args.chunk} rows each):")
    base = rss_bytes()
    for rows in (100_000, args.rows):
        with torch.no_grad(), PeakRSS() as peak:
            start = time.perf_counter()
            class_feature_sums(chunks(rows, args.chunk, n_con, blocks, dev, seed=1), model.features, 2)
            elapsed = time.perf_counter() - start
        print(f"  {rows:>9,} rows: peak RSS +{(peak.peak - base) / 2**20:7.1f} MiB over the start, {elapsed:6.1f} s "
              f"(incl. generating the rows)")
    if dev.startswith("cuda"):
        print(f"  peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
