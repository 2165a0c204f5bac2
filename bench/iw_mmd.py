"""The synthetic latent-thinning experiment of "Distribution Distance Measures in Generative and Privacy Models"
(Diesendruck 2019, §3.3.1, Tables 3.2 / A.1): do the importance-weighted MMD generators recover the target
better than the unweighted one?

Target P: x = θᵀF with θ ~ U(0, 1)^10 and a fixed F (10 × D, F_ij ~ N(0, 1), public seed), D ∈ {2, 4, 10}. The
training data come from MP: θ_1 has density 2θ (θ_1 = √U), so M(x) = 2θ_1 and w = 1/(2θ_1), of infinite
variance (E_MP[1/M²] = ∫ 1/(2θ) dθ = ∞, outside both theorems). 10,000 training rows; 1000 fresh target rows for
the test. Each generator is the thesis' GMMN: ``ResidualELUGenerator`` (dense(10, ELU) + 2 residual BN blocks,
z ∈ R^10), MMD² with the RBF mixture σ ∈ {0.01, 1, 2} (variances) on standardised rows, RMSProp, batch 64, MIW
with 4 groups of 16; the loss is ``kernels.mmd.mmd2_estimate``, the same function ``model=iw_gmmn`` trains with.

Metrics on 1000 generated vs the 1000 target rows, raw scale (the thesis' code): kNN KL(generated ‖ target)
(Wang, Kulkarni & Verdú 2009, k = 5; can be negative), MMD² (single RBF, σ = 1, U-statistic) and "energy" =
½·e_V (the code's normalisation). Mean ± sd over seeds, the thesis' mean ± sd (20 runs, 25,000 steps) beside.
Expect trends, not the thesis' figures: fewer steps and seeds by default, and its MMD² eval used a
diagonal-including sum.

    python bench/iw_mmd.py [--dims 2 4 10] [--seeds 3] [--steps 3000] [--lr 1e-3]
                           [--estimators standard iw miw sniw id]
    python bench/reproduce.py --table iw_mmd_synthetic [--quick] [--write docs/results.md]

The thesis' numbers (mean ± sd and best of 20 runs) are read from ``bench/paper_tables.yaml``
(``iw_mmd_synthetic``), whose settings the reproduce table uses; :func:`section` renders its section.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from scipy.spatial import cKDTree

from lightning_dp.kernels.mmd import energy_distance, mmd2, mmd2_estimate, rbf_kernel
from lightning_dp.nets.mmd_nets import ResidualELUGenerator

LATENT = 10
NAMES = {"standard": "MMD (unweighted)", "iw": "IW-MMD", "miw": "MIW-MMD", "sniw": "SNIW-MMD", "id": "ID-MMD"}
REGISTRY = Path(__file__).resolve().parent / "paper_tables.yaml"
TABLE = "iw_mmd_synthetic"
METRICS = (("mmd2", "MMD² (RBF σ = 1)"), ("energy", "Energy (½·e_V)"), ("kl", "KL(generated ‖ target), kNN k = 5"))
THESIS_ROWS = {"iw": "IW-MMD", "miw": "MIW-MMD", "sniw": "SNIW-MMD", "cgan": "C-GAN"}  # ours -> the thesis' row


def thesis_numbers(path: Path = REGISTRY) -> dict[str, dict[str, dict[int, list[float]]]]:
    """Tables 3.2 / A.1 and A.2 from the registry: ``{row: {metric: {D: [mean, sd, best of 20]}}}``."""
    return yaml.safe_load(path.read_text())["tables"][TABLE]["paper"]


def latent_data(n: int, dim: int, *, thinned: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x = θᵀF (n, D) and weights w = 1/(2θ_1) (n,); θ_1 ~ density 2θ when ``thinned``."""
    mixing = torch.randn(LATENT, dim, generator=torch.Generator().manual_seed(1000 + dim), dtype=torch.float64)
    theta = torch.rand(n, LATENT, generator=generator, dtype=torch.float64)
    if thinned:
        theta[:, 0] = theta[:, 0].sqrt()
    return theta @ mixing, 1 / (2 * theta[:, 0])


def knn_kl(p: np.ndarray, q: np.ndarray, k: int = 5) -> float:
    """D̂(P‖Q) = log(m/(n−1)) + (d/n) Σ log(ν_k(i)/ρ_k(i)) from samples p ~ P (n, d) and q ~ Q (m, d)."""
    n, d = p.shape
    rho = cKDTree(p).query(p, k + 1)[0][:, k]  # the k-th neighbour other than the point itself
    nu = cKDTree(q).query(p, k)[0][:, k - 1]
    return float(math.log(len(q) / (n - 1)) + d * np.mean(np.log(nu / rho)))


def train_one(estimator: str, dim: int, seed: int, *, steps: int, lr: float, batch: int = 64) -> dict[str, float]:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x, w = latent_data(10_000, dim, thinned=True, generator=g)
    target, _ = latent_data(1000, dim, thinned=False, generator=torch.Generator().manual_seed(10_000 + seed))
    mean, std = x.mean(0), x.std(0)  # the thesis' code standardises with the training rows
    xs, w = ((x - mean) / std).float(), w.float()
    net = ResidualELUGenerator(n_continuous=dim, latent_dim=LATENT, width=10, blocks=2)
    opt = torch.optim.RMSprop(net.parameters(), lr=lr)
    kernel = rbf_kernel([0.01, 1.0, 2.0], sigma_is="variance")
    for _ in range(steps):
        idx = torch.randint(len(xs), (batch,), generator=g)
        loss = mmd2_estimate(xs[idx], net(torch.randn(batch, LATENT)), w[idx], kernel, estimator=estimator,
                             groups=4, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        fake = (net(torch.randn(1000, LATENT)).double() * std + mean)  # raw scale
    return {"mmd2": float(mmd2(fake, target, rbf_kernel(1.0))), "energy": 0.5 * float(energy_distance(fake, target)),
            "kl": knn_kl(fake.numpy(), target.numpy())}


def cell(values: list[float]) -> str:
    return f"{np.mean(values):.4f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.4f}"


def run_grid(estimators: list[str], dims: list[int], seeds: int, *, steps: int, lr: float,
             log: Callable[[str], None] | None = None) -> dict[tuple[str, int], list[dict[str, float]]]:
    """:func:`train_one` for every estimator, dimension and seed 0..seeds−1: ``{(estimator, D): [metrics per seed]}``."""
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for d in dims:
        for e in estimators:
            begin = time.perf_counter()
            results[(e, d)] = [train_one(e, d, s, steps=steps, lr=lr) for s in range(seeds)]
            if log is not None:
                log(f"  {NAMES[e]} {d}D: {seeds} seed(s) in {time.perf_counter() - begin:.0f} s")
    return results


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def metric_table(metric: str, results: dict[tuple[str, int], list[dict[str, float]]], thesis: dict[str, Any], *,
                 estimators: list[str], dims: list[int], rows: dict[str, str]) -> str:
    """One metric: per D, ours (mean ± sd, best of our seeds) beside the thesis (mean ± sd, best of 20)."""
    header = ["method"] + [x for d in dims for x in (f"{d}D: ours", "thesis", "ours best", "thesis best")]
    out = []
    for e in estimators:
        paper = thesis.get(rows.get(e, ""), {}).get(metric, {})
        cells = [NAMES[e] + ("" if e in rows else " (no thesis row)")]
        for d in dims:
            ours = [r[metric] for r in results[(e, d)]]
            theirs = paper.get(d)
            cells += [cell(ours), f"{theirs[0]:.4f} ± {theirs[1]:.4f}" if theirs else "–", f"{min(ours):.4f}",
                      f"{theirs[2]:.4f}" if theirs else "–"]
        out.append(cells)
    for row, numbers in thesis.items():
        if row in rows.values():
            continue
        cells = [f"{row} (thesis only, not run)"]
        for d in dims:
            m, sd, best = numbers[metric][d]
            cells += ["–", f"{m:.4f} ± {sd:.4f}", "–", f"{best:.4f}"]
        out.append(cells)
    return markdown(header, out)


def trend_lines(results: dict[tuple[str, int], list[dict[str, float]]], estimators: list[str],
                dims: list[int]) -> list[str]:
    """Does weighting help? Each weighted estimator's mean KL against the unweighted GMMN's, per D."""
    if "standard" not in estimators:
        return []
    lines = []
    for e in (x for x in estimators if x != "standard"):
        wins = [d for d in dims
                if np.mean([r["kl"] for r in results[(e, d)]]) < np.mean([r["kl"] for r in results[("standard", d)]])]
        lines.append(f"{NAMES[e]}: lower mean KL than the unweighted GMMN at "
                     f"{', '.join(f'{d}D' for d in wins) or 'no D'} ({len(wins)} of {len(dims)}).")
    return lines


def section(table: Any, *, seeds: int, quick: bool, extra: list[str], out: Path, command: str, code: str,
            log: Callable[[str], None] = print) -> str:
    """Run the synthetic experiment of ``table`` (``bench/reproduce.py --table iw_mmd_synthetic``); its Markdown
    section, ours beside the thesis' Tables 3.2 / A.2."""
    import platform

    settings = table.bench
    dims, estimators = list(settings["dims"]), list(settings["estimators"])
    steps = settings["quick_steps"] if quick else settings["steps"]
    lr = float(settings["lr"])
    if extra:
        log(f"  {table.name}: --set {' '.join(extra)} does not apply (not a train(cfg) table); ignored")
    torch.manual_seed(0)
    begin = time.perf_counter()
    results = run_grid(estimators, dims, seeds, steps=steps, lr=lr, log=log)
    minutes = (time.perf_counter() - begin) / 60
    rows = dict(settings["rows"])
    mode = " (quick)" if quick else ""
    lines = [
        f"## {table.name}: {table.title}{mode}",
        "",
        f"`{command}`  ",
        f"{seeds} seed(s) ({', '.join(map(str, range(seeds)))}) × {steps:,} generator steps (RMSProp lr {lr:g}) for "
        f"each of {len(estimators)} estimators × {len(dims)} dimensions; {date.today().isoformat()}; "
        f"{minutes:.1f} min wall-clock on {platform.machine()} CPU ({torch.get_num_threads()} torch thread(s)); "
        "seeded, so a re-run gives the same numbers on the same machine.  ",
        f"**Shortened{' (quick mode)' if quick else ''}**: the thesis ran 20 runs × 25,000 steps at lr 1e-4; ours is "
        f"{seeds} run(s) × {steps:,} steps, so compare trends (which estimator wins, how the gap grows with D), "
        "not digits; \"best\" is the best of our seeds, not of 20.  ",
        f"Thesis: {table.source}. No DP (the thesis' Ch. 3 generators are not private).  ",
        f"Code: {code}; `bench/iw_mmd.py` (the losses: `lightning_dp.kernels.mmd.mmd2_estimate`).",
        "",
    ]
    thesis = table.paper
    for metric, title in METRICS:
        lines += [f"{title}, lower is better:", "",
                  metric_table(metric, results, thesis, estimators=estimators, dims=dims, rows=rows), ""]
    trends = trend_lines(results, estimators, dims)
    if trends:
        lines += ["Weighting against no weighting (the thesis' claim: the weighted generators recover the target "
                  "P, the unweighted one learns MP):  ", *(f"{t}  " for t in trends), ""]
    lines += ["Notes:", "", *(f"- {n}" for n in table.notes), *(f"- Not reproduced: {m}" for m in table.missing)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 4, 10])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=1e-3, help="RMSProp (the thesis: 1e-4 for 25,000 steps)")
    parser.add_argument("--estimators", nargs="+", default=["standard", "iw", "miw", "sniw", "id"],
                        choices=list(NAMES))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    results = run_grid(args.estimators, args.dims, args.seeds, steps=args.steps, lr=args.lr)
    thesis = thesis_numbers()
    print(f"Ch. 3 synthetic thinning: {args.seeds} seeds × {args.steps} steps (lr {args.lr:g}), "
          f"{time.time() - start:.0f} s. ours | thesis (Table 3.2, 20 runs × 25,000 steps)")
    for metric, title in METRICS:
        print(f"\n{title.split(' ')[0]:<18}" + "".join(f"| {f'{d}D ours':<18}{f'{d}D thesis':<18}" for d in args.dims))
        for e in [*args.estimators, "cgan"]:
            row = f"{NAMES.get(e, 'C-GAN (thesis)'):<18}"
            for d in args.dims:
                ours = cell([r[metric] for r in results[(e, d)]]) if (e, d) in results else "—"
                theirs = thesis.get(THESIS_ROWS.get(e, ""), {}).get(metric, {}).get(d)
                row += f"| {ours:<18}{f'{theirs[0]:.4f} ± {theirs[1]:.4f}' if theirs else '—':<18}"
            print(row)


if __name__ == "__main__":
    main()
