"""One data module for tabular and image data: load, validate, release what is not public, encode.

The module keeps the private training rows in model space and hands them out only through
``private_batches`` (one-shot mechanisms) and ``train_dataloader`` (DP-SGD, whose callback swaps in
Poisson sampling). The held-out split never reaches a generator; audits use it as the reference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from pytorch_lightning import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_dp.data.dp_preprocessing import needs_release, release_schema
from lightning_dp.data.encoders import TabularEncoder
from lightning_dp.data.sampling import PoissonBatchSampler
from lightning_dp.data.schema import DataError, Schema, validate
from lightning_dp.data.sources import ImageSource, TabularSource, load_source
from lightning_dp.privacy.ledger import PrivacyLedger

log = logging.getLogger(__name__)


class PrivateDataModule(LightningDataModule):
    """Private data for one run.

    Args:
        name: data set name (``breast_cancer``, ``adult``, ``cervical``, ``csv``, ``mnist_test``,
            ``digits``, ``npz``).
        root: folder of the shared data sets (default ``../shared/data`` beside the project).
        path, schema, test_path, label: for ``csv``/``npz``: the file, its schema YAML, an optional
            held-out file, and the label column when no schema is given.
        holdout_fraction: share of rows held out when the source has no test split.
        split_seed: seed of that split (public randomness).
        max_rows: keep only the first rows of the training split (quick runs).
        batch_size: batch size of ``train_dataloader`` (expected batch size under Poisson sampling).
        preprocessing_epsilon_fraction: ε share for DP bounds/categories the schema leaves out.
    """

    def __init__(self, *, name: str, root: str | None = None, path: str | None = None, schema: str | None = None,
                 test_path: str | None = None, label: str | None = None, holdout_fraction: float = 0.2,
                 split_seed: int = 0, max_rows: int | None = None, batch_size: int = 256,
                 preprocessing_epsilon_fraction: float = 0.1) -> None:
        super().__init__()
        self.name, self.root, self.path, self.schema_path = name, root, path, schema
        self.test_path, self.label = test_path, label
        self.holdout_fraction, self.split_seed, self.max_rows = holdout_fraction, split_seed, max_rows
        self.batch_size = batch_size
        self.preprocessing_epsilon_fraction = preprocessing_epsilon_fraction
        self.kind: str | None = None
        self.encoder: TabularEncoder | None = None
        self.image_shape: tuple[int, ...] | None = None
        self.classes: list[str] = []
        self.x: Tensor | None = None
        self.y: Tensor | None = None
        self.holdout: pd.DataFrame | tuple[np.ndarray, np.ndarray] | None = None
        self.train_frame: pd.DataFrame | None = None

    # ---------------------------------------------------------------- loading
    def _load(self) -> TabularSource | ImageSource:
        return load_source(self.name, root=self.root, path=self.path, schema=self.schema_path,
                           test_path=self.test_path, label=self.label)

    def _split(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        perm = np.random.default_rng(self.split_seed).permutation(n)
        n_hold = int(round(self.holdout_fraction * n))
        return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])

    def prepare(self, ledger: PrivacyLedger, *, generator: torch.Generator, state: dict[str, Any] | None = None,
                check_rows: Callable[[int], None] | None = None) -> None:
        """Load and encode the private data; release (and charge) schema facts that are not public.

        Args:
            ledger: the run's ledger.
            generator: noise generator for the DP schema releases.
            state: a saved ``state_dict`` (resume, sampling): its encoder is reused and nothing is released.
            check_rows: called with the number of training rows before anything is released (e.g. the
                δ < 1/n check), so that a refused run has touched nothing.
        """
        source = self._load()
        if isinstance(source, ImageSource):
            self._prepare_images(source, check_rows)
        else:
            self._prepare_tabular(source, ledger, generator, state, check_rows)
        log.info("Data %r: %d private training rows, model-space width %d.", self.name, len(self.x), self.x.shape[1])

    def _prepare_images(self, source: ImageSource, check_rows: Callable[[int], None] | None) -> None:
        self.kind = "image"
        self.image_shape = tuple(source.images.shape[1:])
        self.classes = source.classes
        train_idx, hold_idx = self._split(len(source.images))
        train_idx = train_idx[: self.max_rows] if self.max_rows else train_idx
        if check_rows is not None:
            check_rows(len(train_idx))
        self.x = torch.from_numpy(source.images[train_idx].reshape(len(train_idx), -1)).float()
        self.y = torch.from_numpy(source.labels[train_idx])
        self.holdout = (source.images[hold_idx], source.labels[hold_idx])

    def _prepare_tabular(self, source: TabularSource, ledger: PrivacyLedger, generator: torch.Generator,
                         state: dict[str, Any] | None, check_rows: Callable[[int], None] | None) -> None:
        self.kind = "tabular"
        schema = source.schema
        train = validate(source.train, schema, source=f"the {source.name} training data")
        if source.test is not None:
            holdout = validate(source.test, schema, source=f"the {source.name} test data")
        else:
            train_idx, hold_idx = self._split(len(train))
            train, holdout = train.iloc[train_idx].reset_index(drop=True), train.iloc[hold_idx].reset_index(drop=True)
        if self.max_rows:
            train = train.iloc[: self.max_rows].reset_index(drop=True)
        if len(train) == 0:
            raise DataError(f"The {source.name} training data has no rows.")
        if check_rows is not None:
            check_rows(len(train))
        if state is not None:
            schema = Schema.from_dict(state["schema"])
        elif needs_release(schema):
            schema = release_schema(train, schema, ledger, generator=generator,
                                    epsilon=self.preprocessing_epsilon_fraction * ledger.target_epsilon)
        self.encoder = TabularEncoder(schema)
        keep = self.encoder.keep_mask(train)
        if not keep.all():
            log.warning("Dropped %d training rows whose categories were not released.", int((~keep).sum()))
        self.train_frame = train[keep].reset_index(drop=True)
        self.x, self.y = self.encoder.transform(self.train_frame)
        self.holdout = holdout[self.encoder.keep_mask(holdout)].reset_index(drop=True)
        self.classes = list(self.encoder.classes)

    # ---------------------------------------------------------------- layout and decoding
    @property
    def num_rows(self) -> int:
        return 0 if self.x is None else len(self.x)

    @property
    def layout(self) -> dict[str, Any]:
        """What a model needs to know about model space (all public)."""
        if self.kind == "image":
            return {"n_continuous": int(np.prod(self.image_shape)), "block_sizes": [],
                    "num_classes": len(self.classes)}
        return {"n_continuous": self.encoder.n_continuous, "block_sizes": self.encoder.block_sizes,
                "num_classes": self.encoder.num_classes}

    def decode(self, x: Tensor, y: Tensor) -> pd.DataFrame | dict[str, np.ndarray]:
        """Model-space samples → the user's columns (tabular) or ``{"images", "labels"}`` (images)."""
        return decode_samples(self.state_dict(), x, y)

    def state_dict(self) -> dict[str, Any]:
        """Public facts needed to decode samples and to resume (the released schema, never rows)."""
        state: dict[str, Any] = {"kind": self.kind, "name": self.name, "classes": list(self.classes)}
        if self.kind == "image":
            state["image_shape"] = list(self.image_shape)
        elif self.encoder is not None:
            state["schema"] = self.encoder.schema.to_dict()
        return state

    # ---------------------------------------------------------------- private access
    def private_batches(self, *, chunk_size: int = 4096, rank: int = 0, world_size: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
        """Disjoint shards of the private rows in chunks: rank r gets rows r, r + W, r + 2W, ...

        No padding or repetition (a DistributedSampler would repeat rows and break the sensitivity).
        """
        idx = torch.arange(rank, self.num_rows, world_size)
        for start in range(0, len(idx), chunk_size):
            part = idx[start : start + chunk_size]
            yield self.x[part], self.y[part]

    def use_poisson_sampling(self, *, sample_rate: float, steps_per_epoch: int, rank: int = 0, world_size: int = 1,
                             generator: torch.Generator) -> None:
        """Make ``train_dataloader`` Poisson-sample this rank's shard (set by the DP-SGD mechanism)."""
        self._poisson = {"sample_rate": sample_rate, "steps": steps_per_epoch, "generator": generator,
                         "indices": torch.arange(rank, self.num_rows, world_size)}

    def train_dataloader(self) -> DataLoader:
        dataset = TensorDataset(self.x, self.y)
        poisson = getattr(self, "_poisson", None)
        if poisson is None:
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, drop_last=False)
        sampler = PoissonBatchSampler(poisson["indices"], sample_rate=poisson["sample_rate"], steps=poisson["steps"],
                                      generator=poisson["generator"])
        # batch_size=None: each sampled index list goes to TensorDataset, which fancy-indexes (empty lists too)
        return DataLoader(dataset, sampler=sampler, batch_size=None)


def decode_samples(data_state: dict[str, Any], x: Tensor, y: Tensor) -> pd.DataFrame | dict[str, np.ndarray]:
    """Decode model-space samples from the public data state alone (no private data is read)."""
    if data_state["kind"] == "image":
        images = x.detach().cpu().numpy().reshape(len(x), *data_state["image_shape"]).astype(np.float32)
        return {"images": images, "labels": y.detach().cpu().numpy()}
    return TabularEncoder(Schema.from_dict(data_state["schema"])).inverse_transform(x, y)


def write_table(df: pd.DataFrame, path: str | Path) -> None:
    """Write a frame as CSV or Parquet by the file's suffix, atomically."""
    from lightning_dp.io import atomic_write

    path = Path(path)
    if path.suffix.lower() in (".parquet", ".pq"):
        atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
    elif path.suffix.lower() == ".csv":
        atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))
    else:
        raise ValueError(f"Cannot write {str(path)!r}: use a .csv or .parquet file name.")
