"""Private beta calibration of classifier weights (Sec. 3.5; Kull et al. 2017).

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary Tale",
calibrate the weight classifier's probability s with beta calibration: a logistic regression of the labels on
the two features (ln s, −ln(1 − s)), so that logit μ(s) = c + a ln s − b ln(1 − s), and the calibrated weight
is μ/(1 − μ) times the calibration set's prior ratio. In log space:

    log w_cal(x) = logit μ(s(x)) + log(N_F / ñ_D),   s(x) = σ(log w(x) − prior),

with the calibration set made of the real rows (y = 1, ñ_D = the run's DP row count) and a *fresh* synthetic
sample of N_F rows (y = 0), independent of the rows being weighted.

Privacy. The paper calibrated on a real hold-out and did not account for it. Here the calibration set is the
run's private training rows and the fit is a DP release on the run's ledger (``weights/calibration``); the
run's hold-out stays untouched for the audits. The fit is the private logistic regression of
:mod:`lightning_dp.weighting.logistic` (sum convention, penalty μ, Laplace noise on the coefficients): the
features ln s and −ln(1 − s) are clipped to [−clip, clip] and, with a constant intercept feature, divided by
√(2·clip² + 1), so every row lies in the unit ball and Δ₂ = 1/μ (add/remove) holds. That argument treats each
private row as contributing one feature row z(x_i), so the score function s(·) must itself be public or a DP
release: the coefficients of ``beta_noised``, a DP-SGD classifier, a DP discriminator. The non-private
references (``logreg``, ``mlp``) make no DP claim anyway. Output perturbation (``output_lapl``,
``output_norm``) releases no score function (its β̂ is never released), so its weights cannot be calibrated
privately this way.

Beta calibration wants a, b ≥ 0 (a monotone map) and refits without a feature whose coefficient comes out
negative; a refit would be a second data-dependent release, so here a negative a or b is set to 0 instead
(post-processing of the released coefficients), unless ``monotone=False``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.privacy.ledger import Release
from lightning_dp.weighting.base import PlanInputs, prior_log_ratio, require_epsilon
from lightning_dp.weighting.logistic import (
    DEFAULT_L2,
    check_l2,
    check_plan_inputs,
    coefficient_release,
    perturbed_logistic,
)

RELEASE_NAME = "weights/calibration"
NUM_FEATURES = 3  # ln s, −ln(1 − s), intercept


class PrivateBetaCalibration:
    """Beta calibration fitted with the private logistic regression; composable after any weight estimator.

    Use: ``releases = cal.plan(inputs, epsilon)`` (record them on the ledger), then
    ``cal.apply(real_log_w=..., fresh_log_w=..., log_w=..., prior=..., releases=releases, generator=...)``,
    where the three arrays are the estimator's log weights (its logit plus its ``prior``) of the private
    training rows, of a fresh synthetic sample, and of the synthetic rows to weight (e.g.
    ``estimator.log_weights(rows)`` and ``fit.info["prior"]``).

    Args:
        l2: penalty μ of the calibration's logistic regression (sum convention).
        clip: ln s and −ln(1 − s) are clipped to [−clip, clip] (public), which fixes the unit-ball scaling.
        monotone: set a negative a or b to 0 after the fit (keeps μ(s) monotone in s).

    Raises:
        ConfigError: μ ≤ 0 or clip ≤ 0.
    """

    name: ClassVar[str] = "calibration"

    def __init__(self, *, l2: float = DEFAULT_L2, clip: float = 10.0, monotone: bool = True) -> None:
        self.l2 = check_l2(l2)
        if not (isinstance(clip, int | float) and math.isfinite(clip) and clip > 0):
            raise ConfigError(f"The calibration clip must be a finite number > 0, got {clip!r}; e.g. clip=10.")
        self.clip = float(clip)
        self.monotone = bool(monotone)
        self.info: dict[str, Any] = {}
        self._inputs: PlanInputs | None = None
        self._planned: list[Release] | None = None

    @property
    def scale(self) -> float:
        """√(2·clip² + 1): the divisor that puts the clipped features (and the intercept) in the unit ball."""
        return math.sqrt(2 * self.clip**2 + 1)

    def features(self, logit: np.ndarray | Tensor) -> Tensor:
        """z = (clip(ln s), clip(−ln(1 − s)), 1)/√(2·clip² + 1) with s = σ(logit); (N, 3), ‖z‖₂ ≤ 1."""
        t = torch.as_tensor(np.asarray(logit, dtype=float), dtype=torch.float64)  # (N,)
        log_s = -torch.nn.functional.softplus(-t)  # ln σ(t), exact for large |t|
        log_1ms = torch.nn.functional.softplus(t)  # −ln(1 − σ(t))
        z = torch.stack([log_s.clamp(-self.clip, self.clip), log_1ms.clamp(-self.clip, self.clip),
                         torch.ones_like(t)], dim=1)  # (N, 3)
        return z / self.scale

    def plan(self, inputs: PlanInputs, epsilon: float) -> list[Release]:
        """One Laplace release of the 3 calibration coefficients, (ε, δ)-DP on its own.

        Only ``inputs.num_real``, ``delta`` and ``adjacency`` matter (the calibration has 3 features whatever
        the weight classifier's width).

        Raises:
            ConfigError: missing or non-positive ε.
        """
        check_plan_inputs(inputs)
        epsilon = require_epsilon("calibrated", epsilon)
        release = coefficient_release(RELEASE_NAME, num_features=NUM_FEATURES, l2=self.l2,
                                      adjacency=inputs.adjacency, epsilon=epsilon, delta=inputs.delta)
        self._inputs, self._planned = inputs, [release]
        return [release]

    def apply(self, *, real_log_w: np.ndarray, fresh_log_w: np.ndarray, log_w: np.ndarray, prior: float,
              releases: list[Release], generator: torch.Generator) -> np.ndarray:
        """Fit the calibration (real rows vs the fresh sample) and return the calibrated log weights of ``log_w``.

        Args:
            real_log_w: (N_D,) the estimator's log weights of the private training rows.
            fresh_log_w: (N_F,) its log weights of a fresh synthetic sample (not the rows being weighted).
            log_w: (N_S,) its log weights of the synthetic rows to weight.
            prior: the prior term inside those log weights (the estimator's ``info["prior"]``).
            releases: what :meth:`plan` returned, recorded on the ledger.
            generator: the privacy noise generator.

        Returns:
            (N_S,) logit μ(s) + log(N_F/ñ_D).

        Raises:
            RuntimeError: called before :meth:`plan`.
            ValueError: releases other than the planned ones.
        """
        if self._inputs is None or self._planned is None:
            raise RuntimeError("PrivateBetaCalibration.apply called before plan(): plan the release and record it "
                               "on the ledger first.")
        keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "count")
        if [tuple(getattr(r, k) for k in keys) for r in releases] != [
                tuple(getattr(r, k) for k in keys) for r in self._planned]:
            raise ValueError("PrivateBetaCalibration.apply got releases other than the ones plan() returned: pass "
                             "exactly those (the noise drawn must be the noise the ledger recorded).")
        (release,) = releases
        real = self.features(np.asarray(real_log_w, dtype=float) - prior)  # (N_D, 3)
        fresh = self.features(np.asarray(fresh_log_w, dtype=float) - prior)  # (N_F, 3)
        theta = perturbed_logistic(real, fresh, l2=self.l2, release=release, generator=generator)  # (3,)
        a, b, c = (theta / self.scale).tolist()
        if self.monotone:
            theta = theta.copy()
            theta[:2] = np.maximum(theta[:2], 0.0)
        self.theta = theta
        self.prior = prior_log_ratio(self._inputs.num_real, len(fresh_log_w))
        self.info = {"a": a, "b": b, "c": c, "monotone": self.monotone, "clip": self.clip, "l2": self.l2,
                     "laplace_scale": release.noise_multiplier * release.sensitivity, "prior": self.prior,
                     "num_fresh": len(fresh_log_w)}
        return self.transform(log_w, prior=prior)

    def transform(self, log_w: np.ndarray, *, prior: float) -> np.ndarray:
        """Calibrated log weights of more rows with the fitted (released) coefficients; (N,)."""
        z = self.features(np.asarray(log_w, dtype=float) - prior).numpy()  # (N, 3)
        return z @ self.theta + self.prior
