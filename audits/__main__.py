"""``python -m audits SYNTHETIC_OR_CHECKPOINT --real REAL --holdout HOLDOUT --out DIR``: an audit report.

Writes ``DIR/report.json`` and ``DIR/report.html`` (see :mod:`audits.report` for the inputs and the policy
format). Both are private: computed from REAL and HOLDOUT, not differentially private, not covered by the run's
(ε, δ). Exit code: 0 the policy passed, 1 it failed, 2 bad input (nothing written), 3 an unexpected error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_ERROR = 0, 1, 2, 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m audits",
        description=__doc__.splitlines()[0],
        epilog="Exit code: 0 policy passed, 1 policy failed, 2 bad input, 3 unexpected error.",
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
        "--num-rows", type=int, default=None, help="rows sampled from a checkpoint (default: |REAL|)"
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
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from audits.policy import PolicyError, load_policy

    try:  # before the heavy imports: a bad policy or row count fails in a second
        load_policy(args.policy)
        if args.num_rows is not None and args.num_rows <= 0:
            raise ValueError(f"--num-rows must be positive, got {args.num_rows}.")
    except (PolicyError, ValueError) as err:
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
    except (UserError, ValueError, FileNotFoundError) as err:  # PolicyError, InputError, DataError, CheckpointError
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception:  # noqa: BLE001 - report the bug, distinctly from a failed policy
        traceback.print_exc()
        print("error: the audit failed unexpectedly (above); no report was written.", file=sys.stderr)
        return EXIT_ERROR
    for v in report["verdicts"]:
        value = "n/a" if v["value"] is None else f"{v['value']:.4g}"
        print(
            f"{'PASS' if v['passed'] else 'FAIL'}  {v['check']}: {v['description']} = {value} "
            f"{v['op']} {v['limit']:g}"
        )
    for name, check in report["checks"].items():
        if check["status"] == "skipped":
            print(f"SKIP  {name}: {check['reason']}")
    print(f"policy {'passed' if report['passed'] else 'FAILED'}; report: {paths['html']}")
    print(
        "the report is private (computed from REAL and HOLDOUT, not differentially private): do not publish it"
    )
    return EXIT_PASS if report["passed"] else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
