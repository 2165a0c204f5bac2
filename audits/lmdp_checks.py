"""The α-LMDP goodness-of-fit section of an audit: KSD tests of REAL's sensitive columns x′ against the score of an
energy model's x′ marginal.

"Privacy-Preserving Energy-Based Generative Models for Marginal Distribution Protection" (Tillman, Balch and
Veloso, TMLR 2023), Def. 2.2: a generator satisfies α-LMDP for x′ iff a level-α goodness-of-fit test *rejects*
H0 "the real x′ are a sample of the model's x′ marginal". The kernel Stein discrepancy needs only the model's
score s(x′) = −∇E_ξ(x′), which an energy model has (:class:`audits.inputs.SensitiveScore`); other generators have
none, and for them this section does not apply (the MMD test of :func:`audits.checks.lmdp_mmd` on their generated
x′ still does).

The tests (:func:`audits.lmdp.ksd_test`) run on REAL's x′ in the model's space: each column clipped to its public
(or DP-released) bounds (lo, hi) and mapped to (v − lo) / (hi − lo) ∈ [0, 1], rows with a missing value dropped.
When the model was trained on dequantised integer columns (Gaussian noise of σ model-space units, the checkpoint's
``sensitive_jitter``), REAL's x′ gets the same noise (seeded): the protected marginal is the dequantised one, and
a smooth density tested against integer atoms would be rejected whatever it is. When the energy was not fitted
as a density (PPEM's EBGAN energy), the section says that its rejections are vacuous: such a test rejects with
or without the penalty.

Each test's p-value is decided against α on an interval (:mod:`audits.verdicts`):

* ``u`` (U-statistic, multinomial bootstrap) and ``v`` (V-statistic, wild bootstrap): the p-value k/B of k of B
  bootstrap draws is a Monte Carlo estimate; its interval is Clopper–Pearson on k of B, as for the MMD permutation
  p-value;
* ``linear`` (Ŝ_{l,n} against χ²₁) and ``linear_z`` (one-sided normal): the p-value is an analytic tail
  probability with no Monte Carlo error, so the interval is degenerate, [p, p], and the verdict is p ≤ α on the
  point value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from audits.inputs import AuditInputs
from audits.lmdp import ksd_test
from audits.verdicts import CONFIDENCE, permutation_p_interval

# statistic -> (its name, its null distribution, where it comes from); the keys are audits.lmdp.KSD_STATISTICS
KSD_TESTS = {
    "u": (
        "U-statistic Ŝ_u",
        "multinomial bootstrap",
        '"A Kernelized Stein Discrepancy for Goodness-of-fit Tests" (Liu, Lee and Jordan 2016)',
    ),
    "v": (
        "V-statistic n·Ŝ_v",
        "Rademacher wild bootstrap",
        '"A Kernel Test of Goodness of Fit" (Chwialkowski, Strathmann and Gretton 2016)',
    ),
    "linear": ("linear-time Ŝ_{l,n}", "χ²₁", "PPEM, Lemma 3.1"),
    "linear_z": (
        "linear-time z",
        "one-sided standard normal",
        '"A Kernelized Stein Discrepancy for Goodness-of-fit Tests" (Liu, Lee and Jordan 2016)',
    ),
}
BOOTSTRAPPED = ("u", "v")
VACUOUS = (
    "the model's energy was not fitted as a density of x′ (PPEM's EBGAN margin loss, constant almost everywhere at "
    "equilibrium): these tests reject with or without the α-LMDP penalty, so a rejection says little; train with "
    "model.module.marginal_objective=likelihood for a meaningful test"
)
MODEL_SPACE = (
    "REAL's sensitive columns clipped to their public bounds (lo, hi) and mapped to (v − lo) / (hi − lo) ∈ [0, 1], "
    "the model's input space; rows with a missing value dropped"
)


def not_applicable(inputs: AuditInputs) -> str | None:
    """Why the KSD tests do not apply to these inputs (no energy-model score), or None when they do."""
    if "checkpoint" not in inputs.sources:
        return (
            "does not apply: the synthetic data came as a file, so no model score is known (audit the run's "
            "checkpoint to test an energy model)"
        )
    if inputs.sensitive is None:
        model = inputs.sources["checkpoint"].get("model") or "the checkpoint's model"
        return (
            f"does not apply: {model} is not an energy model (it has no score of the sensitive columns' marginal); "
            "lmdp_mmd tests its generated columns"
        )
    return None


def model_space(
    frame: pd.DataFrame, columns: list[str], bounds: dict[str, tuple[float, float]]
) -> np.ndarray:
    """``frame[columns]`` without rows that miss a value, each column clipped to ``bounds[c] = (lo, hi)`` and
    mapped to (v − lo) / (hi − lo) (a column with lo = hi to 0); shape (n, d′)."""
    x = frame[columns].dropna().to_numpy(np.float64)  # (n, d′)
    lo = np.array([bounds[c][0] for c in columns])
    hi = np.array([bounds[c][1] for c in columns])
    span = np.where(hi > lo, hi - lo, 1.0)
    return (np.clip(x, lo, hi) - lo) / span


def p_interval(statistic: str, test: dict[str, Any], confidence: float) -> tuple[tuple[float, float], str]:
    """The interval of a KSD test's p-value and how it was computed (see the module docstring)."""
    p = float(test["p_value"])
    if statistic in BOOTSTRAPPED:
        draws = int(test["details"]["n_bootstrap"])
        exceed = round(p * draws)  # p = k / B exactly
        return (
            permutation_p_interval(exceed, draws, confidence),
            f"Clopper–Pearson interval of the bootstrap p-value ({draws} draws)",
        )
    return (p, p), "exact: an analytic tail probability has no Monte Carlo error (degenerate interval)"


def ksd_section(
    inputs: AuditInputs,
    *,
    statistics: list[str],
    alpha: float,
    n_bootstrap: int,
    max_samples: int | None,
    seed: int,
    confidence: float = CONFIDENCE,
) -> dict[str, Any] | str:
    """Run the KSD tests of REAL's x′ against the model's score.

    Args:
        inputs: the audit's inputs, with ``inputs.sensitive`` set (see :func:`not_applicable`).
        statistics: the tests, names of :data:`KSD_TESTS`.
        alpha: their level.
        n_bootstrap: draws of the bootstrap tests.
        max_samples: row cap of the quadratic tests (``u``, ``v``); the linear ones use every row.
        seed: seed of the subsample, the shuffle and the bootstrap.
        confidence: of the p-values' intervals.

    Returns:
        The section (JSON-safe but for numpy scalars): ``columns``, ``bounds``, ``model``, ``model_space``,
        ``n_rows``, ``alpha``, ``alpha_lmdp_holds`` (every test rejects) and per test (``ksd_u``, ...) the
        :class:`~audits.lmdp.TestResult` fields with ``test``, ``null``, ``reference``, ``p_value_interval``,
        ``interval_method`` and ``alpha_lmdp_holds``; or a string saying why the tests cannot run on these data.

    Raises:
        ValueError: a sensitive column of the model is not a numeric column of the data, or the inputs have no
            score.
    """
    sensitive = inputs.sensitive
    if sensitive is None:
        raise ValueError("ksd_section needs inputs.sensitive: check not_applicable(inputs) first.")
    columns = sensitive.columns
    bad = [c for c in columns if c not in inputs.numeric]
    if bad:
        raise ValueError(
            f"The model's sensitive columns {bad} are not numeric columns of the data (numeric columns: "
            f"{inputs.numeric}); audit it against the data set it was trained on."
        )
    unbounded = [c for c in columns if c not in inputs.bounds]
    if unbounded:
        return f"the sensitive columns {unbounded} have no public bounds, so REAL cannot be mapped to model space"
    x = model_space(inputs.real, columns, inputs.bounds)
    jitter = np.asarray(sensitive.jitter or [0.0] * len(columns), dtype=np.float64)
    if jitter.any():
        x = x + np.random.default_rng(seed).standard_normal(x.shape) * jitter  # the model's dequantisation
    if len(x) < 4:
        return f"{len(x)} REAL rows without a missing value in the sensitive columns; the KSD tests need at least 4"
    tests = {}
    for statistic in statistics:
        res = ksd_test(
            x,
            sensitive.score,
            statistic=statistic,
            alpha=alpha,
            n_bootstrap=n_bootstrap,
            seed=seed,
            max_samples=max_samples,
        ).to_dict()
        interval, method = p_interval(statistic, res, confidence)
        what, null, reference = KSD_TESTS[statistic]
        tests[res["name"]] = {
            **res,
            "test": what,
            "null": null,
            "reference": reference,
            "p_value_interval": list(interval),
            "interval_method": method,
            "alpha_lmdp_holds": res["reject"],
        }
    return {
        "columns": list(columns),
        "bounds": {c: list(inputs.bounds[c]) for c in columns},
        "model": sensitive.model,
        "score": "the model's score of its x′ marginal, s(x′) = −∇E_ξ(x′)",
        "model_space": MODEL_SPACE,
        "dequantisation": (
            "REAL's integer columns got the Gaussian noise the model was trained with (model-space σ per column): "
            + ", ".join(f"{c} {j:.4g}" for c, j in zip(columns, jitter) if j)
        ) if jitter.any() else None,
        "energy_is_density": sensitive.density,
        **({} if sensitive.density else {"caveat": VACUOUS}),
        "n_rows": len(x),
        "alpha": alpha,
        "alpha_lmdp_holds": all(t["reject"] for t in tests.values()),
        "tests": tests,
    }
