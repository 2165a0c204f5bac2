"""Sample from a saved run: ``python -m lightning_dp.sample CHECKPOINT --num-rows N --out FILE [--weights NAME]``.

Works in a new process from the checkpoint alone: the model is rebuilt from the saved config and the
rows are decoded with the saved public schema. Without ``--weights`` no private data is read and no budget
is spent (sampling is post-processing).

``--weights ESTIMATOR`` adds a ``weight`` column (importance weights p_D/p_G, mean one; bias mitigation,
``lightning_dp/weighting/``). A private estimator spends from the run's own ledger: the request is checked
against the ledger before the run's data is reloaded, its release is recorded in ``ledger.json`` and in the
checkpoint (both written atomically) before the noisy weights exist, and a request that would exceed the
run's target is refused with nothing read or released. ``discriminator`` (dp_gan/dp_cgan) reads no data
and costs nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_dp.errors import EXIT_USER_ERROR, ConfigError, UserError
from lightning_dp.quick_checks import check_output_file

if TYPE_CHECKING:  # torch and Lightning load on use: a bad command line is refused in a second
    from lightning_dp.checkpoint import LoadedRun

SUFFIXES = {"tabular": (".csv", ".parquet", ".pq"), "image": (".npz",)}


def sample_checkpoint(checkpoint: str | Path, num_rows: int, out: str | Path, *, seed: int | None = None) -> str:
    """Load ``checkpoint`` with :func:`~lightning_dp.checkpoint.load_run` and write ``num_rows`` samples to ``out``.

    Raises:
        UnsafeConfigError: the checkpoint's record names a class or holds a value the loader refuses.
        CheckpointError: unreadable or foreign checkpoint.
        ValueError: a bad row count or an output suffix that does not fit the data kind.
    """
    from lightning_dp.checkpoint import load_run

    if num_rows <= 0:
        raise ValueError(f"--num-rows must be positive, got {num_rows}.")
    return sample_run(load_run(checkpoint), num_rows, out, seed=seed)


def sample_run(run: LoadedRun, num_rows: int, out: str | Path, *, seed: int | None = None) -> str:
    """Draw ``num_rows`` samples from a loaded run and write them to ``out`` (its suffix picks the format).

    Raises:
        ValueError: a bad row count or an output suffix that does not fit the data kind.
    """
    from lightning_dp.synthetic import write_samples

    if num_rows <= 0:
        raise ValueError(f"--num-rows must be positive, got {num_rows}.")
    kind = run.data_state["kind"]
    out = Path(out)
    if out.suffix.lower() not in SUFFIXES[kind]:
        raise ValueError(f"This checkpoint generates {kind} data: write it to a file ending in "
                         f"{' or '.join(SUFFIXES[kind])}, not {out.name!r}.")
    return write_samples(run.model, run.data_state, num_rows, out.with_suffix(""), seed=seed, suffix=out.suffix)


def sample_weighted(checkpoint: str | Path, num_rows: int | None, out: str | Path, *, weights: dict[str, Any],
                    seed: int | None = None) -> tuple[str, dict[str, Any]]:
    """Sample rows and their importance weights from a checkpoint; a private estimator spends from its ledger.

    Args:
        checkpoint: the run's ``checkpoints/last.ckpt`` (its folder's ``ledger.json`` is read and updated too).
        num_rows: rows to weight (``None``: the run's DP count, or the most that output perturbation admits).
        out: a ``.csv`` or ``.parquet`` file: the user's columns plus ``weight``.
        weights: the ``weights`` settings (``estimator``, ``epsilon``, ...; :class:`WeightsConfig`).
        seed: seed of the synthetic sample.

    Returns:
        The file written and the weights' summary (estimator, ε, Kish ESS, PSIS k̂), also written beside it as
        ``OUT.weights.json``. Non-private reference weights (``--allow-non-private-weights``) leave the run's ledger
        and DP claim untouched: the written file is private and its summary says so.

    Raises:
        ConfigError, BudgetExceededError, CheckpointError, DataError: refused before anything is released.
    """
    from lightning_dp.budget import RunBudget
    from lightning_dp.checkpoint import data_layout, load_run
    from lightning_dp.privacy.ledger import PrivacyLedger
    from lightning_dp.resume import registry_resume, resume_state
    from lightning_dp.weighting.apply import Weighting, WeightsConfig

    checkpoint = Path(checkpoint)
    run = load_run(checkpoint)
    out = Path(out)
    if out.suffix.lower() not in SUFFIXES["tabular"]:
        raise ValueError(f"Weighted rows are a table: write them to a .csv or .parquet file, not {out.name!r}.")
    config = run.record["config"]
    weighting = Weighting(WeightsConfig.from_node(weights), layout=data_layout(run.data_state),
                          model_name=config["model"].get("name", ""), model_cfg=config["model"],
                          data_kind=run.data_state["kind"])
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    with RunBudget.open(config["privacy"], run_dir) as budget:  # the run's folder locked, its spend from the registry
        cont = registry_resume(budget.registry, resume_state(run_dir, checkpoint))
        ledger = PrivacyLedger.from_state_dict(cont.ledger)
        budget.attach(ledger, run_id=cont.run_id, dataset_id=cont.dataset_id)
        return _sample_weighted(run, checkpoint, run_dir, num_rows, out, weighting, ledger, budget, seed)


def _sample_weighted(run: LoadedRun, checkpoint: Path, run_dir: Path, num_rows: int | None, out: Path,
                     weighting: Any, ledger: Any, budget: Any, seed: int | None) -> tuple[str, dict[str, Any]]:
    from lightning_dp.checkpoint import AtomicCheckpointIO
    from lightning_dp.data.datamodule import PrivateDataModule, write_table
    from lightning_dp.data.dp_count import RowCount
    from lightning_dp.io import atomic_write_text
    from lightning_dp.privacy import mechanisms as mech
    from lightning_dp.weighting.apply import weighted_frame

    config = run.record["config"]
    ledger.unreserve()  # budget reserved at training time is this request's to use
    num_real = RowCount.from_dict(run.data_state["num_rows"]).value
    rows = num_rows if num_rows is not None else weighting.default_rows(num_real=num_real, ledger=ledger)
    if rows <= 0:
        raise ValueError(f"--num-rows must be positive, got {rows}.")
    weighting.check_budget(weighting.plan(num_real=num_real, num_rows=rows, ledger=ledger), ledger)
    real = None
    if weighting.estimator.reads_private:
        dm = PrivateDataModule(**config["data"])
        before = list(ledger.releases)
        dm.prepare(ledger, generator=mech.noise_generator(), state=run.data_state,  # the released count and schema
                   identify=budget.identify)  # the run's data set: its claim and lease in the registry
        if ledger.releases != before:  # a saved state always holds them; refuse a second release of the schema
            raise ConfigError(f"{checkpoint} lacks the run's released schema; weights cannot be fitted from it.")
        real = (dm.x, dm.y)
    ckpt = run.checkpoint

    def persist(led: Any) -> None:  # the checkpoint's copy, then ledger.json: both before any noise
        ckpt["lightning_dp"]["ledger"] = led.state_dict()
        AtomicCheckpointIO().save_checkpoint(ckpt, checkpoint)
        led.save_json(str(run_dir / "ledger.json"))

    ledger.persist = persist
    sample = weighting.run(model=run.model, real=real, num_rows=rows, num_real=num_real, ledger=ledger,
                           generator=mech.noise_generator(), seed=seed, waive=False)
    summary = {**sample.summary, "rows": len(sample.weights), "ledger": ledger.summary()}
    if weighting.no_guarantee:  # the run's artefacts stay DP; this file is not, and says so beside it
        summary["PRIVATE"] = (f"{out.name} holds weights that {weighting.no_guarantee}: they are computed from the "
                              "run's private rows without a mechanism. Handle the file like the data; do not publish it.")
    write_table(weighted_frame(run.data_state, sample), out)
    atomic_write_text(out.with_name(out.name + ".weights.json"), json.dumps(summary, indent=2, default=float) + "\n")
    return str(out), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dp.sample", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a run's checkpoints/last.ckpt")
    parser.add_argument("--num-rows", type=int, default=None,
                        help="number of synthetic rows (or images); with --weights, default: the run's DP count")
    parser.add_argument("--out", required=True, help="output file: .csv or .parquet (tabular), .npz (images)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the latent noise (reproducible samples)")
    parser.add_argument("--weights", default=None, metavar="ESTIMATOR",
                        help="add a weight column: beta_noised, output_lapl, output_norm, priv_mlp, discriminator "
                             "(or the non-private references logreg, mlp with --allow-non-private-weights)")
    parser.add_argument("--weights-epsilon", type=float, default=None, metavar="E",
                        help="ε of the weights on their own, spent from the run's ledger")
    parser.add_argument("--temper", type=float, default=1.0, help="weights w^τ, τ in [0, 1] (default 1)")
    parser.add_argument("--no-psis", action="store_true", help="do not Pareto-smooth the weights (k̂ is reported anyway)")
    parser.add_argument("--allow-non-private-weights", action="store_true",
                        help="allow logreg/mlp (fitted without DP): the written file is then PRIVATE (the run stays DP)")
    args = parser.parse_args(argv)
    try:  # before torch loads: a bad --out or row count is refused in a second, with nothing read
        check_output_file(args.out)
        if args.num_rows is not None and args.num_rows <= 0:
            raise ConfigError(f"--num-rows must be positive, got {args.num_rows}.")
        if args.weights is None and args.num_rows is None:
            raise ConfigError("--num-rows is required (the number of rows to write).")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    logging.basicConfig(level=logging.WARNING)
    for name in ("pytorch_lightning", "lightning_fabric", "lightning"):  # priv_mlp trains with a Trainer: no banners
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    from lightning_dp.progress import plain_console, tracker

    try:
        if args.weights is None:
            from lightning_dp.checkpoint import load_run

            with plain_console(), tracker.session():
                run = load_run(args.checkpoint)  # an untrusted checkpoint is refused before any progress line
                tracker.stage("sample", total=args.num_rows, unit="rows")
                path = sample_run(run, args.num_rows, args.out, seed=args.seed)
            print(f"wrote {args.num_rows} rows to {path}")
            return 0
        weights = {"estimator": args.weights, "epsilon": args.weights_epsilon, "temper": args.temper,
                   "psis": not args.no_psis, "allow_non_private": args.allow_non_private_weights}
        with plain_console(), tracker.session():  # elapsed time while the weights are fitted (their steps: Lightning's)
            tracker.stage(f"weights: {args.weights} (fit the weights, then sample)")
            path, summary = sample_weighted(args.checkpoint, args.num_rows, args.out, weights=weights, seed=args.seed)
    except (UserError, ValueError) as err:  # bad input (CheckpointError, UnsafeConfigError, DataError): says why
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"wrote {summary['rows']} weighted rows to {path}: Kish ESS {summary['kish_ess']:.1f}, "
          f"PSIS k̂ {summary['psis_k']:.2f} ({summary['psis_verdict']}); {summary['ledger']}")
    if "PRIVATE" in summary:
        print(f"PRIVATE: {summary['PRIVATE']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
