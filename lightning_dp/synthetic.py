"""Writing synthetic data: sample a generator in chunks, decode to the user's columns, write atomically.

Used at the end of a run (``train.py``) and later from a checkpoint (``python -m lightning_dp.sample``).
Sampling is post-processing of the checkpoint: it reads no private data and spends no budget.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_dp.data.datamodule import decode_samples
from lightning_dp.io import atomic_write
from lightning_dp.progress import tracker

CHUNK_BYTES = 2**27  # about this much memory per chunk of decoded rows, whatever --num-rows asks for


def write_samples(model: torch.nn.Module, data_state: dict[str, Any], n: int, stem: str | Path,
                  *, seed: int | None = None, suffix: str | None = None) -> str:
    """Sample ``n`` rows, decode them to the user's columns and write them atomically, chunk by chunk.

    Memory stays flat at any ``n``: each chunk is sampled, decoded and appended to the temporary file, which
    is renamed into place at the end (a failure leaves no partial file). After the first chunk, the file's
    final size is estimated and refused when the disk cannot hold it. Tabular data goes to ``<stem>.csv`` (or
    ``.parquet``); images to ``<stem>.npz`` plus a PNG grid of the first chunk.

    Raises:
        StorageError: the file would not fit on the disk (nothing is left behind).
    """
    stem = Path(stem)
    chunks = _decoded_chunks(model, data_state, n, seed=seed, chunk=chunk_rows(data_state))
    if data_state["kind"] == "image":
        path = stem.with_suffix(".npz")
        first: dict[str, np.ndarray] = {}
        atomic_write(path, lambda tmp: _stream_npz(tmp, chunks, n, data_state, first))
        save_image_grid(first["images"], first["labels"], stem.with_suffix(".png"))
        return str(path)
    path = stem.with_suffix(suffix or ".csv")
    if path.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise ValueError(f"Cannot write {str(path)!r}: use a .csv or .parquet file name.")
    atomic_write(path, lambda tmp: _stream_table(tmp, chunks, n, parquet=path.suffix.lower() != ".csv"))
    return str(path)


def chunk_rows(data_state: dict[str, Any]) -> int:
    """Rows per chunk: about :data:`CHUNK_BYTES` of model-space values and decoded cells (public sizes only)."""
    if data_state["kind"] == "image":
        per_row = 8 * int(np.prod(data_state["image_shape"])) + 16
    else:
        columns = data_state["schema"]["columns"]
        width = sum(len(c.get("categories") or []) or 1 for c in columns)
        per_row = 8 * width + 96 * len(columns)  # float model-space values; pandas cells (objects) when decoded
    return int(max(1, min(50_000, CHUNK_BYTES // per_row)))


def _decoded_chunks(model: Any, data_state: dict[str, Any], n: int, *, seed: int | None,
                    chunk: int) -> Iterator[tuple[int, Any]]:
    for i in range(math.ceil(n / chunk)):
        m = min(chunk, n - i * chunk)
        with torch.no_grad():
            x, y = model.sample(m, seed=None if seed is None else seed + i)
        tracker.update(i * chunk + m)
        yield m, decode_samples(data_state, x.cpu(), y.cpu())


def _check_fits(path: str, written: int, done: int, n: int) -> None:
    """After the first chunk: refuse a file whose estimated size exceeds the disk's free space."""
    from lightning_dp.errors import StorageError

    need = written / max(done, 1) * (n - done)
    free = shutil.disk_usage(Path(path).parent).free
    if need > free:
        raise StorageError(f"{n:,} rows would take about {need / 2**30:.1f} GiB more on disk; {free / 2**30:.1f} GiB "
                           "are free. Ask for fewer rows or write elsewhere; nothing was written.")


def _stream_table(tmp: str, chunks: Iterator[tuple[int, Any]], n: int, *, parquet: bool) -> None:
    done, writer = 0, None
    with open(tmp, "wb") as f:
        for m, frame in chunks:
            if parquet:
                import pyarrow as pa
                import pyarrow.parquet as pq

                table = pa.Table.from_pandas(frame, preserve_index=False,
                                             schema=None if writer is None else writer.schema)
                writer = writer or pq.ParquetWriter(f, table.schema)
                writer.write_table(table)
            else:
                f.write(frame.to_csv(index=False, header=done == 0).encode())
            if done == 0:
                f.flush()
                _check_fits(tmp, max(f.tell(), 1), m, n)
            done += m
        if writer is not None:
            writer.close()


def _stream_npz(tmp: str, chunks: Iterator[tuple[int, Any]], n: int, data_state: dict[str, Any],
                first: dict[str, np.ndarray]) -> None:
    """``np.load``-able ``images`` (n, H, W) float32 and ``labels`` (n,) int64, written chunk by chunk: images into
    the archive, labels beside it on disk until the images are done (two zip members cannot be written at once)."""
    shape = (n, *data_state["image_shape"])
    done = 0
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive, \
            tempfile.TemporaryFile(dir=Path(tmp).parent) as labels:
        with archive.open("images.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(member, {"descr": "<f4", "fortran_order": False, "shape": shape})
            for m, decoded in chunks:
                if not first:
                    first.update(images=decoded["images"], labels=decoded["labels"])
                member.write(np.ascontiguousarray(decoded["images"], dtype="<f4").tobytes())
                labels.write(np.ascontiguousarray(decoded["labels"], dtype="<i8").tobytes())
                if done == 0:
                    _check_fits(tmp, 4 * decoded["images"].size + 8 * m, m, n)
                done += m
        labels.seek(0)
        with archive.open("labels.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(member, {"descr": "<i8", "fortran_order": False, "shape": (n,)})
            shutil.copyfileobj(labels, member, 2**24)


def sample_in_chunks(model: Any, n: int, *, seed: int | None = None, chunk: int = 50_000) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.sample`` in chunks, so that millions of rows fit in memory."""
    xs, ys = [], []
    for i in range(math.ceil(n / chunk)):
        m = min(chunk, n - i * chunk)
        x, y = model.sample(m, seed=None if seed is None else seed + i)
        xs.append(x.cpu())
        ys.append(y.cpu())
        tracker.update(i * chunk + m)
    return torch.cat(xs), torch.cat(ys)


def save_image_grid(images: np.ndarray, labels: np.ndarray, path: Path, per_class: int = 10) -> None:
    """A PNG grid with up to ``per_class`` samples of each label, one row per class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = np.unique(labels)
    fig, axes = plt.subplots(len(classes), per_class, figsize=(per_class * 0.6, len(classes) * 0.6), squeeze=False)
    for r, c in enumerate(classes):
        idx = np.flatnonzero(labels == c)[:per_class]
        for k in range(per_class):
            ax = axes[r, k]
            ax.axis("off")
            if k < len(idx):
                ax.imshow(images[idx[k]], cmap="gray", vmin=0, vmax=1)
    fig.tight_layout(pad=0.1)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
