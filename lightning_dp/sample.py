"""Sample from a saved run: ``python -m lightning_dp.sample CHECKPOINT --num-rows N --out FILE``.

Works in a new process from the checkpoint alone: the model is rebuilt from the saved config and the
rows are decoded with the saved public schema. No private data is read and no budget is spent
(sampling is post-processing).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from lightning_dp.checkpoint import CheckpointError, load_checkpoint
from lightning_dp.data.schema import DataError
from lightning_dp.models import build_model
from lightning_dp.train import write_samples

SUFFIXES = {"tabular": (".csv", ".parquet", ".pq"), "image": (".npz",)}


def sample_checkpoint(checkpoint: str | Path, num_rows: int, out: str | Path, *, seed: int | None = None) -> str:
    """Load ``checkpoint``, draw ``num_rows`` samples and write them to ``out``.

    Raises:
        CheckpointError: unreadable or foreign checkpoint.
        ValueError: a bad row count or an output suffix that does not fit the data kind.
    """
    if num_rows <= 0:
        raise ValueError(f"--num-rows must be positive, got {num_rows}.")
    ckpt = load_checkpoint(checkpoint)
    record = ckpt["lightning_dp"]
    kind = record["data"]["kind"]
    out = Path(out)
    if out.suffix.lower() not in SUFFIXES[kind]:
        raise ValueError(f"This checkpoint generates {kind} data: write it to a file ending in "
                         f"{' or '.join(SUFFIXES[kind])}, not {out.name!r}.")
    model = build_model(record["config"]["model"], _layout(record["data"]))
    model.load_state_dict(ckpt["state_dict"])
    return write_samples(model, record["data"], num_rows, out.with_suffix(""), seed=seed, suffix=out.suffix)


def _layout(data_state: dict) -> dict:
    if data_state["kind"] == "image":
        import numpy as np

        return {"n_continuous": int(np.prod(data_state["image_shape"])), "block_sizes": [],
                "num_classes": len(data_state["classes"])}
    from lightning_dp.data.encoders import TabularEncoder
    from lightning_dp.data.schema import Schema

    enc = TabularEncoder(Schema.from_dict(data_state["schema"]))
    return {"n_continuous": enc.n_continuous, "block_sizes": enc.block_sizes, "num_classes": enc.num_classes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dp.sample", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a run's checkpoints/last.ckpt")
    parser.add_argument("--num-rows", type=int, required=True, help="number of synthetic rows (or images)")
    parser.add_argument("--out", required=True, help="output file: .csv or .parquet (tabular), .npz (images)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the latent noise (reproducible samples)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        path = sample_checkpoint(args.checkpoint, args.num_rows, args.out, seed=args.seed)
    except (CheckpointError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.num_rows} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
