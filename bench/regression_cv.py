"""Regression tables of ``bench/reproduce.py``: k-fold CV of a linear regression trained on synthetic rows.

The protocol of the private support points' regression experiment ("Distribution Distance Measures in Generative
and Privacy Models", Diesendruck 2019, §5.7, Fig. 5.8): the rows are split into k folds; for each fold, every
generator of the table is trained (``train(cfg)``) on the other folds, at each budget and (for generators with a
set size) each support-set size; an ordinary least-squares regression of the last column on the others is fitted
on its synthetic rows and scored by its MSE on the held-out fold. Each cell is the median and IQR over folds and
seeds. Non-private references, computed here on the same folds: the real training rows, the optimised support
points Y* (what the private release is centred on; never released by a run), and a random subset of n rows.

Private support points are scored on the n released points themselves (the thesis' protocol) and on the run's
KDE expansion (``synthetic.csv``, as many rows as the released row count). The mechanism releases its draw
whether or not the MH chains mixed (not mixing is not observable; R̂ is in the run's private diagnostics, which this
benchmark reads and reports).

Called by ``bench/reproduce.py`` for tables whose ``bench:`` entry names ``script: regression_cv``; the entry
holds the protocol (``data``, ``folds``, ``fold_seed``, ``budgets``, ``sizes``, ``size_key``, ``target``,
``quick_sizes``).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mean_squared_error
from sklearn.model_selection import KFold

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- protocol
@dataclass(frozen=True)
class Protocol:
    """The table's ``bench:`` entry (less ``script``)."""

    data: str = "diabetes"
    folds: int = 5
    fold_seed: int = 0
    budgets: tuple[float, ...] = (100.0, 1000.0)
    sizes: tuple[int, ...] = (17, 35, 70)
    size_key: str = "model.module.num_points"
    target: str = "target"
    quick_sizes: tuple[int, ...] = (35,)

    @classmethod
    def of(cls, block: dict[str, Any]) -> Protocol:
        block = {k: v for k, v in block.items() if k != "script"}
        for key in ("budgets", "sizes", "quick_sizes"):
            if key in block:
                block[key] = tuple(block[key])
        return cls(**block)


@dataclass
class Cell:
    """The MSEs of one (method, ε, n) over folds and seeds, and what the runs reported."""

    mse: list[float] = field(default_factory=list)
    epsilon: list[float] = field(default_factory=list)
    rhat: list[float] = field(default_factory=list)
    refused: int = 0
    failed: list[str] = field(default_factory=list)


def fold_frames(data: str, protocol: Protocol) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """(training rows, held-out rows) of each fold, by a seeded public shuffle."""
    from lightning_dp.data.sources import load_source

    rows = load_source(data).train
    kfold = KFold(n_splits=protocol.folds, shuffle=True, random_state=protocol.fold_seed)
    return [
        (rows.iloc[a].reset_index(drop=True), rows.iloc[b].reset_index(drop=True))
        for a, b in kfold.split(rows)
    ]


def fold_overrides(data: str, folder: Path, train: pd.DataFrame, test: pd.DataFrame) -> list[str]:
    """Hydra overrides that train on ``train`` and hold out ``test`` (CSV files with the bundled schema)."""
    folder.mkdir(parents=True, exist_ok=True)
    fit, held = folder / "train.csv", folder / "test.csv"
    train.to_csv(fit, index=False)
    test.to_csv(held, index=False)
    schema = resources.files("lightning_dp.data").joinpath(f"schemas/{data}.yaml")
    return ["data.name=csv", f"+data.path={fit}", f"+data.test_path={held}", f"+data.schema={schema}"]


def regression_mse(train: pd.DataFrame, test: pd.DataFrame, target: str) -> float:
    """MSE on ``test`` of an ordinary least-squares regression of ``target`` on the other columns of ``train``."""
    features = [c for c in test.columns if c != target]
    model = LinearRegression().fit(train[features].to_numpy(float), train[target].to_numpy(float))
    return float(
        mean_squared_error(test[target].to_numpy(float), model.predict(test[features].to_numpy(float)))
    )


def optimised_support_points(rows: torch.Tensor, module_cfg: DictConfig, n: int) -> torch.Tensor:
    """Y*: what ``model=support_points`` trains (Adam on ``e(X, Y)``, full batches, clipped to [0, 1]), (n, D).

    Non-private: a reference computed here, never released by a run.
    """
    from lightning_dp.kernels.energy import support_point_loss
    from lightning_dp.models.support_points import SupportPoints

    module = SupportPoints(
        n_continuous=rows.shape[1],
        num_points=n,
        p=module_cfg.p,
        lr=module_cfg.lr,
        num_steps=module_cfg.num_steps,
        init_seed=module_cfg.init_seed,
    )
    opt = torch.optim.Adam([module.points], lr=module_cfg.lr)
    for _ in range(module_cfg.num_steps):
        opt.zero_grad()
        support_point_loss(rows, module.points, module_cfg.p).backward()
        opt.step()
        with torch.no_grad():
            module.points.clamp_(0.0, 1.0)
    return module.points.detach()


# ------------------------------------------------------------------------------------------- runs
def compose_cfg(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


def run_scores(run_label: str, result: dict[str, Any], test: pd.DataFrame, target: str) -> dict[str, float]:
    """MSE of the run's released points (support points) and of its synthetic rows, by row label."""
    from lightning_dp.checkpoint import load_run
    from lightning_dp.data.datamodule import decode_samples

    scores = {run_label: regression_mse(pd.read_csv(result["synthetic"]), test, target)}
    loaded = load_run(result["checkpoint"])
    if hasattr(
        loaded.model, "points"
    ):  # private support points: the n released points, the thesis' synthetic set
        points = loaded.model.points.detach()
        decoded = decode_samples(loaded.data_state, points, torch.zeros(len(points), dtype=torch.long))
        scores = {run_label: regression_mse(decoded, test, target), f"{run_label} + KDE": scores[run_label]}
    return scores


def rhat_of(result: dict[str, Any]) -> float:
    path = Path(result["output_dir"]) / "support_points_mcmc.json"
    return float(json.loads(path.read_text())["rhat"]) if path.exists() else math.nan


def train_and_score(
    cells: dict[tuple, Cell],
    label: str,
    key: tuple[float, int | None],
    cfg: DictConfig,
    test: pd.DataFrame,
    target: str,
    log: Callable[[str], None],
) -> None:
    """Train one run and add its MSEs to ``cells[(row label, ε, n)]``; a refused or failed run is counted."""
    from lightning_dp.callbacks.private_support_points import ChainsNotMixedError
    from lightning_dp.train import train

    where = f"{label} ε={key[0]:g} n={key[1]} seed {cfg.seed}"
    start = time.perf_counter()
    try:
        result = train(cfg)
    except ChainsNotMixedError:
        cells.setdefault((label, *key), Cell()).refused += 1
        log(f"  {where}: refused (the chains did not mix)")
        return
    except Exception as err:  # noqa: BLE001 - reported in the table, not fatal
        cells.setdefault((label, *key), Cell()).failed.append(f"{type(err).__name__}: {err}")
        log(f"  {where} failed: {type(err).__name__}: {err}")
        return
    for row, mse in run_scores(label, result, test, target).items():
        cell = cells.setdefault((row, *key), Cell())
        cell.mse.append(mse)
        cell.epsilon.append(result["epsilon"])
        cell.rhat.append(rhat_of(result))
    log(f"  {where}: {time.perf_counter() - start:.0f} s, ε spent {result['epsilon']:.4g}")


def add_references(
    cells: dict[tuple, Cell],
    train: pd.DataFrame,
    test: pd.DataFrame,
    sizes: tuple[int, ...],
    sp_cfgs: dict[float, DictConfig],
    seeds: int,
    protocol: Protocol,
) -> None:
    """The non-private references of one fold: the real rows, Y* for each norm, random subsets of n rows."""
    from lightning_dp.data.encoders import TabularEncoder
    from lightning_dp.data.sources import bundled_schema

    cells.setdefault(("Real training rows", None, None), Cell()).mse.append(
        regression_mse(train, test, protocol.target)
    )
    if not sp_cfgs:
        return
    encoder = TabularEncoder(bundled_schema(protocol.data))
    x, _ = encoder.transform(train)  # (N, D) in [0, 1] by the public bounds
    for n in sizes:
        for p, sp_cfg in sorted(sp_cfgs.items()):
            decoded = encoder.inverse_transform(optimised_support_points(x, sp_cfg, n))
            cells.setdefault((f"Support points Y*, ℓ{p:g} (non-private)", None, n), Cell()).mse.append(
                regression_mse(decoded, test, protocol.target)
            )
        for seed in range(seeds):
            subset = train.sample(n=n, random_state=seed)
            cells.setdefault(("Random subset of n rows (non-private)", None, n), Cell()).mse.append(
                regression_mse(subset, test, protocol.target)
            )


def collect(
    table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, log: Callable[[str], None]
) -> tuple[dict[tuple, Cell], dict[str, Any]]:
    """Train and score every run of ``table`` on every fold; returns the cells and facts for the text."""
    protocol = Protocol.of(table.bench)
    sizes = protocol.quick_sizes if quick else protocol.sizes
    cells: dict[tuple, Cell] = {}  # (row label, ε or None, n or None) -> MSEs
    sp_cfgs: dict[
        float, DictConfig
    ] = {}  # norm order p -> the support-point settings of the runs that use it
    trained, start = 0, time.perf_counter()
    folds = fold_frames(protocol.data, protocol)
    for f, (train_rows, test_rows) in enumerate(folds):
        log(f"  fold {f + 1} of {len(folds)}")
        data = fold_overrides(protocol.data, out / f"fold{f}", train_rows, test_rows)
        for run in table.runs:
            base = [
                *([f"experiment={run.experiment}"] if run.experiment else []),
                *run.overrides,
                *extra,
                *data,
            ]
            module_cfg = compose_cfg(base).model.module
            sized = protocol.size_key.rsplit(".", 1)[-1] in module_cfg  # support points: one run per set size
            if sized:
                sp_cfgs.setdefault(float(module_cfg.p), module_cfg)
            for eps, n, seed in itertools.product(
                protocol.budgets, sizes if sized else (None,), range(seeds)
            ):
                cfg = compose_cfg(
                    [
                        *base,
                        f"privacy.epsilon={eps:g}",
                        *([f"{protocol.size_key}={n}"] if sized else []),
                        f"seed={seed}",
                        "trainer.enable_progress_bar=false",
                        f"output_dir={out / f'run{trained:04d}'}",
                    ]
                )
                trained += 1
                train_and_score(cells, run.label, (eps, n), cfg, test_rows, protocol.target, log)
        add_references(cells, train_rows, test_rows, sizes, sp_cfgs, seeds, protocol)
    facts = {
        "sizes": sizes,
        "protocol": protocol,
        "runs": trained,
        "norms": sorted(sp_cfgs),
        "minutes": (time.perf_counter() - start) / 60,
        "rows": [len(t) for t, _ in folds],
        "held": [len(h) for _, h in folds],
    }
    return cells, facts


# ------------------------------------------------------------------------------------------- rendering
def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return float(q1), float(med), float(q3)


def fmt_cell(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    parts = []
    if cell.mse:
        q1, med, q3 = quartiles(cell.mse)
        parts.append(f"{med:,.0f} [{q1:,.0f}, {q3:,.0f}]")
    if cell.refused:
        parts.append(f"{cell.refused} refused")
    if cell.failed:
        parts.append(f"{len(cell.failed)} failed")
    return "; ".join(parts) or "–"


def compare(psp: Cell | None, baseline: Cell | None) -> str | None:
    """``better`` when PSP's IQR lies wholly below the baseline's, ``worse`` wholly above, else ``on par``."""
    if psp is None or baseline is None or not psp.mse or not baseline.mse:
        return None
    p1, _, p3 = quartiles(psp.mse)
    b1, _, b3 = quartiles(baseline.mse)
    return "better" if p3 < b1 else "worse" if p1 > b3 else "on par"


def command_of(run: Any, extra: list[str], protocol: Protocol) -> list[str]:
    """The overrides of a run as the table states them (ε and n as symbols)."""
    sized = run.paper == "private support points"
    return [
        *([f"experiment={run.experiment}"] if run.experiment else []),
        *(o for o in (*run.overrides, *extra) if not o.startswith("privacy.epsilon=")),  # set per budget
        "privacy.epsilon=ε",
        *([f"{protocol.size_key}=n"] if sized else []),
    ]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def section(
    table: Any,
    *,
    seeds: int,
    quick: bool,
    extra: list[str],
    out: Path,
    command: str,
    code: str,
    log: Callable[[str], None] = print,
) -> str:
    """Run a regression table and return its Markdown section."""
    import platform

    cells, facts = collect(table, seeds=seeds, quick=quick, extra=extra, out=out, log=log)
    protocol, sizes = facts["protocol"], facts["sizes"]
    histogram = next((r.label for r in table.runs if r.paper == "perturbed histogram"), None)
    psp = [r.label for r in table.runs if r.paper == "private support points"]
    header = ["method", "ε (target)", "ε spent", *(f"n = {n}: MSE median [IQR]" for n in sizes)]
    rows = []

    def spent(key_cells: list[Cell | None]) -> str:
        eps = [e for c in key_cells if c for e in c.epsilon]
        return f"{max(eps):.4g}" if eps else "–"

    for label in ("Real training rows",):
        value = fmt_cell(cells.get((label, None, None)))
        rows.append([label, "non-private", "–", *([value] + ["same"] * (len(sizes) - 1))])
    references = [
        *(f"Support points Y*, ℓ{p:g} (non-private)" for p in facts["norms"]),
        "Random subset of n rows (non-private)",
    ]
    for label in references:
        if any((label, None, n) in cells for n in sizes):
            rows.append([label, "non-private", "–", *(fmt_cell(cells.get((label, None, n))) for n in sizes)])
    labels = [*(x for r in psp for x in (r, f"{r} + KDE")), *([histogram] if histogram else [])]
    for eps in protocol.budgets:
        for label in labels:
            if label == histogram:
                c = cells.get((label, eps, None))
                rows.append([label, f"{eps:g}", spent([c]), *([fmt_cell(c)] + ["same"] * (len(sizes) - 1))])
            elif any((label, eps, n) in cells for n in sizes):
                cs = [cells.get((label, eps, n)) for n in sizes]
                rows.append([label, f"{eps:g}", spent(cs), *(fmt_cell(c) for c in cs)])
    verdicts = []
    for label in psp:
        tally = {"better": 0, "on par": 0, "worse": 0}
        for eps in protocol.budgets:
            for n in sizes:
                v = compare(cells.get((label, eps, n)), cells.get((histogram, eps, None)))
                if v:
                    tally[v] += 1
        verdicts.append(
            [label, f"{tally['better']} / {tally['on par']} / {tally['worse']}", str(sum(tally.values()))]
        )
    paper = table.paper.get("private support points", {})
    if paper:
        verdicts.append(
            [
                "thesis: private support points (Boston, Diabetes, California)",
                f"{paper['better']} / {paper['on_par']} / {paper['worse']}",
                str(paper["settings"]),
            ]
        )
    rhats = [r for key, c in cells.items() if key[0] in psp for r in c.rhat if math.isfinite(r)]
    refused = sum(c.refused for key, c in cells.items() if key[0] in psp)
    mode = " (quick)" if quick else ""
    eps_paper = "/".join(f"{e:g}" for e in np.atleast_1d(table.privacy[0]))
    lines = [
        f"## {table.name}: {table.title}{mode}",
        "",
        f"`{command}`  ",
        f"{protocol.folds}-fold CV (public shuffle, seed {protocol.fold_seed}), {seeds} release(s) per fold and "
        f"setting; {date.today().isoformat()}; {facts['minutes']:.1f} min wall-clock for {facts['runs']} runs on "
        f"{platform.machine()} CPU ({torch.get_num_threads()} torch thread(s)); privacy noise from OS entropy, so "
        "re-runs differ within the IQRs below.",
        "",
        f"Thesis: {table.source}, at α = {eps_paper}.  ",
        f"Data: scikit-learn's {protocol.data}, {sum(facts['held'])} rows; training folds of "
        f"{min(facts['rows'])}–{max(facts['rows'])} rows, held-out folds of {min(facts['held'])}–"
        f"{max(facts['held'])}.  ",
        f"Code: {code} (at the end of the table's runs).  ",
        "Runs: "
        + "; ".join(f"{r.label}: `{' '.join(command_of(r, extra, protocol))}`" for r in table.runs)
        + ".",
        "",
        f"MSE of a linear regression of `{protocol.target}` (original units) trained on each method's rows and "
        'tested on the real held-out fold: median [Q1, Q3] over folds × releases. "+ KDE": the run\'s expanded '
        "synthetic rows instead of its n released points. The histogram does not depend on n.",
        "",
        markdown_table(header, rows),
        "",
        "PSP against the perturbed histogram, per (ε, n): better = PSP's IQR wholly below the histogram's, worse = "
        "wholly above, else on par.",
        "",
        markdown_table(["method", "better / on par / worse", "settings"], verdicts),
        "",
        f"MH chains: R̂ median {np.median(rhats):.3f}, max {max(rhats):.3f} over {len(rhats)} released sets; "
        f"{sum(r > 1.1 for r in rhats)} with R̂ > 1.1 (released all the same; R̂ is private)"
        + (f"; {refused} refused by an older pipeline." if refused else ".")
        if rhats
        else "MH chains: no released set.",
        "",
        "Notes:",
        "",
        *(f"- {n}" for n in table.notes),
        *(f"- Not reproduced: {m}" for m in table.missing),
    ]
    return "\n".join(lines) + "\n"
