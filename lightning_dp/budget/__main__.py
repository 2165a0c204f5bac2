"""``python -m lightning_dp.budget``: the data sets' budgets, their spend by run and release, and budget changes.

    list                                 every data set: budget, held, spent, runs
    show NAME                            one data set: its runs, their releases, the event log
    export [NAME] --format json|csv      for compliance (stdout, or --out FILE written atomically)
    set NAME EPSILON [--delta D] --reason TEXT   set a budget (an explicit act, logged with who, when and why);
                                         --create registers a name, --separate lets rows that overlap others join it
    raise NAME EPSILON [--delta D] --reason TEXT raise it (refuses a lower value)
    end RUN --reason TEXT                end a run whose process is gone: its claim shrinks to its spend
    policy [--registered-only on|off] [--overlap-threshold F] --reason TEXT   show or change the registry's policy

The registry is ``--registry`` (a file path or postgresql://USER@HOST:PORT/DB), else ``$LIGHTNING_DP_REGISTRY``,
else the default SQLite file. Everything shown is a function of the runs' public parameters (ε, δ, mechanisms,
noise, counts of releases), never of the rows.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from lightning_dp.budget.registry import Dataset, Registry, RunRow
from lightning_dp.errors import EXIT_USER_ERROR, UserError

CSV_COLUMNS = ("dataset", "budget_epsilon", "budget_delta", "run_id", "run_status", "run_target_epsilon", "run_delta",
               "run_epsilon_spent", "run_charge_epsilon", "output_dir", "external_of", "release", "mechanism",
               "sensitivity", "noise_multiplier", "epsilon", "sample_rate", "delta", "count", "epsilon_alone",
               "epsilon_cumulative", "first_at", "last_at")


def _status(run: RunRow) -> str:
    if not run.active:
        return "ended"
    return "running" if run.live else "stopped (claim held until resumed or ended)"


def dataset_summary(registry: Registry, dataset: Dataset, *, releases: bool = True) -> dict[str, Any]:
    """One data set: budget, what its runs hold and spent, and each run with its releases (ε of each; with
    ``releases=False`` the runs' totals only, which ``list`` prints without loading the accountant)."""
    runs = registry.runs(dataset)
    held = sum(r.charge for r in runs)
    out_runs = []
    for r in runs:
        run = {"run_id": r.run_id, "status": _status(r), "output_dir": r.output_dir,
               "target_epsilon": r.target_epsilon, "delta": r.delta, "epsilon_spent": r.epsilon_spent,
               "epsilon_committed": r.epsilon_committed, "charge_epsilon": r.charge, "external_of": r.external_of,
               "created_at": r.created_at, "closed_at": r.closed_at}
        if releases:
            run.update(_releases(r.state))
        out_runs.append(run)
    held_delta = sum(r.delta_charge for r in runs)
    return {"dataset": dataset.name, "budget_epsilon": dataset.budget_epsilon, "held_epsilon": held,
            "spent_epsilon": sum(r.epsilon_committed for r in runs), "remaining_epsilon": dataset.budget_epsilon - held,
            "budget_delta": dataset.budget_delta, "held_delta": held_delta,
            "remaining_delta": dataset.budget_delta - held_delta, "separate": dataset.separate,
            "delta_total": sum(r.delta for r in runs), "versions": registry.versions(dataset),
            "composition": "basic: the data set's ε is the sum of its runs' ε, its δ the sum of their δ",
            "runs": out_runs, "events": registry.events(dataset)}


def _releases(state: dict[str, Any]) -> dict[str, Any]:
    """A run's releases with ε of each, recomputed by the accountant (imported here: it loads torch and Opacus)."""
    from lightning_dp.privacy.ledger import PrivacyLedger

    view = PrivacyLedger.from_state_dict(state).to_dict()
    keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "epsilon", "sample_rate", "delta", "count",
            "epsilon_alone", "epsilon_cumulative", "first_at", "last_at")
    return {"dp_claim": view["dp_claim"], "releases": [{k: rel[k] for k in keys} for rel in view["releases"]]}


def _csv(summaries: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for s in summaries:
        for run in s["runs"]:
            base = {"dataset": s["dataset"], "budget_epsilon": s["budget_epsilon"], "budget_delta": s["budget_delta"],
                    "run_id": run["run_id"],
                    "run_status": run["status"], "run_target_epsilon": run["target_epsilon"], "run_delta": run["delta"],
                    "run_epsilon_spent": run["epsilon_spent"], "run_charge_epsilon": run["charge_epsilon"],
                    "output_dir": run["output_dir"], "external_of": run["external_of"]}
            for rel in run["releases"] or [{}]:
                writer.writerow({**base, **{("release" if k == "name" else k): v for k, v in rel.items()}})
    return buffer.getvalue()


def _print_list(registry: Registry) -> None:
    print(f"registry: {registry.display}")
    policy = registry.policy()
    print(f"policy: {'registered data sets only' if policy['registered_only'] else 'runs may register new data sets'}; "
          f"rows more than {policy['overlap_threshold']:.0%} a registered data set's are charged to it")
    print(f"{'data set':<28} {'budget ε':>9} {'held ε':>9} {'spent ε':>9} {'left ε':>9} {'budget δ':>9} {'held δ':>9}  runs")
    for ds in registry.datasets():
        s = dataset_summary(registry, ds, releases=False)
        running = sum(1 for r in s["runs"] if r["status"] != "ended")
        print(f"{ds.name:<28} {ds.budget_epsilon:>9.4g} {s['held_epsilon']:>9.4g} {s['spent_epsilon']:>9.4g} "
              f"{s['remaining_epsilon']:>9.4g} {ds.budget_delta:>9.3g} {s['held_delta']:>9.3g}  {len(s['runs'])} "
              f"({running} not ended)")


def _print_show(summary: dict[str, Any]) -> None:
    s = summary
    print(f"data set {s['dataset']}: budget ε = {s['budget_epsilon']:g}; held ε = {s['held_epsilon']:.4g} (spent "
          f"{s['spent_epsilon']:.4g}), left ε = {s['remaining_epsilon']:.4g}; δ budget {s['budget_delta']:.3g}, held "
          f"δ = {s['held_delta']:.3g}; {'separate (may overlap other data sets); ' if s['separate'] else ''}"
          f"{s['versions']} version(s) of its rows; {s['composition']}")
    for run in s["runs"]:
        print(f"  run {run['run_id']}  {run['status']}  ε = {run['epsilon_spent']:.4g} of {run['target_epsilon']:g} "
              f"(charged {run['charge_epsilon']:.4g})  {run['output_dir']}"
              + (f"  [from external {run['external_of']}]" if run["external_of"] else "")
              + ("" if run["dp_claim"] else "  NO DP CLAIM"))
        for rel in run["releases"]:
            print(f"      {rel['name']:<36} {rel['mechanism']:<20} ×{rel['count']:<6} ε alone {rel['epsilon_alone']:.4g}")
    print("  events:")
    for e in s["events"]:
        extra = {k: v for k, v in e.items() if k not in ("at", "actor", "action", "run_id") and v is not None}
        print(f"    {e['at']}  {e['actor']}  {e['action']}" + (f"  run {e['run_id']}" if e["run_id"] else "")
              + (f"  {json.dumps(extra, default=str)}" if extra else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_dp.budget", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:9]))
    parser.add_argument("--registry", default=None, help="file path or postgresql://... (default: $LIGHTNING_DP_REGISTRY "
                                                         "or ~/.local/share/lightning-dp/budget.sqlite)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every data set")
    show = sub.add_parser("show", help="one data set")
    show.add_argument("name")
    export = sub.add_parser("export", help="machine-readable export")
    export.add_argument("name", nargs="?", default=None, help="one data set (default: all)")
    export.add_argument("--format", choices=("json", "csv"), default="json")
    export.add_argument("--out", default=None, help="file to write (default: stdout)")
    for name, helptext in (("set", "set a budget"), ("raise", "raise a budget")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("name")
        p.add_argument("epsilon", type=float)
        p.add_argument("--delta", type=float, default=None, help="the δ budget (the runs' δ add up)")
        p.add_argument("--reason", required=True)
        if name == "set":
            p.add_argument("--create", action="store_true", help="register a new named data set")
            p.add_argument("--separate", action="store_true", default=None,
                           help="rows that overlap other registered data sets may join this one (the owner's call)")
    end = sub.add_parser("end", help="end a run whose process is gone")
    end.add_argument("run_id")
    end.add_argument("--reason", required=True)
    policy = sub.add_parser("policy", help="show or change the registry's policy")
    policy.add_argument("--registered-only", choices=("on", "off"), default=None,
                        help="on: runs may only use data sets the owner registered (set NAME E --create)")
    policy.add_argument("--overlap-threshold", type=float, default=None,
                        help="rows more than this share a registered data set's (either way) are charged to it")
    policy.add_argument("--reason", default="")
    args = parser.parse_args(argv)
    try:
        registry = Registry(args.registry)
        if args.command == "list":
            _print_list(registry)
        elif args.command == "show":
            _print_show(dataset_summary(registry, registry.dataset(args.name)))
        elif args.command == "export":
            datasets = [registry.dataset(args.name)] if args.name else registry.datasets()
            summaries = [dataset_summary(registry, ds) for ds in datasets]
            body = (json.dumps({"registry": registry.display, "datasets": summaries}, indent=2, default=float) + "\n"
                    if args.format == "json" else _csv(summaries))
            if args.out:
                from lightning_dp.io import atomic_write_text

                atomic_write_text(args.out, body)
                print(f"wrote {len(summaries)} data set(s) to {args.out}")
            else:
                sys.stdout.write(body)
        elif args.command in ("set", "raise"):
            before, ds = registry.set_budget(args.name, args.epsilon, reason=args.reason,
                                             only_raise=args.command == "raise", create=getattr(args, "create", False),
                                             delta=args.delta, separate=getattr(args, "separate", None))
            print(f"data set {ds.name}: budget ε = {ds.budget_epsilon:g}, δ = {ds.budget_delta:g}"
                  + (" (separate)" if ds.separate else "")
                  + (" (registered)" if before is None else f" (was {before:g})"))
        elif args.command == "policy":
            if args.registered_only is not None or args.overlap_threshold is not None:
                registry.set_policy(reason=args.reason, overlap_threshold=args.overlap_threshold,
                                    registered_only=None if args.registered_only is None else args.registered_only == "on")
            print(json.dumps(registry.policy()))
        elif args.command == "end":
            charge = registry.end_run(args.run_id, reason=args.reason)
            print(f"run {args.run_id} ended; its data set is now charged its spend, ε = {charge:.4g}")
    except (UserError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
