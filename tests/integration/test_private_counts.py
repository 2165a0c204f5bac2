"""No count of private rows, batches or steps leaves a run unless it is DP or public.

Two data sets of 512 and 513 rows, the DP count made equal on both sides (as the Gaussian noise may make it):
everything the runs publish (checkpoints with Lightning's loop state and the module's buffers, the log, the
console) must be the same function of that count, so must not differ. The data module's loader walks every
row in ⌈ñ/B⌉ batches (``DPCountBatchSampler``), which is the one place this is enforced.
"""

from __future__ import annotations

import logging
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from lightning_dp.checkpoint import AtomicCheckpointIO
from lightning_dp.data import datamodule as datamodule_module
from lightning_dp.data.dp_count import RowCount
from lightning_dp.data.sampling import DPCountBatchSampler
from lightning_dp.train import train
from tests.conftest import make_cfg

RELEASED = 512.4  # the DP count both sides get
SCHEMA = {"columns": [{"name": "x", "type": "continuous", "bounds": [0.0, 1.0]},
                      {"name": "c", "type": "categorical", "categories": ["a", "b"]}]}
TINY_SP = ("model=support_points", "privacy.noise_seed=0", "model.module.num_points=5", "model.module.num_steps=6",
           "model.module.bandwidth=0.05", "model.mechanisms.0.burn_in=50", "model.mechanisms.0.thin=10",
           "model.mechanisms.0.draws=3", "model.mechanisms.0.num_chains=2", "model.mechanisms.0.trace_every=5",
           "data.holdout_fraction=0", "data.batch_size=512", "trainer.max_epochs=2",
           "callbacks.checkpoint.every_n_steps=1", "trainer.log_every_n_steps=50")


def test_the_plain_loader_has_as_many_batches_as_the_dp_count_says():
    for n in (0, 3, 511, 512, 513, 2000):
        sampler = DPCountBatchSampler(torch.arange(n), num_batches=2, generator=torch.Generator().manual_seed(0))
        batches = list(sampler)
        assert len(batches) == len(sampler) == 2
        assert sorted(i for b in batches for i in b) == list(range(n))  # every row once
        assert max(map(len, batches)) - min(map(len, batches)) <= 1


def _files(tmp_path, n: int):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.uniform(size=513).round(4), "c": rng.choice(["a", "b"], 513)}).head(n)
    path = tmp_path / f"rows_{n}.csv"
    frame.to_csv(path, index=False)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    return path


def _counts(obj, prefix=""):
    """Every integer or integer tensor in a checkpoint (outside the weights), by its path."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("state_dict", "optimizer_states", "lightning_dp"):
                continue
            out.update(_counts(v, f"{prefix}.{k}"))
        return out
    if isinstance(obj, list | tuple):
        return {k: v for i, item in enumerate(obj) for k, v in _counts(item, f"{prefix}[{i}]").items()}
    if isinstance(obj, bool | int | float):
        return {prefix: obj}
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return {prefix: obj.item()}
    return {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, single_thread):
    real_count = datamodule_module.release_row_count

    def same_count(n, ledger, **kwargs):
        real = real_count(n, ledger, **kwargs)  # recorded as usual; its value replaced by one both sides share
        return RowCount(value=RELEASED, source=real.source, std=real.std)

    out = {}
    for n in (512, 513):
        tmp = tmp_path_factory.mktemp(f"n{n}")
        saved = []
        real_save = AtomicCheckpointIO.save_checkpoint

        def save(self, checkpoint, path, storage_options=None, saved=saved, real_save=real_save):
            saved.append(checkpoint)
            return real_save(self, checkpoint, path, storage_options)

        records = []
        handler = logging.Handler()
        handler.emit = lambda record, records=records: records.append(record.getMessage())
        logging.getLogger().addHandler(handler)
        try:
            with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mp.setattr(datamodule_module, "release_row_count", same_count)
                mp.setattr(AtomicCheckpointIO, "save_checkpoint", save)
                path = _files(tmp, n)
                cfg = make_cfg(tmp / "run", *TINY_SP, "data=csv", f"data.path={path}",
                               f"data.schema={tmp / 'schema.yaml'}")
                train(cfg)
        finally:
            logging.getLogger().removeHandler(handler)
        records += [str(w.message) for w in caught]  # Lightning's "number of training batches (k)" is a warning
        out[n] = (saved, records, tmp / "run")
    return out


def test_checkpoints_hold_the_same_loop_state_and_counters(runs):
    (saved_a, _, _), (saved_b, _, _) = runs[512], runs[513]
    assert len(saved_a) == len(saved_b) > 1
    for a, b in zip(saved_a, saved_b, strict=True):
        assert _counts(a) == _counts(b)  # Lightning's loops: batch_progress, _batches_that_stepped, epoch, global_step
        assert int(a["state_dict"]["batches_seen"]) == int(b["state_dict"]["batches_seen"])
    loops = _counts(saved_a[-1])
    assert any("batch_progress" in k for k in loops)
    # ⌈512.4 / 512⌉ = 2 batches per epoch, two epochs: a function of the DP count (n = 512 alone would give 1)
    assert int(saved_a[-1]["state_dict"]["batches_seen"]) == 4


def test_logs_and_lightning_lines_do_not_count_the_rows(runs, capsys):
    (_, rec_a, out_a), (_, rec_b, out_b) = runs[512], runs[513]

    def numbers_free(lines):  # drop timings, paths and the noisy values that differ by seed-free noise only; the
        # data set's name in the budget registry is a keyed fingerprint (random without the registry's secret key), the
        # run's id a random one
        return [re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#",
                       re.sub(r"fp-[0-9a-f]+|Run [0-9a-f]+", "ID", line.replace(str(out_a), "OUT").replace(str(out_b), "OUT")))
                for line in lines]

    batches = [line for line in rec_a + rec_b if "training batches" in line]
    assert all("(2)" in line for line in batches)  # Lightning's "number of training batches (k)", where shown: ⌈ñ/B⌉
    progress = [[re.sub(r"elapsed.*", "", ln) for ln in rec if ln.startswith("progress:")] for rec in (rec_a, rec_b)]
    assert progress[0] == progress[1]  # the progress lines' steps done/planned
    a_lines = [ln for ln in rec_a if "took" not in ln]
    b_lines = [ln for ln in rec_b if "took" not in ln]
    assert len(a_lines) == len(b_lines)
    assert [ln for ln in a_lines if "batches" in ln] == [ln for ln in b_lines if "batches" in ln]
    assert numbers_free(a_lines) == numbers_free(b_lines)
