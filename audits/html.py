"""``report.html``: one self-contained page (inline CSS, figures as base64 PNGs, no external resource) rendered
from the JSON report and the checks' figures.

The page is as private as the JSON: it opens, before any number, with a banner carrying the report's
``privacy`` statement (computed from the real rows, not differentially private), and repeats a one-line
reminder above the histograms of real columns. A run that makes no differential-privacy claim (α-LMDP only, its
ledger's ``dp_claim`` false) gets a second banner right below: its synthetic data and checkpoint are not DP
releases. Next comes what the run's (ε, δ) guarantees, in one sentence,
and that the audit is empirical evidence, not a proof; then the policy's status and one line per threshold
(status, value, interval, limit, reason), the privacy verdict apart from the utility expectations.

Words: ε is only ever the privacy budget; the presence-disclosure distance threshold is r (the thesis' ε).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from matplotlib.figure import Figure

CSS = """
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1d232b;
       background: #f3f5f7; margin: 0; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 12px; padding-bottom: 6px; border-bottom: 1px solid #e1e5ea; }
h3 { font-size: 15px; margin: 18px 0 8px; }
section { background: #fff; border: 1px solid #dde2e8; border-radius: 8px; padding: 18px 22px; margin: 18px 0; }
.meta { color: #5a6572; font-size: 13px; }
.banner { display: flex; align-items: center; gap: 16px; margin: 14px 0 6px; }
.badge { display: inline-block; border-radius: 4px; padding: 1px 8px; font-weight: 600; font-size: 12px; }
.pass { background: #e3f4e8; color: #166c34; }
.fail { background: #fde7e7; color: #a11a1a; }
.skip { background: #eceff3; color: #4a5560; }
.inconclusive { background: #fff3d6; color: #7a5200; }
.guarantee { background: #eef4fb; border: 1px solid #c9dbef; border-radius: 8px; padding: 8px 16px; margin: 10px 0; }
.guarantee p { margin: 4px 0; }
.big { font-size: 20px; padding: 6px 16px; }
nav { margin: 10px 0 0; font-size: 13px; }
nav a { color: #2457a6; margin-right: 14px; text-decoration: none; white-space: nowrap; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; max-width: 100%; }
th, td { border-bottom: 1px solid #e6e9ee; padding: 5px 10px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.hash { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11px; word-break: break-all; }
.path { overflow-wrap: anywhere; }
.wide { overflow-x: auto; }
figure { margin: 12px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eef0f3; }
figcaption { color: #5a6572; font-size: 12px; }
details > summary { cursor: pointer; color: #2457a6; margin: 6px 0; }
pre { background: #f6f8fa; padding: 10px; border-radius: 6px; overflow-x: auto; font-size: 12px; }
p.note { color: #5a6572; margin: 4px 0 10px; }
p.warn { background: #fff6e0; border: 1px solid #f0d9a0; border-radius: 6px; padding: 6px 10px; margin: 8px 0; }
.private { background: #fde7e7; border: 2px solid #a11a1a; border-radius: 8px; padding: 10px 16px; margin: 12px 0; }
.private strong { color: #a11a1a; font-size: 16px; }
.private p { margin: 6px 0 0; }
p.private-note { color: #a11a1a; font-weight: 600; margin: 8px 0 4px; }
"""
PRIVATE_BANNER = "Contains private information — not differentially private"
NO_DP_BANNER = "No differential-privacy claim — α-LMDP only"
NO_DP_TEXT = (
    "This run makes NO differential-privacy claim: its synthetic data and its checkpoint are NOT differentially "
    "private releases, and no (ε, δ) covers them. α-LMDP protects the distribution of the sensitive columns, not "
    "individuals."
)


# ----------------------------------------------------------------------------------------- helpers
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any, digits: int = 4) -> str:
    """A number with ``digits`` significant digits; ``—`` for None/NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return esc(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, numeric: Sequence[int] = ()) -> str:
    """An HTML table; cells are escaped strings already (use :func:`fmt`/:func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


BADGES = {"skip": "SKIPPED", "pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE"}


def badge(status: str | bool | None, text: str | None = None, *, big: bool = False) -> str:
    """A coloured label: ``pass``, ``fail``, ``inconclusive`` or ``skip`` (None); True/False mean pass/fail."""
    cls = "skip" if status is None else {True: "pass", False: "fail"}.get(status, status)  # type: ignore[arg-type]
    text = text or BADGES[cls]
    return f'<span class="badge {cls}{" big" if big else ""}">{esc(text)}</span>'


def figure_html(fig: Figure, caption: str, *, dpi: int = 90) -> str:
    """A figure as an inline base64 PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (
        f'<figure><img alt="{esc(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


# ----------------------------------------------------------------------------------------- sections
def _ci(interval: Sequence[float] | None, digits: int = 3) -> str:
    return "—" if interval is None else f"[{fmt(interval[0], digits)}, {fmt(interval[1], digits)}]"


def _verdict_table(verdicts: list[dict[str, Any]]) -> str:
    rows = [
        (
            esc(v["check"]),
            esc(v["description"]),
            fmt(v["value"]),
            _ci(v["interval"]),
            f"{esc(v['op'])} {fmt(v['limit'])}",
            badge(v["status"]),
            esc(v["reason"]),
        )
        for v in verdicts
    ]
    conf = f"{verdicts[0]['confidence']:.0%} interval" if verdicts else "interval"
    return table(["check", "what", "value", conf, "limit", "result", "why"], rows, numeric=(2, 3, 4))


def _verdicts(report: dict[str, Any]) -> str:
    gating = [v for v in report["verdicts"] if v["gates"]]
    expected = [v for v in report["verdicts"] if not v["gates"]]
    rule = (
        f"Each threshold is decided on a {report['confidence']:.0%} confidence interval of its statistic: PASS "
        "when the whole interval is within the limit, FAIL when the whole interval is beyond it (a confident "
        "statement), INCONCLUSIVE when the interval contains the limit or the statistic cannot be estimated from "
        "these data. The policy passes when every threshold passes, fails when any fails, and is inconclusive "
        "otherwise."
    )
    body = (
        _verdict_table(gating)
        if gating
        else (
            '<p class="note">No threshold decided the policy: it sets none, or the checks that set them were '
            "skipped.</p>"
        )
    )
    extra = ""
    if expected:
        extra = (
            '<h3>Utility expectations</h3><p class="note">Reported with the same rule, but they do not change the '
            "privacy verdict above: a private run can still be of little use.</p>" + _verdict_table(expected)
        )
    skipped = [
        f"{esc(n)}: {esc(c['reason'])}" for n, c in report["checks"].items() if c["status"] == "skipped"
    ]
    extra += "".join(f'<p class="note">{badge(None)} {s}</p>' for s in skipped)
    return (
        f'<section id="verdicts"><h2>Policy</h2><p class="note">Policy: {esc(report["policy"]["source"])}. '
        f"{esc(rule)}</p>{body}{extra}</section>"
    )


def _guarantee(report: dict[str, Any]) -> str:
    """What the run's (ε, δ) guarantees, and that the audit is evidence, not proof."""
    g = report["guarantee"]
    return (
        '<div class="guarantee" id="guarantee"><p><b>What this run guarantees.</b> '
        f"{esc(g['statement'])}</p><p>{esc(g['evidence'])}</p></div>"
    )


def _inputs(report: dict[str, Any]) -> str:
    rows = [
        (
            esc(name),
            f'<span class="path">{esc(s.get("path", ""))}</span>',
            fmt(s.get("rows")),
            fmt(s.get("columns")),
            f'<span class="hash">{esc(s.get("sha256", ""))}</span>',
            esc(s.get("sha256_of", "")),
        )
        for name, s in report["inputs"].items()
    ]
    cols = report["columns"]
    cands = report["candidates"]
    return (
        '<section id="inputs"><h2>Inputs</h2>'
        + table(["input", "source", "rows", "columns", "SHA-256", "of"], rows, numeric=(2, 3))
        + f'<p class="note">Label: {esc(cols["label"] or "none")}. Numeric columns ({len(cols["numeric"])}): '
        f"{esc(', '.join(cols['numeric']) or 'none')}. Categorical ({len(cols['categorical'])}): "
        f"{esc(', '.join(cols['categorical']) or 'none')}.</p>"
        f'<p class="note">Candidates: {cands["members"]:,} members (REAL), {cands["non_members"]:,} non-members '
        f"(HOLDOUT), {cands['reference']:,} held-out reference rows (seed {report['seed']}).</p></section>"
    )


def _ledger(report: dict[str, Any]) -> str:
    led = report.get("ledger")
    if not led:
        return (
            '<section id="ledger"><h2>Privacy ledger</h2><p class="note">No ledger: the synthetic data came '
            "as a file, not from a checkpoint or a training run, so the privacy spent is unknown.</p></section>"
        )
    summary = table(
        ["target ε", "δ", "ε spent", "accountant", "adjacency", "δ of releases"],
        [
            (
                fmt(led["target_epsilon"]),
                fmt(led["delta"]),
                fmt(led["epsilon"]),
                esc(led["accountant"]),
                esc(led["adjacency"]),
                fmt(led.get("delta_of_releases")),
            )
        ],
        numeric=(0, 1, 2, 5),
    )
    rows = [
        (
            esc(r["name"]),
            esc(r["mechanism"]),
            fmt(r["sensitivity"]),
            fmt(r.get("noise_multiplier")),
            fmt(r.get("sample_rate")),
            fmt(r.get("count")),
            fmt(r.get("epsilon_alone")),
            fmt(r.get("epsilon_cumulative")),
            esc(r.get("note", "")),
        )
        for r in led["releases"]
    ]
    releases = table(
        [
            "release",
            "mechanism",
            "sensitivity",
            "noise multiplier",
            "sample rate",
            "count",
            "ε alone",
            "ε cumulative",
            "note",
        ],
        rows,
        numeric=(2, 3, 4, 5, 6, 7),
    )
    composition = report["guarantee"]["composition"]
    claim = (
        '<p class="warn">This run makes NO differential-privacy claim (α-LMDP only): the ε below covers only the '
        "releases listed, not the model trained on the private rows.</p>"
        if report["guarantee"].get("dp_claim") is False
        else ""
    )
    return (
        f'<section id="ledger"><h2>Privacy ledger</h2>{claim}{summary}<h3>Releases</h3>{releases}'
        f'<p class="note">{esc(composition)}</p></section>'
    )


def _membership(c: dict[str, Any]) -> str:
    rows, notes = [], set()
    for name, a in c["attacks"].items():
        tpr = a["tpr_at_fpr"]
        rows.append(
            (
                esc(name),
                fmt(a["auc"]),
                _ci(a.get("auc_delong_ci")),
                *("not estimable" if tpr.get(f) is None else fmt(tpr[f]) for f in ("0.001", "0.01")),
                fmt(a["n_members"]),
                fmt(a["n_non_members"]),
            )
        )
        if a.get("tpr_at_fpr_note"):
            notes.add(a["tpr_at_fpr_note"])
    note = "".join(f" TPR {esc(n)}." for n in sorted(notes))
    return (
        table(
            [
                "attack",
                "ROC-AUC",
                "95% CI (DeLong)",
                "TPR at 0.1% FPR",
                "TPR at 1% FPR",
                "members",
                "non-members",
            ],
            rows,
            numeric=(1, 2, 3, 4, 5, 6),
        )
        + f'<p class="note">Encoding: {esc(c["encoding"])}. AUC 0.5 is chance; below 0.5 the attack does worse '
        f"than chance.{note}</p>"
    )


def _presence(c: dict[str, Any]) -> str:
    rows = [
        (
            esc(what),
            fmt(r["confident_r_star"]),
            fmt(r["sensitivity_at_confident_r_star"]),
            fmt(r["r_star"]),
            fmt(r["sensitivity_at_r_star"]),
            fmt(r["precision_at_r_star"]),
        )
        for what, r in (("synthetic", c), ("held-out baseline", c["baseline"]))
    ]
    risk = c["risk_above_baseline"]
    interval = c.get("risk_interval") or {}
    target = fmt(c["precision_target"])
    header = [
        "source",
        "confident r*",
        "sensitivity there",
        "r* (thesis)",
        "sensitivity at r*",
        "precision at r*",
    ]
    return (
        table(header, rows, numeric=(1, 2, 3, 4, 5))
        + '<p class="note">A candidate is flagged as a training row when a source row lies within the distance '
        f"threshold r of it. The thesis reports r*, the largest r with precision &gt; {target}; with few "
        "candidates that point estimate crosses the target by chance, so the verdict uses the confident r*: the "
        f"largest r whose precision is above {target} with {fmt(c['confidence'])} confidence (none: sensitivity "
        f"0). Risk above baseline at the confident r*: {fmt(risk['confident_sensitivity'])} "
        f"({interval.get('confidence', 0.95):.0%} interval {_ci(interval.get('confident_sensitivity'))}); at the "
        f"thesis' r*: sensitivity {fmt(risk['sensitivity'])}, precision {fmt(risk['precision'])}. {NEGATIVE_RISK} "
        f"{fmt(c['n_members'])} members, {fmt(c['n_non_members'])} non-members, {fmt(c['n_source_rows'])} rows in "
        "each source.</p>"
    )


def _attribute(c: dict[str, Any]) -> str:
    rows = []
    for what, r in (("synthetic", c), ("held-out baseline", c["baseline"])):
        med = r.get("medgan") or {}
        rows.append(
            (
                esc(what),
                fmt(r["sensitivity"]),
                fmt(r["precision"]),
                fmt(med.get("sensitivity")),
                fmt(med.get("precision")),
            )
        )
    risk = c["risk_above_baseline"]
    return (
        table(
            ["source", "sensitivity", "precision", "medGAN sensitivity (0/1 columns)", "medGAN precision"],
            rows,
            numeric=(1, 2, 3, 4),
        )
        + f'<p class="note">Known columns: {esc(", ".join(c["known_columns"]))}. k = {c["k"]}, tolerance '
        f"{fmt(c['tolerance'])} ({esc(c['tolerance_mode'])}). Risk above baseline: sensitivity "
        f"{fmt(risk['sensitivity'])} (95% interval {_ci((c.get('risk_interval') or {}).get('sensitivity'))}), "
        f"precision {fmt(risk['precision'])}. {NEGATIVE_RISK}</p>"
    )


def _lmdp(c: dict[str, Any]) -> str:
    holds = c["alpha_lmdp_holds"]
    rows = [
        (
            fmt(c["statistic"]),
            fmt(c["p_value"]),
            _ci(c.get("p_value_interval")),
            fmt(c["alpha"]),
            esc(c["n"]),
            fmt(c["details"]["bandwidth"]),
            badge(holds, "α-LMDP holds" if holds else "α-LMDP does not hold"),
        )
    ]
    return (
        f'<p class="note"><b>What passing means:</b> {esc(LMDP_MEANING)}</p>'
        + table(
            [
                "MMD² (unbiased)",
                "p-value",
                "95% interval of p",
                "α",
                "rows (real, synthetic)",
                "bandwidth",
                "decision",
            ],
            rows,
            numeric=(0, 1, 2, 3, 5),
        )
        + f'<p class="note">Sensitive columns x′: {esc(", ".join(c["columns"]))}. The interval of p is the Monte '
        "Carlo error of the permutation p-value (Clopper–Pearson). "
        f"{esc(c['standardisation'])}.</p>"
    )


def _lmdp_ksd(c: dict[str, Any]) -> str:
    rows = []
    for t in c["tests"].values():
        holds = t["alpha_lmdp_holds"]
        rows.append(
            (
                esc(t["test"]),
                esc(t["null"]),
                fmt(t["statistic"]),
                fmt(t["p_value"]),
                _ci(t.get("p_value_interval")),
                fmt(t["alpha"]),
                fmt(t["n"]),
                fmt(t["details"].get("bandwidth")),
                badge(holds, "α-LMDP holds" if holds else "α-LMDP does not hold"),
            )
        )
    methods = sorted({t["interval_method"] for t in c["tests"].values()})
    refs = "; ".join(f"{t['test']}: {t['reference']}" for t in c["tests"].values())
    bounds = ", ".join(f"{col} [{fmt(lo)}, {fmt(hi)}]" for col, (lo, hi) in c["bounds"].items())
    caveat = f'<p class="note"><b>Caveat:</b> {esc(c["caveat"])}.</p>' if c.get("caveat") else ""
    dequantised = f" {esc(c['dequantisation'])}." if c.get("dequantisation") else ""
    return (
        f'<p class="note"><b>What passing means:</b> {esc(LMDP_KSD_MEANING)}</p>'
        + caveat
        + table(
            [
                "test",
                "null distribution",
                "statistic",
                "p-value",
                "95% interval of p",
                "α",
                "rows",
                "bandwidth",
                "decision",
            ],
            rows,
            numeric=(2, 3, 4, 5, 6, 7),
        )
        + f'<p class="note">Sensitive columns x′ of {esc(c["model"] or "the model")}: {esc(bounds)}. Score: '
        f"{esc(c['score'])}. {esc(c['model_space'])}; {fmt(c['n_rows'])} rows.{dequantised} Intervals of p: "
        f"{esc('; '.join(methods))}. Tests: {esc(refs)}.</p>"
    )


def _utility(c: dict[str, Any]) -> str:
    metric, summary = c["metric"], c["summary"]
    rows = [
        (esc(r["model"]), fmt(r.get(metric)), fmt(r.get(f"real_{metric}")), esc(r.get("error") or ""))
        for r in c["table"]
    ]
    rows.append(("<b>mean</b>", fmt(c["value"]), fmt(c["real_value"]), ""))
    notes = "; ".join(summary.get("warnings", []))
    ci = c.get("intervals") or {}
    return (
        f'<p class="note">Label {esc(summary["label"])} ({esc(summary["task"])}); scored on HOLDOUT '
        f"({fmt(summary['n_rows'].get('real_test'))} rows).</p>"
        + table(
            ["classifier", f"{metric}, trained on synthetic", f"{metric}, trained on REAL", "error"],
            rows,
            numeric=(1, 2),
        )
        + f'<p class="note">95% intervals over HOLDOUT rows: mean {esc(metric)} {_ci(ci.get("value"))}, gap to '
        f"REAL-trained {fmt(c['gap_to_real'])} {_ci(ci.get('gap_to_real'))}.</p>"
        + (f'<p class="note">Warnings: {esc(notes)}</p>' if notes else "")
    )


def _fidelity(c: dict[str, Any]) -> str:
    syn, ref, ci = c["summary"], c["holdout_reference"], c.get("intervals") or {}
    rows = [(esc(k), fmt(syn[k]), _ci(ci.get(k)), fmt(ref[k])) for k in syn]
    per_col = [
        (esc(name), esc(d["type"]), fmt(d.get("tv")), fmt(d.get("ks")), fmt(d.get("w1")))
        for name, d in c["columns"].items()
    ]
    return (
        table(
            ["metric", "synthetic vs REAL", "95% interval (thresholded metrics)", "HOLDOUT vs REAL (floor)"],
            rows,
            numeric=(1, 2, 3),
        )
        + "<details><summary>Per column</summary>"
        + table(["column", "type", "TV", "KS", "W1 (range-scaled)"], per_col, numeric=(2, 3, 4))
        + "</details>"
    )


def _excess_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    body = [
        (
            what,
            f"{e['main']['count']} / {e['main']['of']}",
            f"{e['control']['count']} / {e['control']['of']}",
            fmt(e["value"]),
            _ci(e["interval"]),
        )
        for what, e in rows
    ]
    return table(["statistic", "main", "control", "excess", "interval"], body, numeric=(3,))


def _copies(c: dict[str, Any]) -> str:
    return (
        f"<p>Every one of the {c['n_synthetic_rows']} synthetic rows matched against REAL; HOLDOUT rows matched the "
        f"same way are the control. Near copies: best match weight above τ = {fmt(c['near']['tau'])}, which a fresh "
        f"HOLDOUT row exceeds with probability {fmt(c['near']['null_rate'])} ({esc(c['match_weight'])}).</p>"
        + _excess_table([("exact copies", c["exact"]), ("near copies (weight > τ)", c["near"])])
        + _closer(c["closer"])
    )


def _closer(k: dict[str, Any]) -> str:
    return (
        f"<p>Paired test: REAL in {k['chunks']} chunk(s) of {k['chunk_rows']} rows, HOLDOUT sampled to as many. "
        f"Synthetic rows whose best REAL match beats their best HOLDOUT match by more than {fmt(k['margin'])} "
        f"(log-likelihood ratio): {fmt(k['real_ahead'])} of {k['rows']}; the reverse: {fmt(k['holdout_ahead'])}. "
        f"Excess {fmt(k['value'])}, interval {_ci(k['interval'])}.</p>"
    )


def _vulnerable(c: dict[str, Any]) -> str:
    return (
        f"<p>The {c['k']} most unusual REAL rows ({esc(c['rule'])}) are always examined, against the {c['k']} most "
        "unusual HOLDOUT rows as control. A record is singled out when a synthetic row matches it better than any "
        "other real row does.</p>" + _excess_table([("singled out", c["singled_out"])])
    )


def _singling_out(c: dict[str, Any]) -> str:
    return (
        f"<p>{c['queries']} predicates on {c['n_cols']} columns, each picking out exactly one synthetic row, are "
        f"evaluated on {c['reference_rows']} REAL rows and as many HOLDOUT rows (control). Anonymeter's risk "
        f"(r_main − r_control)/(1 − r_control) = {fmt(c['anonymeter_risk'])}.</p>"
        + _excess_table([("singled out", c["singled_out"])])
    )


def _linkability(c: dict[str, Any]) -> str:
    sets = " | ".join(", ".join(a) for a in c["aux_columns"])
    return (
        f"<p>Auxiliary column sets: {esc(sets)}. Anonymeter's risk (r_main − r_control)/(1 − r_control) = "
        f"{fmt(c['anonymeter_risk'])}.</p>" + _excess_table([("linked", c["linked"])])
    )


BODIES = {
    "membership": _membership,
    "copies": _copies,
    "vulnerable_records": _vulnerable,
    "singling_out": _singling_out,
    "linkability": _linkability,
    "presence_disclosure": _presence,
    "attribute_disclosure": _attribute,
    "lmdp_mmd": _lmdp,
    "lmdp_ksd": _lmdp_ksd,
    "utility": _utility,
    "fidelity": _fidelity,
}
CAPTIONS = {
    "roc": "ROC curves of the membership attacks (members = REAL candidates, non-members = HOLDOUT candidates).",
    "sweep": "Presence disclosure over the distance threshold r: synthetic set (solid) vs held-out baseline (dashed).",
    "per_column": "Attribute disclosure: share of each unknown column imputed correctly for members.",
    "bars": "Utility: each classifier trained on synthetic vs on REAL rows, scored on HOLDOUT.",
    "marginals": "Marginals of REAL vs synthetic rows (densities for numbers, frequencies for categories).",
    "copies": "Best match weight to a REAL row: every synthetic row vs the HOLDOUT control, with τ (log scale).",
    "vulnerable": "The most unusual records: best match to a synthetic row vs to another real row.",
    "log_weights": "Histogram of the synthetic rows' log importance weights (normalised to mean one).",
}
NEGATIVE_RISK = (
    "A negative risk above baseline means the attack did worse with the synthetic data than with held-out real "
    "rows: no evidence of disclosure."
)
LMDP_MEANING = (
    "α-LMDP protects the distribution of the sensitive columns, not individuals: it holds when a level-α test "
    "can tell the real columns from the synthetic ones (p ≤ α), so PASS here means the test detected a "
    "difference, i.e. the synthetic data do not reproduce the real marginal of these columns."
)
LMDP_KSD_MEANING = (
    'α-LMDP holds when a level-α goodness-of-fit test rejects "the real sensitive columns are a sample of the '
    "model's marginal of them\" (p ≤ α), so PASS here means the test found that the model's marginal does not fit "
    "the real one; each test is one verdict."
)
REMINDERS = {  # figure -> a line shown above it
    "marginals": "Private: histograms of the real training rows (REAL), not differentially private.",
}


def _check(name: str, c: dict[str, Any], figures: dict[str, Figure], verdicts: list[dict[str, Any]]) -> str:
    mine = [v for v in verdicts if v["check"] == name]
    statuses = {v["status"] for v in mine}
    worst = "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"
    status = badge(worst) if mine else badge(None, "SKIPPED" if c["status"] == "skipped" else "REPORT ONLY")
    role = {
        "expectation": " (utility expectation)",
        "property": " (property of the sensitive columns; never changes the verdict)",
    }.get(c.get("role"), "")
    head = f'<section id="{esc(name)}"><h2>{esc(c["title"])}{esc(role)} {status}</h2>'
    if c["status"] == "skipped":
        return head + f'<p class="note">Not run: {esc(c["reason"])}.</p></section>'
    figs = "".join(
        (f'<p class="private-note">{esc(REMINDERS[key])}</p>' if key in REMINDERS else "")
        + figure_html(fig, CAPTIONS.get(key, key))
        for key, fig in figures.items()
    )
    return head + BODIES[name](c) + figs + f'<p class="note">Ran in {fmt(c["seconds"])} s.</p></section>'


def _weights(report: dict[str, Any], figures: dict[str, Figure]) -> str:
    """The importance-weights section (empty without weights): diagnostics, utility and distances without and with
    the weights, and a histogram of the log weights."""
    w = report.get("weights")
    if not w:
        return ""
    d, u, dist = w["diagnostics"], w["utility"], w["distances"]
    verdict = badge("fail" if w["unreliable"] else "pass", d["psis_verdict"].upper())
    rows = [
        ("rows", fmt(w["n"])),
        ("Kish ESS (Σw)²/Σw²", f"{fmt(d['kish_ess'])} ({fmt(100 * d['kish_ess_fraction'], 3)}% of rows)"),
        ("N_eff of a weighted logistic regression (A.6.1)", fmt(w.get("sandwich_ess"))),
        ("PSIS k̂", f"{fmt(d['psis_k'], 3)} {verdict}"),
        ("largest weight's share of Σw", fmt(d["max_weight_share"], 3)),
        ("zero weights", fmt(w["zero_weights"])),
    ]
    body = table(["diagnostic", "value"], rows, numeric=(1,))
    compare = []
    if u["status"] == "ran":
        compare.append(
            (f"TSTR {esc(u['metric'])} on HOLDOUT (mean)", fmt(u["unweighted"]), fmt(u["weighted"]))
        )
        compare += [
            (f"&nbsp;&nbsp;{esc(m)}", fmt(v["unweighted"]), fmt(v["weighted"]))
            for m, v in u["per_model"].items()
        ]
    for key, what in (
        ("mmd2", "MMD² to HOLDOUT"),
        ("w1", "Wasserstein-1 to HOLDOUT"),
        ("paper_w1", "paper's W1"),
    ):
        if key in dist:
            compare.append((esc(what), fmt(dist[key]["unweighted"]), fmt(dist[key]["weighted"])))
    body += table(["", "without weights", "with weights"], compare, numeric=(1, 2))
    skipped = "" if u["status"] == "ran" else f" Utility not scored: {esc(u['reason'])}."
    figs = "".join(figure_html(fig, CAPTIONS.get(key, key)) for key, fig in figures.items())
    return (
        '<section id="weights"><h2>Importance weights</h2>'
        + (f'<p class="warn">{esc(w["message"])}</p>' if w["unreliable"] else "")
        + body
        + f'<p class="note">{esc(w["notes"])} Distances on {fmt(dist["n_synthetic"])} synthetic and '
        f"{fmt(dist['n_real'])} HOLDOUT rows ({esc(dist['encoding'])}; bandwidth {fmt(dist['bandwidth'])}).{skipped}</p>"
        + figs
        + "</section>"
    )


def _privacy(report: dict[str, Any]) -> str:
    """The banner that opens the page: the report is private and not DP."""
    label = report["privacy"]
    if label.get("run_dp_claim") is False:
        covered = "Covered by an (ε, δ): nothing, the run makes no differential-privacy claim."
    else:
        covered = f"Covered by the run's (ε, δ): {', '.join(label['dp_artefacts'])}."
    return (
        f'<div class="private" id="privacy" role="note"><strong>{esc(PRIVATE_BANNER)}</strong>'
        f"<p>{esc(label['statement'])}</p>"
        f'<p class="meta">{esc(covered)} Not covered: this page and report.json.</p>'
        "</div>"
    )


def _no_dp_claim(report: dict[str, Any]) -> str:
    """The banner of a run that makes no differential-privacy claim (empty for a DP run or a file)."""
    label = report["privacy"]
    if label.get("run_dp_claim") is not False:
        return ""
    reasons = "".join(
        f"<li><b>{esc(r.get('name', ''))}</b>: {esc(r.get('note', ''))}</li>"
        for r in label.get("no_dp_claim", [])
    )
    return (
        f'<div class="private" id="no-dp-claim" role="note"><strong>{esc(NO_DP_BANNER)}</strong>'
        f"<p>{esc(NO_DP_TEXT)}</p>"
        + (f"<p>The run's ledger says why:</p><ul>{reasons}</ul>" if reasons else "")
        + "</div>"
    )


def _run(report: dict[str, Any]) -> str:
    versions = table(["package", "version"], [(esc(k), esc(v)) for k, v in report["versions"].items()])
    config = report.get("config")
    cfg = (
        f"<details><summary>Run config</summary><pre>{esc(json.dumps(config, indent=2))}</pre></details>"
        if config
        else '<p class="note">No run config (the synthetic data came as a file).</p>'
    )
    policy = f"<details><summary>Policy</summary><pre>{esc(json.dumps(report['policy'], indent=2))}</pre></details>"
    return f'<section id="run"><h2>Run</h2>{cfg}{policy}<h3>Versions</h3>{versions}</section>'


def render_html(report: dict[str, Any], figures: dict[str, dict[str, Figure]]) -> str:
    """The whole page, opening with the privacy banner. Figures are closed (their memory freed) once rendered."""
    checks = report["checks"]
    links = [
        ("verdicts", "Policy"),
        ("inputs", "Inputs"),
        ("ledger", "Privacy ledger"),
        *[(n, c["title"]) for n, c in checks.items()],
        *([("weights", "Importance weights")] if report.get("weights") else []),
        ("run", "Run"),
    ]
    nav = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in links)
    status = report["status"]
    verdict = (
        badge(status, f"POLICY {BADGES[status]}", big=True) + f" <span>{esc(report['status_reason'])}</span>"
    )
    source = report["inputs"].get("checkpoint", report["inputs"]["synthetic"]).get("path", "")
    body = "".join(_check(n, c, figures.get(n, {}), report["verdicts"]) for n, c in checks.items())
    body += _weights(report, figures.get("weights", {}))
    warnings = "".join(f'<p class="warn">{esc(w)}</p>' for w in report.get("warnings", []))
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Audit report (private): {esc(source)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body><main>'
        f"<h1>lightning-dp audit report</h1>{_privacy(report)}{_no_dp_claim(report)}{_guarantee(report)}"
        f'<div class="meta">{esc(source)} · {esc(report["created_at"])} · {fmt(report["duration_s"])} s</div>'
        f'<div class="banner">{verdict}</div>{warnings}<nav>{nav}</nav>'
        f"{_verdicts(report)}{_inputs(report)}{_ledger(report)}{body}{_run(report)}</main></body></html>\n"
    )
    for per_check in figures.values():
        for fig in per_check.values():
            fig.clear()
    return page
