"""Audit policies: which checks ``python -m audits`` runs, with which options and pass/fail thresholds.

The format is documented in :mod:`audits.report`; the shipped default is ``audits/policies/default.yaml``.
This module only loads and validates a policy (unknown checks, options or attacks are errors that name the
valid ones) and fills in the defaults; the checks themselves are in :mod:`audits.checks`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lightning_dp.errors import UserError

# Every check, with each option's default. Options named ``max_*`` / ``min_*`` are thresholds: a check
# gates the policy on those that are set (not null); a check with none set is informational.
CHECKS: dict[str, dict[str, Any]] = {
    "membership": {
        "attacks": ["dcr", "dcr_ratio", "domias"],
        "n_bootstrap": 200,
        "max_auc": None,
    },
    "presence_disclosure": {
        "precision_target": 0.55,
        "max_risk_above_baseline": None,
    },
    "attribute_disclosure": {
        "known_columns": None,
        "k": 5,
        "tolerance": 0.05,
        "tolerance_mode": "relative",
        "max_risk_above_baseline": None,
    },
    "lmdp_mmd": {
        "columns": None,
        "alpha": 0.05,
        "n_permutations": 200,
        "max_samples": 1000,
    },
    "utility": {
        "label": None,
        "classifiers": ["logistic_regression", "gaussian_nb", "decision_tree"],
        "metric": None,
        "min_score": None,
        "min_roc": None,
        "max_gap_to_real": None,
    },
    "fidelity": {
        "n_range_queries": 500,
        "max_mean_tv": None,
        "max_mean_ks": None,
        "max_mean_w1": None,
        "max_two_way_marginal": None,
        "max_range_query_error": None,
    },
}
# Settings shared by all checks (top-level keys of a policy besides ``checks``).
SETTINGS: dict[str, Any] = {"seed": 0, "max_candidates": 1000}
# Attacks the report can run from data alone (``shadow`` needs a function that trains shadow generators).
REPORT_ATTACKS = ("dcr", "dcr_ratio", "domias")


class PolicyError(UserError, ValueError):
    """A policy names an unknown check, option or attack, or has a malformed value."""


def default_policy_path() -> Path:
    """The shipped default policy, ``audits/policies/default.yaml``."""
    return Path(str(resources.files("audits").joinpath("policies/default.yaml")))


def load_policy(policy: str | Path | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read and validate a policy; fill in every default.

    Args:
        policy: a YAML file, an already parsed mapping, or ``None`` for the shipped default.

    Returns:
        ``{"source": str, "seed": int, "max_candidates": int, "checks": {name: {option: value}}}`` with
        only the checks the policy asks for, in the order of :data:`CHECKS`.

    Raises:
        PolicyError: unreadable file, unknown check/option/attack, or a malformed value.
    """
    if policy is None or isinstance(policy, (str, Path)):
        path = default_policy_path() if policy is None else Path(policy)
        if not path.is_file():
            raise PolicyError(
                f"Policy file {str(path)!r} does not exist. Pass --policy PATH to a YAML policy, or "
                "leave it out for the default policy."
            )
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise PolicyError(f"Policy file {str(path)!r} is not valid YAML: {err}") from err
        source = str(path)
    else:
        raw, source = copy.deepcopy(dict(policy)), "inline"
    if not isinstance(raw, Mapping) or "checks" not in raw:
        raise PolicyError(
            f"Policy {source!r} must be a mapping with a 'checks' entry, e.g. "
            "'checks: {membership: {max_auc: 0.6}}'. Valid checks: " + ", ".join(CHECKS) + "."
        )
    unknown = sorted(set(raw) - {"checks", *SETTINGS})
    if unknown:
        raise PolicyError(
            f"Policy {source!r}: unknown top-level key(s) {unknown}; valid: checks, {', '.join(SETTINGS)}."
        )
    checks = raw["checks"]
    if isinstance(checks, list):  # a bare list of names: every check with its defaults
        checks = {name: None for name in checks}
    if not isinstance(checks, Mapping) or not checks:
        raise PolicyError(
            f"Policy {source!r}: 'checks' must be a non-empty mapping (or list) of checks; valid "
            f"checks: {', '.join(CHECKS)}."
        )
    bad = [str(name) for name in checks if name not in CHECKS]
    if bad:
        raise PolicyError(f"Policy {source!r}: unknown check(s) {bad}; valid checks: {', '.join(CHECKS)}.")
    out: dict[str, Any] = {"source": source, **{k: raw.get(k, v) for k, v in SETTINGS.items()}, "checks": {}}
    for name in CHECKS:  # a fixed order: the report reads the same whatever the policy's order
        if name in checks:
            out["checks"][name] = _check_options(name, checks[name] or {}, source)
    _validate_settings(out, source)
    return out


def _check_options(name: str, given: Any, source: str) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise PolicyError(f"Policy {source!r}: check {name!r} must map options to values, got {given!r}.")
    unknown = sorted(set(given) - set(CHECKS[name]))
    if unknown:
        raise PolicyError(
            f"Policy {source!r}: check {name!r} has unknown option(s) {unknown}; valid: "
            f"{', '.join(CHECKS[name])}."
        )
    opts = {**copy.deepcopy(CHECKS[name]), **given}
    for key, value in opts.items():
        if (
            key.startswith(("max_", "min_"))
            and value is not None
            and not (isinstance(value, (int, float)) and not isinstance(value, bool))
        ):
            raise PolicyError(f"Policy {source!r}: {name}.{key} must be a number or null, got {value!r}.")
    if name == "membership":
        attacks = opts["attacks"]
        if isinstance(attacks, str):
            attacks = opts["attacks"] = [attacks]
        bad = [a for a in attacks if a not in REPORT_ATTACKS]
        if bad or not attacks:
            hint = (
                " ('shadow' needs a shadow-training function: call audits.membership.run_attack)"
                if ("shadow" in bad)
                else ""
            )
            raise PolicyError(
                f"Policy {source!r}: membership.attacks has unknown or unsupported attack(s) {bad}"
                f"{hint}; valid: {', '.join(REPORT_ATTACKS)}."
            )
    if name == "lmdp_mmd" and not 0 < float(opts["alpha"]) < 1:
        raise PolicyError(f"Policy {source!r}: lmdp_mmd.alpha must be in (0, 1), got {opts['alpha']!r}.")
    if name == "utility" and opts["min_roc"] is not None:  # shorthand for metric: roc_auc + min_score
        if opts["min_score"] is not None or opts["metric"] not in (None, "roc_auc"):
            raise PolicyError(
                f"Policy {source!r}: utility.min_roc is short for metric: roc_auc with min_score; "
                "give one or the other."
            )
        opts["metric"], opts["min_score"] = "roc_auc", opts["min_roc"]
    return opts


def _validate_settings(policy: dict[str, Any], source: str) -> None:
    for key in ("seed", "max_candidates"):
        value = policy[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PolicyError(f"Policy {source!r}: {key} must be a non-negative integer, got {value!r}.")
    if policy["max_candidates"] < 2:
        raise PolicyError(f"Policy {source!r}: max_candidates must be >= 2, got {policy['max_candidates']}.")
