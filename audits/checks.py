"""The checks of an audit report, by name: each runs audit building blocks on the inputs and returns its
numbers (JSON-safe), its figures, and one verdict per policy threshold.

Candidates (shared by the privacy checks): ``members`` are up to ``max_candidates`` REAL rows, ``non_members``
as many HOLDOUT rows; the rest of HOLDOUT is the ``reference`` set (S_base of Diesendruck 2019 Ch. 4), disjoint
from the candidates. The disclosure checks compare the synthetic set with the reference set at equal size
(both subsampled to the smaller), so that the baseline sees the same density of records.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from audits.disclosure import attribute_disclosure, presence_disclosure
from audits.distances import TabularEncoder
from audits.fidelity import plot_marginals, tabular_fidelity
from audits.inputs import AuditInputs
from audits.lmdp import mmd_permutation_test
from audits.membership import run_attack
from audits.utility import METRICS, json_safe, plot_utility, tstr

log = logging.getLogger(__name__)

Tick = Callable[[], None]
ROC_POINTS = 200  # ROC curves are stored with at most this many points
MAX_MARGINALS = 32  # marginal histograms of at most this many columns (the first ones)


@dataclass
class Verdict:
    """One policy threshold: ``value <op> limit``; ``value`` None means it could not be computed."""

    check: str
    criterion: str
    description: str
    value: float | None
    op: str
    limit: float
    passed: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


@dataclass
class CheckResult:
    """A check's numbers, figures (name -> Figure) and verdicts; ``skipped`` says why it did not run."""

    result: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    skipped: str | None = None


def compare(
    check: str,
    criterion: str,
    description: str,
    value: Any,
    limit: float | None,
    *,
    at_most: bool,
    missing_ok: bool = False,
) -> list[Verdict]:
    """``[Verdict]`` for a set threshold (``[]`` when ``limit`` is None). A value that is None or NaN fails,
    unless ``missing_ok`` (a metric that does not apply, e.g. TV without categorical columns)."""
    if limit is None:
        return []
    op = "≤" if at_most else "≥"
    if value is None or not math.isfinite(float(value)):
        note = "not applicable to these data" if missing_ok else "could not be computed"
        return [Verdict(check, criterion, description, None, op, float(limit), missing_ok, note)]
    value = float(value)
    passed = value <= limit if at_most else value >= limit
    return [Verdict(check, criterion, description, value, op, float(limit), passed)]


# ----------------------------------------------------------------------------------------- candidates
@dataclass
class Candidates:
    """Member and non-member candidates and the disjoint reference set."""

    members: pd.DataFrame
    non_members: pd.DataFrame
    reference: pd.DataFrame

    @classmethod
    def draw(cls, inputs: AuditInputs, *, max_candidates: int, seed: int) -> Candidates:
        """``n = min(max_candidates, |REAL|, |HOLDOUT| // 2)`` candidates per side, drawn with ``seed``."""
        rng = np.random.default_rng(seed)
        n = min(max_candidates, len(inputs.real), len(inputs.holdout) // 2)
        members = inputs.real.iloc[np.sort(rng.choice(len(inputs.real), n, replace=False))]
        order = rng.permutation(len(inputs.holdout))
        non_members, reference = (
            inputs.holdout.iloc[np.sort(order[:n])],
            inputs.holdout.iloc[np.sort(order[n:])],
        )
        return cls(*(f.reset_index(drop=True) for f in (members, non_members, reference)))

    def sizes(self) -> dict[str, int]:
        return {
            "members": len(self.members),
            "non_members": len(self.non_members),
            "reference": len(self.reference),
        }


def _sample(frame: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    if len(frame) <= n:
        return frame
    return frame.iloc[np.sort(np.random.default_rng(seed).choice(len(frame), n, replace=False))].reset_index(
        drop=True
    )


# ----------------------------------------------------------------------------------------- membership
def membership(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], seed: int, tick: Tick
) -> CheckResult:
    """Membership-inference attacks (``audits.membership``) on the encoded rows; one ROC figure."""
    enc = TabularEncoder(scaling="minmax").fit(pd.concat([cands.members, cands.non_members, cands.reference]))
    arrays = {
        "synthetic": enc.transform(inputs.synthetic),
        "members": enc.transform(cands.members),
        "non_members": enc.transform(cands.non_members),
        "reference": enc.transform(cands.reference),
    }
    out: dict[str, Any] = {
        "encoding": "min-max scaled numerics, one-hot categoricals (fitted on real rows)",
        "attacks": {},
    }
    verdicts, curves = [], {}
    for name in opts["attacks"]:
        res = run_attack(name, **arrays, seed=seed, n_bootstrap=opts["n_bootstrap"])
        keep = np.unique(np.linspace(0, len(res.fpr) - 1, min(len(res.fpr), ROC_POINTS + 1)).astype(int))
        curves[name] = (res.fpr, res.tpr, res.auc)
        out["attacks"][name] = {**res.to_dict(), "roc": {"fpr": res.fpr[keep], "tpr": res.tpr[keep]}}
        verdicts += compare(
            "membership", "max_auc", f"{name} attack ROC-AUC", res.auc, opts["max_auc"], at_most=True
        )
        tick()
    return CheckResult(json_safe(out), {"roc": _roc_figure(curves)}, verdicts)


def _roc_figure(curves: dict[str, tuple[np.ndarray, np.ndarray, float]]) -> Figure:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    lin, log_ax = fig.subplots(1, 2)
    for name, (fpr, tpr, auc) in curves.items():
        lin.plot(fpr, tpr, label=f"{name} (AUC {auc:.3f})")
        pos = fpr > 0
        log_ax.plot(fpr[pos], tpr[pos], label=name)
    lin.plot([0, 1], [0, 1], color="grey", linestyle=":", label="chance")
    lin.set(xlabel="false-positive rate", ylabel="true-positive rate", title="ROC of membership attacks")
    grid = np.logspace(-3, 0, 50)
    log_ax.plot(grid, grid, color="grey", linestyle=":")
    log_ax.set(
        xscale="log",
        yscale="log",
        xlim=(1e-3, 1),
        ylim=(1e-3, 1.05),
        xlabel="false-positive rate",
        title="low false-positive regime (log-log)",
    )
    lin.legend(fontsize="small", loc="lower right")
    return fig


# ----------------------------------------------------------------------------------------- disclosure
def _sources(inputs: AuditInputs, cands: Candidates, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    n = min(len(inputs.synthetic), len(cands.reference))
    return _sample(inputs.synthetic, n, seed), _sample(cands.reference, n, seed + 1)


def presence(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], seed: int, tick: Tick
) -> CheckResult:
    """Presence disclosure sweep with the held-out baseline (``audits.disclosure``)."""
    syn, base = _sources(inputs, cands, seed)
    res = presence_disclosure(
        syn, cands.members, cands.non_members, baseline=base, precision_target=opts["precision_target"]
    )
    res["n_source_rows"] = len(syn)
    tick()
    verdicts = compare(
        "presence_disclosure",
        "max_risk_above_baseline",
        "sensitivity at ε* above the held-out baseline",
        res["risk_above_baseline"]["sensitivity"],
        opts["max_risk_above_baseline"],
        at_most=True,
    )
    return CheckResult(json_safe(res), {"sweep": _presence_figure(res)}, verdicts)


def _presence_figure(res: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    prec_ax, sens_ax = fig.subplots(1, 2)
    for what, r, style in (("synthetic", res, "-"), ("held-out baseline", res["baseline"], "--")):
        t = np.asarray(r["thresholds"], dtype=float)
        prec_ax.plot(t, np.asarray(r["precision"], dtype=float), style, label=what)
        sens_ax.plot(t, np.asarray(r["sensitivity"], dtype=float), style, label=what)
        if r["epsilon_star"] is not None:
            sens_ax.axvline(r["epsilon_star"], linestyle=style, color="grey", linewidth=0.8)
    prec_ax.axhline(res["precision_target"], color="red", linestyle=":", label="precision target")
    prec_ax.set(
        xlabel="distance threshold ε",
        ylabel="precision",
        title="presence disclosure: precision",
        ylim=(0, 1.02),
    )
    sens_ax.set(
        xlabel="distance threshold ε (grey: ε*)",
        ylabel="sensitivity",
        title="presence disclosure: sensitivity",
        ylim=(0, 1.02),
    )
    prec_ax.legend(fontsize="small")
    return fig


def attribute(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], seed: int, tick: Tick
) -> CheckResult:
    """Attribute disclosure by kNN imputation of the unknown columns, with the held-out baseline."""
    columns = list(inputs.real.columns)
    known = opts["known_columns"] or columns[: math.ceil(len(columns) / 2)]
    syn, base = _sources(inputs, cands, seed)
    res = attribute_disclosure(
        syn,
        cands.members,
        known_columns=known,
        numeric_columns=inputs.numeric,
        non_members=cands.non_members,
        baseline=base,
        k=opts["k"],
        tolerance=opts["tolerance"],
        tolerance_mode=opts["tolerance_mode"],
    )
    res["n_source_rows"] = len(syn)
    tick()
    verdicts = compare(
        "attribute_disclosure",
        "max_risk_above_baseline",
        "imputation sensitivity above the held-out baseline",
        res["risk_above_baseline"]["sensitivity"],
        opts["max_risk_above_baseline"],
        at_most=True,
    )
    return CheckResult(json_safe(res), {"per_column": _attribute_figure(res)}, verdicts)


def _attribute_figure(res: dict[str, Any]) -> Figure:
    cols = res["unknown_columns"]
    fig = Figure(figsize=(8, 0.32 * len(cols) + 1.4), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(cols))
    for offset, (what, r) in zip((-0.2, 0.2), (("synthetic", res), ("held-out baseline", res["baseline"]))):
        ax.barh(y + offset, [r["per_column_sensitivity"][c] for c in cols], 0.4, label=what)
    ax.set_yticks(y, cols, fontsize="small")
    ax.invert_yaxis()
    ax.set(
        xlabel=f"share of members' values imputed within {res['tolerance']:.0%} (categories: exact)",
        title=f"attribute disclosure per unknown column (k = {res['k']})",
        xlim=(0, 1),
    )
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    return fig


# ----------------------------------------------------------------------------------------- α-LMDP
def lmdp_mmd(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], seed: int, tick: Tick
) -> CheckResult:
    """MMD permutation test of the real sensitive columns x′ against the synthetic ones (PPEM §3.6 (d))."""
    columns = opts["columns"] or inputs.numeric
    if not columns:
        tick()
        return CheckResult(skipped="no numeric columns: name the sensitive columns in lmdp_mmd.columns")
    bad = [c for c in columns if c not in inputs.numeric]
    if bad:
        raise ValueError(
            f"lmdp_mmd.columns {bad} are not numeric columns of the data; numeric columns: {inputs.numeric}."
        )
    real = inputs.real[columns].dropna().to_numpy(float)
    syn = inputs.synthetic[columns].dropna().to_numpy(float)
    mean, std = real.mean(0), real.std(0)
    std = np.where(std > 0, std, 1.0)
    test = mmd_permutation_test(
        (real - mean) / std,
        (syn - mean) / std,
        alpha=opts["alpha"],
        n_permutations=opts["n_permutations"],
        seed=seed,
        max_samples=opts["max_samples"],
    )
    tick()
    res = {
        **test.to_dict(),
        "columns": list(columns),
        "alpha_lmdp_holds": test.reject,
        "standardisation": "Columns z-scored with REAL's mean and std; rows with a missing value dropped",
    }
    verdict = Verdict(
        "lmdp_mmd",
        "alpha",
        "α-LMDP: MMD test tells real x′ from synthetic (p-value)",
        test.p_value,
        "≤",
        float(opts["alpha"]),
        bool(test.reject),
    )
    return CheckResult(json_safe(res), {}, [verdict])


# ----------------------------------------------------------------------------------------- utility
def utility(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], seed: int, tick: Tick
) -> CheckResult:
    """TSTR: classifiers fitted on synthetic rows, scored on HOLDOUT; the same fitted on REAL for reference."""
    label = opts["label"] or inputs.label
    if label is None:
        tick()
        return CheckResult(skipped="no label: name it in utility.label, pass --label, or use a checkpoint")
    if label not in inputs.real.columns:
        raise ValueError(f"utility.label {label!r} is not a column; columns: {list(inputs.real.columns)}.")
    categorical = [c for c in inputs.categorical if c != label]
    res = tstr(
        inputs.synthetic,
        inputs.holdout,
        label=label,
        real_train=inputs.real,
        classifiers=opts["classifiers"],
        categorical=categorical,
        seed=seed,
    )
    tick()
    task = res.summary["task"]
    metric = opts["metric"] or ("roc_auc" if task == "binary" else res.summary["primary_metric"])
    if metric not in METRICS[task]:
        raise ValueError(
            f"utility.metric {metric!r} does not apply to a {task} label; valid: {list(METRICS[task])}."
        )
    value = res.summary["average"].get(metric)
    real_value = res.summary.get("real_average", {}).get(metric)
    gap = None if value is None or real_value is None else real_value - value
    out = {**res.to_dict(), "metric": metric, "value": value, "real_value": real_value, "gap_to_real": gap}
    verdicts = compare(
        "utility",
        "min_score",
        f"mean {metric} of classifiers trained on synthetic",
        value,
        opts["min_score"],
        at_most=False,
    )
    verdicts += compare(
        "utility",
        "max_gap_to_real",
        f"{metric} of real-trained minus synthetic-trained",
        gap,
        opts["max_gap_to_real"],
        at_most=True,
    )
    return CheckResult(json_safe(out), {"bars": plot_utility(res, metric)}, verdicts)


# ----------------------------------------------------------------------------------------- fidelity
FIDELITY_SUMMARY = {
    "mean_tv": ("mean_tv",),
    "mean_ks": ("mean_ks",),
    "mean_w1": ("mean_w1",),
    "two_way_marginal": ("two_way_marginal", "mean"),
    "range_query_error": ("range_query", "mean_abs_error"),
    "mmd2": ("mmd", "mmd2"),
}


def _summary(res: dict[str, Any]) -> dict[str, float | None]:
    out = {}
    for name, path in FIDELITY_SUMMARY.items():
        value: Any = res
        for key in path:
            value = value[key]
        out[name] = value
    return out


def fidelity(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], seed: int, tick: Tick
) -> CheckResult:
    """Tabular fidelity of synthetic vs REAL, and of HOLDOUT vs REAL as the sampling-noise floor."""
    kwargs = {"categorical": inputs.categorical, "seed": seed, "n_range_queries": opts["n_range_queries"]}
    res = tabular_fidelity(inputs.real, inputs.synthetic, **kwargs)
    floor = tabular_fidelity(inputs.real, inputs.holdout, **kwargs)
    res["summary"], res["holdout_reference"] = _summary(res), _summary(floor)
    tick()
    verdicts = []
    for key, what in (
        ("mean_tv", "mean total variation of categorical columns"),
        ("mean_ks", "mean KS statistic of numeric columns"),
        ("mean_w1", "mean range-scaled Wasserstein-1 of numeric columns"),
        ("two_way_marginal", "mean L1 error of 2-way marginals"),
        ("range_query_error", "mean absolute error of range queries"),
    ):
        verdicts += compare(
            "fidelity",
            f"max_{key}",
            what,
            res["summary"][key],
            opts[f"max_{key}"],
            at_most=True,
            missing_ok=True,
        )
    columns = list(inputs.real.columns)[:MAX_MARGINALS]
    res["marginals_plotted"] = columns
    fig = plot_marginals(
        inputs.real, inputs.synthetic, columns, max_columns=len(columns), categorical=inputs.categorical
    )
    return CheckResult(json_safe(res), {"marginals": fig}, verdicts)


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its function and how many progress steps it takes for given options."""

    run: Callable[[AuditInputs, Candidates, dict[str, Any], int, Tick], CheckResult]
    title: str
    steps: Callable[[dict[str, Any]], int] = lambda opts: 1


REGISTRY: dict[str, CheckSpec] = {
    "membership": CheckSpec(membership, "Membership inference", lambda opts: len(opts["attacks"])),
    "presence_disclosure": CheckSpec(presence, "Presence disclosure"),
    "attribute_disclosure": CheckSpec(attribute, "Attribute disclosure"),
    "lmdp_mmd": CheckSpec(lmdp_mmd, "α-LMDP (MMD two-sample test)"),
    "utility": CheckSpec(utility, "Utility (train on synthetic, test on real)"),
    "fidelity": CheckSpec(fidelity, "Fidelity"),
}
