"""Audit policies: which checks ``python -m audits`` runs, with which options and thresholds.

The format is documented in :mod:`audits.report`; the shipped default is ``audits/policies/default.yaml``.
A policy has two sections of checks: ``checks``, whose thresholds decide the policy's status, and
``expectations``, whose thresholds are reported with the same pass / fail / inconclusive statuses but never
change it (utility expectations: a DP run can be private and still not useful). This module only loads and
validates a policy (unknown keys, checks, options, attacks, metrics or classifiers are errors that name the valid
ones; values out of range are errors that say the range) and fills in the defaults; the checks themselves are in
:mod:`audits.checks`, the decision rule in :mod:`audits.verdicts`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lightning_dp.errors import UserError

# Every check, with each option's default. Options named ``max_*`` / ``min_*`` are thresholds: a check
# gates the policy on those that are set (not null); a check with none set is informational. ``rule_out_X``
# (with ``max_X``) is the leak a pass rules out: FAIL when the whole interval is above ``max_X``, PASS when it is
# within ``rule_out_X``, INCONCLUSIVE between (null: ``max_X`` itself, the plain interval rule).
# The α-LMDP checks (``lmdp_*``) never gate: they are a property of the sensitive columns, reported apart.
CHECKS: dict[str, dict[str, Any]] = {
    "membership": {
        "attacks": ["dcr", "dcr_ratio", "domias"],
        "n_bootstrap": 200,
        "max_auc": None,
        "rule_out_auc": None,
    },
    "presence_disclosure": {
        "precision_target": 0.55,
        "n_bootstrap": 500,
        "max_risk_above_baseline": None,
        "rule_out_risk_above_baseline": None,
    },
    "attribute_disclosure": {
        "known_columns": None,
        "k": 5,
        "tolerance": 0.05,
        "tolerance_mode": "relative",
        "n_bootstrap": 200,
        "max_risk_above_baseline": None,
        "rule_out_risk_above_baseline": None,
    },
    "copies": {
        "bins": 500,
        "null_rate": 0.01,
        "max_exact_excess": None,
        "rule_out_exact_excess": None,
        "max_near_excess": None,
        "rule_out_near_excess": None,
        "margin": 8.0,
        "max_closer_excess": None,
        "rule_out_closer_excess": None,
    },
    "vulnerable_records": {
        "k": 100,
        "max_differences": 2,
        "bins": 500,
        "max_singled_out_excess": None,
        "rule_out_singled_out_excess": None,
    },
    "singling_out": {
        "n_attacks": 500,
        "n_cols": 3,
        "max_risk_excess": None,
        "rule_out_risk_excess": None,
    },
    "linkability": {
        "aux_columns": None,
        "bins": 500,
        "max_linked_excess": None,
        "rule_out_linked_excess": None,
    },
    "lmdp_mmd": {
        "columns": None,
        "alpha": 0.05,
        "n_permutations": 200,
        "max_samples": 1000,
    },
    "lmdp_ksd": {
        "statistics": ["u", "v", "linear"],
        "alpha": 0.05,
        "n_bootstrap": 500,
        "max_samples": 1000,
    },
    "utility": {
        "label": None,
        "classifiers": ["logistic_regression", "gaussian_nb", "decision_tree"],
        "metric": None,
        "n_bootstrap": 200,
        "min_score": None,
        "min_roc": None,
        "max_gap_to_real": None,
    },
    "fidelity": {
        "n_range_queries": 500,
        "n_bootstrap": 200,
        "max_mean_tv": None,
        "max_mean_ks": None,
        "max_mean_w1": None,
        "max_two_way_marginal": None,
        "max_range_query_error": None,
    },
}
# Settings shared by all checks (top-level keys of a policy besides ``checks`` and ``expectations``).
SETTINGS: dict[str, Any] = {"seed": 0, "max_candidates": 1000, "confidence": 0.95}
SECTIONS = ("checks", "expectations")
# Attacks the report can run from data alone (``shadow`` needs a function that trains shadow generators).
REPORT_ATTACKS = ("dcr", "dcr_ratio", "domias")
# The names of audits.utility (METRICS, CLASSIFIERS, REGRESSORS, PRESETS), here so that a policy is checked
# without importing scikit-learn; tests/audits/test_report.py keeps them equal.
METRIC_NAMES = (
    "accuracy",
    "f1_macro",
    "f1_weighted",
    "mse",
    "prc",
    "prc_hard",
    "r2",
    "roc_auc",
    "roc_auc_hard",
)
LOWER_IS_BETTER = ("mse",)
MODEL_NAMES = (
    "adaboost",
    "bagging",
    "bernoulli_nb",
    "decision_tree",
    "gaussian_nb",
    "gbm",
    "lda",
    "linear_regression",
    "linear_svm",
    "linear_svr",
    "logistic_regression",
    "mlp",
    "random_forest",
    "ridge",
    "svc",
    "xgboost",
)
PRESET_NAMES = ("bias_mitigation", "default", "dp_merf", "pearl")
KSD_STATISTICS = ("u", "v", "linear", "linear_z")  # = audits.lmdp.KSD_STATISTICS (not imported: torch, scipy)
MIN_CANDIDATES = 25  # = audits.verdicts.MIN_CANDIDATES (not imported: that would load scipy)
MIN_BOOTSTRAP = 100


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
        if path.is_dir():
            raise PolicyError(
                f"Policy {str(path)!r} is a folder, not a file. Pass --policy PATH to a YAML policy."
            )
        if not path.is_file():
            raise PolicyError(
                f"Policy file {str(path)!r} does not exist. Pass --policy PATH to a YAML policy, or "
                "leave it out for the default policy."
            )
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
            raise PolicyError(f"Policy file {str(path)!r} is not valid YAML: {err}") from err
        source = str(path)
    else:
        raw, source = copy.deepcopy(dict(policy)), "inline"
    if not isinstance(raw, Mapping) or "checks" not in raw:
        raise PolicyError(
            f"Policy {source!r} must be a mapping with a 'checks' entry, e.g. "
            "'checks: {membership: {max_auc: 0.6}}'. Valid checks: " + ", ".join(CHECKS) + "."
        )
    unknown = sorted(str(k) for k in set(raw) - {*SECTIONS, *SETTINGS})
    if unknown:
        raise PolicyError(
            f"Policy {source!r}: unknown top-level key(s) {unknown}; valid: {', '.join((*SECTIONS, *SETTINGS))}."
        )
    sections = {}
    for section in SECTIONS:
        checks = raw.get(section) if section in raw else {}
        if isinstance(checks, list):  # a bare list of names: every check with its defaults
            checks = {name: None for name in checks}
        if not isinstance(checks, Mapping) or (section == "checks" and not checks):
            raise PolicyError(
                f"Policy {source!r}: '{section}' must be a{' non-empty' if section == 'checks' else ''} mapping "
                f"(or list) of checks; valid checks: {', '.join(CHECKS)}."
            )
        bad = [str(name) for name in checks if name not in CHECKS]
        if bad:
            raise PolicyError(
                f"Policy {source!r}: unknown check(s) {bad}; valid checks: {', '.join(CHECKS)}."
            )
        sections[section] = checks
    both = [name for name in sections["checks"] if name in sections["expectations"]]
    if both:
        raise PolicyError(
            f"Policy {source!r}: {both} listed both under 'checks' and 'expectations'; a check is either part of "
            "the verdict (checks) or a reported expectation (expectations)."
        )
    out: dict[str, Any] = {"source": source, **{k: raw.get(k, v) for k, v in SETTINGS.items()}}
    for section in SECTIONS:
        out[section] = {}
        for name in CHECKS:  # a fixed order: the report reads the same whatever the policy's order
            if name in sections[section]:
                out[section][name] = _check_options(name, sections[section][name] or {}, source)
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
        if key.startswith(("max_", "min_", "rule_out_")) and value is not None and not _is_number(value):
            raise PolicyError(
                f"Policy {source!r}: {name}.{key} must be a finite number or null, got {value!r}."
            )
    if name == "membership":
        attacks = opts["attacks"]
        if isinstance(attacks, str):
            attacks = opts["attacks"] = [attacks]
        if not isinstance(attacks, list):
            attacks = [attacks]
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
    if name in ("lmdp_mmd", "lmdp_ksd") and not (_is_number(opts["alpha"]) and 0 < float(opts["alpha"]) < 1):
        raise PolicyError(f"Policy {source!r}: {name}.alpha must be in (0, 1), got {opts['alpha']!r}.")
    if name == "lmdp_ksd" and isinstance(opts["statistics"], str):
        opts["statistics"] = [opts["statistics"]]
    if name == "utility" and opts["min_roc"] is not None:  # shorthand for metric: roc_auc + min_score
        if opts["min_score"] is not None or opts["metric"] not in (None, "roc_auc"):
            raise PolicyError(
                f"Policy {source!r}: utility.min_roc is short for metric: roc_auc with min_score; "
                "give one or the other."
            )
        opts["metric"], opts["min_score"] = "roc_auc", opts["min_roc"]
    _check_values(name, opts, source)
    return opts


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _names(value: Any) -> bool:
    return value is None or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))


def _check_values(name: str, opts: dict[str, Any], source: str) -> None:
    """Ranges and names of a check's options (a bad value fails here, before any data are read)."""
    where = f"Policy {source!r}: {name}"
    ranges = {
        "max_auc": (0.0, 1.0, "an AUC"),
        "rule_out_auc": (0.0, 1.0, "an AUC"),
        "max_risk_above_baseline": (-1.0, 1.0, "a difference of rates"),
        "rule_out_risk_above_baseline": (-1.0, 1.0, "a difference of rates"),
    }
    for key, (low, high, what) in ranges.items():
        value = opts.get(key)
        if value is not None and not low <= float(value) <= high:
            raise PolicyError(f"{where}.{key} must be in [{low:g}, {high:g}] ({what}), got {value!r}.")
    for key in [k for k in opts if k.startswith("rule_out_")]:
        limit, value = opts.get("max_" + key[len("rule_out_") :]), opts[key]
        if value is not None and (limit is None or float(value) < float(limit)):
            raise PolicyError(
                f"{where}.{key} must come with max_{key[len('rule_out_'):]} and be at least as large (it is the leak "
                f"a pass rules out; max_ the one a fail confirms), got {value!r} with max_ {limit!r}."
            )
    for key in (
        "max_exact_excess", "max_near_excess", "max_singled_out_excess", "max_linked_excess", "max_risk_excess",
        "max_closer_excess",
    ):
        value = opts.get(key)
        if value is not None and not -1.0 <= float(value) <= 1.0:
            raise PolicyError(f"{where}.{key} must be in [-1, 1] (a difference of rates), got {value!r}.")
    if "bins" in opts and not _is_int(opts["bins"], 2):
        raise PolicyError(f"{where}.bins must be an integer >= 2, got {opts['bins']!r}.")
    if name == "copies" and not (_is_number(opts["null_rate"]) and 0 < opts["null_rate"] < 0.5):
        raise PolicyError(f"{where}.null_rate must be in (0, 0.5), e.g. 0.01, got {opts['null_rate']!r}.")
    if name == "copies" and not (_is_number(opts["margin"]) and opts["margin"] > 0):
        raise PolicyError(f"{where}.margin must be a log-likelihood ratio > 0, e.g. 3, got {opts['margin']!r}.")
    if name == "vulnerable_records" and not _is_int(opts["k"], 10):
        raise PolicyError(f"{where}.k must be an integer >= 10, got {opts['k']!r}.")
    if name == "vulnerable_records" and not _is_int(opts["max_differences"], 0):
        raise PolicyError(f"{where}.max_differences must be an integer >= 0, got {opts['max_differences']!r}.")
    if name == "singling_out" and not (_is_int(opts["n_attacks"], 50) and _is_int(opts["n_cols"], 1)):
        raise PolicyError(
            f"{where}.n_attacks must be an integer >= 50 and n_cols >= 1 (e.g. 500 and 3), got "
            f"{opts['n_attacks']!r} and {opts['n_cols']!r}."
        )
    if name == "linkability" and opts["aux_columns"] is not None:
        aux = opts["aux_columns"]
        if not (isinstance(aux, list) and len(aux) == 2 and all(_names(a) and a for a in aux)):
            raise PolicyError(
                f"{where}.aux_columns must be two non-empty lists of column names (the attacker's two sets of "
                f"auxiliary information), or null to alternate the columns, got {aux!r}."
            )
    if "n_bootstrap" in opts and not _is_int(opts["n_bootstrap"], MIN_BOOTSTRAP):
        raise PolicyError(
            f"{where}.n_bootstrap must be an integer >= {MIN_BOOTSTRAP} (fewer draws cannot place a 95% "
            f"interval), got {opts['n_bootstrap']!r}."
        )
    if name == "presence_disclosure" and not (
        _is_number(opts["precision_target"]) and 0 < opts["precision_target"] < 1
    ):
        raise PolicyError(f"{where}.precision_target must be in (0, 1), got {opts['precision_target']!r}.")
    if name == "attribute_disclosure":
        if not _is_int(opts["k"], 1):
            raise PolicyError(f"{where}.k must be an integer >= 1, got {opts['k']!r}.")
        if not (_is_number(opts["tolerance"]) and opts["tolerance"] >= 0):
            raise PolicyError(f"{where}.tolerance must be a number >= 0, got {opts['tolerance']!r}.")
        if opts["tolerance_mode"] not in ("relative", "range"):
            raise PolicyError(
                f"{where}.tolerance_mode must be 'relative' or 'range', got {opts['tolerance_mode']!r}."
            )
        if not _names(opts["known_columns"]):
            raise PolicyError(f"{where}.known_columns must be a list of column names or null.")
    if name == "lmdp_mmd":
        if not _names(opts["columns"]):
            raise PolicyError(f"{where}.columns must be a list of column names or null.")
        if not (opts["max_samples"] is None or _is_int(opts["max_samples"], 2)):
            raise PolicyError(
                f"{where}.max_samples must be an integer >= 2 or null, got {opts['max_samples']!r}."
            )
        if not _is_int(opts["n_permutations"], 1):
            raise PolicyError(
                f"{where}.n_permutations must be an integer >= 1, got {opts['n_permutations']!r}."
            )
    if name == "lmdp_ksd":
        stats = opts["statistics"]
        bad = [s for s in stats if s not in KSD_STATISTICS] if isinstance(stats, list) else [stats]
        if bad or not stats or len(set(stats)) < len(stats):
            raise PolicyError(
                f"{where}.statistics must be a non-empty list of distinct KSD tests, got {stats!r}; valid: "
                f"{', '.join(KSD_STATISTICS)}."
            )
        if not (opts["max_samples"] is None or _is_int(opts["max_samples"], 4)):
            raise PolicyError(
                f"{where}.max_samples must be an integer >= 4 or null, got {opts['max_samples']!r}."
            )
    if name == "utility":
        metric = opts["metric"]
        if metric is not None and metric not in METRIC_NAMES:
            raise PolicyError(
                f"{where}.metric {metric!r} is unknown; valid metrics: {', '.join(METRIC_NAMES)}."
            )
        if metric in LOWER_IS_BETTER and (
            opts["min_score"] is not None or opts["max_gap_to_real"] is not None
        ):
            raise PolicyError(
                f"{where}.metric {metric!r} is an error (lower is better), so min_score and max_gap_to_real "
                "cannot bound it; use r2 for a regression label."
            )
        models = opts["classifiers"]
        models = [models] if isinstance(models, str) else models
        valid = (*MODEL_NAMES, *PRESET_NAMES)
        bad = [m for m in models if m not in valid] if isinstance(models, list) else [models]
        if bad or not models:
            raise PolicyError(
                f"{where}.classifiers has unknown name(s) {bad}; valid: {', '.join(MODEL_NAMES)}, or a preset: "
                f"{', '.join(PRESET_NAMES)}."
            )
        if not (opts["label"] is None or isinstance(opts["label"], str)):
            raise PolicyError(f"{where}.label must be a column name or null, got {opts['label']!r}.")
    if name == "fidelity" and not _is_int(opts["n_range_queries"], 1):
        raise PolicyError(
            f"{where}.n_range_queries must be an integer >= 1, got {opts['n_range_queries']!r}."
        )


def _validate_settings(policy: dict[str, Any], source: str) -> None:
    for key in ("seed", "max_candidates"):
        value = policy[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
            raise PolicyError(f"Policy {source!r}: {key} must be an integer in [0, 2^32), got {value!r}.")
    if policy["max_candidates"] < MIN_CANDIDATES:
        raise PolicyError(
            f"Policy {source!r}: max_candidates must be >= {MIN_CANDIDATES} (with fewer the privacy checks cannot "
            f"decide), got {policy['max_candidates']}."
        )
    conf = policy["confidence"]
    if not (_is_number(conf) and 0.5 <= conf < 1):
        raise PolicyError(f"Policy {source!r}: confidence must be in [0.5, 1), e.g. 0.95, got {conf!r}.")
    every = {**policy["checks"], **policy["expectations"]}
    resampled = (
        ("lmdp_mmd", "n_permutations", "permutations"),
        ("lmdp_ksd", "n_bootstrap", "bootstrap draws"),
    )
    for name, key, what in resampled:
        opts = every.get(name)
        if opts is None or (name == "lmdp_ksd" and not set(opts["statistics"]) & {"u", "v"}):
            continue
        # the smallest Monte Carlo p-value (0 of n) must be decidable below α at this confidence
        need = math.ceil(math.log((1 - conf) / 2) / math.log(1 - opts["alpha"]) - 1e-9)
        if opts[key] < need:
            raise PolicyError(
                f"Policy {source!r}: {name}.{key} must be >= {need} for α = {opts['alpha']:g} at confidence "
                f"{conf:g} (with fewer, even a p-value of 0 {what} out of n cannot be shown to be below α), got "
                f"{opts[key]}."
            )
