"""One data module for tabular and image data: load, validate, release what is not public, encode.

The module keeps the private training rows in model space and hands them out only through
``private_batches`` (one-shot mechanisms) and ``train_dataloader`` (DP-SGD, whose callback swaps in
Poisson sampling; otherwise every row once per epoch in ⌈ñ/B⌉ batches, ñ the DP count, so that no loop
counter, progress bar or log line of the fit loop counts the private rows). The held-out split never reaches a generator; audits use it as the reference.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from pytorch_lightning import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_dp.data.canonical import canonical_frame, canonical_images, row_digests
from lightning_dp.data.dp_cells import DEFAULT_BINS, needs_cells, release_cells
from lightning_dp.data.dp_count import RELEASE_NAME as COUNT_RELEASE
from lightning_dp.data.dp_count import RowCount, release_row_count
from lightning_dp.data.dp_preprocessing import needs_release, release_schema
from lightning_dp.data.encoders import TabularEncoder
from lightning_dp.data.representation import REPRESENTATIONS
from lightning_dp.data.sampling import DPCountBatchSampler, PoissonBatchSampler
from lightning_dp.data.schema import DataError, Schema, validate
from lightning_dp.data.sources import ImageSource, TabularSource, load_source
from lightning_dp.data.splits import holdout_mask, subsample_mask
from lightning_dp.privacy.ledger import PrivacyLedger

log = logging.getLogger(__name__)


def image_layout(shape: Sequence[int], classes: Sequence[str]) -> dict[str, Any]:
    """Model space of images: one column per pixel, no categorical blocks, the declared classes (all public: every
    image has the same shape, whatever the rows)."""
    return {"n_continuous": int(np.prod(tuple(shape))), "block_sizes": [], "num_classes": len(classes)}


class PrivateDataModule(LightningDataModule):
    """Private data for one run.

    Args:
        name: data set name (``breast_cancer``, ``diabetes``, ``adult``, ``cervical``, ``csv``, ``mnist_test``,
            ``digits``, ``npz``).
        root: folder of the shared data sets (default ``../shared/data`` beside the project).
        path, schema, test_path: for ``csv``/``npz``: the file, its schema YAML (required for tables:
            nothing about the columns is read from the rows), and an optional held-out file.
        num_classes: number of labels of an ``npz`` file (public; labels must be 0..K−1).
        holdout_fraction: share of rows held out when the source has no test file. Each row is held out
            by a keyed hash of its own values (``splits.py``), so adding a row never moves another.
        split_seed: public key of that hash.
        max_rows: about this many training rows (quick runs): a keyed-hash Bernoulli subsample at rate
            ``max_rows / ñ`` with ñ the run's DP count, so it never acts on row order.
        public_num_rows: the data owner's statement that the number of training rows is public (and
            equal to this); ``None`` releases a DP count (``dp_count.py``).
        batch_size: batch size of ``train_dataloader`` (expected batch size under Poisson sampling).
        preprocessing_epsilon_fraction: ε share for DP bounds/categories/cells the schema leaves out.
        representation: how continuous columns are written in model space: ``cells`` (spikes, quantile bins,
            missing as cells and a within-cell position; ``representation.py``) or ``minmax`` (one number).
        bins: quantile bins of a cells column whose schema says neither ``bins: [edges]`` nor ``bins: K``.
    """

    def __init__(self, *, name: str, root: str | None = None, path: str | None = None, schema: str | None = None,
                 test_path: str | None = None, num_classes: int | None = None, holdout_fraction: float = 0.2,
                 split_seed: int = 0, max_rows: int | None = None, public_num_rows: int | None = None,
                 batch_size: int = 256, preprocessing_epsilon_fraction: float = 0.1, representation: str = "cells",
                 bins: int = DEFAULT_BINS) -> None:
        super().__init__()
        self.name, self.root, self.path, self.schema_path = name, root, path, schema
        self.test_path, self.num_classes = test_path, num_classes
        self.holdout_fraction, self.split_seed, self.max_rows = holdout_fraction, split_seed, max_rows
        self.public_num_rows = public_num_rows
        self.batch_size = batch_size
        self.preprocessing_epsilon_fraction = preprocessing_epsilon_fraction
        if representation not in REPRESENTATIONS:
            raise DataError(f"data.representation={representation!r}; valid: {', '.join(REPRESENTATIONS)}.")
        if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 1000:
            raise DataError(f"data.bins={bins!r} must be a whole number of quantile bins from 1 to 1000.")
        self.representation, self.bins = representation, bins
        self.minmax_columns: tuple[str, ...] = ()
        self.row_count: RowCount | None = None
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
                           test_path=self.test_path, num_classes=self.num_classes)

    def prepare(self, ledger: PrivacyLedger, *, generator: torch.Generator, state: dict[str, Any] | None = None,
                check_rows: Callable[[RowCount], None] | None = None, count_budget_fraction: float = 0.02,
                private_use: bool = False, check_schema: Callable[[Any], None] | None = None,
                minmax_columns: Sequence[str] | Callable[[Schema], Sequence[str]] = (),
                identify: Callable[[np.ndarray, str], None] | None = None,
                check_layout: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Load, split and encode the private data; release (and charge) n and the schema facts that are not public.

        Order: everything that can fail on the user's input (files, schema, validation) runs before the
        first release; then the row count (``dp_count.py``), then ``check_rows``, then the schema release.
        Each release is one :meth:`PrivacyLedger.durable` block: with the ledger's ``commit`` set (``train``
        saves the data state and the ledger to ``.prefit.json``), the count and the schema are on disk
        before ``check_rows`` or anything else sees them.

        Args:
            ledger: the run's ledger.
            generator: noise generator for the DP releases.
            state: a saved ``state_dict`` (resume): the count and schema it holds are reused, not released again.
            check_rows: called with the run's row count (DP or public) before anything else is released
                (e.g. the δ < 1/n check).
            count_budget_fraction: Rényi-DP share of the DP row count.
            private_use: for audits and benchmarks, whose outputs are labelled private: without a ``state``
                the exact count is used and nothing is released (a schema that needs a release is refused).
            check_schema: called with the public schema (None for images) before anything is released (the
                model's own checks, e.g. PPEM's sensitive columns).
            minmax_columns: continuous columns the model needs as one min-max number under ``cells`` (PPEM's
                sensitive columns), or a function of the public schema giving them; ignored when a ``state``
                says which they are.
            identify: called with one canonical digest per row of the whole source (training and test rows, shape
                (N,)) and the data kind, after the rows are checked and before anything is released: the budget
                registry's fingerprint of the data set (``lightning_dp/budget``).
            check_layout: called with the model-space layout of image data before anything is released (public:
                the shape every image has and the declared classes; e.g. the model's memory check). Tabular data
                goes through ``check_schema``.
        """
        source = self._load()
        if isinstance(source, TabularSource):
            chosen = minmax_columns(source.schema) if callable(minmax_columns) else minmax_columns
            self.minmax_columns = tuple(chosen)
        if check_schema is not None:
            check_schema(source.schema if isinstance(source, TabularSource) else None)
        if check_layout is not None and isinstance(source, ImageSource):
            check_layout(image_layout(source.images.shape[1:], source.classes))
        if private_use and state is None and isinstance(source, TabularSource):
            if needs_release(source.schema):
                raise DataError(f"The {source.name} schema leaves bounds or categories to a DP release: load it from "
                                "the run's checkpoint (its released schema), or declare them in the schema.")
            if needs_cells(source.schema, self.minmax_columns):  # rows read for scoring only: nothing to learn
                self.representation = "minmax"
        if isinstance(source, ImageSource):
            image_rows = canonical_images(source.images, source.labels)  # (N, HW + 1): what each image is
            train, holdout = self._split_images(image_rows)
            digests = row_digests(image_rows)  # (N,)
        else:
            train, holdout, digests = self._split_tabular(source)
        if len(train) == 0:
            raise DataError(f"The {source.name} training data has no rows.")
        if identify is not None:
            identify(digests, "image" if isinstance(source, ImageSource) else "tabular")
        if state is not None and "num_rows" in state:
            self.row_count = RowCount.from_dict(state["num_rows"])
        elif private_use:
            self.row_count = RowCount(value=float(len(train)), source="exact (private use)")
        else:
            with ledger.durable():
                self.row_count = release_row_count(len(train), ledger, budget_fraction=count_budget_fraction,
                                                   generator=generator, public_num_rows=self.public_num_rows)
            if self.row_count.source == "dp":  # the share as a share: ε does not add up, so its ε looks larger
                alone = ledger.epsilon([r for r in ledger.releases if r.name == COUNT_RELEASE])
                log.info("The DP row count takes %g%% of the run's Rényi-DP budget (privacy.count_budget_fraction). "
                         "Alone it is ε = %.3g, because ε does not add up: the run still spends up to ε = %g in all.",
                         100 * count_budget_fraction, alone, ledger.target_epsilon)
        if isinstance(train, pd.DataFrame):
            train = self._subsample(train, canonical_frame(train, source.schema, validated=True))
        else:
            train = self._subsample(train, image_rows[train])
        if check_rows is not None:
            check_rows(self.row_count)
        if isinstance(source, ImageSource):
            self._encode_images(source, train, holdout)
        else:
            with ledger.durable():
                self._encode_tabular(source, train, holdout, ledger, generator, state)
        log.info("Data %r: %s; model-space width %d.", self.name, self.row_count.describe(), self.x.shape[1])

    def row_identity(self) -> tuple[np.ndarray, str]:
        """One canonical digest per row of the whole source (as ``prepare`` gives ``identify``) and the data kind,
        without releasing anything: the budget registry's fingerprint for a run that releases before ``prepare``
        (a tuning run's selection, ``lightning_dp/tuning/tune.py``).

        Raises:
            DataError: unreadable or invalid rows.
        """
        source = self._load()
        if isinstance(source, ImageSource):
            return row_digests(canonical_images(source.images, source.labels)), "image"
        return self._split_tabular(source)[2], "tabular"

    def _split_tabular(self, source: TabularSource) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
        """Training and held-out rows, and one canonical digest per row of the source (training rows first)."""
        train = validate(source.train, source.schema, source=f"the {source.name} training data")
        canonical = canonical_frame(train, source.schema, validated=True)  # not the cells as read (splits.py)
        digests = row_digests(canonical)  # (n,)
        if source.test is not None:
            test = validate(source.test, source.schema, source=f"the {source.name} test data")
            test_digests = row_digests(canonical_frame(test, source.schema, validated=True))  # (m,)
            return train, test, np.concatenate([digests, test_digests])
        held = holdout_mask(canonical, fraction=self.holdout_fraction, seed=self.split_seed)
        return train[~held].reset_index(drop=True), train[held].reset_index(drop=True), digests

    def _split_images(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the training and held-out images; ``rows`` are canonical pixels and label, (N, HW + 1)."""
        held = holdout_mask(rows, fraction=self.holdout_fraction, seed=self.split_seed)
        return np.flatnonzero(~held), np.flatnonzero(held)

    def _subsample(self, train: pd.DataFrame | np.ndarray, rows: pd.DataFrame | np.ndarray) -> pd.DataFrame | np.ndarray:
        """``max_rows``: a keyed-hash Bernoulli subsample of ``train`` (hashing ``rows``, its canonical values) at
        the rate ``max_rows / ñ``, a function of the DP count only."""
        if not self.max_rows:
            return train
        rate = min(1.0, self.max_rows / self.row_count.value)
        keep = subsample_mask(rows, rate=rate, seed=self.split_seed)
        self.row_count = RowCount(value=max(self.row_count.value * rate, 1.0), source=self.row_count.source,
                                  std=self.row_count.std * rate)
        if isinstance(train, pd.DataFrame):
            return train[keep].reset_index(drop=True)
        return train[keep]

    def _encode_images(self, source: ImageSource, train_idx: np.ndarray, hold_idx: np.ndarray) -> None:
        self.kind = "image"
        self.image_shape = tuple(source.images.shape[1:])
        self.classes = source.classes
        self.x = torch.from_numpy(source.images[train_idx].reshape(len(train_idx), -1)).float()
        self.y = torch.from_numpy(source.labels[train_idx])
        self.holdout = (source.images[hold_idx], source.labels[hold_idx])

    def _encode_tabular(self, source: TabularSource, train: pd.DataFrame, holdout: pd.DataFrame, ledger: PrivacyLedger,
                        generator: torch.Generator, state: dict[str, Any] | None) -> None:
        self.kind = "tabular"
        schema = source.schema
        if state is not None and "schema" in state:
            self.encoder = TabularEncoder.from_state_dict(state)
        else:
            cells = self.representation == "cells"
            minmax = self.minmax_columns if cells else ()
            releases = int(bool(needs_release(schema))) + int(cells and bool(needs_cells(schema, minmax)))
            epsilon = self.preprocessing_epsilon_fraction * ledger.target_epsilon / max(releases, 1)
            if needs_release(schema):
                schema = release_schema(train, schema, ledger, generator=generator, num_rows=self.row_count.value,
                                        epsilon=epsilon)
            if cells and needs_cells(schema, minmax):
                schema, unknown = release_cells(train, schema, ledger, epsilon=epsilon, num_rows=self.row_count.value,
                                                generator=generator,
                                                minmax_columns=minmax, bins=self.bins)
                minmax = (*minmax, *unknown)
            self.encoder = TabularEncoder(schema, representation=self.representation, minmax_columns=minmax)
        keep = self.encoder.keep_mask(train)
        if needs_release(source.schema):  # data-independent: whether any row was dropped is private
            log.warning("Rows whose categories were not released (too rare for DP partition selection) are left out "
                        "of training. Declare the categories in the schema to keep them.")
        self.train_frame = train[keep].reset_index(drop=True)
        self.x, self.y = self.encoder.transform(self.train_frame)
        self.holdout = holdout[self.encoder.keep_mask(holdout)].reset_index(drop=True)
        self.classes = list(self.encoder.classes)

    # ---------------------------------------------------------------- layout and decoding
    @property
    def num_rows(self) -> int:
        """The exact number of training rows: private; for the mechanisms' own use, never for a release."""
        return 0 if self.x is None else len(self.x)

    @property
    def released_num_rows(self) -> float:
        """The number of training rows as the run may use it (DP or public; ``dp_count.py``)."""
        if self.row_count is None:
            raise RuntimeError("prepare() has not run: the row count is not released yet.")
        return self.row_count.value

    @property
    def layout(self) -> dict[str, Any]:
        """What a model needs to know about model space (all public)."""
        if self.kind == "image":
            return image_layout(self.image_shape, self.classes)
        return self.encoder.layout

    def decode(self, x: Tensor, y: Tensor) -> pd.DataFrame | dict[str, np.ndarray]:
        """Model-space samples → the user's columns (tabular) or ``{"images", "labels"}`` (images)."""
        return decode_samples(self.state_dict(), x, y)

    def state_dict(self) -> dict[str, Any]:
        """Public or DP facts needed to decode samples and to resume (the released schema and count, never rows)."""
        state: dict[str, Any] = {"kind": self.kind, "name": self.name, "classes": list(self.classes)}
        if self.row_count is not None:
            state["num_rows"] = self.row_count.to_dict()
        if self.kind == "image":
            state["image_shape"] = list(self.image_shape)
        elif self.encoder is not None:
            state.update(self.encoder.state_dict())
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

    def num_batches(self, *, world_size: int = 1) -> int:
        """Batches per epoch of ``train_dataloader`` without Poisson sampling: ⌈ñ / (B·W)⌉ for the DP (or public)
        count ñ, the same on every rank; never a function of the exact number of rows."""
        return max(math.ceil(self.released_num_rows / (self.batch_size * world_size)), 1)

    def use_poisson_sampling(self, *, sample_rate: float, steps_per_epoch: int, rank: int = 0, world_size: int = 1,
                             generator: torch.Generator) -> None:
        """Make ``train_dataloader`` Poisson-sample this rank's shard (set by the DP-SGD mechanism)."""
        self._poisson = {"sample_rate": sample_rate, "steps": steps_per_epoch, "generator": generator,
                         "indices": torch.arange(rank, self.num_rows, world_size)}

    def train_dataloader(self) -> DataLoader:
        dataset = TensorDataset(self.x, self.y)
        poisson = getattr(self, "_poisson", None)
        if poisson is None:  # every row once per epoch, in ⌈ñ/B⌉ batches: no count of rows leaves through the loop
            world = self.trainer.world_size if self.trainer is not None else 1
            rank = self.trainer.global_rank if self.trainer is not None else 0
            sampler = DPCountBatchSampler(torch.arange(rank, self.num_rows, world),
                                          num_batches=self.num_batches(world_size=world),
                                          generator=torch.Generator().manual_seed(int(torch.randint(2**62, ()))))
            return DataLoader(dataset, sampler=sampler, batch_size=None)
        sampler = PoissonBatchSampler(poisson["indices"], sample_rate=poisson["sample_rate"], steps=poisson["steps"],
                                      generator=poisson["generator"])
        # batch_size=None: each sampled index list goes to TensorDataset, which fancy-indexes (empty lists too)
        return DataLoader(dataset, sampler=sampler, batch_size=None)


def decode_samples(data_state: dict[str, Any], x: Tensor, y: Tensor) -> pd.DataFrame | dict[str, np.ndarray]:
    """Decode model-space samples from the public data state alone (no private data is read)."""
    if data_state["kind"] == "image":
        images = x.detach().cpu().numpy().reshape(len(x), *data_state["image_shape"]).astype(np.float32)
        return {"images": images, "labels": y.detach().cpu().numpy()}
    return TabularEncoder.from_state_dict(data_state).inverse_transform(x, y)


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
