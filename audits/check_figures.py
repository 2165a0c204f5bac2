"""The figures of the privacy checks in ``report.html``: membership ROC curves, the presence sweep over the
distance threshold r, and attribute disclosure per unknown column."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure


def roc_figure(curves: dict[str, tuple[np.ndarray, np.ndarray, float]]) -> Figure:
    """ROC curves of the membership attacks, linear and log-log (name -> (fpr, tpr, auc))."""
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


def presence_figure(res: dict[str, Any]) -> Figure:
    """Precision and sensitivity over the distance threshold r, synthetic source vs held-out baseline."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    prec_ax, sens_ax = fig.subplots(1, 2)
    for what, r, style in (("synthetic", res, "-"), ("held-out baseline", res["baseline"], "--")):
        t = np.asarray(r["thresholds"], dtype=float)
        prec_ax.plot(t, np.asarray(r["precision"], dtype=float), style, label=what)
        sens_ax.plot(t, np.asarray(r["sensitivity"], dtype=float), style, label=what)
        if r["r_star"] is not None:
            sens_ax.axvline(r["r_star"], linestyle=style, color="grey", linewidth=0.8)
    prec_ax.axhline(res["precision_target"], color="red", linestyle=":", label="precision target")
    prec_ax.set(
        xlabel="distance threshold r",
        ylabel="precision",
        title="presence disclosure: precision",
        ylim=(0, 1.02),
    )
    sens_ax.set(
        xlabel="distance threshold r (grey: r*)",
        ylabel="sensitivity",
        title="presence disclosure: sensitivity",
        ylim=(0, 1.02),
    )
    prec_ax.legend(fontsize="small")
    return fig


def attribute_figure(res: dict[str, Any]) -> Figure:
    """Share of each unknown column imputed correctly for members, synthetic source vs held-out baseline."""
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


def copies_figure(synthetic: np.ndarray, holdout: np.ndarray, tau: float) -> Figure:
    """Histograms of the best match weight to REAL of every synthetic row and of the HOLDOUT control rows."""
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    both = np.concatenate([synthetic, holdout])
    bins = np.linspace(both.min(), both.max(), 60) if both.max() > both.min() else 10
    ax.hist(synthetic, bins=bins, density=True, alpha=0.5, label="synthetic rows")
    ax.hist(holdout, bins=bins, density=True, histtype="step", color="black", label="HOLDOUT rows (control)")
    ax.axvline(tau, color="red", linestyle="--", label="τ")
    ax.set(xlabel="best match weight to a REAL row", ylabel="density", yscale="log", title="Links to REAL rows")
    ax.legend(fontsize="small")
    return fig


def vulnerable_figure(res: dict[str, Any]) -> Figure:
    """Each examined record's best match weight to a synthetic row against that to another real row."""
    fig = Figure(figsize=(6, 5), layout="constrained")
    ax = fig.subplots()
    for side, marker in (("members", "o"), ("control", "x")):
        ax.scatter(res[side]["to_other_real"], res[side]["to_synthetic"], marker=marker, s=14, label=side)
    lim = [
        min(np.min(res[s][k]) for s in ("members", "control") for k in ("to_other_real", "to_synthetic")),
        max(np.max(res[s][k]) for s in ("members", "control") for k in ("to_other_real", "to_synthetic")),
    ]
    ax.plot(lim, lim, color="grey", linestyle=":")
    ax.set(
        xlabel="best match weight to another real row",
        ylabel="best match weight to a synthetic row",
        title=f"The {res['k']} most unusual rows (above the diagonal: singled out)",
    )
    ax.legend(fontsize="small")
    return fig
