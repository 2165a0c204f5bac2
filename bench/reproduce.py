"""Re-run the papers' headline tables on the data we have, at the papers' (ε, δ), ours beside theirs.

    python bench/reproduce.py --list
    python bench/reproduce.py --table dp_merf_adult [--seeds 3] [--quick] [--write docs/results.md]
    python bench/reproduce.py --table all --write docs/results.md
    python bench/reproduce.py --table dp_merf_adult --validate --seeds 1 --set model.module.num_features=2000

The tables, the papers' numbers and the protocol differences are in ``bench/paper_tables.yaml``. For each
table and seed, every generator is trained with ``train(cfg)`` from ``configs/experiment/<name>.yaml`` into a
temporary folder. Tabular tables are scored train-on-synthetic/test-on-real with
``audits.utility.tstr_over_seeds`` (ROC/PRC from hard predictions, the papers' protocol, and from scores;
the average over classifiers per seed, then mean ± std over seeds), image tables with
``audits.fidelity.image_fidelity`` (accuracy of classifiers trained on synthetic digits, FID/KID on a small
CNN's features). The real-data row fits the same classifiers on the real training split (once, seed 0).

``--write FILE`` replaces this table's section of FILE (other sections are kept) and records the exact
command. ``--validate`` carves a validation split (20%, fixed seed) out of the real *training* split, trains
on the rest and scores on it, so that hyperparameters are chosen without the test set (DP-MERF pitfall 12);
``--set`` adds Hydra overrides to every run of the table and ``--only LABEL`` keeps only those runs.
``--quick`` fits 6 fast classifiers and one seed.

A table with a ``bench:`` entry runs its own experiment: ``bench/<script>.py`` (``bench.script``) trains, scores
and renders the section with ``section(table, *, seeds, quick, extra, out, command, code, log)``, e.g.
``iw_mmd_synthetic`` (``bench/iw_mmd.py``: the thesis' Ch. 3 synthetic GMMNs, shorter in ``--quick``) and
``mmd_gan_ae_ehr`` (``bench/mmd_gan_ae.py``: ``train.py`` then ``python -m audits`` per data set and seed) and
``support_points_diabetes`` (``bench/regression_cv.py``: 5-fold CV of a linear regression on each generator's rows).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from threadpoolctl import threadpool_limits

from audits.utility import PRESETS, tstr, tstr_over_seeds
from lightning_dp.data.canonical import canonical_frame
from lightning_dp.data.datamodule import PrivateDataModule, decode_samples
from lightning_dp.data.sources import load_source
from lightning_dp.data.splits import holdout_mask
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "bench" / "paper_tables.yaml"
QUICK_CLASSIFIERS = [
    "logistic_regression",
    "gaussian_nb",
    "bernoulli_nb",
    "linear_svm",
    "decision_tree",
    "lda",
]
VALIDATION_FRACTION, VALIDATION_SEED = 0.2, 12345
LABELS = {  # our metric keys -> column titles
    "roc_auc_hard": "ROC (hard)",
    "prc_hard": "PRC (hard)",
    "roc_auc": "ROC (score)",
    "prc": "PRC (score)",
    "prc_hard_at_paper_prevalence": "PRC (hard) at the paper's test prevalence†",
    "acc_logistic_regression": "Accuracy (LR)",
    "acc_cnn": "Accuracy (CNN)",
    "f1_logistic_regression": "Macro F1 (LR)",
    "f1_cnn": "Macro F1 (CNN)",
    "fid": "FID (our CNN)",
    "kid": "KID ×10³ (our CNN)",
}


# ------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Run:
    """A generator trained for a table: ``train(cfg)`` with ``experiment=<experiment>`` plus overrides."""

    label: str
    experiment: str | None
    paper: str | None = None
    overrides: tuple[str, ...] = ()
    weights: str | None = None  # "discriminator": TSTR with the DP-GAN discriminator's importance weights

    @property
    def train_key(self) -> tuple:
        return (self.experiment, self.overrides)


@dataclass
class Table:
    """One of the papers' tables: what we run, the paper's numbers and how to compare them."""

    name: str
    title: str
    source: str
    kind: str
    privacy: list
    runs: list[Run]
    paper: dict[str, dict[str, float]]
    compare: list[tuple[str, str, str]]
    extra: list[str] = field(default_factory=list)
    fit: str | list[str] = "dp_merf"
    average: str | list[str] = "dp_merf"
    seeds: int = 3
    paper_prevalence: float | None = None
    fidelity: list[tuple[str, str, str]] = field(default_factory=list)
    per_classifier: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    per_classifier_metrics: list[str] = field(default_factory=lambda: ["roc_auc_hard", "prc_hard"])
    per_classifier_title: str = ""
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    bench: dict[str, Any] = field(default_factory=dict)  # {script: bench/<script>.py with section(), its settings}


def load_tables(path: Path = REGISTRY) -> dict[str, Table]:
    """The registry of tables, by name."""
    raw = yaml.safe_load(path.read_text())["tables"]
    tables = {}
    for name, spec in raw.items():
        runs = [Run(**{**r, "overrides": tuple(r.get("overrides", ()))}) for r in spec.pop("runs")]
        spec["compare"] = [tuple(c) for c in spec["compare"]]
        spec["fidelity"] = [tuple(c) for c in spec.get("fidelity", [])]
        tables[name] = Table(name=name, runs=runs, **spec)
    return tables


def bench_script(script: str) -> Any:
    """``bench/<script>.py`` of a table with a ``bench`` entry: it runs its own experiment and renders the section
    with ``section(table, *, seeds, quick, extra, out, command, code, log)``."""
    name = f"bench_{script}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{script}.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def names_of(preset: str | list[str]) -> list[str]:
    return list(PRESETS[preset]) if isinstance(preset, str) else list(preset)


# ------------------------------------------------------------------------------------------- data
@dataclass
class RealData:
    """The real training and test data of a run's config (tabular frames or image arrays)."""

    kind: str
    train: Any
    test: Any
    label: str | None = None
    categorical: list[str] | None = None
    train_labels: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    description: str = ""


def real_data(cfg: DictConfig) -> RealData:
    """Load the real splits the run trained on. Only for scoring; the throwaway ledger is never released."""
    dm = PrivateDataModule(**cfg.data)
    dm.prepare(PrivacyLedger(target_epsilon=1e6, delta=1e-5), generator=mech.noise_generator(0), private_use=True)
    if dm.kind == "image":
        images, labels = dm.holdout
        train = dm.x.numpy().reshape(-1, *dm.image_shape)
        return RealData(
            "image",
            train,
            images,
            train_labels=dm.y.numpy(),
            test_labels=labels,
            description=f"{len(train):,} real training images, {len(images):,} real test images",
        )
    schema = dm.encoder.schema
    cats = [c.name for c in schema.features if c.type == "categorical"]
    test = dm.holdout
    pos = sorted(test[schema.label].astype(str).unique())[-1]
    rate = (test[schema.label].astype(str) == pos).mean()
    return RealData(
        "tabular",
        dm.train_frame,
        test,
        label=schema.label,
        categorical=cats,
        description=f"{len(dm.train_frame):,} real training rows, {len(test):,} real test rows "
        f"({rate:.1%} `{pos}`)",
    )


def validation_overrides(cfg: DictConfig, folder: Path) -> list[str]:
    """Overrides that train on 80% of the real training split and test on the other 20% (CSV files).

    The test split of the data set is never read: the carve comes from the rows the data module would
    train on (its own holdout split first, for data sets without a test file).
    """
    data = cfg.data
    source = load_source(data.name, root=data.root)
    train = source.train
    if source.test is None:
        canonical = canonical_frame(train, source.schema)  # the data module's split, on canonical values
        held = holdout_mask(canonical, fraction=data.holdout_fraction, seed=data.split_seed)
        train = train[~held]
    perm = np.random.default_rng(VALIDATION_SEED).permutation(len(train))
    n_val = int(round(VALIDATION_FRACTION * len(train)))
    folder.mkdir(parents=True, exist_ok=True)
    fit, val = folder / "fit.csv", folder / "validation.csv"
    train.iloc[np.sort(perm[n_val:])].to_csv(fit, index=False)
    train.iloc[np.sort(perm[:n_val])].to_csv(val, index=False)
    schema = resources.files("lightning_dp.data").joinpath(f"schemas/{data.name}.yaml")
    return ["data.name=csv", f"+data.path={fit}", f"+data.test_path={val}", f"+data.schema={schema}"]


# ------------------------------------------------------------------------------------------- runner
def compose_cfg(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


class Runner:
    """Trains and scores the runs of tables, caching both so that tables sharing a run train it once."""

    def __init__(
        self,
        out: Path,
        *,
        quick: bool = False,
        validate: bool = False,
        extra: list[str] | None = None,
        log=print,
    ) -> None:
        self.out, self.quick, self.validate, self.extra, self.log = (
            out,
            quick,
            validate,
            list(extra or []),
            log,
        )
        self.trained: dict[tuple, dict[str, Any]] = {}
        self.scored: dict[tuple, dict[str, Any]] = {}
        self.reals: dict[str, tuple[RealData, dict[str, Any]]] = {}
        self.failed: dict[tuple[str, str], str] = {}  # (table, run label) -> why

    def overrides(self, run: Run, seed: int) -> list[str]:
        base = [f"experiment={run.experiment}"] if run.experiment else []
        base += [*run.overrides, *self.extra]
        if self.validate:
            base += validation_overrides(
                compose_cfg(base), self.out / "validation" / (run.experiment or "run")
            )
        return [*base, f"seed={seed}", "trainer.enable_progress_bar=false"]

    def train(self, run: Run, seed: int) -> dict[str, Any]:
        key = (*run.train_key, seed)
        if key not in self.trained:
            from lightning_dp.train import train

            folder = self.out / f"run{len(self.trained):03d}_{run.experiment or 'custom'}_seed{seed}"
            cfg = compose_cfg([*self.overrides(run, seed), f"output_dir={folder}"])
            start = time.perf_counter()
            result = train(cfg)
            result["cfg"], result["seconds"] = cfg, time.perf_counter() - start
            self.log(
                f"  trained {run.label} (seed {seed}) in {result['seconds']:.0f} s, ε = {result['epsilon']:.4f}"
            )
            self.trained[key] = result
        return self.trained[key]

    def real(self, cfg: DictConfig, table: Table) -> tuple[RealData, dict[str, Any]]:
        """The real splits and the real-data reference scores (once per data config and classifiers)."""
        key = OmegaConf.to_yaml(cfg.data) + str(self.classifiers(table))
        if key not in self.reals:
            data = real_data(cfg)
            start = time.perf_counter()
            if data.kind == "tabular":
                res = tstr(
                    data.train,
                    data.test,
                    label=data.label,
                    classifiers=self.classifiers(table),
                    categorical=data.categorical,
                    seed=0,
                )
                ref = {"per_seed": res.table.reset_index().assign(seed=0)}
            else:
                ref = {}  # image references come with each image_fidelity call
            self.log(f"  real-data reference in {time.perf_counter() - start:.0f} s")
            self.reals[key] = (data, ref)
        return self.reals[key]

    def classifiers(self, table: Table) -> list[str]:
        names = names_of(table.fit)
        if not self.quick:
            return names
        return [n for n in names if n in QUICK_CLASSIFIERS] or names[:2]

    def score(self, table: Table, run: Run, seeds: list[int]) -> dict[str, Any]:
        """Scores of a run over seeds: per-seed TSTR tables (tabular) or image metrics."""
        key = (*run.train_key, run.weights, tuple(seeds), tuple(self.classifiers(table)))
        results = {s: self.train(run, s) for s in seeds}
        data, _ = self.real(results[seeds[0]]["cfg"], table)
        if key not in self.scored:
            start = time.perf_counter()
            out: dict[str, Any] = {
                "epsilon": [r["epsilon"] for r in results.values()],
                "delta": results[seeds[0]]["delta"],
            }
            if data.kind == "tabular":
                out |= score_tabular(data, results, run, self.classifiers(table))
            else:
                out |= score_images(data, results)
            self.log(f"  scored {run.label} in {time.perf_counter() - start:.0f} s")
            self.scored[key] = out
        if table.fidelity and "fidelity" not in self.scored[key]:
            self.scored[key]["fidelity"] = fidelity_tabular(data, results)
        return self.scored[key]


def score_tabular(
    data: RealData, results: dict[int, dict[str, Any]], run: Run, classifiers: list[str]
) -> dict:
    common = {"label": data.label, "classifiers": classifiers, "categorical": data.categorical}
    if run.weights is None:
        synthetic = {s: pd.read_csv(r["synthetic"]) for s, r in results.items()}
        per_seed = tstr_over_seeds(synthetic, data.test, **common).per_seed
        return {"per_seed": constant_predictions(per_seed, synthetic, data)}
    if run.weights != "discriminator":
        raise ValueError(f"Unknown weights {run.weights!r}; valid: discriminator")
    tables, frames = [], {}
    for seed, result in results.items():
        frames[seed], weights = discriminator_weighted_sample(result["checkpoint"], len(data.train), seed)
        res = tstr(frames[seed], data.test, seed=seed, sample_weight=weights, **common)
        tables.append(res.table.reset_index().assign(seed=seed))
    return {"per_seed": constant_predictions(pd.concat(tables, ignore_index=True), frames, data)}


def constant_predictions(
    per_seed: pd.DataFrame, synthetic: dict[int, pd.DataFrame], data: RealData
) -> pd.DataFrame:
    """Score seeds whose synthetic rows have a single class as what any classifier fitted on them is: a constant.

    scikit-learn refuses to fit one class (``tstr`` then gives NaN); leaving those seeds out would average only
    the lucky seeds. A constant prediction has ROC 0.5 (hard and score) and average precision equal to the
    test prevalence π (hard and score); its accuracy is π or 1 − π. Such rows get ``single_class = True``.
    """
    labels = data.test[data.label].astype(str)
    pos = sorted(labels.unique())[-1]
    rate = float((labels == pos).mean())
    per_seed = per_seed.assign(single_class=False)
    for seed, frame in synthetic.items():
        classes = frame[data.label].dropna().astype(str).unique()
        if len(classes) > 1:
            continue
        rows = per_seed["seed"] == seed
        accuracy = rate if len(classes) and classes[0] == pos else 1 - rate
        values = {"roc_auc_hard": 0.5, "roc_auc": 0.5, "prc_hard": rate, "prc": rate, "accuracy": accuracy}
        per_seed.loc[rows, list(values)] = list(values.values())
        per_seed.loc[rows, "single_class"] = True
    return per_seed


def discriminator_weighted_sample(checkpoint: str, n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """``n`` rows of a DP-GAN checkpoint with importance weights ``w = D/(1 − D)`` (bias mitigation §2.8).

    With as many synthetic as real rows in the discriminator's training (N_G = N_D) the prior term is 0,
    so ``log w`` is the discriminator's logit. Weights are normalised to mean 1. Post-processing only.
    """
    from lightning_dp.checkpoint import load_run

    run = load_run(checkpoint)
    model = run.model
    model.eval()
    x, y = model.sample(n, seed=seed)
    with torch.no_grad():
        joined, y_in = model._join(x, y)  # what the discriminator saw (label block for DP-GAN)
        logit = model.discriminator(joined, y_in).double()  # (n,)
    weights = torch.softmax(logit, 0).numpy() * n  # exp(logit) normalised to mean 1
    return decode_samples(run.data_state, x, y), weights


def fidelity_tabular(data: RealData, results: dict[int, dict[str, Any]]) -> dict[str, list[float]]:
    """PEARL App. I.1 metrics of each seed's synthetic rows against the real test split."""
    from audits.fidelity import tabular_fidelity

    out: dict[str, list[float]] = {"range_query": [], "two_way_marginal": [], "mmd2": []}
    for seed, result in results.items():
        f = tabular_fidelity(
            data.test,
            pd.read_csv(result["synthetic"])[list(data.test.columns)],
            categorical=[*data.categorical, data.label],
            seed=seed,
        )
        out["range_query"].append(f["range_query"]["mean_abs_error"])
        out["two_way_marginal"].append(f["two_way_marginal"]["mean"])
        out["mmd2"].append(f["mmd"]["mmd2"])
    return out


def score_images(data: RealData, results: dict[int, dict[str, Any]]) -> dict:
    from audits.fidelity import image_fidelity

    rows, real, floor = [], {}, {}
    for seed, result in results.items():
        with np.load(result["synthetic"]) as z:
            images, labels = z["images"], z["labels"]
        f = image_fidelity(
            data.train,
            data.test,
            images,
            real_train_labels=data.train_labels,
            synthetic_labels=labels,
            real_test_labels=data.test_labels,
            seed=seed,
        )
        row = {"seed": seed, "fid": f["fid"], "kid": 1e3 * f["kid_mean"]}
        for kind, s in f["downstream"].items():
            row |= {f"acc_{kind}": s["accuracy"], f"f1_{kind}": s["f1_macro"]}
            real.setdefault(f"acc_{kind}", []).append(s["real_accuracy"])
            real.setdefault(f"f1_{kind}", []).append(s["real_f1_macro"])
        floor.setdefault("fid", []).append(f["reference"]["fid"])
        floor.setdefault("kid", []).append(1e3 * f["reference"]["kid_mean"])
        rows.append(row)
    return {"images": pd.DataFrame(rows), "real_images": real | floor}


# ------------------------------------------------------------------------------------------- summaries
def with_paper_prevalence(per_seed: pd.DataFrame, test_rate: float, paper_rate: float | None) -> pd.DataFrame:
    """Add PRC (hard) at the paper's test prevalence, derived per model from ROC (hard) and accuracy.

    For hard predictions ROC = (1 + TPR − FPR)/2 and accuracy = π·TPR + (1 − π)(1 − FPR) on our test set
    (prevalence π), which give TPR and FPR; average precision of hard predictions is
    TPR·precision + (1 − TPR)·π', with precision = π'TPR / (π'TPR + (1 − π')FPR) at the paper's π'. This is
    the expected value on our test set with negatives (or positives) randomly undersampled to π'.
    """
    if paper_rate is None or "accuracy" not in per_seed:
        return per_seed
    j = 2 * per_seed["roc_auc_hard"] - 1  # TPR − FPR
    tpr = ((per_seed["accuracy"] - (1 - test_rate) * (1 + j)) / (2 * test_rate - 1)).clip(0, 1)
    fpr = (tpr - j).clip(0, 1)
    p = paper_rate
    predicted = p * tpr + (1 - p) * fpr
    precision = np.where(predicted > 0, p * tpr / predicted.where(predicted > 0, 1), 0.0)
    return per_seed.assign(prc_hard_at_paper_prevalence=tpr * precision + (1 - tpr) * p)


def seed_averages(per_seed: pd.DataFrame, models: list[str], metrics: list[str]) -> dict[str, list[float]]:
    """Per seed, the nan-mean over ``models`` of each metric (the papers' per-run average over classifiers)."""
    rows = per_seed[per_seed["model"].isin(models)]
    by_seed = rows.groupby("seed")[[m for m in metrics if m in rows]].mean()
    return {m: by_seed[m].tolist() for m in by_seed}


def fmt(values: list[float] | float | None, digits: int = 3) -> str:
    if values is None:
        return "–"
    vals = [v for v in np.atleast_1d(values).astype(float) if np.isfinite(v)]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}g}" if abs(vals[0]) < 1e-2 else f"{vals[0]:.{digits}f}"
    mean, std = float(np.mean(vals)), float(np.std(vals))
    if abs(mean) < 1e-2:
        return f"{mean:.2g} ± {std:.1g}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_delta(delta: float) -> str:
    return f"{delta:g}".replace("e-0", "e-")


def paper_value(table: Table, row: str | None, metric: str) -> tuple[float | None, bool]:
    """The paper's value, or the mean of its per-classifier values (flagged as computed here)."""
    if row is None:
        return None, False
    value = table.paper.get(row, {}).get(metric)
    if value is not None:
        return value, False
    per = table.per_classifier.get(row)
    keys = {"roc": 0, "prc": 1}
    if per and metric in keys and all(len(v) > keys[metric] for v in per.values()):
        return float(np.mean([v[keys[metric]] for v in per.values()])), True
    return None, False


# ------------------------------------------------------------------------------------------- rendering
def code_version() -> str:
    """The commit, and the files under lightning_dp/, audits/ and configs/ that differ from it."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        status = subprocess.run(
            [*git, "status", "--porcelain", "--", "lightning_dp", "audits", "configs"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    return f"`{head.stdout.strip()}`" + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def render(table: Table, runner: Runner, seeds: list[int], *, command: str, seconds: float) -> str:
    """The table's Markdown section: ours (mean ± std over seeds) beside the paper's numbers."""
    failed = {
        run.label: runner.failed[(table.name, run.label)]
        for run in table.runs
        if (table.name, run.label) in runner.failed
    }
    scores = {run.label: runner.score(table, run, seeds) for run in table.runs if run.label not in failed}
    data, ref = runner.real(compose_cfg(runner.overrides(table.runs[0], seeds[0])), table)
    fitted = set(ref["per_seed"]["model"]) if data.kind == "tabular" else set()
    models = [
        m for m in names_of(table.average) if m in fitted
    ]  # what was averaged (missing libraries skipped)
    test_rate = paper_rate = None
    metrics = [c[0] for c in table.compare] + table.extra
    if data.kind == "tabular":
        pos = sorted(data.test[data.label].astype(str).unique())[-1]
        test_rate, paper_rate = (
            float((data.test[data.label].astype(str) == pos).mean()),
            table.paper_prevalence,
        )
        if runner.validate:
            paper_rate = None
        metrics = [m for m in metrics if m != "prc_hard_at_paper_prevalence" or paper_rate is not None]

    def ours(score: dict[str, Any]) -> dict[str, list[float]]:
        if data.kind == "image":
            return {m: score["images"][m].tolist() for m in metrics if m in score["images"]}
        return seed_averages(with_paper_prevalence(score["per_seed"], test_rate, paper_rate), models, metrics)

    titles = {c[0]: c[2] for c in table.compare}
    header = ["method", "(ε, δ) spent"]
    for m in metrics:
        header += [f"{titles[m]}: ours", "paper"] if m in titles else [LABELS.get(m, m)]
    computed = False

    def row(label: str, values: dict[str, list[float]], paper_row: str | None, privacy: str) -> list[str]:
        nonlocal computed
        cells = [label, privacy]
        for m in metrics:
            cells.append(fmt(values.get(m)))
            for c in table.compare:
                if c[0] == m:
                    value, derived = paper_value(table, paper_row, c[1])
                    computed |= derived
                    cells.append("–" if value is None else f"{value:.3f}*" if derived else f"{value:g}")
        return cells

    if data.kind == "tabular":
        real_values = seed_averages(
            with_paper_prevalence(ref["per_seed"], test_rate, paper_rate), models, metrics
        )
    else:
        real_values = next((s["real_images"] for s in scores.values()), {})
    rows = [row("Real data (reference)", real_values, "Real" if "Real" in table.paper else None, "–")]
    for run in table.runs:
        if run.label in failed:
            rows.append(row(f"{run.label} — not run: {failed[run.label]}", {}, run.paper, "–"))
            continue
        s = scores[run.label]
        spent = f"({fmt(max(s['epsilon']), 3)}, {fmt_delta(s['delta'])})"
        rows.append(row(run.label, ours(s), run.paper, spent))
    paper_rows = [r for r in table.paper if r != "Real" and r not in {run.paper for run in table.runs}]
    for r in paper_rows:
        rows.append(row(f"{r} (paper only, not run)", {}, r, "–"))

    mode = " (validation split)" if runner.validate else (" (quick)" if runner.quick else "")
    privacy = table.privacy
    eps = "/".join(f"{e:g}" for e in np.atleast_1d(privacy[0]))
    lines = [
        f"## {table.name}: {table.title}{mode}",
        "",
        f"`{command}`  ",
        f"{len(seeds)} seed(s) ({', '.join(map(str, seeds))}); {date.today().isoformat()}; "
        f"{seconds / 60:.1f} min wall-clock on {platform.machine()} CPU ({torch.get_num_threads()} torch "
        "thread(s)); privacy noise from OS entropy, so re-runs differ within the ± below.",
        "",
        f"Paper: {table.source}, at (ε, δ) = ({eps}, {fmt_delta(privacy[1])}).  ",
        f"Data: {data.description}.  ",
        f"Code: {code_version()} (at the end of the table's runs).  ",
    ]
    if data.kind == "tabular":
        n_fit = len(runner.classifiers(table))
        lines.append(
            f"Classifiers: {', '.join(models)} ({len(models)} averaged"
            + (f"; {n_fit} fitted)" if n_fit != len(models) else ")")
            + (
                "; quick mode: a subset of the paper's classifiers, not comparable with its average"
                if runner.quick
                else ""
            )
            + ".  "
        )
        skipped = [m for m in runner.classifiers(table) if m not in set(ref["per_seed"]["model"])]
        if skipped:
            lines.append(f"Not fitted: {', '.join(skipped)} (library not installed).  ")
    lines.append(
        "Runs: "
        + "; ".join(
            f"{r.label}: `" + (f"experiment={r.experiment}" if r.experiment else "the default config")
            + "".join(f" {o}" for o in r.overrides)
            + "".join(f" {o}" for o in runner.extra)
            + "`"
            + (f", {r.weights} weights" if r.weights else "")
            for r in table.runs
        )
        + "."
    )
    lines += ["", markdown_table(header, rows), ""]
    if paper_rate is not None and "prc_hard_at_paper_prevalence" in metrics:
        lines.append(
            f"† Our test set is {test_rate:.1%} positive, the paper's {paper_rate:.1%}; derived from each "
            "classifier's hard TPR/FPR (`with_paper_prevalence`), the expected PRC on our test set "
            "undersampled to the paper's prevalence.  "
        )
    if computed:
        lines.append("\\* The paper gives no average: the mean of its per-classifier values.  ")
    for run in (r for r in table.runs if r.label in scores and "per_seed" in scores[r.label]):
        single = scores[run.label]["per_seed"].groupby("seed")["single_class"].any()
        if single.any():
            lines.append(
                f"{run.label}: {int(single.sum())} of {len(single)} seeds sampled a single class (the released "
                "count of the other class was ≤ 0), so no classifier can be fitted; they are scored as constant "
                "predictions (ROC 0.5, PRC = test prevalence), see `constant_predictions`.  "
            )
    if data.kind == "tabular":
        lines.append(
            "Mean ± std over seeds of each seed's average over the classifiers; the real row is one fit "
            "(seed 0). Hard = scored from `predict` (the papers' protocol); score = `predict_proba` / "
            "`decision_function`."
        )
    else:
        lines.append(
            "Mean ± std over seeds. Real row: classifiers trained on the real training images; FID/KID "
            "of the real row: two halves of the real test images (a noise floor)."
        )
    if table.fidelity:
        lines += ["", "Fidelity (PEARL Table 3; lower is better):", ""]
        head = ["method"] + [x for c in table.fidelity for x in (f"{c[2]}: ours", "paper")]
        frows = []
        for run in (r for r in table.runs if r.label in scores):
            f = scores[run.label].get("fidelity", {})
            cells = [run.label]
            for ours_key, paper_key, _ in table.fidelity:
                value = table.paper.get(run.paper, {}).get(paper_key)
                cells += [fmt(f.get(ours_key)), "–" if value is None else f"{value:g}"]
            frows.append(cells)
        lines.append(markdown_table(head, frows))
    if table.per_classifier:
        lines += ["", per_classifier_block(table, runner, scores, ref, test_rate, models)]
    if runner.validate:
        lines += [
            "",
            "Validation split: 20% of the real training rows (seed 12345) held out as the test set; "
            "the generator and the real row were fitted on the other 80%. The test split was not read. "
            "The paper column is for orientation only.",
        ]
    else:
        lines += ["", "Notes:", "", *(f"- {n}" for n in table.notes)]
        lines += [f"- Not reproduced: {m}" for m in table.missing]
    return "\n".join(lines) + "\n"


def per_classifier_block(
    table: Table,
    runner: Runner,
    scores: dict[str, Any],
    ref: dict[str, Any],
    test_rate: float | None,
    models: list[str],
) -> str:
    """Per classifier: ours (mean ± std over seeds) beside the paper's per-classifier values."""
    metrics = table.per_classifier_metrics
    sources = {"Real": ("Real data", ref["per_seed"])}
    for run in (r for r in table.runs if r.label in scores):
        if run.paper in table.per_classifier:
            sources[run.paper] = (run.label, scores[run.label]["per_seed"])
    parts = [f"Per classifier, vs {table.per_classifier_title}:"]
    for i, metric in enumerate(metrics):
        header = ["classifier"]
        cols = [(r, lab, ps) for r, (lab, ps) in sources.items() if r in table.per_classifier]
        for _, label, _ in cols:
            header += [f"{label}: ours", "paper"]
        rows = []
        names = list(next(iter(table.per_classifier.values())))
        for name in [*names, "average"]:
            cells = [name]
            for paper_row, _, per_seed in cols:
                if name == "average":
                    vals = seed_averages(per_seed, [n for n in names if n in models], [metric]).get(metric)
                    paper = np.mean([v[i] for v in table.per_classifier[paper_row].values()])
                else:
                    sel = per_seed[per_seed["model"] == name]
                    vals = sel[metric].tolist() if len(sel) else None
                    paper = table.per_classifier[paper_row].get(name, [None] * (i + 1))[i]
                cells += [fmt(vals), "–" if paper is None else f"{paper:.3f}"]
            rows.append(cells)
        parts += ["", f"{LABELS.get(metric, metric)}:", "", markdown_table(header, rows)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------- results file
HEADER = """# Reproduction of the papers' headline tables

Generated by `bench/reproduce.py` from the registry `bench/paper_tables.yaml`; **do not edit by hand**. Each
section below names the exact command that produced it; re-running that command replaces the section.
Numbers are ours (mean ± std over seeds) beside the paper's, at the paper's (ε, δ) on the data we have
(`../shared/data`: UCI Adult, UCI Cervical cancer, the MNIST test split; scikit-learn's breast cancer).

Common differences from the papers: our accountant composes in Rényi DP and converts with Balle et al. (2020),
tighter than the papers' conversions, so the same ε buys less noise; bandwidths and schema facts that are not
public are released with DP and charged to the same budget (the papers' code computed them non-privately);
runs are shorter than the papers' where the experiment configs say so (2 shared CPU cores). Hyperparameters
were fixed a priori or chosen on a validation split carved from the real training data (the sections marked
"validation split"), never on the test set.
"""
SECTION = re.compile(r"<!-- section:(?P<key>[^ ]+) -->\n(?P<body>.*?)<!-- /section:(?P=key) -->\n?", re.S)


def write_results(path: Path, sections: dict[str, str], order: list[str]) -> None:
    """Replace or add ``sections`` in the results file, keeping the others; registry order, then the rest."""
    old = {m["key"]: m["body"] for m in SECTION.finditer(path.read_text())} if path.exists() else {}
    old.pop("header", None)
    merged = old | sections
    keys = [k for k in order if k in merged] + sorted(k for k in merged if k not in order)
    parts = [f"<!-- section:header -->\n{HEADER}<!-- /section:header -->\n"]
    parts += [f"\n<!-- section:{k} -->\n{merged[k]}<!-- /section:{k} -->\n" for k in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(parts))
    tmp.replace(path)


def section_key(table: str, validate: bool, extra: list[str], only: list[str] | None = None) -> str:
    parts = [
        table,
        *(["validation"] if validate else []),
        *(f"only={o}" for o in only or []),
        *(extra if validate else []),
    ]
    return "--".join(re.sub(r"[^\w.=-]", "_", p) for p in parts)


def reproduce(
    tables: list[Table],
    *,
    seeds: int | None,
    quick: bool,
    validate: bool,
    extra: list[str],
    out: Path,
    command: str,
    only: list[str] | None = None,
    log=print,
    on_section=None,
) -> dict[str, str]:
    """Run ``tables`` (only the runs labelled ``only``, if given) and return their Markdown sections by key;
    ``on_section(key, text)`` is called as each table is done (to write results as they come)."""
    runner = Runner(out, quick=quick, validate=validate, extra=extra, log=log)
    sections = {}
    for table in tables:
        if only:
            table = replace(table, runs=[r for r in table.runs if r.label in only])
        n = seeds or (1 if quick else table.seeds)
        log(f"== {table.name}: {table.title} ({n} seed(s))")
        start = time.perf_counter()
        if table.bench:  # a bench script's own experiment (no scored train(cfg) runs here)
            if validate:
                log(f"  {table.name}: --validate does not apply (no real test split is scored); skipped")
                continue
            text = bench_script(table.bench["script"]).section(
                table, seeds=n, quick=quick, extra=extra, out=out / table.name, command=command,
                code=code_version(), log=log)
            log("\n" + text)
            key = section_key(table.name, validate, extra, only)
            sections[key] = text
            if on_section is not None:
                on_section(key, text)
            continue
        for run in table.runs:
            try:
                runner.score(table, run, list(range(n)))
            except Exception as err:  # noqa: BLE001 - a run that fails is reported in its table, not fatal
                runner.failed[(table.name, run.label)] = f"{type(err).__name__}: {err}"
                log(f"  {run.label} failed: {type(err).__name__}: {err}")
        try:
            text = render(table, runner, list(range(n)), command=command, seconds=time.perf_counter() - start)
        except Exception as err:  # noqa: BLE001 - e.g. the data set is missing
            text = f"## {table.name}: {table.title}\n\n`{command}`  \nnot run: {type(err).__name__}: {err}\n"
        log("\n" + text)
        key = section_key(table.name, validate, extra, only)
        sections[key] = text
        if on_section is not None:
            on_section(key, text)
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", nargs="+", help="table name(s) from bench/paper_tables.yaml, or 'all'")
    parser.add_argument("--list", action="store_true", help="list the tables and exit")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default: the table's)")
    parser.add_argument("--quick", action="store_true", help="6 fast classifiers and 1 seed")
    parser.add_argument(
        "--validate", action="store_true", help="score on a validation split of the training data"
    )
    parser.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides for every run")
    parser.add_argument("--only", nargs="*", default=None, help="run only the runs with these labels")
    parser.add_argument(
        "--write", type=Path, default=None, help="results file to update (e.g. docs/results.md)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch and BLAS threads (1 suits a shared machine)"
    )
    args = parser.parse_args(argv)
    registry = load_tables()
    if args.list or not args.table:
        for name, t in registry.items():
            print(f"{name:<18} {t.title}  [{', '.join(r.label for r in t.runs)}]")
        return 0
    names = list(registry) if args.table == ["all"] else args.table
    unknown = [n for n in names if n not in registry]
    if unknown:
        parser.error(f"unknown table(s) {unknown}; valid: {', '.join(registry)}, all")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning_dp"):
        logging.getLogger(name).setLevel(logging.ERROR)
    command = "python bench/reproduce.py " + shlex.join(argv if argv is not None else sys.argv[1:])

    def write(key: str, text: str) -> None:
        if args.write:
            write_results(args.write, {key: text}, order=list(registry))
            print(f"wrote {key} to {args.write}", flush=True)

    with threadpool_limits(args.threads), tempfile.TemporaryDirectory() as tmp:
        reproduce(
            [registry[n] for n in names],
            seeds=args.seeds,
            quick=args.quick,
            validate=args.validate,
            extra=args.set,
            out=args.out or Path(tmp),
            command=command,
            only=args.only,
            on_section=write,
        )
    return 0


if __name__ == "__main__":
    from lightning_dp.budget import throwaway_registry

    throwaway_registry()  # many trainings on public benchmark data: never the user's budget registry
    sys.exit(main())
