"""The checks of an audit report, by name: each runs audit building blocks on the inputs and returns its
numbers (JSON-safe), its figures, and one verdict per policy threshold, decided on a confidence interval of its
statistic (:mod:`audits.verdicts`).

Candidates (shared by the privacy checks): ``members`` are up to ``max_candidates`` REAL rows, ``non_members``
as many HOLDOUT rows; the rest of HOLDOUT is the ``reference`` set (S_base of Diesendruck 2019 Ch. 4), disjoint
from the candidates. The disclosure checks compare the synthetic set with the reference set at equal size
(both subsampled to the smaller), so that the baseline sees the same density of records. With fewer than
:data:`audits.verdicts.MIN_CANDIDATES` candidates per side (HOLDOUT under 50 rows) the privacy checks do not run
and their thresholds are inconclusive: their rates could not be estimated.

A check that does not apply to the inputs (the KSD tests of :mod:`audits.lmdp_checks` without an energy model) is
skipped with ``applies=False``: it sets no verdict, so it neither passes nor makes the policy inconclusive.

Intervals: DeLong's for attack AUCs; Clopper–Pearson for the Monte Carlo error of the α-LMDP permutation and
bootstrap p-values (the analytic χ²₁ p-value is exact); bootstraps (:mod:`audits.resampling`) for disclosure risks, utility scores and fidelity distances.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from audits import leaks
from audits.check_figures import (
    attribute_figure,
    copies_figure,
    presence_figure,
    roc_figure,
    vulnerable_figure,
)
from audits.disclosure import attribute_disclosure, presence_disclosure
from audits.distances import TabularEncoder
from audits.fidelity import plot_marginals, tabular_fidelity
from audits.inputs import AuditInputs
from audits.linkage import MatchWeights
from audits.lmdp import mmd_permutation_test, robust_standardise
from audits.lmdp_checks import ksd_section, not_applicable
from audits.membership import run_attack
from audits.resampling import attribute_interval, fidelity_interval, presence_interval, utility_interval
from audits.utility import METRICS, json_safe, plot_utility, tstr
from audits.verdicts import CONFIDENCE, MIN_CANDIDATES, Verdict, decide, permutation_p_interval, undecided

log = logging.getLogger(__name__)

Tick = Callable[[], None]
ROC_POINTS = 200  # ROC curves are stored with at most this many points
MAX_MARGINALS = 32  # marginal histograms of at most this many columns (the first ones)
PRESENCE_RISK = "sensitivity at the confident r* (precision above target with confidence) above the baseline"


@dataclass
class CheckResult:
    """A check's numbers, figures (name -> Figure) and verdicts; ``skipped`` says why it did not run, and
    ``applies`` whether its thresholds are then inconclusive (True) or not set at all (False: the check does not
    apply to these inputs)."""

    result: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    skipped: str | None = None
    applies: bool = True


@dataclass(frozen=True)
class Context:
    """What every check needs besides its options: the seed, the verdicts' confidence and whether its
    thresholds gate the policy (False: a utility expectation)."""

    seed: int
    confidence: float = CONFIDENCE
    gates: bool = True

    def decide(
        self,
        check: str,
        criterion: str,
        description: str,
        value: Any,
        interval: Any,
        limit: Any,
        *,
        at_most: bool,
        method: str = "",
        not_estimable: str = "",
        pass_limit: Any = None,
    ) -> list[Verdict]:
        """``[Verdict]`` for a set threshold, ``[]`` when ``limit`` is None (the option only reports);
        ``pass_limit`` is the leak a pass rules out (None: ``limit``, see :func:`audits.verdicts.decide`)."""
        if limit is None:
            return []
        value = None if value is None else float(value)
        return [
            decide(
                check,
                criterion,
                description,
                value,
                interval,
                float(limit),
                at_most=at_most,
                confidence=self.confidence,
                method=method,
                not_estimable=not_estimable,
                gates=self.gates,
                pass_limit=None if pass_limit is None else float(pass_limit),
            )
        ]


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

    def too_few(self) -> str | None:
        """Why the privacy checks cannot decide with these candidates, or None."""
        n = min(len(self.members), len(self.non_members))
        if n >= MIN_CANDIDATES:
            return None
        return (
            f"only {n} member and {len(self.non_members)} non-member candidates; the privacy checks need at least "
            f"{MIN_CANDIDATES} of each (HOLDOUT of at least {2 * MIN_CANDIDATES} rows, half of them non-member "
            "candidates, and REAL of at least as many) to estimate their rates"
        )


def _sample(frame: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    if len(frame) <= n:
        return frame
    return frame.iloc[np.sort(np.random.default_rng(seed).choice(len(frame), n, replace=False))].reset_index(
        drop=True
    )


# ----------------------------------------------------------------------------------------- membership
def membership(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
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
        res = run_attack(name, **arrays, seed=ctx.seed, n_bootstrap=opts["n_bootstrap"])
        keep = np.unique(np.linspace(0, len(res.fpr) - 1, min(len(res.fpr), ROC_POINTS + 1)).astype(int))
        curves[name] = (res.fpr, res.tpr, res.auc)
        out["attacks"][name] = {**res.to_dict(), "roc": {"fpr": res.fpr[keep], "tpr": res.tpr[keep]}}
        verdicts += ctx.decide(
            "membership",
            "max_auc",
            f"{name} attack ROC-AUC",
            res.auc,
            res.auc_delong_ci,
            opts["max_auc"],
            at_most=True,
            method="DeLong normal interval",
            pass_limit=opts["rule_out_auc"],
        )
        tick()
    return CheckResult(json_safe(out), {"roc": roc_figure(curves)}, verdicts)


# ----------------------------------------------------------------------------------------- disclosure
def _sources(inputs: AuditInputs, cands: Candidates, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    n = min(len(inputs.synthetic), len(cands.reference))
    return _sample(inputs.synthetic, n, seed), _sample(cands.reference, n, seed + 1)


def presence(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """Presence disclosure sweep with the held-out baseline (``audits.disclosure``)."""
    syn, base = _sources(inputs, cands, ctx.seed)
    distances: dict[str, Any] = {}
    res = presence_disclosure(
        syn,
        cands.members,
        cands.non_members,
        baseline=base,
        precision_target=opts["precision_target"],
        confidence=ctx.confidence,
        distances=distances,
    )
    res["n_source_rows"] = len(syn)
    ci = presence_interval(
        distances,
        precision_target=opts["precision_target"],
        n_bootstrap=opts["n_bootstrap"],
        seed=ctx.seed,
        confidence=ctx.confidence,
    )
    res["risk_interval"] = {
        "confident_sensitivity": ci["interval"],
        "confidence": ctx.confidence,
        "method": ci["method"],
    }
    tick()
    verdicts = ctx.decide(
        "presence_disclosure",
        "max_risk_above_baseline",
        PRESENCE_RISK,
        res["risk_above_baseline"]["confident_sensitivity"],
        ci["interval"],
        opts["max_risk_above_baseline"],
        at_most=True,
        method=ci["method"],
        pass_limit=opts["rule_out_risk_above_baseline"],
    )
    return CheckResult(json_safe(res), {"sweep": presence_figure(res)}, verdicts)


def attribute(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """Attribute disclosure by kNN imputation of the unknown columns, with the held-out baseline."""
    columns = list(inputs.real.columns)
    if len(columns) < 2:
        tick()
        return CheckResult(skipped="the data have one column: nothing is left to impute from a known one")
    known = opts["known_columns"] or columns[: math.ceil(len(columns) / 2)]
    if bad := [c for c in known if c not in columns]:
        raise ValueError(
            f"attribute_disclosure.known_columns {bad} are not columns of the data; columns: {columns}."
        )
    if set(known) >= set(columns):
        raise ValueError(
            "attribute_disclosure.known_columns names every column; leave at least one unknown to impute."
        )
    syn, base = _sources(inputs, cands, ctx.seed)
    per_member: dict[str, Any] = {}
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
        per_member=per_member,
    )
    res["n_source_rows"] = len(syn)
    ci = attribute_interval(
        per_member, n_bootstrap=opts["n_bootstrap"], seed=ctx.seed, confidence=ctx.confidence
    )
    res["risk_interval"] = {
        "sensitivity": ci["interval"],
        "confidence": ctx.confidence,
        "method": ci["method"],
    }
    tick()
    verdicts = ctx.decide(
        "attribute_disclosure",
        "max_risk_above_baseline",
        "imputation sensitivity above the held-out baseline",
        res["risk_above_baseline"]["sensitivity"],
        ci["interval"],
        opts["max_risk_above_baseline"],
        at_most=True,
        method=ci["method"],
        pass_limit=opts["rule_out_risk_above_baseline"],
    )
    return CheckResult(json_safe(res), {"per_column": attribute_figure(res)}, verdicts)


# ----------------------------------------------------------------------------------------- leaks
COPIES_EXACT = "share of synthetic rows that are exact copies of a REAL row, minus that of HOLDOUT rows"
COPIES_NEAR = (
    "share of synthetic rows linked to a REAL row above the HOLDOUT-calibrated match weight τ, minus that of "
    "HOLDOUT rows"
)
COPIES_CLOSER = (
    "share of synthetic rows whose best REAL match beats their best HOLDOUT match by a likelihood ratio above "
    "e^margin, minus the share where HOLDOUT's beats REAL's by as much (REAL in chunks of HOLDOUT's size)"
)
SINGLED_OUT = (
    "share of the most unusual REAL rows singled out by a synthetic row (equal in all but a few columns, and matched "
    "better than by any other real row), minus that of the most unusual HOLDOUT rows"
)
SINGLING_OUT = (
    "share of predicates that pick out one synthetic row and pick out one REAL row (Anonymeter's singling out), minus "
    "the share that pick out one HOLDOUT row (both sets of the same size)"
)
LINKED = "share of member candidates linked through the synthetic rows (Anonymeter), minus that of non-members"
NEWCOMBE = "Newcombe hybrid score interval of a difference of proportions"


def _weights(inputs: AuditInputs, opts: dict[str, Any]) -> MatchWeights:
    return MatchWeights(bins=opts["bins"]).fit(inputs.real, inputs.numeric)


def copies(inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick) -> CheckResult:
    """Exact and near copies of REAL rows among ALL synthetic rows, HOLDOUT as control (:func:`audits.leaks.copies`)."""
    both = pd.concat([inputs.real, inputs.holdout], ignore_index=True)  # symmetric in REAL and HOLDOUT
    res = leaks.copies(
        inputs.synthetic,
        inputs.real,
        inputs.holdout,
        weights=MatchWeights(bins=opts["bins"]).fit(both, inputs.numeric),
        null_rate=opts["null_rate"],
        margin=opts["margin"],
        seed=ctx.seed,
        confidence=ctx.confidence,
    )
    tick()
    w = res.pop("weights")
    verdicts = ctx.decide(
        "copies",
        "max_exact_excess",
        COPIES_EXACT,
        res["exact"]["value"],
        res["exact"]["interval"],
        opts["max_exact_excess"],
        at_most=True,
        method=NEWCOMBE,
        pass_limit=opts["rule_out_exact_excess"],
    )
    verdicts += ctx.decide(
        "copies",
        "max_near_excess",
        COPIES_NEAR,
        res["near"]["value"],
        res["near"]["interval"],
        opts["max_near_excess"],
        at_most=True,
        method=NEWCOMBE,
        pass_limit=opts["rule_out_near_excess"],
    )
    verdicts += ctx.decide(
        "copies",
        "max_closer_excess",
        COPIES_CLOSER,
        res["closer"]["value"],
        res["closer"]["interval"],
        opts["max_closer_excess"],
        at_most=True,
        method="normal interval of a mean of per-row signs, one pseudo-row of each sign added",
        pass_limit=opts["rule_out_closer_excess"],
    )
    res["match_weight"] = (
        "Fellegi–Sunter match weight (audits.linkage): agreement on a value scores log(0.9/u), u its share of REAL "
        f"and HOLDOUT rows together; numbers agree within one of {opts['bins']} quantile bins of REAL and HOLDOUT"
    )
    res["n_synthetic_rows"] = len(inputs.synthetic)
    fig = copies_figure(w["synthetic"], w["holdout"], res["near"]["tau"])
    return CheckResult(json_safe(res), {"copies": fig}, verdicts)


def vulnerable_records(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """The most unusual REAL rows, always examined, against the most unusual HOLDOUT rows
    (:func:`audits.leaks.vulnerable`)."""
    res = leaks.vulnerable(
        inputs.synthetic,
        inputs.real,
        inputs.holdout,
        weights=_weights(inputs, opts),
        k=opts["k"],
        max_differences=opts["max_differences"],
        confidence=ctx.confidence,
    )
    tick()
    verdicts = ctx.decide(
        "vulnerable_records",
        "max_singled_out_excess",
        SINGLED_OUT,
        res["singled_out"]["value"],
        res["singled_out"]["interval"],
        opts["max_singled_out_excess"],
        at_most=True,
        method=NEWCOMBE,
        pass_limit=opts["rule_out_singled_out_excess"],
    )
    res["rule"] = (
        "the k rows of highest self-information Σ_j −log u_j(x_j) (u_j: share of REAL rows agreeing with the value "
        "in column j): rare values and rare combinations of them; singled out: the best synthetic match differs in at "
        f"most {opts['max_differences']} columns and beats every other real row"
    )
    fig = vulnerable_figure(res)
    return CheckResult(json_safe(res), {"vulnerable": fig}, verdicts)


def singling_out(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """Anonymeter's multivariate singling out, HOLDOUT (of REAL's size) as control (:func:`audits.leaks.singling_out`)."""
    res = leaks.singling_out(
        inputs.synthetic,
        inputs.real,
        inputs.holdout,
        numeric=inputs.numeric,
        n_attacks=opts["n_attacks"],
        n_cols=opts["n_cols"],
        seed=ctx.seed,
        confidence=ctx.confidence,
    )
    tick()
    verdicts = ctx.decide(
        "singling_out",
        "max_risk_excess",
        SINGLING_OUT,
        res["singled_out"]["value"],
        res["singled_out"]["interval"],
        opts["max_risk_excess"],
        at_most=True,
        method=NEWCOMBE,
        pass_limit=opts["rule_out_risk_excess"],
    )
    return CheckResult(json_safe(res), {}, verdicts)


def linkability(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """Anonymeter's linkability on the member candidates, non-member candidates as control
    (:func:`audits.leaks.linkability`)."""
    columns = list(inputs.real.columns)
    if opts["aux_columns"]:
        aux = tuple(opts["aux_columns"])
        bad = [c for part in aux for c in part if c not in columns]
        if bad:
            raise ValueError(f"linkability.aux_columns {bad} are not columns of the data; columns: {columns}.")
    else:
        aux = (columns[0::2], columns[1::2])
    res = leaks.linkability(
        inputs.synthetic,
        cands.members,
        cands.non_members,
        weights=_weights(inputs, opts),
        aux=aux,
        seed=ctx.seed,
        confidence=ctx.confidence,
    )
    tick()
    verdicts = ctx.decide(
        "linkability",
        "max_linked_excess",
        LINKED,
        res["linked"]["value"],
        res["linked"]["interval"],
        opts["max_linked_excess"],
        at_most=True,
        method=NEWCOMBE,
        pass_limit=opts["rule_out_linked_excess"],
    )
    return CheckResult(json_safe(res), {}, verdicts)


# ----------------------------------------------------------------------------------------- α-LMDP
def lmdp_mmd(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """MMD permutation test of the real sensitive columns x′ against the synthetic ones (PPEM §3.6 (d)).

    Passing means the test *detects* a difference: α-LMDP ("Privacy-Preserving Energy-Based Generative Models
    for Marginal Distribution Protection", Def. 2.2) holds when real x′ can be told from the model's x′. The
    columns are the policy's, else an energy model's sensitive columns, else every numeric column.
    """
    if opts["columns"]:
        columns, source = opts["columns"], "the policy (lmdp_mmd.columns)"
    elif inputs.sensitive is not None:
        columns, source = inputs.sensitive.columns, "the model's sensitive columns"
    else:
        columns, source = inputs.numeric, "every numeric column (no sensitive columns named)"
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
    if min(len(real), len(syn)) < 2:
        tick()
        return CheckResult(skipped="fewer than 2 rows without a missing value in the sensitive columns")
    bounds = [inputs.bounds.get(c) for c in columns]
    real_z, syn_z = robust_standardise(real, syn, bounds)
    test = mmd_permutation_test(
        real_z,
        syn_z,
        alpha=opts["alpha"],
        n_permutations=opts["n_permutations"],
        seed=ctx.seed,
        max_samples=opts["max_samples"],
    )
    tick()
    p_ci = permutation_p_interval(test.details["n_exceed"], opts["n_permutations"], ctx.confidence)
    res = {
        **test.to_dict(),
        "columns": list(columns),
        "columns_from": source,
        "alpha_lmdp_holds": test.reject,
        "p_value_interval": list(p_ci),
        "standardisation": (
            "Columns clipped to their public bounds ("
            + (", ".join(c for c, b in zip(columns, bounds) if b is not None) or "none known")
            + ") or else to REAL's 0.5% and 99.5% quantiles, then centred on REAL's median and scaled by its "
            "IQR/1.349; rows with a missing value dropped"
        ),
    }
    verdicts = ctx.decide(
        "lmdp_mmd",
        "alpha",
        "α-LMDP: p-value of the MMD test of real x′ against synthetic (passes if ≤ α)",
        test.p_value,
        p_ci,
        opts["alpha"],
        at_most=True,
        method=f"Clopper–Pearson interval of the permutation p-value ({opts['n_permutations']} permutations)",
    )
    return CheckResult(json_safe(res), {}, verdicts)


def lmdp_ksd(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """KSD goodness-of-fit tests of REAL's x′ against an energy model's score (:mod:`audits.lmdp_checks`).

    One verdict per test: passes when its p-value is ≤ α (the test rejects "real x′ ~ the model's x′", so
    α-LMDP holds), decided on the Clopper–Pearson interval of a bootstrap p-value, or on the exact analytic
    p-value (a degenerate interval) for ``linear`` and ``linear_z``. Does not apply (no verdict) without an
    energy-model checkpoint.
    """
    if reason := not_applicable(inputs):
        for _ in opts["statistics"]:
            tick()
        return CheckResult(skipped=reason, applies=False)
    res = ksd_section(
        inputs,
        statistics=opts["statistics"],
        alpha=opts["alpha"],
        n_bootstrap=opts["n_bootstrap"],
        max_samples=opts["max_samples"],
        seed=ctx.seed,
        confidence=ctx.confidence,
    )
    for _ in opts["statistics"]:
        tick()
    if isinstance(res, str):
        return CheckResult(skipped=res)
    verdicts = []
    for test in res["tests"].values():
        verdicts += ctx.decide(
            "lmdp_ksd",
            "alpha",
            f"α-LMDP: p-value of the KSD {test['test']} test ({test['null']}) of real x′ against the model's "
            "score (passes if ≤ α)",
            test["p_value"],
            test["p_value_interval"],
            opts["alpha"],
            at_most=True,
            method=test["interval_method"],
        )
    return CheckResult(json_safe(res), {}, verdicts)


# ----------------------------------------------------------------------------------------- utility
def utility(
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
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
        seed=ctx.seed,
    )
    task = res.summary["task"]
    metric = opts["metric"] or ("roc_auc" if task == "binary" else res.summary["primary_metric"])
    if metric not in METRICS[task]:
        raise ValueError(
            f"utility.metric {metric!r} does not apply to a {task} label; valid: {list(METRICS[task])}."
        )
    value = res.summary["average"].get(metric)
    real_value = res.summary.get("real_average", {}).get(metric)
    gap = None if value is None or real_value is None else real_value - value
    ci = utility_interval(
        res.predictions,
        task=task,
        metric=metric,
        pos_label=res.summary["pos_label"],
        n_bootstrap=opts["n_bootstrap"],
        seed=ctx.seed,
        confidence=ctx.confidence,
    )
    tick()
    out = {
        **res.to_dict(),
        "metric": metric,
        "value": value,
        "real_value": real_value,
        "gap_to_real": gap,
        "intervals": {
            "value": ci["score"],
            "gap_to_real": ci["gap"],
            "confidence": ctx.confidence,
            "method": ci["method"],
        },
    }
    verdicts = ctx.decide(
        "utility",
        "min_score",
        f"mean {metric} of classifiers trained on synthetic",
        value,
        ci["score"],
        opts["min_score"],
        at_most=False,
        method=ci["method"],
    )
    verdicts += ctx.decide(
        "utility",
        "max_gap_to_real",
        f"{metric} of real-trained minus synthetic-trained",
        gap,
        ci["gap"],
        opts["max_gap_to_real"],
        at_most=True,
        method=ci["method"],
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
FIDELITY_THRESHOLDS = {
    "mean_tv": ("mean total variation of categorical columns", "these data have no categorical columns"),
    "mean_ks": ("mean KS statistic of numeric columns", "these data have no numeric columns"),
    "mean_w1": ("mean range-scaled Wasserstein-1 of numeric columns", "these data have no numeric columns"),
    "two_way_marginal": ("mean L1 error of 2-way marginals", "these data have fewer than 2 columns"),
    "range_query_error": ("mean absolute error of range queries", "no range query could be drawn"),
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
    inputs: AuditInputs, cands: Candidates, opts: dict[str, Any], ctx: Context, tick: Tick
) -> CheckResult:
    """Tabular fidelity of synthetic vs REAL, and of HOLDOUT vs REAL as the sampling-noise floor."""
    kwargs = {"categorical": inputs.categorical, "seed": ctx.seed, "n_range_queries": opts["n_range_queries"]}
    res = tabular_fidelity(inputs.real, inputs.synthetic, **kwargs)
    floor = tabular_fidelity(inputs.real, inputs.holdout, **kwargs)
    res["summary"], res["holdout_reference"] = _summary(res), _summary(floor)
    keys = [k for k in FIDELITY_THRESHOLDS if opts[f"max_{k}"] is not None]
    ci = fidelity_interval(
        inputs.real,
        inputs.synthetic,
        categorical=inputs.categorical,
        keys=keys,
        n_bootstrap=opts["n_bootstrap"],
        seed=ctx.seed,
        n_range_queries=opts["n_range_queries"],
        confidence=ctx.confidence,
    )
    res["intervals"] = {**ci["intervals"], "confidence": ctx.confidence, "method": ci["method"]}
    tick()
    verdicts = []
    for key in keys:
        what, missing = FIDELITY_THRESHOLDS[key]
        verdicts += ctx.decide(
            "fidelity",
            f"max_{key}",
            what,
            res["summary"][key],
            ci["intervals"][key],
            opts[f"max_{key}"],
            at_most=True,
            method=ci["method"],
            not_estimable=f"{missing}; remove max_{key} from the policy",
        )
    columns = list(inputs.real.columns)[:MAX_MARGINALS]
    res["marginals_plotted"] = columns
    fig = plot_marginals(
        inputs.real, inputs.synthetic, columns, max_columns=len(columns), categorical=inputs.categorical
    )
    return CheckResult(json_safe(res), {"marginals": fig}, verdicts)


# ----------------------------------------------------------------------------------------- weights
def weights_psis(section: dict[str, Any], ctx: Context) -> list[Verdict]:
    """``weights_psis``: warns (``fail``, never gating) when the PSIS k̂ of the synthetic rows' importance weights
    (:func:`audits.weighted.weights_section`) is above 0.7: the weights are unreliable. k̂ is a diagnostic without
    an interval: the verdict is on its value."""
    k_hat, limit = section["diagnostics"]["psis_k"], section["psis_threshold"]
    unreliable = section["unreliable"]
    reason = section["message"] if unreliable else f"k̂ = {k_hat:.3g} is within the limit ≤ {limit:g}."
    status = "fail" if unreliable else "pass"
    return [
        Verdict(
            "weights_psis",
            "max_psis_k",
            "PSIS k̂ of the synthetic rows' importance weights",
            k_hat,
            "≤",
            limit,
            status,
            None,
            ctx.confidence,
            "point value (k̂ is a diagnostic; Vehtari et al.'s 0.7)",
            reason,
            False,
        )
    ]


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its function, title, kind (``privacy`` checks need enough candidates; ``utility``
    checks do not), its thresholds (policy option -> (what it bounds, True for an upper bound)) and how many
    progress steps it takes for given options."""

    run: Callable[[AuditInputs, Candidates, dict[str, Any], Context, Tick], CheckResult]
    title: str
    kind: str = "privacy"
    thresholds: dict[str, tuple[str, bool]] = field(default_factory=dict)
    steps: Callable[[dict[str, Any]], int] = lambda opts: 1

    def undecided(self, name: str, opts: dict[str, Any], reason: str, ctx: Context) -> list[Verdict]:
        """Inconclusive verdicts for every threshold the policy sets, when the check could not run."""
        return [
            undecided(
                name,
                key,
                what,
                opts[key],
                reason,
                at_most=at_most,
                confidence=ctx.confidence,
                gates=ctx.gates,
            )
            for key, (what, at_most) in self.thresholds.items()
            if opts.get(key) is not None
        ]


REGISTRY: dict[str, CheckSpec] = {
    "membership": CheckSpec(
        membership,
        "Membership inference",
        thresholds={"max_auc": ("every attack's ROC-AUC", True)},
        steps=lambda opts: len(opts["attacks"]),
    ),
    "presence_disclosure": CheckSpec(
        presence,
        "Presence disclosure",
        thresholds={"max_risk_above_baseline": (PRESENCE_RISK, True)},
    ),
    "attribute_disclosure": CheckSpec(
        attribute,
        "Attribute disclosure",
        thresholds={"max_risk_above_baseline": ("imputation sensitivity above the held-out baseline", True)},
    ),
    "copies": CheckSpec(
        copies,
        "Copies of training rows (exact and near, every synthetic row)",
        thresholds={
            "max_exact_excess": (COPIES_EXACT, True),
            "max_near_excess": (COPIES_NEAR, True),
            "max_closer_excess": (COPIES_CLOSER, True),
        },
    ),
    "vulnerable_records": CheckSpec(
        vulnerable_records,
        "The most vulnerable records (targeted)",
        thresholds={"max_singled_out_excess": (SINGLED_OUT, True)},
    ),
    "singling_out": CheckSpec(
        singling_out,
        "Singling out (Anonymeter's definition)",
        thresholds={"max_risk_excess": (SINGLING_OUT, True)},
    ),
    "linkability": CheckSpec(
        linkability,
        "Linkability (Anonymeter's definition)",
        thresholds={"max_linked_excess": (LINKED, True)},
    ),
    "lmdp_mmd": CheckSpec(
        lmdp_mmd,
        "α-LMDP (MMD two-sample test)",
        kind="lmdp",
        thresholds={"alpha": ("α-LMDP: p-value of the MMD test of real x′ against synthetic", True)},
    ),
    "lmdp_ksd": CheckSpec(
        lmdp_ksd,
        "α-LMDP (KSD goodness-of-fit tests of an energy model)",
        kind="lmdp",
        thresholds={
            "alpha": ("α-LMDP: p-values of the KSD tests of real x′ against the model's score", True)
        },
        steps=lambda opts: len(opts["statistics"]),
    ),
    "utility": CheckSpec(
        utility,
        "Utility (train on synthetic, test on real)",
        kind="utility",
        thresholds={
            "min_score": ("mean score of classifiers trained on synthetic", False),
            "max_gap_to_real": ("real-trained minus synthetic-trained score", True),
        },
    ),
    "fidelity": CheckSpec(
        fidelity,
        "Fidelity",
        kind="utility",
        thresholds={f"max_{k}": (what, True) for k, (what, _) in FIDELITY_THRESHOLDS.items()},
    ),
}
