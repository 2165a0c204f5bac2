"""``report.html``: one self-contained page (inline CSS, figures as base64 PNGs, no external resource) rendered
from the JSON report and the checks' figures.

The page is as private as the JSON: it opens, before any number, with a banner carrying the report's
``privacy`` statement (computed from the real rows, not differentially private), and repeats a one-line
reminder above the histograms of real columns.
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


def badge(passed: bool | None, text: str | None = None, *, big: bool = False) -> str:
    cls = "skip" if passed is None else ("pass" if passed else "fail")
    text = text or {"skip": "SKIPPED", "pass": "PASS", "fail": "FAIL"}[cls]
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
def _verdicts(report: dict[str, Any]) -> str:
    rows = [
        (
            esc(v["check"]),
            esc(v["description"]),
            esc(v["criterion"]),
            fmt(v["value"]),
            f"{esc(v['op'])} {fmt(v['limit'])}",
            badge(v["passed"]),
            esc(v["note"]),
        )
        for v in report["verdicts"]
    ]
    header = ["check", "what", "threshold", "value", "limit", "result", "note"]
    if not any(v["note"] for v in report["verdicts"]):  # no notes: no empty column
        header, rows = header[:-1], [r[:-1] for r in rows]
    body = table(header, rows, numeric=(3, 4))
    if not rows:
        body = '<p class="note">The policy sets no thresholds: every check only reports its numbers.</p>'
    skipped = [
        f"{esc(n)}: {esc(c['reason'])}" for n, c in report["checks"].items() if c["status"] == "skipped"
    ]
    extra = "".join(f'<p class="note">{badge(None)} {s}</p>' for s in skipped)
    return (
        f'<section id="verdicts"><h2>Policy</h2><p class="note">Policy: {esc(report["policy"]["source"])}; '
        f"one line per threshold.</p>{body}{extra}</section>"
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
    return f'<section id="ledger"><h2>Privacy ledger</h2>{summary}<h3>Releases</h3>{releases}</section>'


def _membership(c: dict[str, Any]) -> str:
    rows = []
    for name, a in c["attacks"].items():
        tpr, ci = a["tpr_at_fpr"], a["auc_ci"]
        rows.append(
            (
                esc(name),
                fmt(a["auc"]),
                f"[{fmt(ci[0], 3)}, {fmt(ci[1], 3)}]",
                fmt(tpr.get("0.001")),
                fmt(tpr.get("0.01")),
                fmt(a["n_members"]),
                fmt(a["n_non_members"]),
            )
        )
    return (
        table(
            ["attack", "ROC-AUC", "95% CI", "TPR at 0.1% FPR", "TPR at 1% FPR", "members", "non-members"],
            rows,
            numeric=(1, 2, 3, 4, 5, 6),
        )
        + f'<p class="note">Encoding: {esc(c["encoding"])}. AUC 0.5 is chance.</p>'
    )


def _presence(c: dict[str, Any]) -> str:
    rows = [
        (
            esc(what),
            fmt(r["epsilon_star"]),
            fmt(r["sensitivity_at_epsilon_star"]),
            fmt(r["precision_at_epsilon_star"]),
        )
        for what, r in (("synthetic", c), ("held-out baseline", c["baseline"]))
    ]
    risk = c["risk_above_baseline"]
    return (
        table(["source", "ε*", "sensitivity at ε*", "precision at ε*"], rows, numeric=(1, 2, 3))
        + f'<p class="note">ε* is the largest distance with precision &gt; {fmt(c["precision_target"])}. '
        f"Risk above baseline: sensitivity {fmt(risk['sensitivity'])}, precision {fmt(risk['precision'])}. "
        f"{fmt(c['n_members'])} members, {fmt(c['n_non_members'])} non-members, {fmt(c['n_source_rows'])} "
        "rows in each source.</p>"
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
        f"{fmt(risk['sensitivity'])}, precision {fmt(risk['precision'])}.</p>"
    )


def _lmdp(c: dict[str, Any]) -> str:
    holds = c["alpha_lmdp_holds"]
    rows = [
        (
            fmt(c["statistic"]),
            fmt(c["p_value"]),
            fmt(c["alpha"]),
            esc(c["n"]),
            fmt(c["details"]["bandwidth"]),
            badge(holds, "α-LMDP holds" if holds else "α-LMDP does not hold"),
        )
    ]
    return (
        table(
            ["MMD² (unbiased)", "p-value", "α", "rows (real, synthetic)", "bandwidth", "decision"],
            rows,
            numeric=(0, 1, 2, 4),
        )
        + f'<p class="note">Sensitive columns x′: {esc(", ".join(c["columns"]))}. α-LMDP (PPEM Def. 2.2) holds '
        "when the permutation test rejects that the real x′ follow the synthetic marginal (p ≤ α). "
        f"{esc(c['standardisation'])}.</p>"
    )


def _utility(c: dict[str, Any]) -> str:
    metric, summary = c["metric"], c["summary"]
    rows = [
        (esc(r["model"]), fmt(r.get(metric)), fmt(r.get(f"real_{metric}")), esc(r.get("error") or ""))
        for r in c["table"]
    ]
    rows.append(("<b>mean</b>", fmt(c["value"]), fmt(c["real_value"]), ""))
    notes = "; ".join(summary.get("warnings", []))
    return (
        f'<p class="note">Label {esc(summary["label"])} ({esc(summary["task"])}); scored on HOLDOUT '
        f"({fmt(summary['n_rows'].get('real_test'))} rows).</p>"
        + table(
            ["classifier", f"{metric}, trained on synthetic", f"{metric}, trained on REAL", "error"],
            rows,
            numeric=(1, 2),
        )
        + (f'<p class="note">Warnings: {esc(notes)}</p>' if notes else "")
    )


def _fidelity(c: dict[str, Any]) -> str:
    syn, ref = c["summary"], c["holdout_reference"]
    rows = [(esc(k), fmt(syn[k]), fmt(ref[k])) for k in syn]
    per_col = [
        (esc(name), esc(d["type"]), fmt(d.get("tv")), fmt(d.get("ks")), fmt(d.get("w1")))
        for name, d in c["columns"].items()
    ]
    return (
        table(["metric", "synthetic vs REAL", "HOLDOUT vs REAL (floor)"], rows, numeric=(1, 2))
        + "<details><summary>Per column</summary>"
        + table(["column", "type", "TV", "KS", "W1 (range-scaled)"], per_col, numeric=(2, 3, 4))
        + "</details>"
    )


BODIES = {
    "membership": _membership,
    "presence_disclosure": _presence,
    "attribute_disclosure": _attribute,
    "lmdp_mmd": _lmdp,
    "utility": _utility,
    "fidelity": _fidelity,
}
CAPTIONS = {
    "roc": "ROC curves of the membership attacks (members = REAL candidates, non-members = HOLDOUT candidates).",
    "sweep": "Presence disclosure over the distance threshold ε: synthetic set (solid) vs held-out baseline (dashed).",
    "per_column": "Attribute disclosure: share of each unknown column imputed correctly for members.",
    "bars": "Utility: each classifier trained on synthetic vs on REAL rows, scored on HOLDOUT.",
    "marginals": "Marginals of REAL vs synthetic rows (densities for numbers, frequencies for categories).",
}
REMINDERS = {  # figure -> a line shown above it
    "marginals": "Private: histograms of the real training rows (REAL), not differentially private.",
}


def _check(name: str, c: dict[str, Any], figures: dict[str, Figure], verdicts: list[dict[str, Any]]) -> str:
    mine = [v for v in verdicts if v["check"] == name]
    status = (
        badge(None)
        if c["status"] == "skipped"
        else (badge(all(v["passed"] for v in mine)) if mine else badge(None, "REPORT ONLY"))
    )
    head = f'<section id="{esc(name)}"><h2>{esc(c["title"])} {status}</h2>'
    if c["status"] == "skipped":
        return head + f'<p class="note">Skipped: {esc(c["reason"])}.</p></section>'
    figs = "".join(
        (f'<p class="private-note">{esc(REMINDERS[key])}</p>' if key in REMINDERS else "")
        + figure_html(fig, CAPTIONS.get(key, key))
        for key, fig in figures.items()
    )
    return head + BODIES[name](c) + figs + f'<p class="note">Ran in {fmt(c["seconds"])} s.</p></section>'


def _privacy(report: dict[str, Any]) -> str:
    """The banner that opens the page: the report is private and not DP."""
    label = report["privacy"]
    dp = ", ".join(label["dp_artefacts"])
    return (
        f'<div class="private" id="privacy" role="note"><strong>{esc(PRIVATE_BANNER)}</strong>'
        f"<p>{esc(label['statement'])}</p>"
        f'<p class="meta">Covered by the run\'s (ε, δ): {esc(dp)}. Not covered: this page and report.json.</p>'
        "</div>"
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
        ("run", "Run"),
    ]
    nav = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in links)
    n_fail = sum(not v["passed"] for v in report["verdicts"])
    verdict = (
        badge(True, "POLICY PASSED", big=True)
        if report["passed"]
        else badge(False, f"POLICY FAILED ({n_fail} of {len(report['verdicts'])} lines)", big=True)
    )
    source = report["inputs"].get("checkpoint", report["inputs"]["synthetic"]).get("path", "")
    body = "".join(_check(n, c, figures.get(n, {}), report["verdicts"]) for n, c in checks.items())
    warnings = "".join(f'<p class="warn">{esc(w)}</p>' for w in report.get("warnings", []))
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Audit report (private): {esc(source)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head><body><main>'
        f"<h1>lightning-dp audit report</h1>{_privacy(report)}"
        f'<div class="meta">{esc(source)} · {esc(report["created_at"])} · {fmt(report["duration_s"])} s</div>'
        f'<div class="banner">{verdict}</div>{warnings}<nav>{nav}</nav>'
        f"{_verdicts(report)}{_inputs(report)}{_ledger(report)}{body}{_run(report)}</main></body></html>\n"
    )
    for per_check in figures.values():
        for fig in per_check.values():
            fig.clear()
    return page
