"""Bias mitigation with DP importance weights: Ghalebikesabi et al., "Bias Mitigated Learning from Differentially
Private Synthetic Data: A Cautionary Tale" (main Table 1, Supp. Tables 2 and 6), three tables:

* ``bias_breast``: the project's DP-GAN on breast cancer at total ε = 6 (δ = 1e-5), every weighting scheme of the
  paper. ``none`` and ``discriminator`` share one run at ε = 6; each private estimator (``beta_noised``,
  ``output_lapl``, ``output_norm``, ``priv_mlp``) is its own ``train.py ... weights=NAME weights.epsilon=3`` run, so
  the GAN trains on what the RDP ledger leaves of ε = 6; ``logreg`` and ``mlp`` are non-private references fitted on
  the ε = 6 run's synthetic rows (``python -m lightning_dp.sample ... --allow-non-private-weights``). Every run
  weights with ``weights.psis=false`` (raw weights); the ``-p`` rows apply
  :func:`lightning_dp.weighting.postprocess.psis` to those raw weights afterwards (post-processing, free).
* ``bias_gmm``: the Gaussian-mixture toy (Sec. 4.1, Supp. Table 2): known DGP and SDGP densities, so the TRUE
  weights exist; the estimators are called directly on standalone ledgers (ε_w = 3).
* ``bias_adult``: DP-MERF and PEARL on Adult at total ε = 1, unweighted vs ``beta_noised`` / ``priv_mlp``
  weights at ε_w = 0.3 (the generator gets what the ledger leaves of ε = 1).

    python bench/reproduce.py --table bias_breast --write docs/results.md
    python bench/reproduce.py --table bias_gmm --write docs/results.md
    python bench/reproduce.py --table bias_adult --write docs/results.md

Trainings are ``train.py`` subprocesses (``bench.workers`` at a time, one torch thread each) into ``out``; a run
folder that already holds ``synthetic.csv`` is reused (``--out`` keeps them between calls).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLASSIFIERS = ["logistic_regression", "svc", "random_forest", "mlp"]
SHORT = {"logistic_regression": "LR", "svc": "SVM", "random_forest": "RF", "mlp": "MLP"}


def reproduce_module() -> Any:
    """bench/reproduce.py's helpers (loaded as the module reproduce.py itself registered, or fresh)."""
    mod = sys.modules.get("bench_reproduce") or sys.modules.get("__main__")
    if mod is None or not hasattr(mod, "compose_cfg"):
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_reproduce", ROOT / "bench" / "reproduce.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench_reproduce"] = mod
        spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------- formatting
def cell(values: Any, digits: int = 3) -> str:
    vals = [float(v) for v in np.atleast_1d(np.asarray(values, dtype=float)) if np.isfinite(v)] if values is not None \
        else []
    if not vals:
        return "n/a"
    mean, std = float(np.mean(vals)), float(np.std(vals))
    big = abs(mean) >= 1e4
    f = (lambda v: f"{v:.3g}") if (abs(mean) < 1e-2 or big) else (lambda v: f"{v:.{digits}f}")
    return f(mean) if len(vals) == 1 else f"{f(mean)} ± {f(std)}"


def pcell(value: Any) -> str:
    return "–" if value is None else f"{value:g}"


def head_lines(table: Any, *, command: str, seeds: list[int], seconds: float, code: str, extra: str = "") -> list[str]:
    import torch

    return [f"## {table.name}: {table.title}", "", f"`{command}`  ",
            f"{len(seeds)} seed(s) ({', '.join(map(str, seeds))}); {date.today().isoformat()}; {seconds / 60:.1f} min "
            f"wall-clock on {platform.machine()} CPU ({torch.get_num_threads()} torch thread(s) here; trainings as "
            "subprocesses with 1 thread each).  ",
            f"Paper: {table.source}.  ", f"Code: {code} (at the end of the table's runs).  ", *([extra] if extra else [])]


# ------------------------------------------------------------------------------------------- training
def train_runs(jobs: list[tuple[Path, list[str]]], *, workers: int, log: Callable[[str], None]) -> dict[Path, str]:
    """``train.py`` with each job's overrides into its folder; a finished folder is reused, an interrupted one
    trained again. Writes each run's wall-clock to ``bench_seconds.txt``. Errors by folder."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    errors: dict[Path, str] = {}

    def one(job: tuple[Path, list[str]]) -> None:
        folder, overrides = job
        if (folder / "synthetic.csv").exists() and (folder / "ledger.json").exists():
            return
        if folder.exists():  # an interrupted run: start again
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"output_dir={folder}",
               "trainer.enable_progress_bar=false"]
        proc = subprocess.run(cmd, cwd=folder.parent, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not (folder / "synthetic.csv").exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errors[folder] = (lines[-1] if lines else "unknown error")[:300]
            log(f"  FAILED {folder.parent.name}/{folder.name}: {errors[folder]}")
        else:
            (folder / "bench_seconds.txt").write_text(f"{seconds:.1f}\n")
            log(f"  trained {folder.parent.name}/{folder.name} in {seconds:.0f} s")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, jobs))
    return errors


def training_time(folders: list[Path], reused: set[Path]) -> str:
    """Summed training wall-clock of the run folders (config.yaml written at the start, synthetic.csv at the end)."""
    total = 0.0
    for f in folders:
        if (f / "synthetic.csv").exists() and (f / "config.yaml").exists():
            total += max((f / "synthetic.csv").stat().st_mtime - (f / "config.yaml").stat().st_mtime, 0.0)
    text = f"the {len(folders)} trainings took {total / 60:.1f} min summed (up to `workers` = 2 at a time)"
    if reused:
        text += (f"; {len(reused)} of them were reused from an earlier call with the same `--out` folder, so the "
                 "wall-clock above covers only this call's trainings and the scoring")
    return text


def ledger_eps(folder: Path) -> dict[str, Any]:
    """ε of the generator's releases alone, of the weights alone, and the run's total (ledger.json)."""
    d = json.loads((folder / "ledger.json").read_text())
    gen = [r for r in d["releases"] if not r["name"].startswith("weights/") and not r["name"].startswith("dp_sgd/classifier")]
    sgd = [r["epsilon_alone"] for r in gen if r["name"].startswith("dp_sgd/") or r["name"].startswith("dp_merf")
           or r["name"].startswith("pearl")]
    w = [r for r in d["releases"] if r["name"].startswith("weights/") or r["name"] == "dp_sgd/classifier"]
    from lightning_dp.privacy.ledger import PrivacyLedger, Release

    def alone(rels: list[dict]) -> float:
        if not rels:
            return 0.0
        keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "sample_rate", "count", "note")
        objs = [Release(**{k: r[k] for k in keys if k in r and r[k] is not None}) for r in rels]
        return PrivacyLedger(target_epsilon=1e9, delta=d["delta"]).epsilon(objs)

    return {"total": d["epsilon"], "dp_claim": d["dp_claim"], "generator_main": max(sgd) if sgd else float("nan"),
            "generator": alone(gen), "weights": alone(w)}


def sample_reference(folder: Path, name: str, seed: int, rows: int, *, log: Callable[[str], None]) -> Path | None:
    """Non-private reference weights (logreg, mlp) on the run's own synthetic sample (same seed and rows), raw."""
    out = folder / f"weighted_{name}.csv"
    if out.exists():
        return out
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lightning_dp.sample", str(folder / "checkpoints" / "last.ckpt"), "--num-rows", str(rows),
           "--out", str(out), "--weights", name, "--allow-non-private-weights", "--no-psis", "--seed", str(seed)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        log(f"  FAILED {name} weights on {folder.name}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        return None
    return out


# ------------------------------------------------------------------------------------------- scoring
def weight_variants(raw: np.ndarray) -> dict[str, dict[str, Any]]:
    """Raw weights (mean one) and their PSIS-smoothed version, with Kish ESS and k̂ of each."""
    from lightning_dp.weighting.postprocess import kish_ess, psis, self_normalise

    with np.errstate(divide="ignore"):
        lw = np.log(np.asarray(raw, dtype=np.float64))
    smoothed, k = psis(lw)
    out = {}
    for tag, logs in (("", lw), ("-p", smoothed)):
        out[tag] = {"w": self_normalise(logs), "kish_ess": kish_ess(logs), "psis_k": k, "n": len(logs)}
    return out


class TabularScorer:
    """TSTR with weights (the 4 classifiers), weighted MMD² and W1 on min-max [0, 1] features (label included)."""

    def __init__(self, data: Any, *, metric: str = "roc_auc", hard: bool = False) -> None:
        from audits.distances import TabularEncoder

        self.data, self.metric, self.hard = data, metric, hard
        self.columns = list(data.test.columns)
        self.encoder = TabularEncoder(scaling="minmax", categorical_columns=[*data.categorical, data.label]).fit(
            data.train[self.columns])
        self.x_test = self.encoder.transform(data.test[self.columns])

    def __call__(self, frame: pd.DataFrame, weights: np.ndarray, seed: int, *, max_points: int = 2000) -> dict[str, float]:
        from audits.utility import tstr
        from audits.weighted import paper_weighted_w1, weighted_mmd2, weighted_w1

        frame = frame[self.columns]
        out: dict[str, float] = {}
        if frame[self.data.label].astype(str).nunique() > 1:
            res = tstr(frame, self.data.test, label=self.data.label, classifiers=CLASSIFIERS,
                       categorical=self.data.categorical, seed=seed, sample_weight=weights)
            t = res.table
            for m in CLASSIFIERS:
                if m in t.index:
                    out[f"{m}"] = float(t.loc[m, self.metric])
                    if self.hard:
                        out[f"{m}_hard"] = float(t.loc[m, "roc_auc_hard"])
        else:  # a single class: any classifier is a constant, ROC 0.5
            for m in CLASSIFIERS:
                out[m] = 0.5
                if self.hard:
                    out[f"{m}_hard"] = 0.5
        out["avg"] = float(np.nanmean([out.get(m, np.nan) for m in CLASSIFIERS]))
        if self.hard:
            out["avg_hard"] = float(np.nanmean([out.get(f"{m}_hard", np.nan) for m in CLASSIFIERS]))
        x = self.encoder.transform(frame)
        rng = np.random.default_rng(seed)
        kx = np.sort(rng.choice(len(x), min(len(x), max_points), replace=False))
        kz = np.sort(rng.choice(len(self.x_test), min(len(self.x_test), max_points), replace=False))
        xs, zs, ws = x[kx], self.x_test[kz], np.asarray(weights, dtype=float)[kx]
        if len(xs) >= 2 and ws.sum() > 0:
            out["mmd2"] = weighted_mmd2(xs, zs, ws, bandwidth=1.0)
            out["w1"] = weighted_w1(xs, zs, ws, seed=seed)
            out["paper_w1"] = paper_weighted_w1(xs, zs, ws, seed=seed)
        return out


def reading(results: dict[str, list[dict[str, Any]]], base: str, rows: list[str]) -> list[str]:
    """Each row against ``base`` (the unweighted data): mean difference in the 4-classifier AUC, MMD² and W1, and
    whether it exceeds the seed-to-seed standard error of the difference."""
    b = results.get(base, [])
    if not b:
        return ["no unweighted row to compare with"]
    out = []
    for r in rows:
        vals = results.get(r, [])
        if not vals:
            continue
        parts = []
        for key, what, better in (("avg", "AUC (mean of 4)", 1), ("mmd2", "MMD²", -1), ("w1", "W1", -1)):
            x = np.array([v.get(key, np.nan) for v in vals], dtype=float)
            y = np.array([v.get(key, np.nan) for v in b], dtype=float)
            if not np.isfinite(x).any() or not np.isfinite(y).any():
                continue
            diff = np.nanmean(x) - np.nanmean(y)
            se = math.sqrt(np.nanvar(x) / max(np.isfinite(x).sum(), 1) + np.nanvar(y) / max(np.isfinite(y).sum(), 1))
            n_min = min(np.isfinite(x).sum(), np.isfinite(y).sum())
            verdict = ("one seed: no error bar" if n_min < 2 else "within noise" if abs(diff) <= 2 * se else
                       ("better" if diff * better > 0 else "worse"))
            parts.append(f"{what} {diff:+.3g} ({verdict})")
        out.append(f"{r} vs {base}: " + ", ".join(parts))
    return out


# ------------------------------------------------------------------------------------------- breast
BREAST_PRIVATE = ["beta_noised", "beta_gauss", "output_lapl", "output_norm", "priv_mlp"]
# rows that are an estimator with other settings: beta_gauss = beta_noised with Gaussian noise on the L2 sensitivity
VARIANTS = {"beta_gauss": ["weights=beta_noised", "weights.params.noise=gaussian"]}
BREAST_ROWS = ["none", "discriminator", "discriminator-p", "logreg", "logreg-p", "beta_noised", "beta_noised-p",
               "beta_gauss", "beta_gauss-p",
               "output_lapl", "output_lapl-p", "output_norm", "output_norm-p", "priv_mlp", "priv_mlp-p", "mlp", "mlp-p"]


def breast_section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
                   log: Callable[[str], None]) -> str:
    rp = reproduce_module()
    cfgb = table.bench
    start = time.perf_counter()
    seed_list = list(range(seeds))
    eps_w = cfgb.get("weights_epsilon", 3.0)
    experiment = cfgb.get("experiment", "bias_breast")
    jobs = []
    for s in seed_list:
        base = [f"experiment={experiment}", f"seed={s}", *extra, "weights.psis=false"]
        jobs.append((out / f"seed{s}_eps6", [*base[:2], *extra, "weights=discriminator", "weights.psis=false"]))
        for name in BREAST_PRIVATE:
            chosen = VARIANTS.get(name, [f"weights={name}"])
            jobs.append((out / f"seed{s}_{name}", [*base[:2], *extra, *chosen, f"weights.epsilon={eps_w}",
                                                   "weights.psis=false"]))
    reused = {f for f, _ in jobs if (f / "synthetic.csv").exists()}
    errors = train_runs(jobs, workers=int(cfgb.get("workers", 2)), log=log)
    timing = training_time([f for f, _ in jobs], reused)
    data = rp.real_data(rp.compose_cfg([f"experiment={experiment}", *extra]))
    scorer = TabularScorer(data)
    results: dict[str, list[dict[str, Any]]] = {r: [] for r in BREAST_ROWS}
    eps: dict[str, list[dict[str, Any]]] = {}
    for s in seed_list:
        six = out / f"seed{s}_eps6"
        sources: dict[str, tuple[pd.DataFrame, Path]] = {}
        if six in errors or not (six / "synthetic.csv").exists():
            continue
        frame = pd.read_csv(six / "synthetic.csv")
        sources["discriminator"] = (frame, six)
        for name in ("logreg", "mlp"):
            path = sample_reference(six, name, s, len(frame), log=log)
            if path is not None:
                ref = pd.read_csv(path)
                sources[name] = (ref, six)
        for name in BREAST_PRIVATE:
            folder = out / f"seed{s}_{name}"
            if folder not in errors and (folder / "synthetic.csv").exists():
                sources[name] = (pd.read_csv(folder / "synthetic.csv"), folder)
        for name, (f, folder) in sources.items():
            eps.setdefault(name, []).append(ledger_eps(folder))
            variants = weight_variants(f["weight"].to_numpy())
            for tag, v in variants.items():
                row = name + tag
                sc = scorer(f, v["w"], s)
                results[row].append({**sc, "kish_ess": v["kish_ess"], "psis_k": v["psis_k"], "n_s": v["n"]})
            if name == "discriminator":
                sc = scorer(f, np.ones(len(f)), s)
                results["none"].append({**sc, "kish_ess": float(len(f)), "psis_k": float("nan"), "n_s": len(f)})
        log(f"  scored seed {s}")
    eps["none"] = eps.get("discriminator", [])
    seconds = time.perf_counter() - start

    paper = table.paper
    header = ["scheme", "ε GAN alone / weights alone / total", "N_S"]
    for m in CLASSIFIERS:
        header += [f"{SHORT[m]} AUC: ours", "paper"]
    header += ["mean of 4: ours", "paper"]
    header += ["MMD² ours", "paper MMD", "W1 (OT) ours", "W1 paper-style ours", "paper WST", "Kish ESS", "PSIS k̂"]
    rows = []
    for r in BREAST_ROWS:
        vals, base = results[r], r.removesuffix("-p")
        p = paper.get(r, {})
        if not vals:
            rows.append([r, "not run" + (f": {next(iter(errors.values()))}" if errors else ""), *["–"] * (len(header) - 2)])
            continue
        e = eps.get(base, [])
        if base in ("logreg", "mlp"):
            privacy = f"{cell([x['generator'] for x in e], 2)} / non-private / NO DP CLAIM"
        elif base in ("none", "discriminator"):
            privacy = f"{cell([x['generator'] for x in e], 2)} / – (free) / {cell([x['total'] for x in e], 2)}"
        else:
            privacy = (f"{cell([x['generator'] for x in e], 2)} / {cell([x['weights'] for x in e], 2)} / "
                       f"{cell([x['total'] for x in e], 2)}")
        cells = [r + (" (non-private)" if base in ("logreg", "mlp") else ""), privacy,
                 cell([v["n_s"] for v in vals], 0)]
        for m in CLASSIFIERS:
            cells += [cell([v.get(m, np.nan) for v in vals]), pcell(p.get(SHORT[m]))]
        pv = [p[SHORT[m]] for m in CLASSIFIERS if SHORT[m] in p]
        cells += [cell([v.get("avg", np.nan) for v in vals]), f"{np.mean(pv):.4f}" + ("" if len(pv) == 4 else
                                                                                       f" ({len(pv)} of 4)") if pv else "–"]
        cells += [cell([v.get("mmd2", np.nan) for v in vals], 4), pcell(p.get("MMD")),
                  cell([v.get("w1", np.nan) for v in vals]), cell([v.get("paper_w1", np.nan) for v in vals]),
                  pcell(p.get("WST")), cell([v["kish_ess"] for v in vals], 1), cell([v["psis_k"] for v in vals], 2)]
        rows.append(cells)
    lines = head_lines(table, command=command, seeds=seed_list, seconds=seconds, code=code,
                       extra=f"Data: {data.description}.  ")
    lines.append(f"Training time: {timing}.  ")
    lines.append("Runs per seed: `python train.py experiment=bias_breast seed=S weights=discriminator weights.psis=false` "
                 "(ε = 6: rows none, discriminator, and the logreg/mlp references via `python -m lightning_dp.sample "
                 "CKPT --weights logreg|mlp --allow-non-private-weights --no-psis --seed S` on the same rows) and "
                 f"`python train.py experiment=bias_breast seed=S weights=NAME weights.epsilon={eps_w:g} weights.psis=false` "
                 f"for NAME in {', '.join(n for n in BREAST_PRIVATE if n not in VARIANTS)}; beta_gauss is "
                 "`weights=beta_noised weights.params.noise=gaussian` (not in the paper).")
    if errors:
        lines.append(f"Failed runs: {'; '.join(f'{k.name}: {v}' for k, v in errors.items())}.")
    lines += ["", reproduce_module().markdown_table(header, rows), "",
              "Mean ± std over seeds. AUC from scores (`predict_proba`/`decision_function`), each classifier fitted "
              "with `sample_weight` = the weights (mean one) on the weighted synthetic rows and tested on the real test "
              "split. MMD²: weighted unbiased estimate, Gaussian kernel of bandwidth 1, on min-max [0, 1] features "
              "(fitted on the real training split; the label one-hot included) against the real test split. W1 (OT): "
              "exact optimal transport between the weighted synthetic measure and the test rows; W1 paper-style: the "
              "cost matrix multiplied by the weights between uniform marginals (what the paper's WST appears to be). "
              "Kish ESS = (Σw)²/Σw²; PSIS k̂ of the raw weights (< 0.5 good, > 0.7 unreliable). `-p`: the same run's "
              "raw weights Pareto-smoothed afterwards with `lightning_dp.weighting.postprocess.psis` (post-processing of "
              "released weights, no retraining). ε GAN alone: the generator's releases alone (the row-count release "
              "and the discriminator's DP-SGD) under RDP; weights alone: the weights' release(s) alone; total: the "
              "run's ledger. Paper values: the DPGAN block of Supp. Table 6 (main Table 1 for output_lapl, which Supp. "
              "Table 6 lacks; it has no LR value).", "", "Reading (computed from the table):", "",
              *(f"- {x}" for x in reading(results, "none", [r for r in BREAST_ROWS if r != "none"])),
              "", "Notes:", "", *(f"- {n}" for n in table.notes)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- GMM toy
GMM_SCHEMES = ["true", "none", "logreg", "mlp", "beta_noised", "output_lapl", "output_norm", "priv_mlp"]


def gmm_data(seed: int, *, n: int = 10_000, sd: float = 0.05, left: float = 0.7) -> dict[str, np.ndarray]:
    """DGP: a 5×5 grid of N(m, sd²I), m ∈ {−2,…,2}², mapped to [0, 1]² by (x + 2.25)/4.5; SDGP: U(left half) w.p.
    ``left``, U(right half) otherwise. Real labels y ~ Bern(0.8) if x₀ < 0.5 else Bern(0.2); synthetic labels coin flips."""
    from scipy.special import logsumexp

    rng = np.random.default_rng(seed)
    grid = np.array([(a, b) for a in range(-2, 3) for b in range(-2, 3)], dtype=float)
    comp = rng.integers(0, 25, n)
    raw = grid[comp] + sd * rng.standard_normal((n, 2))
    x = np.clip((raw + 2.25) / 4.5, 0.0, 1.0)
    y = (rng.random(n) < np.where(x[:, 0] < 0.5, 0.8, 0.2)).astype(float)
    perm = rng.permutation(n)
    n_train = int(0.8 * n)
    tr, te = perm[:n_train], perm[n_train:]
    side = rng.random(n_train) < left
    gx = np.column_stack([np.where(side, 0.5 * rng.random(n_train), 0.5 + 0.5 * rng.random(n_train)),
                          rng.random(n_train)])
    gy = (rng.random(n_train) < 0.5).astype(float)
    means, s = (grid + 2.25) / 4.5, sd / 4.5

    def log_pd(points: np.ndarray) -> np.ndarray:
        d2 = ((points[:, None, :] - means[None]) ** 2).sum(-1)  # (N, 25)
        return logsumexp(-d2 / (2 * s**2), axis=1) - math.log(25) - math.log(2 * math.pi * s**2)

    log_pg = np.where(gx[:, 0] < 0.5, math.log(2 * left), math.log(2 * (1 - left)))
    log_true = log_pd(gx) - log_pg
    p1 = np.where(gx[:, 0] < 0.5, 0.8, 0.2)
    log_true_y = log_true + np.log(np.where(gy == 1, p1, 1 - p1)) - math.log(0.5)
    return {"x": x[tr], "y": y[tr], "x_test": x[te], "y_test": y[te], "gx": gx, "gy": gy,
            "log_true": log_true, "log_true_y": log_true_y}


def gmm_weights(name: str, real: np.ndarray, synthetic: np.ndarray, *, radius: float, seed: int, epsilon: float,
                delta: float, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """log w of the synthetic rows from estimator ``name`` on a standalone ledger; (log_w, keep, info)."""
    import torch

    from lightning_dp.privacy import mechanisms as mech
    from lightning_dp.privacy.ledger import PrivacyLedger
    from lightning_dp.weighting import build_estimator
    from lightning_dp.weighting.base import PlanInputs
    from lightning_dp.weighting.features import unit_ball
    from lightning_dp.weighting.logistic import max_rows

    rf = unit_ball(torch.tensor(real, dtype=torch.float32), radius)
    sf = unit_ball(torch.tensor(synthetic, dtype=torch.float32), radius)
    kw = dict(params.get(name, {}))
    if name in ("beta_noised", "output_lapl", "output_norm", "priv_mlp"):
        kw["epsilon"] = epsilon
    if name == "mlp":
        kw.setdefault("seed", seed)
    est = build_estimator(name, **kw)
    ledger = PrivacyLedger(target_epsilon=epsilon, delta=delta)
    inputs = PlanInputs(num_real=float(len(real)), num_synthetic=len(synthetic), num_features=rf.shape[1], delta=delta)
    keep = None
    if hasattr(est, "admissible"):
        n_s = max_rows(inputs, estimator=est, upper=len(synthetic))
        inputs = PlanInputs(num_real=float(len(real)), num_synthetic=n_s, num_features=rf.shape[1], delta=delta)
        keep = np.arange(n_s)
        sf = sf[:n_s]
    releases = est.plan(inputs)
    if ledger.epsilon_if(releases) > epsilon * (1 + 1e-9):
        raise RuntimeError(f"{name}: planned releases exceed ε = {epsilon}")
    if getattr(est, "records_own_releases", False):
        est.ledger = ledger
    else:
        for r in releases:
            ledger.record(r)
    fit = est.fit(rf, sf, releases=releases, generator=mech.noise_generator(10_000 + seed))
    spent = ledger.spent if est.private else float("nan")
    return np.asarray(fit.log_w, dtype=np.float64), keep, {"epsilon": spent, "n_s": len(sf)}


def gmm_section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
                log: Callable[[str], None]) -> str:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from audits.weighted import paper_weighted_w1, weighted_mmd2, weighted_w1
    from lightning_dp.weighting.postprocess import kish_ess, self_normalise

    cfgb = table.bench
    start = time.perf_counter()
    seed_list = list(range(seeds))
    eps, delta = float(cfgb.get("epsilon", 3.0)), float(cfgb.get("delta", 1e-5))
    left = float(cfgb.get("left", 0.7))
    params = cfgb.get("params", {})
    mu = float(cfgb.get("l2", 800.0))
    for name in ("logreg", "beta_noised", "output_lapl", "output_norm"):
        params = {**params, name: {"l2": mu, **params.get(name, {})}}
    res: dict[str, list[dict[str, float]]] = {s: [] for s in GMM_SCHEMES}
    for s in seed_list:
        d = gmm_data(s, left=left)
        for name in GMM_SCHEMES:
            t0 = time.perf_counter()
            row: dict[str, float] = {}
            for labelled in (False, True):
                real = np.column_stack([d["x"], d["y"]]) if labelled else d["x"]
                syn = np.column_stack([d["gx"], d["gy"]]) if labelled else d["gx"]
                test = np.column_stack([d["x_test"], d["y_test"]]) if labelled else d["x_test"]
                keep, info = None, {"epsilon": float("nan"), "n_s": len(syn)}
                if name == "true":
                    log_w = d["log_true_y"] if labelled else d["log_true"]
                elif name == "none":
                    log_w = np.zeros(len(syn))
                else:
                    try:
                        log_w, keep, info = gmm_weights(name, real, syn, radius=math.sqrt(real.shape[1] + 1), seed=s,
                                                        epsilon=eps, delta=delta, params=params)
                    except Exception as err:  # noqa: BLE001 - reported in the row
                        log(f"  {name} failed: {type(err).__name__}: {err}")
                        continue
                if keep is not None:
                    syn = syn[keep]
                w = self_normalise(log_w)
                tag = "lab_" if labelled else ""
                row[f"{tag}w1"] = weighted_w1(syn, test, w, seed=s)
                row[f"{tag}ess"] = kish_ess(log_w)
                row[f"{tag}n_s"] = len(syn)
                row[f"{tag}eps"] = info["epsilon"]
                if labelled:
                    row["lab_paper_w1"] = paper_weighted_w1(syn, test, w, seed=s)
                    rng = np.random.default_rng(s)
                    kx = np.sort(rng.choice(len(syn), min(len(syn), 2000), replace=False))
                    row["lab_mmd2"] = weighted_mmd2(syn[kx], test, w[kx], bandwidth=1.0)
                    if len(np.unique(syn[:, 2])) > 1:
                        clf = LogisticRegression(max_iter=1000).fit(syn[:, :2], syn[:, 2], sample_weight=w)
                        row["lab_auc"] = roc_auc_score(test[:, 2], clf.predict_proba(test[:, :2])[:, 1])
            res[name].append(row)
            log(f"  gmm seed {s} {name}: {time.perf_counter() - t0:.0f} s")
    seconds = time.perf_counter() - start
    paper = table.paper
    header = ["scheme", "ε_w spent (alone)", "N_S", "W1 (OT), unlabelled", "Kish ESS (unlab.)",
              "W1 (OT), labelled", "W1 paper-style", "paper WST", "MMD²", "paper MMD", "AUC weighted LR",
              "paper AUC logreg", "Kish ESS (lab.)"]
    rows = []
    for name in GMM_SCHEMES:
        vals = res[name]
        p = paper.get(name, {})
        g = lambda k, vals=vals: [v.get(k, np.nan) for v in vals]  # noqa: E731
        label = {"true": "true weights (paper: generator)", "logreg": "logreg (non-private)",
                 "mlp": "mlp (non-private)"}.get(name, name)
        epsv = g("eps")
        rows.append([label, "–" if not np.isfinite(epsv).any() else cell(epsv, 2), cell(g("n_s"), 0),
                     cell(g("w1"), 4), cell(g("ess"), 1), cell(g("lab_w1"), 4), cell(g("lab_paper_w1"), 4),
                     pcell(p.get("WST")), cell(g("lab_mmd2"), 4), pcell(p.get("MMD")), cell(g("lab_auc")),
                     pcell(p.get("AUC_logreg")), cell(g("lab_ess"), 1)])
    lines = head_lines(table, command=command, seeds=seed_list, seconds=seconds, code=code)
    lines += [f"Setup: DGP 10,000 points, 5×5 grid of 2-D Gaussians (means {{−2,…,2}}², sd 0.05, equal weights) "
              f"mapped to [0, 1]² by x ↦ (x + 2.25)/4.5 (so the density is known; clipped to [0, 1], which no point "
              f"reaches in practice); seeded 80/20 split (N_D = 8,000, 2,000 test). SDGP: U([0, ½]×[0, 1]) with "
              f"probability {left:g}, U([½, 1]×[0, 1]) with {1 - left:g} (our choice: the paper leaves the mixture "
              f"unspecified), N_G = N_D = 8,000; true weights p_D/p_G. Labelled variant (Supp. Table 2): real y ~ "
              f"Bern(0.8) if x₀ < 0.5 else Bern(0.2), synthetic y a fair coin, weights on (x, y). Estimators called "
              f"directly (`lightning_dp.weighting.build_estimator`) on features `unit_ball([x (, y)], √(d + 1))` "
              f"(intercept appended), each private one on its own `PrivacyLedger(target_epsilon={eps:g}, "
              f"delta={delta:g})`, logistic penalty μ = {mu:g} (the paper's Λ = 0.1 times N_D, sum convention); "
              f"output perturbation weights the first N_S synthetic rows, N_S the largest admissible "
              f"(`max_rows`).", "",
              reproduce_module().markdown_table(header, rows), "",
              "Mean ± std over seeds. W1 (OT): exact weighted Wasserstein-1 (`audits.weighted.weighted_w1`, "
              "2,000-row subsamples per side) against the 2,000 real test points; W1 paper-style: the cost matrix "
              "multiplied by the weights (`paper_weighted_w1`). MMD²: weighted, bandwidth 1, 2,000 synthetic rows. "
              "AUC: a logistic regression of y on x fitted on the weighted synthetic rows, scored on the real test "
              "points. Paper: Supp. Table 2 (its `generator` row = true weights); the unlabelled W1 is only a plot "
              "there (Fig. 2), so that column has no paper value.", "", "Notes:", "",
              *(f"- {n}" for n in table.notes)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- Adult
def adult_section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
                  log: Callable[[str], None]) -> str:
    rp = reproduce_module()
    cfgb = table.bench
    start = time.perf_counter()
    seed_list = list(range(seeds))
    generators = cfgb.get("generators", {"DP-MERF": "dp_merf_adult", "PEARL": "pearl_adult"})
    eps_w = float(cfgb.get("weights_epsilon", 0.3))
    schemes = cfgb.get("schemes", ["none", "beta_noised", "priv_mlp"])
    gen_overrides = cfgb.get("overrides", {})
    try:
        data = rp.real_data(rp.compose_cfg([f"experiment={next(iter(generators.values()))}", *extra]))
    except Exception as err:  # noqa: BLE001 - Adult missing
        return "\n".join([f"## {table.name}: {table.title}", "", f"`{command}`  ",
                          f"not run: the Adult data could not be loaded ({type(err).__name__}: {err})."]) + "\n"
    jobs, keys = [], []
    for label, exp in generators.items():
        for scheme in schemes:
            for s in seed_list:
                ov = [f"experiment={exp}", f"seed={s}", *gen_overrides.get(label, []), *extra]
                if scheme != "none":
                    ov += [f"weights={scheme}", f"weights.epsilon={eps_w}", "weights.psis=false",
                           *cfgb.get("weights_overrides", {}).get(scheme, [])]
                folder = out / f"{exp}_{scheme}_seed{s}"
                jobs.append((folder, ov))
                keys.append((label, scheme, s, folder))
    reused = {f for f, _ in jobs if (f / "synthetic.csv").exists()}
    errors = train_runs(jobs, workers=int(cfgb.get("workers", 2)), log=log)
    timing = training_time([f for f, _ in jobs], reused)
    scorer = TabularScorer(data, hard=True)
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for label, scheme, s, folder in keys:
        if folder in errors or not (folder / "synthetic.csv").exists():
            continue
        f = pd.read_csv(folder / "synthetic.csv")
        e = ledger_eps(folder)
        if scheme == "none":
            variants = {"": {"w": np.ones(len(f)), "kish_ess": float(len(f)), "psis_k": float("nan"), "n": len(f)}}
        else:
            variants = weight_variants(f["weight"].to_numpy())
        for tag, v in variants.items():
            sc = scorer(f, v["w"], s)
            res.setdefault((label, scheme + tag), []).append({**sc, **v, "w": None, **{f"eps_{k}": x for k, x in e.items()}})
        log(f"  scored {folder.name}")
    seconds = time.perf_counter() - start
    header = ["generator", "weights", "ε generator alone / weights alone / total", "AUC (score), mean of 4",
              *[f"{SHORT[m]}" for m in CLASSIFIERS], "ROC (hard), mean of 4", "MMD²", "W1 (OT)", "Kish ESS", "PSIS k̂"]
    rows = []
    for label in generators:
        for scheme in schemes:
            for tag in ([""] if scheme == "none" else ["", "-p"]):
                vals = res.get((label, scheme + tag), [])
                g = lambda k, vals=vals: [v.get(k, np.nan) for v in vals]  # noqa: E731
                if not vals:
                    rows.append([label, scheme + tag, "not run", *["–"] * (len(header) - 3)])
                    continue
                privacy = (f"{cell(g('eps_generator'), 3)} / "
                           f"{'–' if scheme == 'none' else cell(g('eps_weights'), 3)} / {cell(g('eps_total'), 3)}")
                rows.append([label, scheme + tag, privacy, cell(g("avg")), *[cell(g(m)) for m in CLASSIFIERS],
                             cell(g("avg_hard")), cell(g("mmd2"), 4), cell(g("w1")), cell(g("kish_ess"), 1),
                             cell(g("psis_k"), 2)])
    lines = head_lines(table, command=command, seeds=seed_list, seconds=seconds, code=code,
                       extra=f"Data: {data.description}.  ")
    lines.append(f"Training time: {timing}.  ")
    lines.append("Runs per generator and seed: `python train.py experiment=EXP seed=S` (unweighted, ε = 1) and "
                 f"`python train.py experiment=EXP seed=S weights=NAME weights.epsilon={eps_w:g} weights.psis=false` for "
                 f"NAME in beta_noised, priv_mlp (EXP: {', '.join(generators.values())}"
                 + "".join(f"; {k} also `{' '.join(v)}`" for k, v in gen_overrides.items() if v)
                 + "".join(f"; weights={k} also `{' '.join(v)}`" for k, v in cfgb.get("weights_overrides", {}).items() if v)
                 + ").")
    if errors:
        lines.append(f"Failed runs: {'; '.join(f'{k.name}: {v}' for k, v in errors.items())}.")
    lines += ["", reproduce_module().markdown_table(header, rows), "",
              "Mean ± std over seeds. TSTR with the 4 classifiers of the paper (LR, SVM, RF, MLP; `sample_weight` = "
              "the weights), scored on the real UCI test file; per-classifier columns are AUC from scores. MMD² "
              "(bandwidth 1) and W1 on min-max [0, 1] one-hot features (label included), 2,000-row subsamples per "
              "side, against the test split. `-p`: the raw weights Pareto-smoothed afterwards (post-processing). "
              "The paper has no Adult experiment: no paper column.", "", "Reading (computed from the table; "
              "'within noise': the difference is within 2 standard errors over seeds):", "",
              *(f"- {x}" for x in overall(res, generators, schemes)),
              *(f"- {label}: {x}" for label in generators for x in reading(
                  {k[1]: v for k, v in res.items() if k[0] == label}, "none",
                  [s_ + t for s_ in schemes if s_ != "none" for t in ("", "-p")])),
              "", "Notes:", "",
              *(f"- {n}" for n in table.notes)]
    return "\n".join(lines) + "\n"


def overall(res: dict[tuple[str, str], list[dict[str, Any]]], generators: dict[str, str], schemes: list[str]) -> list[str]:
    """One plain sentence per generator: does any weighting beat the unweighted run on AUC (mean of 4) and MMD²?"""
    out = []
    for label in generators:
        base = [v.get("avg", np.nan) for v in res.get((label, "none"), [])]
        if not base:
            continue
        better, worse, same = [], [], []
        for sch in (x for x in schemes if x != "none"):
            vals = [v.get("avg", np.nan) for v in res.get((label, sch), [])]
            if not vals:
                continue
            diff = np.nanmean(vals) - np.nanmean(base)
            se = math.sqrt(np.nanvar(vals) / len(vals) + np.nanvar(base) / len(base))
            n = min(len(vals), len(base))
            (same if n < 2 or abs(diff) <= 2 * se else better if diff > 0 else worse).append(f"{sch} ({diff:+.3f})")
        text = f"Does weighting help {label}? AUC (mean of 4 classifiers) vs unweighted: "
        if better:
            text += f"better beyond 2 standard errors: {', '.join(better)}; "
        if worse:
            text += f"worse: {', '.join(worse)}; "
        if same:
            text += f"no difference beyond the seed-to-seed noise: {', '.join(same)}"
        out.append(text.rstrip("; ") + ".")
    return out


# ------------------------------------------------------------------------------------------- entry point
SECTIONS = {"breast": breast_section, "gmm": gmm_section, "adult": adult_section}


def section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
            log: Callable[[str], None] = print) -> str:
    """The Markdown section of a bias-mitigation table (``table.bench.experiment``: breast, gmm or adult)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kind = table.bench["kind"]
    if quick:
        seeds = 1
    return SECTIONS[kind](table, seeds=seeds, quick=quick, extra=list(extra), out=out, command=command, code=code,
                          log=log)
