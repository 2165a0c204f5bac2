"""Empirical ε lower bounds of DP-MERF's one-shot release from a planted canary (``audits/canary.py``).

Composes the real config (``model=dp_merf`` as shipped, with ``--features`` random features), takes D = the
first ``--rows`` training rows of a bundled data set in model space and its first held-out row as the canary,
and runs ``--trials`` releases with and ``--trials`` without it through the real ``SanitizedEmbedding``:

* at the claimed (ε, δ) = (1, 1e-5): the bound must stay below ε = 1 (the audit finds no violation);
* with the noise switched off (target ε = 1e4, σ ≈ 0.01): the bound must exceed 1 (the audit has power).

Then the same for DP-SGD (``SGDCanary``: the real ``DPSGD`` callback's noisy gradient releases, full batches),
and for the DP importance-weighted GMMN (``IWGMMNCanary``: the real ``IWMMDGenerator`` step under ``DPSGD``, the
canary weighted 50× to show that a weight cannot raise the sensitivity).

Also prints the tight ε of the Gaussian mechanism the attack sees (μ = √2/σ for the sums and counts
together; √T/σ for T DP-SGD steps): what an optimal attack approaches with unboundedly many trials.

    python bench/canary.py [--data breast_cancer] [--rows 100] [--trials 500] [--features 200]
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from scipy.optimize import brentq
from scipy.stats import norm

from audits.canary import EmbeddingCanary, IWGMMNCanary, SGDCanary, audit_trials
from lightning_dp.data.datamodule import PrivateDataModule
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.privacy.mechanisms import noise_generator

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DELTA = 1e-5


def gdp_epsilon(mu: float, delta: float) -> float:
    """Tight ε of μ-GDP at δ (Dong, Roth & Su 2019, Cor. 2.13): solve Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ."""

    def gap(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta

    high = 1.0
    while gap(high) > 0:
        high *= 2
    return brentq(gap, 0.0, high) if gap(0.0) > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="breast_cancer")
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument(
        "--trials", type=int, default=500, help="releases per side (with / without the canary)"
    )
    parser.add_argument("--features", type=int, default=200)
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"data={args.data}", f"++model.module.num_features={args.features}"]
        )
    dm = PrivateDataModule(**{**cfg.data, "max_rows": args.rows})
    dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=DELTA), generator=noise_generator(0))  # public schema
    canary_x, canary_y = dm.encoder.transform(dm.holdout.iloc[:1])
    print(
        f"D = {dm.num_rows} {args.data} rows, canary = its first held-out row; D' = {args.features} features; "
        f"{args.trials} trials per side; 95% confidence"
    )
    for label, epsilon in (("claimed ε = 1", 1.0), ("noise off (ε target 1e4)", 1e4)):
        trial = EmbeddingCanary(
            model_cfg=cfg.model,
            layout=dm.layout,
            x=dm.x,
            y=dm.y,
            canary=(canary_x[0], int(canary_y[0])),
            epsilon=epsilon,
            delta=DELTA,
        )
        audit_and_print(label, trial, trials=args.trials, mu=lambda s: math.sqrt(2) / s)
    steps = 4
    print(
        f"\nDP-SGD (the DPSGD callback, full batches, {steps} steps, C = 1) on the same D, canary far from D:"
    )
    far = canary_x[0] * 0 + 5.0
    for label, epsilon in (("claimed ε = 1", 1.0), ("noise off (ε target 1e4)", 1e4)):
        trial = SGDCanary(dm.x, far, epsilon=epsilon, delta=DELTA, steps=steps)
        audit_and_print(label, trial, trials=args.trials, mu=lambda s: math.sqrt(steps) / s)
    print(
        f"\nDP importance-weighted GMMN (model=iw_gmmn standardize=none privacy=dp_sgd: the real IWMMDGenerator step "
        f"and DPSGD, full batches, {steps} steps, C = 1) on the same D (label one-hot in the row), the canary its "
        "first held-out row with weight 50 (the others 1):"
    )
    rows = torch.cat([dm.x, torch.nn.functional.one_hot(dm.y, dm.layout["num_classes"]).float()], 1)
    planted = torch.cat([canary_x[0], torch.nn.functional.one_hot(torch.tensor(int(canary_y[0])),
                                                                  dm.layout["num_classes"]).float()])

    def weights(x: torch.Tensor) -> torch.Tensor:
        return 1.0 + 49.0 * ((x - planted).abs().sum(1) < 1e-6).float()

    logging.getLogger("lightning_dp.callbacks.dp_sgd").setLevel(logging.ERROR)  # "only a few steps": intended
    for label, epsilon in (("claimed ε = 1", 1.0), ("noise off (ε target 1e4)", 1e4)):
        trial = IWGMMNCanary(rows, planted, weights=weights, epsilon=epsilon, delta=DELTA, steps=steps)
        shift = math.sqrt(sum(float((b - a).norm()) ** 2 for a, b in zip(*trial.clean)))  # ≤ √T·C
        audit_and_print(label, trial, trials=args.trials, mu=lambda s, shift=shift: shift / s)


def audit_and_print(label: str, trial, *, trials: int, mu) -> None:
    """Run the audit and print the bound beside the tight ε of the Gaussian the attack sees (μ(σ)-GDP)."""
    start = time.perf_counter()
    res = audit_trials(trial, trials=trials, delta=DELTA)
    sigma = trial.noise_multiplier
    print(
        f"{label:26s} σ = {sigma:.4g}: ε lower bound {res.epsilon_lower_bound:.3f} (FP {res.false_positives}/"
        f"{res.n_negatives}, FN {res.false_negatives}/{res.n_positives}); tight ε of the attacked Gaussian "
        f"{gdp_epsilon(mu(sigma), DELTA):.3f}; {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
