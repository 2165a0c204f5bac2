"""Writing synthetic data: sample a generator in chunks, decode to the user's columns, write atomically.

Used at the end of a run (``train.py``) and later from a checkpoint (``python -m lightning_dp.sample``).
Sampling is post-processing of the checkpoint: it reads no private data and spends no budget.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_dp.data.datamodule import decode_samples, write_table
from lightning_dp.io import atomic_write
from lightning_dp.progress import tracker


def write_samples(model: torch.nn.Module, data_state: dict[str, Any], n: int, stem: str | Path,
                  *, seed: int | None = None, suffix: str | None = None) -> str:
    """Sample ``n`` rows, decode them to the user's columns and write them atomically.

    Tabular data goes to ``<stem>.csv`` (or ``.parquet``); images to ``<stem>.npz`` plus a PNG grid.
    """
    x, y = sample_in_chunks(model, n, seed=seed)
    decoded = decode_samples(data_state, x, y)
    stem = Path(stem)
    if data_state["kind"] == "image":
        path = stem.with_suffix(".npz")
        atomic_write(path, lambda tmp: _savez(tmp, decoded))
        save_image_grid(decoded["images"], decoded["labels"], stem.with_suffix(".png"))
        return str(path)
    path = stem.with_suffix(suffix or ".csv")
    write_table(decoded, path)
    return str(path)


def _savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to a temporary name
        np.savez_compressed(f, **arrays)


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
