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

from lightning_dp.checkpoint import LoadedRun, load_run
from lightning_dp.errors import EXIT_USER_ERROR, UserError
from lightning_dp.synthetic import write_samples

SUFFIXES = {"tabular": (".csv", ".parquet", ".pq"), "image": (".npz",)}


def sample_checkpoint(checkpoint: str | Path, num_rows: int, out: str | Path, *, seed: int | None = None) -> str:
    """Load ``checkpoint`` with :func:`~lightning_dp.checkpoint.load_run` and write ``num_rows`` samples to ``out``.

    Raises:
        UnsafeConfigError: the checkpoint's record names a class or holds a value the loader refuses.
        CheckpointError: unreadable or foreign checkpoint.
        ValueError: a bad row count or an output suffix that does not fit the data kind.
    """
    if num_rows <= 0:
        raise ValueError(f"--num-rows must be positive, got {num_rows}.")
    return sample_run(load_run(checkpoint), num_rows, out, seed=seed)


def sample_run(run: LoadedRun, num_rows: int, out: str | Path, *, seed: int | None = None) -> str:
    """Draw ``num_rows`` samples from a loaded run and write them to ``out`` (its suffix picks the format).

    Raises:
        ValueError: a bad row count or an output suffix that does not fit the data kind.
    """
    if num_rows <= 0:
        raise ValueError(f"--num-rows must be positive, got {num_rows}.")
    kind = run.data_state["kind"]
    out = Path(out)
    if out.suffix.lower() not in SUFFIXES[kind]:
        raise ValueError(f"This checkpoint generates {kind} data: write it to a file ending in "
                         f"{' or '.join(SUFFIXES[kind])}, not {out.name!r}.")
    return write_samples(run.model, run.data_state, num_rows, out.with_suffix(""), seed=seed, suffix=out.suffix)


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
    except (UserError, ValueError) as err:  # bad input (CheckpointError, UnsafeConfigError, DataError): says why
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"wrote {args.num_rows} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
