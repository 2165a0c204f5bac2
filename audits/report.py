"""Audit reports: run the checks a policy asks for and write ``report.json`` and a self-contained ``report.html``.

Command line (``audits/__main__.py``)::

    python -m audits SYNTHETIC_OR_CHECKPOINT --real REAL --holdout HOLDOUT --out DIR \\
        [--policy policy.yaml] [--num-rows N] [--seed S] [--label COLUMN] [--data-root PATH]

* ``SYNTHETIC_OR_CHECKPOINT``: a synthetic ``.csv``/``.parquet`` in the user's columns, or a run's checkpoint
  (``N`` rows are sampled from it, default as many as REAL, at most 1,000,000; its ledger and config go into the
  report).
* ``REAL`` (the private training rows) and ``HOLDOUT`` (real rows never trained on): files, or a data set name
  such as ``adult``, loaded with the checkpoint's data config and released schema (the run's split; the schema
  is not released again). REAL and HOLDOUT holding the same rows is refused.
* Exit code: 0 the policy passed, 1 it failed, 4 it was inconclusive, 2 bad input (nothing written), 3 an
  unexpected error (nothing written).

Verdicts (:mod:`audits.verdicts`): every threshold is decided on a confidence interval of its statistic (95% by
default): ``pass`` when the whole interval is within the limit, ``fail`` when the whole interval is beyond it,
``inconclusive`` when it contains the limit or the statistic cannot be estimated (e.g. fewer than 25 candidates
per side). The policy's ``status`` is ``fail`` if any gating threshold fails, ``pass`` if all pass (and there is at
least one), ``inconclusive`` otherwise; thresholds under ``expectations`` are reported alike but never change it.

The report is private. It is computed from REAL and HOLDOUT (exact counts, hashes, statistics, attack scores
and distances on real rows), is not differentially private and is not covered by the run's (ε, δ); only the
synthetic data, the checkpoint and ``ledger.json`` are. An audit spends no privacy budget because its output
is not a DP release, not because it is post-processing. ``report.json`` opens with a ``privacy`` object
(:func:`privacy_label`) that says so and lists the sections computed from real rows; ``report.html`` opens
with the same statement. Handle both files like the private data: access-controlled, not published.

A run trained without DP (an energy model protecting only the marginal of its sensitive columns, α-LMDP) says so in
its ledger (``"dp_claim": false`` with the reasons in ``"no_dp_claim"``; a missing key means a DP run). Its report
says plainly, in the ``privacy`` object (``run_dp_claim: false``, ``no_dp_claim``, no ``dp_artefacts``), in
``guarantee`` and at the top of ``report.html``, that the run makes NO differential-privacy claim: its synthetic
data and checkpoint are not DP releases.

Importance weights: when the synthetic data have a ``weight`` column (the sampler writes one for bias mitigation;
REAL has none), it is taken out of the rows (never a feature) and ``report.json`` gets a ``weights`` section
(:func:`audits.weighted.weights_section`): TSTR on HOLDOUT with and without the weights (the utility check's
classifiers), weighted and unweighted MMD² and Wasserstein-1 to HOLDOUT, Kish's ESS and the PSIS k̂. A k̂ above 0.7
adds a warning and a non-gating ``weights_psis`` verdict (fail): the weights are unreliable.

``train.py ... audit=default`` runs the same audit at the end of training into the run's ``output_dir``
(:func:`audit_run`).

Policy format (YAML; the default is ``audits/policies/default.yaml``)::

    seed: 0                     # seed of candidate draws, attacks, tests, classifiers (--seed overrides)
    max_candidates: 1000        # member / non-member candidates per side (at least 25)
    confidence: 0.95            # two-sided confidence of every verdict's interval
    checks:                     # thresholds here decide the policy's status; unknown names are errors
      membership:               # attacks of audits.membership on the synthetic set
        attacks: [dcr, dcr_ratio, domias]
        n_bootstrap: 200        # bootstrap of the reported TPR intervals (the AUC verdict uses DeLong's)
        max_auc: 0.53           # FAIL when an attack's whole DeLong interval is above 0.53
        rule_out_auc: 0.65      # PASS when every attack's interval is within 0.65 (null: max_auc, the plain rule)
      copies:                   # audits.leaks.copies: every synthetic row against REAL, HOLDOUT as control
        bins: 500               # quantile bins of REAL's numbers for record linkage (audits.linkage)
        null_rate: 0.01         # τ: the match weight a HOLDOUT row exceeds with this probability
        max_exact_excess: 0.002         # exact copies: synthetic share minus HOLDOUT share
        rule_out_exact_excess: 0.05
        max_near_excess: 0.005          # rows linked above τ: synthetic share minus HOLDOUT share
        rule_out_near_excess: 0.1
        margin: 8.0             # paired test: a synthetic row is far closer to REAL than to HOLDOUT by > e^8
        max_closer_excess: 0.005        # share far closer to REAL minus share far closer to HOLDOUT
        rule_out_closer_excess: 0.05
      vulnerable_records:       # audits.leaks.vulnerable: the k most unusual REAL rows vs HOLDOUT's
        k: 100
        max_differences: 2      # a synthetic match equal in all but at most 2 columns singles a record out
        bins: 500
        max_singled_out_excess: 0.05
        rule_out_singled_out_excess: 0.25
      singling_out:             # audits.leaks.singling_out (Anonymeter's multivariate attack), HOLDOUT as control
        n_attacks: 500          # predicates that pick out one synthetic row
        n_cols: 3               # columns per predicate
        max_risk_excess: 0.05   # share picking out one REAL row minus one HOLDOUT row (sets of equal size)
        rule_out_risk_excess: 0.3
      linkability:              # audits.leaks.linkability (Anonymeter's definition), non-members as control
        aux_columns: null       # two lists of columns; null: alternate columns
        bins: 500
        max_linked_excess: 0.01
        rule_out_linked_excess: 0.1
      presence_disclosure:      # Diesendruck 2019 Ch. 4, r* = largest distance threshold with precision > target
        precision_target: 0.55
        n_bootstrap: 500
        max_risk_above_baseline: 0.05   # sensitivity at r* minus the held-out baseline's
        rule_out_risk_above_baseline: 0.15   # PASS when the interval is within it (also for attribute disclosure)
      attribute_disclosure:     # kNN imputation of the unknown columns from the synthetic set
        known_columns: null     # default: the first half of the columns
        k: 5
        tolerance: 0.05
        tolerance_mode: relative        # or range
        n_bootstrap: 200
        max_risk_above_baseline: 0.05   # sensitivity minus the held-out baseline's
      lmdp_mmd:                 # α-LMDP (PPEM Def. 2.2): passes when the test REJECTS "real x′ ~ synthetic x′"
        columns: null           # the sensitive columns x′; default: an energy model's, else every numeric column
        alpha: 0.05
        n_permutations: 200     # at least log((1 - confidence)/2) / log(1 - alpha) (72 at the defaults)
        max_samples: 1000
      lmdp_ksd:                 # α-LMDP of an energy model: KSD tests of REAL's x′ against its score −∇E(x′); one
                                # verdict per test, passing when it REJECTS; no verdict without an energy model
        statistics: [u, v, linear]      # also linear_z; u: multinomial bootstrap, v: wild bootstrap, linear: χ²₁
        alpha: 0.05
        n_bootstrap: 500        # draws of u and v; at least as many as lmdp_mmd's permutations need
        max_samples: 1000       # rows of REAL for u and v (quadratic); the linear tests use every row
    expectations:               # the same format; reported with a status, never change the policy's status
      utility:                  # TSTR on HOLDOUT (skipped when no label is known)
        label: null             # default: the schema's label or --label
        classifiers: [logistic_regression, gaussian_nb, decision_tree]   # or a preset: dp_merf, pearl
        metric: null            # default: roc_auc (binary), f1_weighted (multi-class), r2 (regression)
        n_bootstrap: 200
        min_score: null         # mean of the metric over the classifiers >= this
        min_roc: 0.6            # short for metric: roc_auc, min_score: 0.6
        max_gap_to_real: null   # real-trained minus synthetic-trained metric <= this
      fidelity:                 # audits.fidelity.tabular_fidelity vs REAL (HOLDOUT vs REAL as the floor)
        n_range_queries: 500
        n_bootstrap: 200
        max_mean_tv: 0.2        # also: max_mean_ks, max_mean_w1, max_two_way_marginal, max_range_query_error

Options named ``max_*``/``min_*`` (and ``lmdp_mmd.alpha``, ``lmdp_ksd.alpha``) are thresholds, each one verdict in
the report (``lmdp_ksd.alpha`` one per test); a threshold left null only reports its number. ``rule_out_X`` beside
``max_X`` separates the two limits of a leak detector (:func:`audits.verdicts.decide`). The α-LMDP checks never
decide the status, wherever they are listed: they are reported with the role ``property``. A check that is
skipped (no label, too few candidates) makes its thresholds inconclusive, except one that does not apply to the
inputs (``lmdp_ksd`` without an energy model), which sets none. Distance-based checks run chunked (bounded memory) in the building blocks. ``--out`` is
checked before any data are read, and both report files are written together after every check has run
(:mod:`audits.output`): on an error neither exists.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from audits.checks import REGISTRY, Candidates, CheckResult, Context
from audits.inputs import AuditInputs, frame_source, load_inputs, normalise, schema_bounds
from audits.output import check_output_folder, write_files
from audits.policy import load_policy
from audits.utility import json_safe
from audits.verdicts import overall_status
from lightning_dp.progress import tracker

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 3: verdicts with status, interval and reason; "status" of the policy; expectations
REPORT_FILES = ("report.json", "report.html")
FEW_CANDIDATES = 200  # below this many candidates per side the report warns that its intervals are wide
PRIVATE_INPUTS = ("REAL: the private training rows", "HOLDOUT: real rows not trained on")
DP_ARTEFACTS = ("synthetic data", "checkpoint", "ledger.json")
FROM_REAL_ROWS = {  # section of the report -> what in it is computed from real rows (a check's: if it ran)
    "inputs": "exact row counts and SHA-256 hashes of REAL and HOLDOUT",
    "candidates": "exact numbers of REAL and HOLDOUT rows drawn as attack candidates",
    "checks.membership": "membership-attack scores on REAL and HOLDOUT rows (ROC curves, AUCs, TPRs)",
    "checks.presence_disclosure": "distances from REAL and HOLDOUT rows to their nearest synthetic and HOLDOUT "
    "rows (the thresholds of the sweep), with the rates at each",
    "checks.attribute_disclosure": "per-column rates at which REAL rows' unknown values are imputed from "
    "synthetic and HOLDOUT rows",
    "checks.copies": "exact-copy counts and best record-linkage match weights of synthetic and HOLDOUT rows to REAL "
    "rows, the threshold τ from HOLDOUT's weights, and the counts above it",
    "checks.vulnerable_records": "the most unusual REAL and HOLDOUT rows' self-information and their best match "
    "weights to synthetic and to other real rows, and how many were singled out",
    "checks.singling_out": "how many of the predicates built from synthetic rows pick out exactly one REAL row and "
    "one HOLDOUT row",
    "checks.linkability": "how many REAL and HOLDOUT candidates were linked through the synthetic rows",
    "checks.lmdp_mmd": "MMD², p-value and bandwidth of a test of REAL against synthetic columns, clipped and "
    "scaled with REAL's quantiles",
    "checks.lmdp_ksd": "KSD statistics, p-values, bandwidths and row counts of goodness-of-fit tests of REAL's "
    "sensitive columns against the model's score",
    "checks.utility": "scores on HOLDOUT rows of classifiers trained on synthetic and on REAL rows",
    "checks.fidelity": "per-column TV, KS and Wasserstein-1, 2-way-marginal, range-query and MMD errors of "
    "synthetic and HOLDOUT against REAL, REAL's mean range-query answer, the median distance between REAL rows "
    "(report.html adds histograms of REAL's columns)",
    "weights": "scores on HOLDOUT rows of classifiers trained on synthetic rows with and without their importance "
    "weights, and MMD² and Wasserstein-1 distances of the weighted and unweighted synthetic rows to HOLDOUT",
    "verdicts": "the verdicts, their intervals and warnings derived from these numbers",
}
NO_DP_CLAIM = "This run makes NO differential-privacy claim (α-LMDP only)"
ACCOUNTANTS = {
    "rdp": "Rényi DP (Mironov 2017)",
    "prv": "privacy-loss random variables (the PRV accountant)",
}


def dp_claim(ledger: Mapping[str, Any] | None) -> tuple[bool | None, list[dict[str, str]]]:
    """Whether the run claims differential privacy, and why not.

    Returns:
        ``(claim, reasons)``: ``claim`` is the ledger's ``dp_claim`` (True when the key is missing), None without a
        ledger (the synthetic data came as a file); ``reasons`` the ledger's ``no_dp_claim`` entries
        (``{"name", "note"}``), empty for a DP run.
    """
    if not ledger:
        return None, []
    claim = ledger.get("dp_claim", True) is not False
    reasons = [] if claim else [dict(r) for r in ledger.get("no_dp_claim") or []]
    return claim, reasons


def no_dp_statement(reasons: list[dict[str, str]]) -> str:
    """The plain statement of a run without a DP claim: what is, and is not, protected, and the ledger's reasons."""
    text = "; ".join(f"{r.get('name', '')}: {r.get('note', '')}".strip(": ").rstrip(".") for r in reasons)
    return (
        f"{NO_DP_CLAIM}. "
        + (f"Its ledger says why: {text}. " if text else "")
        + "Its model was trained on the private rows without a differentially private mechanism, so its synthetic "
        "data and its checkpoint are NOT differentially private releases and no (ε, δ) covers them. α-LMDP protects "
        "the distribution of the sensitive columns, not individuals: handle the synthetic data and the checkpoint "
        "with the care due to the private data."
    )


def privacy_label(
    checks: Mapping[str, Mapping[str, Any]],
    ledger: Mapping[str, Any] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The ``privacy`` object that opens ``report.json``: what the report is, and is not, under DP.

    Args:
        checks: the report's ``checks`` (name -> result with ``status``); only checks that ran are listed.
        ledger: the run's ledger, if known: a run without a DP claim (:func:`dp_claim`) is said to make none.
        extra: other sections of the report computed from real rows (``weights``).

    Returns:
        ``contains_private_information`` (True), ``dp`` (False), a plain ``statement``, ``private_inputs``,
        ``from_real_rows`` (report section -> what in it comes from real rows), ``dp_artefacts`` (none for a run
        without a DP claim), ``run_dp_claim`` (True, False, or None without a ledger) and ``no_dp_claim`` (the
        ledger's reasons).
    """
    ran = [f"checks.{name}" for name, c in checks.items() if c["status"] == "ran"]
    sections = {
        key: FROM_REAL_ROWS.get(key, "the numbers of this check, computed on real rows")
        for key in ("inputs", "candidates", *ran, *extra, "verdicts")
    }
    claim, reasons = dp_claim(ledger)
    covered = (
        "Only the synthetic data, the checkpoint and ledger.json are covered by the run's (ε, δ)."
        if claim is not False
        else no_dp_statement(reasons)
    )
    statement = (
        "This report is computed from the real private rows, REAL (training) and HOLDOUT. It is NOT "
        "differentially private and is not covered by the run's (ε, δ). From real rows it holds: "
        + "; ".join(sections.values())
        + ". Handle it like the private data itself: access-controlled, not published. "
        + covered
    )
    return {
        "contains_private_information": True,
        "dp": False,
        "statement": statement,
        "private_inputs": list(PRIVATE_INPUTS),
        "from_real_rows": sections,
        "dp_artefacts": list(DP_ARTEFACTS) if claim is not False else [],
        "run_dp_claim": claim,
        "no_dp_claim": reasons,
    }


def guarantee(ledger: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the run's (ε, δ) guarantees, in plain words, and how its releases compose.

    Returns:
        ``{"epsilon", "delta", "dp_claim", "statement", "composition", "evidence"}`` (ε and δ None without a
        ledger, and for a run that makes no DP claim).
    """
    evidence = (
        "This audit is empirical evidence about one release, not a proof: passing checks do not show that the "
        "run is differentially private (that follows from the mechanisms and the ledger), and a failing check is "
        "a reason to investigate."
    )
    claim, reasons = dp_claim(ledger)
    if not ledger:
        return {
            "epsilon": None,
            "delta": None,
            "dp_claim": claim,
            "statement": "Unknown: the synthetic data came as a file, without the run's ledger, so no (ε, δ) is "
            "known for it.",
            "composition": "",
            "evidence": evidence,
        }
    n = len(ledger.get("releases", []))
    accountant = ACCOUNTANTS.get(ledger.get("accountant"), str(ledger.get("accountant")))
    if not claim:
        spent = ledger.get("epsilon")
        listed = (
            f"The ledger lists {n} release(s) (ε = {float(spent):.4g} in {accountant}); that ε covers those "
            "releases alone, not the model trained after them."
            if n and spent is not None
            else ""
        )
        return {
            "epsilon": None,
            "delta": None,
            "dp_claim": False,
            "statement": "None under differential privacy. " + no_dp_statement(reasons),
            "composition": listed,
            "evidence": evidence,
        }
    eps, delta = float(ledger["epsilon"]), float(ledger["delta"])
    return {
        "epsilon": eps,
        "delta": delta,
        "dp_claim": True,
        "statement": f"For any one person, whether their row was in the training data changes the probability of "
        f"any output of this run (the synthetic data, the checkpoint) by at most a factor e^ε = {math.exp(eps):.3g} "
        f"(ε = {eps:.4g}), except with probability δ = {delta:.3g}.",
        "composition": f"The run's {n} releases compose in {accountant}, so the total ε = {eps:.4g} is less than the "
        "sum of the per-release ε (each of which is its ε alone, as if it were the only release).",
        "evidence": evidence,
    }


def _ordered(policy: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """``(name, options, gates)`` of every check of the policy, in the registry's order. The α-LMDP checks never
    gate, wherever the policy lists them: they test a property of the sensitive columns' marginal (PPEM Def. 2.2),
    not a leak of training rows (they pass when real and synthetic differ), so they are reported apart."""
    out = []
    for name in REGISTRY:
        if name in policy["checks"]:
            out.append((name, policy["checks"][name], REGISTRY[name].kind != "lmdp"))
        elif name in policy.get("expectations", {}):
            out.append((name, policy["expectations"][name], False))
    return out


def build_report(
    inputs: AuditInputs, policy: dict[str, Any], *, seed: int | None = None, progress: bool | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, Figure]]]:
    """Run the policy's checks on ``inputs``.

    Args:
        inputs: the three frames and their sources.
        policy: a policy from :func:`audits.policy.load_policy`.
        seed: overrides the policy's seed.
        progress: show a progress bar (None: only on a terminal).

    Returns:
        ``(report, figures)``: the JSON-safe report, its first key the :func:`privacy_label` (the report is
        private and not DP), and, per check, its matplotlib figures.
    """
    from tqdm.auto import tqdm

    from lightning_dp.checkpoint import versions

    start = time.time()
    seed = policy["seed"] if seed is None else seed
    confidence = policy.get("confidence", 0.95)
    cands = Candidates.draw(inputs, max_candidates=policy["max_candidates"], seed=seed)
    too_few = cands.too_few()
    ordered = _ordered(policy)
    total = sum(REGISTRY[name].steps(opts) for name, opts, _ in ordered)
    checks: dict[str, Any] = {}
    figures: dict[str, dict[str, Figure]] = {}
    verdicts = []
    bar = tqdm(total=total, desc="audit", unit="step", disable=None if progress is None else not progress)
    done = [0]  # steps done (a disabled bar does not count)
    with bar, tracker.session():  # lines off a terminal, at each check and every 30 s (lightning_dp.progress)
        for name, opts, gates in ordered:
            spec, ctx = REGISTRY[name], Context(seed=seed, confidence=confidence, gates=gates)
            bar.set_postfix_str(name)
            tracker.stage(f"audit: {name}", total=total, unit="audit steps", done=done[0])
            t0 = time.time()

            def tick(n: int = 1) -> None:
                bar.update(n)
                done[0] += n
                tracker.update(done[0])

            if spec.kind == "privacy" and too_few:
                res = CheckResult(skipped=too_few)
                tick(spec.steps(opts))
            else:
                res = spec.run(inputs, cands, opts, ctx, tick)
            if res.skipped:  # inconclusive thresholds, unless the check does not apply to these inputs
                why = f"The check did not run: {res.skipped}."
                res.verdicts = spec.undecided(name, opts, why, ctx) if res.applies else []
            status = {"status": "skipped", "reason": res.skipped} if res.skipped else {"status": "ran"}
            if res.skipped and not res.applies:
                status["applies"] = False
            checks[name] = {
                **status,
                "title": spec.title,
                "role": "verdict" if gates else "property" if spec.kind == "lmdp" else "expectation",
                "seconds": round(time.time() - t0, 2),
                **res.result,
            }
            figures[name] = res.figures
            verdicts += res.verdicts
            log.info("audit check %s done in %.1f s", name, time.time() - t0)
    weights = None
    warnings = list(inputs.warnings)
    if inputs.weights is not None:  # the synthetic file's weight column (audits.weighted)
        from audits.checks import weights_psis
        from audits.weighted import log_weight_figure, section_options, weights_section

        opts = section_options(policy)
        weights = weights_section(
            inputs.synthetic,
            inputs.weights,
            inputs.real,
            inputs.holdout,
            label=opts["label"] or inputs.label,
            categorical=inputs.categorical,
            classifiers=opts["classifiers"],
            metric=opts["metric"],
            seed=seed,
        )
        verdicts += weights_psis(weights, Context(seed=seed, confidence=confidence, gates=False))
        warnings += [weights["message"]] if weights["unreliable"] else []
        figures["weights"] = {
            "log_weights": log_weight_figure(inputs.weights, k_hat=weights["diagnostics"]["psis_k"])
        }
    status, reason = overall_status(verdicts)
    n = min(cands.sizes()["members"], cands.sizes()["non_members"])
    if too_few:
        warnings.append(f"The privacy checks did not run: {too_few}. Their thresholds are inconclusive.")
    elif n < FEW_CANDIDATES:
        warnings.append(
            f"Only {n} member and {n} non-member candidates: the intervals of the attack AUCs and disclosure rates "
            "are wide at this size, so only large effects can be decided (see each verdict's interval)."
        )
    report = {
        "privacy": privacy_label(checks, inputs.ledger, ("weights",) if weights else ()),
        "format_version": FORMAT_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - start, 2),
        "status": status,
        "status_reason": reason,
        "passed": status == "pass",  # format version 2's field: status == "pass"
        "confidence": confidence,
        "guarantee": guarantee(inputs.ledger),
        "verdicts": [v.to_dict() for v in verdicts],
        "summary": [],
        "warnings": warnings,
        "policy": policy,
        "seed": seed,
        "inputs": inputs.sources,
        "columns": {
            "all": list(inputs.real.columns),
            "numeric": inputs.numeric,
            "categorical": inputs.categorical,
            "label": inputs.label,
        },
        "candidates": cands.sizes(),
        "ledger": inputs.ledger,
        "config": inputs.config,
        "versions": versions(),
        "checks": checks,
        **({"weights": weights} if weights else {}),
    }
    report = json_safe(report)
    report["summary"] = summary_lines(report)
    return report, figures


def _interval(v: Mapping[str, Any]) -> str:
    if v["interval"] is None:
        return ""
    lo, hi = v["interval"]
    return f" ({v['confidence']:.0%} CI [{lo:.3g}, {hi:.3g}])"


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per check: its status (``PASS``/``FAIL``/``INCONCLUSIVE``, ``SKIP`` for a skipped check without
    thresholds or one that does not apply to the inputs, ``REPORT`` for one that only reports numbers), its name (``(expectation)`` for a utility
    expectation) and its thresholds' values, intervals and limits (or why they were not decided)."""
    lines = []
    for name, check in report["checks"].items():
        mine = [v for v in report["verdicts"] if v["check"] == name]
        role = {"expectation": " (expectation)", "property": " (property, not a leak test)"}.get(
            check.get("role"), ""
        )
        if not mine:
            tag = "SKIP" if check["status"] == "skipped" else "REPORT"
            why = check.get("reason") or "no threshold set; numbers only"
            lines.append(f"{tag} {name}{role}: {why}")
            continue
        statuses = {v["status"] for v in mine}
        tag = "FAIL" if "fail" in statuses else "INCONCLUSIVE" if "inconclusive" in statuses else "PASS"
        parts = []
        for v in mine:
            if v["value"] is None:
                parts.append(f"{v['description']}: {v['reason']}")
            else:
                mark = "" if len(mine) == 1 else f" [{v['status']}]"
                parts.append(
                    f"{v['description']} = {v['value']:.4g}{_interval(v)} {v['op']} {v['limit']:g}{mark}"
                )
        if check["status"] == "skipped":
            parts = [f"did not run: {check['reason']}"]
        lines.append(f"{tag} {name}{role}: " + "; ".join(parts))
    for v in report["verdicts"]:  # verdicts of a report section rather than a check (weights_psis)
        if v["check"] not in report["checks"]:
            value = "not a number" if v["value"] is None else f"{v['value']:.4g}"
            what = f"{v['description']} = {value} {v['op']} {v['limit']:g}"
            lines.append(f"{v['status'].upper()} {v['check']}: {what}")
    return lines


def write_report(
    report: dict[str, Any], figures: dict[str, dict[str, Figure]], out: str | Path
) -> dict[str, str]:
    """Render ``report.html`` and ``report.json`` and write both into ``out`` as one unit
    (:func:`audits.output.write_files`): a reader finds both files of one audit or neither. Both are private
    (see ``report["privacy"]``).

    Raises:
        OutputError: a file could not be written (nothing is left behind).
    """
    from audits.html import render_html

    html = render_html(report, figures)
    text = json.dumps(report, indent=1, allow_nan=False) + "\n"
    paths = write_files(out, {"report.html": html, "report.json": text})
    return {"html": paths["report.html"], "json": paths["report.json"]}


def run_audit(
    synthetic: str | Path,
    *,
    real: str,
    holdout: str,
    out: str | Path,
    policy: str | Path | Mapping[str, Any] | None = None,
    num_rows: int | None = None,
    seed: int | None = None,
    data_root: str | None = None,
    label: str | None = None,
    progress: bool | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Everything ``python -m audits`` does: load the policy, check ``out``, load the inputs, run the checks,
    write the report (private: computed from ``real`` and ``holdout``, not differentially private).

    Returns:
        ``(report, paths)``.

    Raises:
        PolicyError, InputError, OutputError, CheckpointError, ValueError: bad input (nothing is written).
    """
    pol = load_policy(policy)  # first: a bad policy fails before any data are read
    check_output_folder(out)  # then a bad --out, before any work
    seed = pol["seed"] if seed is None else seed
    with tracker.session():  # progress lines off a terminal from the first read to the last write
        tracker.stage("audit: read inputs (sample a checkpoint, load REAL and HOLDOUT)")
        inputs = load_inputs(
            synthetic, real=real, holdout=holdout, num_rows=num_rows, seed=seed, data_root=data_root, label=label
        )
        report, figures = build_report(inputs, pol, seed=seed, progress=progress)
        tracker.stage("audit: write report.json and report.html")
        return report, write_report(report, figures, out)


def audit_run(
    audit_cfg: Mapping[str, Any],
    *,
    datamodule: Any,
    result: dict[str, Any],
    ledger: Any,
    config: dict[str, Any],
) -> dict[str, Any] | None:
    """The audit at the end of training: the synthetic file just written against the data module's private
    training rows (REAL) and holdout, into the run's ``output_dir`` (``train.py`` calls it after ``train()``).

    Nothing is charged to ``ledger``: the report is not a DP release. It is private (computed from REAL and
    the holdout, not covered by the run's (ε, δ)) and labelled so; only the synthetic data, the checkpoint and
    ``ledger.json`` are covered (none of them when the run makes no DP claim). When the policy runs an α-LMDP
    check, the checkpoint just written is loaded for an energy model's score (:func:`sensitive_score_of`).

    Args:
        audit_cfg: the ``audit`` config group (``policy``: None for the default, a path, or an inline policy;
            ``seed``).
        datamodule: the run's prepared ``PrivateDataModule``.
        result: ``train()``'s result (``synthetic``, ``checkpoint``, ``output_dir``).
        ledger: the run's ``PrivacyLedger``.
        config: the resolved run config.

    Returns:
        ``{"report": path of report.html, "json": path of report.json, "status": "pass" | "fail" |
        "inconclusive", "reason": one sentence, "summary": one line per check ("PASS membership: ...")}``, or
        None for image data (not audited here).

    Raises:
        PolicyError, InputError: a bad policy or data; OutputError: the report could not be written.
    """
    from omegaconf import DictConfig, OmegaConf

    from audits.inputs import pop_weights, read_frame, sensitive_score_of, sha256_file
    from lightning_dp.checkpoint import load_run

    if datamodule.kind != "tabular" or not result.get("synthetic"):
        log.warning("audit=... audits tabular runs only; no report for %s data.", datamodule.kind)
        return None
    policy = audit_cfg.get("policy")
    if isinstance(policy, DictConfig):
        policy = OmegaConf.to_container(policy, resolve=True)
    pol = load_policy(policy)
    seed = audit_cfg.get("seed")
    schema = datamodule.encoder.schema
    lmdp = {"lmdp_ksd", "lmdp_mmd"} & {*pol["checks"], *pol["expectations"]}
    model_name = config.get("model", {}).get("name")
    # an energy model's score of its sensitive columns, for the α-LMDP checks: from the checkpoint just written
    sensitive = sensitive_score_of(load_run(result["checkpoint"]).model, model_name) if lmdp else None
    warnings: list[str] = []
    synthetic, weights = pop_weights(
        read_frame(result["synthetic"], "The synthetic data"), datamodule.train_frame.columns
    )
    frames, numeric = normalise(
        synthetic,
        datamodule.train_frame,
        datamodule.holdout,
        schema=schema,
        label=schema.label,
        kinds={"synthetic": "csv" if str(result["synthetic"]).endswith(".csv") else "parquet"},
        warnings=warnings,
    )
    sources = {
        "synthetic": {
            "path": result["synthetic"],
            "kind": "file",
            "rows": len(frames["synthetic"]),
            "columns": frames["synthetic"].shape[1],
            "sha256": sha256_file(result["synthetic"]),
            "sha256_of": "file bytes",
        },
        "real": frame_source(
            f"data set {datamodule.name!r} (private training rows)", datamodule.train_frame, kind="data set"
        ),
        "holdout": frame_source(
            f"data set {datamodule.name!r} (holdout)", datamodule.holdout, kind="data set"
        ),
        "checkpoint": {
            "path": result["checkpoint"],
            "model": model_name,
            "sha256": sha256_file(result["checkpoint"]),
            "sha256_of": "file bytes",
        },
    }
    inputs = AuditInputs(
        **frames,
        numeric=numeric,
        label=schema.label,
        sources=sources,
        ledger=ledger.to_dict(),
        config=config,
        bounds=schema_bounds(schema),
        warnings=warnings,
        sensitive=sensitive,
        weights=weights,
    )
    with tracker.session():
        report, figures = build_report(inputs, pol, seed=seed)
        tracker.stage("audit: write report.json and report.html")
        paths = write_report(report, figures, result["output_dir"])
    log.info(
        "Audit %s: %s (private: computed from real rows, not DP)", report["status"].upper(), paths["html"]
    )
    return {
        "report": paths["html"],
        "json": paths["json"],
        "status": report["status"],
        "reason": report["status_reason"],
        "summary": report["summary"],
    }
