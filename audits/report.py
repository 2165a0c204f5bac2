"""Audit reports: run the checks a policy asks for and write ``report.json`` and a self-contained ``report.html``.

Command line (``audits/__main__.py``)::

    python -m audits SYNTHETIC_OR_CHECKPOINT --real REAL --holdout HOLDOUT --out DIR \\
        [--policy policy.yaml] [--num-rows N] [--seed S] [--label COLUMN] [--data-root PATH]

* ``SYNTHETIC_OR_CHECKPOINT``: a synthetic ``.csv``/``.parquet`` in the user's columns, or a run's checkpoint
  (``N`` rows are sampled from it, default as many as REAL; its ledger and config go into the report).
* ``REAL`` (the private training rows) and ``HOLDOUT`` (real rows never trained on): files, or a data set name
  such as ``adult``, loaded with the checkpoint's data config and released schema (the run's split; the schema
  is not released again).
* Exit code: 0 the policy passed, 1 it failed, 2 bad input (nothing written), 3 an unexpected error.

The report is private. It is computed from REAL and HOLDOUT (exact counts, hashes, statistics, attack scores
and distances on real rows), is not differentially private and is not covered by the run's (ε, δ); only the
synthetic data, the checkpoint and ``ledger.json`` are. An audit spends no privacy budget because its output
is not a DP release, not because it is post-processing. ``report.json`` opens with a ``privacy`` object
(:func:`privacy_label`) that says so and lists the sections computed from real rows; ``report.html`` opens
with the same statement. Handle both files like the private data: access-controlled, not published.

``train.py ... audit=default`` runs the same audit at the end of training into the run's ``output_dir``.

Policy format (YAML; the default is ``audits/policies/default.yaml``)::

    seed: 0                     # seed of candidate draws, attacks, tests, classifiers (--seed overrides)
    max_candidates: 1000        # member / non-member candidates per side
    checks:                     # a mapping (or a list of names, for defaults); unknown names are errors
      membership:               # attacks of audits.membership on the synthetic set
        attacks: [dcr, dcr_ratio, domias]
        n_bootstrap: 200
        max_auc: 0.6            # every attack's ROC-AUC <= 0.6
      presence_disclosure:      # Diesendruck 2019 Ch. 4, ε* = largest ε with precision > precision_target
        precision_target: 0.55
        max_risk_above_baseline: 0.05   # sensitivity at ε* minus the held-out baseline's
      attribute_disclosure:     # kNN imputation of the unknown columns from the synthetic set
        known_columns: null     # default: the first half of the columns
        k: 5
        tolerance: 0.05
        tolerance_mode: relative        # or range
        max_risk_above_baseline: 0.05   # sensitivity minus the held-out baseline's
      lmdp_mmd:                 # α-LMDP (PPEM Def. 2.2): passes when the test REJECTS "real x′ ~ synthetic x′"
        columns: null           # the sensitive columns x′; default: every numeric column
        alpha: 0.05
        n_permutations: 200
        max_samples: 1000
      utility:                  # TSTR on HOLDOUT (skipped when no label is known)
        label: null             # default: the schema's label or --label
        classifiers: [logistic_regression, gaussian_nb, decision_tree]   # or a preset: dp_merf, pearl
        metric: null            # default: roc_auc (binary), f1_weighted (multi-class), r2 (regression)
        min_score: null         # mean of the metric over the classifiers >= this
        min_roc: 0.6            # short for metric: roc_auc, min_score: 0.6
        max_gap_to_real: null   # real-trained minus synthetic-trained metric <= this
      fidelity:                 # audits.fidelity.tabular_fidelity vs REAL (HOLDOUT vs REAL as the floor)
        n_range_queries: 500
        max_mean_tv: 0.2        # also: max_mean_ks, max_mean_w1, max_two_way_marginal, max_range_query_error

Options named ``max_*``/``min_*`` are thresholds, each one line of pass/fail in the report; a threshold left
null only reports its number, and a metric that does not apply (TV without categorical columns) passes. The
policy passes when every line passes. Distance-based checks run chunked (bounded memory) in the building
blocks. Both report files are written atomically, after every check has run: on an error neither exists.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from audits.checks import REGISTRY, Candidates, CheckResult
from audits.inputs import AuditInputs, frame_source, load_inputs, normalise
from audits.policy import load_policy
from audits.utility import json_safe

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: the "privacy" object first
REPORT_FILES = ("report.json", "report.html")
FEW_CANDIDATES = 200  # below this many candidates per side the report warns that its rates are noisy
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
    "checks.lmdp_mmd": "MMD², p-value and bandwidth of a test of REAL against synthetic columns, standardised "
    "with REAL's mean and std",
    "checks.utility": "scores on HOLDOUT rows of classifiers trained on synthetic and on REAL rows",
    "checks.fidelity": "per-column TV, KS and Wasserstein-1, 2-way-marginal, range-query and MMD errors of "
    "synthetic and HOLDOUT against REAL, REAL's mean range-query answer, the median distance between REAL rows "
    "(report.html adds histograms of REAL's columns)",
    "verdicts": "the pass/fail verdicts and warnings derived from these numbers",
}


def privacy_label(checks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``privacy`` object that opens ``report.json``: what the report is, and is not, under DP.

    Args:
        checks: the report's ``checks`` (name -> result with ``status``); only checks that ran are listed.

    Returns:
        ``contains_private_information`` (True), ``dp`` (False), a plain ``statement``, ``private_inputs``,
        ``from_real_rows`` (report section -> what in it comes from real rows) and ``dp_artefacts``.
    """
    ran = [f"checks.{name}" for name, c in checks.items() if c["status"] == "ran"]
    sections = {
        key: FROM_REAL_ROWS.get(key, "the numbers of this check, computed on real rows")
        for key in ("inputs", "candidates", *ran, "verdicts")
    }
    statement = (
        "This report is computed from the real private rows, REAL (training) and HOLDOUT. It is NOT "
        "differentially private and is not covered by the run's (ε, δ). From real rows it holds: "
        + "; ".join(sections.values())
        + ". Handle it like the private data itself: access-controlled, not published. Only the synthetic "
        "data, the checkpoint and ledger.json are covered by the run's (ε, δ)."
    )
    return {
        "contains_private_information": True,
        "dp": False,
        "statement": statement,
        "private_inputs": list(PRIVATE_INPUTS),
        "from_real_rows": sections,
        "dp_artefacts": list(DP_ARTEFACTS),
    }


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
    cands = Candidates.draw(inputs, max_candidates=policy["max_candidates"], seed=seed)
    total = sum(REGISTRY[name].steps(opts) for name, opts in policy["checks"].items())
    checks: dict[str, Any] = {}
    figures: dict[str, dict[str, Figure]] = {}
    verdicts = []
    with tqdm(
        total=total, desc="audit", unit="step", disable=None if progress is None else not progress
    ) as bar:
        for name, opts in policy["checks"].items():
            bar.set_postfix_str(name)
            t0 = time.time()
            res: CheckResult = REGISTRY[name].run(inputs, cands, opts, seed, lambda: bar.update(1))
            status = {"status": "skipped", "reason": res.skipped} if res.skipped else {"status": "ran"}
            checks[name] = {
                **status,
                "title": REGISTRY[name].title,
                "seconds": round(time.time() - t0, 2),
                **res.result,
            }
            figures[name] = res.figures
            verdicts += res.verdicts
            log.info("audit check %s done in %.1f s", name, time.time() - t0)
    n = min(cands.sizes()["members"], cands.sizes()["non_members"])
    warnings = (
        [
            f"Only {n} member and {n} non-member candidates: attack AUCs and disclosure rates are noisy at "
            "this size (see the AUC intervals), and the presence rule (largest ε with precision > 55%) can "
            "pick a large ε by chance."
        ]
        if n < FEW_CANDIDATES
        else []
    )
    report = {
        "privacy": privacy_label(checks),
        "format_version": FORMAT_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - start, 2),
        "passed": all(v.passed for v in verdicts),
        "verdicts": [v.to_dict() for v in verdicts],
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
    }
    return json_safe(report), figures


def write_report(
    report: dict[str, Any], figures: dict[str, dict[str, Figure]], out: str | Path
) -> dict[str, str]:
    """Render and write ``report.html`` and ``report.json`` into ``out``, each atomically.

    Both are rendered in memory first; the JSON is written last, and if it fails the new HTML is removed, so
    a reader finds both files of one audit or neither. Both files are private (see ``report["privacy"]``).
    """
    from audits.html import render_html
    from lightning_dp.io import atomic_write_text

    out = Path(out)
    html = render_html(report, figures)
    text = json.dumps(report, indent=1, allow_nan=False) + "\n"
    paths = {"html": str(out / "report.html"), "json": str(out / "report.json")}
    atomic_write_text(paths["html"], html)
    try:
        atomic_write_text(paths["json"], text)
    except BaseException:
        os.unlink(paths["html"])
        raise
    return paths


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
    """Everything ``python -m audits`` does: load the policy and inputs, run the checks, write the report
    (private: computed from ``real`` and ``holdout``, not differentially private).

    Returns:
        ``(report, paths)``.

    Raises:
        PolicyError, InputError, CheckpointError, ValueError: bad input (nothing is written).
    """
    pol = load_policy(policy)  # first: a bad policy fails before any data are read
    seed = pol["seed"] if seed is None else seed
    inputs = load_inputs(
        synthetic, real=real, holdout=holdout, num_rows=num_rows, seed=seed, data_root=data_root, label=label
    )
    report, figures = build_report(inputs, pol, seed=seed, progress=progress)
    return report, write_report(report, figures, out)


def audit_run(
    audit_cfg: Mapping[str, Any],
    *,
    datamodule: Any,
    result: dict[str, Any],
    ledger: Any,
    config: dict[str, Any],
) -> str | None:
    """The audit at the end of ``train()``: the synthetic file just written against the data module's private
    training rows (REAL) and holdout, into the run's ``output_dir``.

    Nothing is charged to ``ledger``: the report is not a DP release. It is private (computed from REAL and
    the holdout, not covered by the run's (ε, δ)) and labelled so; only the synthetic data, the checkpoint and
    ``ledger.json`` are covered.

    Args:
        audit_cfg: the ``audit`` config group (``policy``: None for the default, a path, or an inline policy;
            ``seed``).
        datamodule: the run's prepared ``PrivateDataModule``.
        result: ``train()``'s result (``synthetic``, ``checkpoint``, ``output_dir``).
        ledger: the run's ``PrivacyLedger``.
        config: the resolved run config.

    Returns:
        The path of ``report.html``, or None for image data (not audited here).
    """
    from omegaconf import DictConfig, OmegaConf

    from audits.inputs import read_frame, sha256_file

    if datamodule.kind != "tabular" or not result.get("synthetic"):
        log.warning("audit=... audits tabular runs only; no report for %s data.", datamodule.kind)
        return None
    policy = audit_cfg.get("policy")
    if isinstance(policy, DictConfig):
        policy = OmegaConf.to_container(policy, resolve=True)
    pol = load_policy(policy)
    seed = audit_cfg.get("seed")
    schema = datamodule.encoder.schema
    frames, numeric = normalise(
        read_frame(result["synthetic"], "The synthetic data"),
        datamodule.train_frame,
        datamodule.holdout,
        schema=schema,
        label=schema.label,
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
            "model": config.get("model", {}).get("name"),
            "sha256": sha256_file(result["checkpoint"]),
            "sha256_of": "file bytes",
        },
    }
    inputs = AuditInputs(
        **frames, numeric=numeric, label=schema.label, sources=sources, ledger=ledger.to_dict(), config=config
    )
    report, figures = build_report(inputs, pol, seed=seed)
    paths = write_report(report, figures, result["output_dir"])
    failed = [f"{v['check']} {v['criterion']}" for v in report["verdicts"] if not v["passed"]]
    verdict = "passed" if report["passed"] else f"FAILED ({', '.join(failed)})"
    log.info("Audit %s: %s (private: computed from real rows, not DP)", verdict, paths["html"])
    return paths["html"]
