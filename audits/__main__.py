"""``python -m audits SYNTHETIC_OR_CHECKPOINT --real REAL --holdout HOLDOUT --out DIR``: an audit report.

Writes ``DIR/report.json`` and ``DIR/report.html`` (see :mod:`audits.report` for the inputs and the policy
format). Both are private: computed from REAL and HOLDOUT, not differentially private, not covered by the run's
(ε, δ). Every threshold of the policy is decided on a confidence interval of its statistic: PASS when the whole
interval is within the limit, FAIL when it is entirely beyond it, INCONCLUSIVE when the data cannot decide.

Exit codes:

* 0: the policy passed (every threshold passed with confidence);
* 1: the policy failed (at least one threshold failed with confidence);
* 2: bad input: a policy, file, data set, checkpoint, option or ``--out`` folder that cannot be used; the message
  names the problem and the fix, and nothing is written;
* 3: an unexpected error (a bug: its traceback is printed); nothing is written;
* 4: the policy was inconclusive (no threshold failed, but at least one could not be decided, or nothing was
  decided at all, e.g. every check was skipped).

``python -m audits one-run --canaries M --out DIR -- OVERRIDES...``: the one-run privacy audit of the training
pipeline (:mod:`audits.one_run`); exit 0 when its ε lower bound does not exceed the claimed ε, 1 when it does,
2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_ERROR, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4
EXIT_CODES = {"pass": EXIT_PASS, "fail": EXIT_FAIL, "inconclusive": EXIT_INCONCLUSIVE}
MAX_SEED = 2**32 - 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m audits",
        description=__doc__.splitlines()[0],
        epilog="Exit codes: 0 policy passed, 1 policy failed, 4 policy inconclusive (nothing failed but something "
        "could not be decided), 2 bad input (nothing written), 3 unexpected error (nothing written).",
    )
    parser.add_argument(
        "synthetic",
        metavar="SYNTHETIC_OR_CHECKPOINT",
        help="synthetic rows (.csv/.parquet, the user's columns) or a run's checkpoint (sampled)",
    )
    parser.add_argument(
        "--real", required=True, help="private training rows: a file or a data set name (adult)"
    )
    parser.add_argument(
        "--holdout", required=True, help="real rows never trained on: a file or a data set name"
    )
    parser.add_argument("--out", required=True, help="folder for report.json and report.html")
    parser.add_argument("--policy", default=None, help="policy YAML (default: audits/policies/default.yaml)")
    parser.add_argument(
        "--num-rows",
        type=int,
        default=None,
        help="rows sampled from a checkpoint (default: |REAL|; at most 1,000,000)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of sampling, candidates, attacks (default: policy)"
    )
    parser.add_argument("--label", default=None, help="label column for utility (default: the schema's)")
    parser.add_argument(
        "--data-root", default=None, help="folder of the shared data sets (default: the run's)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the audit; the exit code (see the module docstring). ``python -m audits one-run ...`` runs the one-run
    privacy audit of the pipeline instead (:mod:`audits.one_run`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["one-run"]:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        from audits.one_run import main as one_run_main

        return one_run_main(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from lightning_dp.progress import plain_console

    with plain_console():  # progress lines (off a terminal) without the logging prefix
        return _audit(args)


def _audit(args: argparse.Namespace) -> int:
    from audits.inputs import InputError, check_num_rows
    from audits.output import check_output_folder
    from audits.policy import PolicyError, load_policy

    try:  # before the heavy imports: a bad policy, row count, seed or --out fails in a second
        load_policy(args.policy)
        check_num_rows(args.num_rows)
        if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
            raise InputError(f"--seed must be in [0, {MAX_SEED}], got {args.seed}.")
        check_output_folder(args.out)
    except (PolicyError, InputError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from audits.report import run_audit
    from lightning_dp.errors import UserError

    try:
        report, paths = run_audit(
            args.synthetic,
            real=args.real,
            holdout=args.holdout,
            out=args.out,
            policy=args.policy,
            num_rows=args.num_rows,
            seed=args.seed,
            data_root=args.data_root,
            label=args.label,
        )
    except (UserError, ValueError, FileNotFoundError) as err:  # Policy/Input/Output/Data/CheckpointError
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception:  # noqa: BLE001 - report the bug, distinctly from a failed policy
        traceback.print_exc()
        print("error: the audit failed unexpectedly (above); no report was written.", file=sys.stderr)
        return EXIT_ERROR
    for line in report["summary"]:
        print(line)
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    print(f"policy {report['status'].upper()}: {report['status_reason']} Report: {paths['html']}")
    print(
        "the report is private (computed from REAL and HOLDOUT, not differentially private): do not publish it"
    )
    return EXIT_CODES[report["status"]]


if __name__ == "__main__":
    sys.exit(main())
