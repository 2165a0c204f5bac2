"""PEARL speed in the Adult setting: generator steps/s and the one-shot release, timed in one run.

The model is PEARL's Adult configuration (K = 500 frequency vectors, batch 1,100, a critic step every 10
generator steps) on the Adult model space of a run (the data module's layout, the ``cells`` representation by
default; 6 continuous columns + 102 one-hot for the random stand-in). The release is the
``SanitizedEmbedding`` callback's whole job on the private rows: the DP moments for σ0 (one pass), the
class-wise CF sums and counts (a second pass), the calibrations and the noise. The rows are the real
Adult training split when ``../shared/data/adult`` exists, otherwise random rows of the same layout and
size. Generator steps are timed inside a Lightning ``fit`` (manual optimisation, logging and all) after
a warm-up, with and without the critic.

    python bench/pearl.py [--steps 300] [--rows 32561] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Iterator
from types import SimpleNamespace

import pytorch_lightning as pl
import torch
from threadpoolctl import threadpool_limits
from torch import Tensor

from lightning_dp.callbacks.sanitized_embedding import SanitizedEmbedding
from lightning_dp.data.sources import DEFAULT_ROOT
from lightning_dp.models.pearl import PEARL
from lightning_dp.nets.generators import ConditionalGenerator
from lightning_dp.privacy.ledger import PrivacyLedger

ADULT_BLOCKS = [9, 16, 7, 15, 6, 5, 2, 42]  # TabularEncoder on adult.yaml (missing as a category)
N_CON = 6


class RandomRows:
    """Stand-in for the data module when Adult is absent: random model-space rows, fixed seed."""

    layout = {"n_continuous": N_CON, "block_sizes": ADULT_BLOCKS}

    def __init__(self, n: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        con = torch.rand(n, N_CON, generator=gen)
        hot = [
            torch.nn.functional.one_hot(torch.randint(0, k, (n,), generator=gen), k).float()
            for k in ADULT_BLOCKS
        ]
        self.x, self.y = torch.cat([con, *hot], 1), torch.randint(0, 2, (n,), generator=gen)

    def private_batches(
        self, *, chunk_size: int = 4096, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[Tensor, Tensor]]:
        for start in range(rank * chunk_size, len(self.x), chunk_size * world_size):
            yield self.x[start : start + chunk_size], self.y[start : start + chunk_size]


def adult_rows(rows: int) -> tuple[object, str]:
    """The Adult training split in model space if available, else random rows of its layout."""
    if (DEFAULT_ROOT / "adult").exists():
        from lightning_dp.data.datamodule import PrivateDataModule
        from lightning_dp.privacy import mechanisms as mech

        dm = PrivateDataModule(name="adult", max_rows=rows)
        dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=1e-5), generator=mech.noise_generator(0))
        return dm, f"Adult training split, {dm.num_rows:,} rows"
    return RandomRows(rows), f"random rows in Adult's layout, {rows:,} rows (Adult not found)"


class StepTimer(pl.Callback):
    """Wall time of the generator steps after ``warmup`` steps."""

    def __init__(self, warmup: int, sync) -> None:
        self.warmup, self.sync, self.start, self.steps = warmup, sync, None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            self.sync()
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= self.warmup:
            self.steps += 1

    def on_train_end(self, trainer, pl_module) -> None:
        self.sync()
        self.elapsed = time.perf_counter() - self.start


def make_model(critic: bool, device: str, layout: dict) -> PEARL:
    n_con, blocks = layout["n_continuous"], list(layout["block_sizes"])
    gen = ConditionalGenerator(n_continuous=n_con, block_sizes=blocks, num_classes=2, latent_dim=10)
    return PEARL(
        gen,
        n_continuous=n_con,
        block_sizes=blocks,
        num_classes=2,
        num_features=1000,
        batch_size=1100,
        n_gen=10,
        critic=critic,
    ).to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed generator steps per variant")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rows", type=int, default=32561, help="private rows released (Adult train: 32,561)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared machine)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    data, what = adult_rows(args.rows)

    # one-shot release: both passes over the private rows, calibration and noise, as in a run
    model = make_model(True, dev, data.layout)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    callback = SanitizedEmbedding(
        ledger=ledger, datamodule=data, bandwidth_epsilon_fraction=0.5, budget_split="rdp"
    )
    trainer_stub = SimpleNamespace(global_rank=0, world_size=1)
    sync()
    start = time.perf_counter()
    callback.on_fit_start(trainer_stub, model)
    sync()
    t_release = time.perf_counter() - start
    sigmas = {r.name.split("/")[-1]: r.noise_multiplier for r in ledger.releases}

    width = data.layout["n_continuous"] + sum(data.layout["block_sizes"])
    print(
        f"PEARL, Adult setting: K = 500 frequencies (1,000 real features), d = {width}, "
        f"batch 1,100 (+2), n_gen = 10; device {dev}, {torch.get_num_threads()} CPU threads"
    )
    print(
        f"one-shot release ({what}): {t_release:.2f} s for both releases "
        f"({args.rows / t_release:,.0f} rows/s); ε = {ledger.spent:.4f}, noise multipliers {sigmas}, "
        f"ℓ = 1/σ0 = {float(model.bandwidth):.3f}"
    )
    released = {
        k: v.clone()
        for k, v in model.state_dict().items()
        if k in ("target", "class_probs", "bandwidth", "released")
    }
    for critic in (True, False):
        model = make_model(critic, dev, data.layout)
        model.load_state_dict(released, strict=False)
        model.hparams.steps_per_epoch = args.warmup + args.steps
        timer = StepTimer(args.warmup, sync)
        trainer = pl.Trainer(
            accelerator="gpu" if dev.startswith("cuda") else "cpu",
            devices=1,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer],
        )
        trainer.fit(model)
        rate = timer.steps / timer.elapsed
        label = "with critic (1 critic step / 10)" if critic else "without critic"
        print(
            f"generator steps/s, {label:<34}: {rate:8.1f}  ({1e3 / rate:.1f} ms/step over {timer.steps} steps)"
        )


if __name__ == "__main__":
    main()
