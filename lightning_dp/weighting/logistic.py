"""Importance weights from an L2-regularised logistic regression (and its MLP twin), private and not.

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary Tale",
Sec. 3.1–3.3: a classifier of real (y = 1) against synthetic (y = 0) rows gives log w(x) = βᵀx + log(N_G/N_D)
(the paper prints the prior term inverted; see :mod:`lightning_dp.weighting.base`). Estimators here:

* ``logreg`` (:class:`LogisticWeights`) and ``mlp`` (:class:`MLPWeights`): non-private references;
* ``beta_noised`` (:class:`BetaNoised`): Laplace noise on β (Ji & Elkan 2013); weights for any number of rows;
* ``output_lapl`` (:class:`OutputLaplace`, Corollary 1): fresh log-Laplace noise on every log weight;
* ``output_norm`` (:class:`OutputGaussian`, Corollary 2): fresh lognormal noise on every log weight.

**Objective (the sum convention).** β̂(D) = argmin_β F_D(β) with

    F_D(β) = Σ_{i ∈ D ∪ G} ℓ(y_i βᵀx_i) + (μ/2)‖β‖²,   ℓ(t) = log(1 + e^{−t}),  y_i ∈ {−1, +1},

no separate intercept (it is the last, constant, coordinate of x, penalised like the others; sklearn's
unpenalised intercept would break the strong convexity below). sklearn's ``C`` is 1/μ. The paper's
"L2 regularization 0.1" read as Λ = 0.1 in the mean convention (1/N_D)Σℓ + (Λ/2)‖β‖² with N_D = 455 (breast)
is μ = Λ·N_D ≈ 45.5; the default ``l2 = 50`` is that order. The mean convention would make the sensitivity
depend on the private row count; the sum convention does not.

**Sensitivity (after Chaudhuri et al. 2011).** Rows lie in the unit ball (‖x‖₂ ≤ 1,
:func:`lightning_dp.weighting.features.unit_ball`). F_D is μ-strongly convex and each loss term has gradient
∇ℓ(yβᵀx) = −y σ(−yβᵀx) x of norm ≤ ‖x‖ ≤ 1. Let D' = D ∪ {z} (add/remove adjacency), β₁ = β̂(D), β₂ = β̂(D').
Then ∇F_D(β₁) = 0 and ∇F_D(β₂) = −∇ℓ_z(β₂), so strong convexity gives

    μ‖β₂ − β₁‖² ≤ (∇F_D(β₂) − ∇F_D(β₁))ᵀ(β₂ − β₁) = −∇ℓ_z(β₂)ᵀ(β₂ − β₁) ≤ ‖β₂ − β₁‖,

i.e. ‖β̂(D) − β̂(D')‖₂ ≤ Δ₂ := 1/μ; replacing one row is a removal then an addition, so Δ₂ = 2/μ under
replace-one adjacency. Only real rows are private: the synthetic rows are post-processing of a DP generator
and identical in both neighbours. Consequences:

* the L1 sensitivity of β is ≤ √F·Δ₂ (F = feature width, intercept included);
* the log-weight sensitivity is |xᵀ(β₁ − β₂)| ≤ ‖x‖·Δ₂ ≤ Δ₂ for every row x (the prior term is public), tighter
  than the paper's 2√d/(N_D λ) by the √d the paper loses through ‖x‖_∞‖Δβ‖₁.

Every private estimator plans its release from public facts (:class:`~lightning_dp.weighting.base.PlanInputs`),
calibrated so that the release alone is (ε, δ)-DP under the ledger's RDP accounting, and draws exactly the
noise the recorded release describes. The prior term uses the run's DP row count ñ_D, never ``len(real)``.
"""

from __future__ import annotations

import logging
import math
import warnings
from abc import abstractmethod
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.privacy.ledger import ADJACENCIES, BudgetExceededError, Release
from lightning_dp.privacy.mechanisms import gaussian_noise, laplace_noise
from lightning_dp.weighting.base import (
    PlanInputs,
    WeightEstimator,
    WeightFit,
    prior_log_ratio,
    require_epsilon,
    standalone_noise,
)
from lightning_dp.weighting.features import check_unit_ball
from lightning_dp.weighting.noise import (
    gaussian_exp_moments,
    ji_elkan_log_factor,
    laplace_exp_moments,
    laplace_location,
    laplace_scale_limit,
)

log = logging.getLogger(__name__)

DEFAULT_L2 = 50.0


# ---------------------------------------------------------------------------------------------- pure helpers
def coefficient_sensitivity(l2: float, *, adjacency: str = "add_remove") -> float:
    """Δ₂ = ‖β̂(D) − β̂(D')‖₂ bound: 1/μ (add/remove) or 2/μ (replace-one), rows in the unit ball.

    >>> coefficient_sensitivity(50.0), coefficient_sensitivity(50.0, adjacency="replace_one")
    (0.02, 0.04)
    """
    if adjacency not in ADJACENCIES:
        raise ValueError(f"Unknown adjacency {adjacency!r}; valid: {', '.join(ADJACENCIES)}.")
    return (1.0 if adjacency == "add_remove" else 2.0) / float(l2)


def fit_logistic(real: np.ndarray, synthetic: np.ndarray, *, l2: float) -> np.ndarray:
    """β̂ = argmin Σ ℓ(y βᵀx) + (μ/2)‖β‖², real rows y = 1, synthetic y = 0; (F,).

    sklearn's lbfgs with C = 1/μ, no separate intercept and a tight tolerance, so that β̂ is the exact
    minimiser the sensitivity bound is about (to ~1e-9).
    """
    from sklearn.linear_model import LogisticRegression

    x = np.concatenate([real, synthetic]).astype(float)  # (N_D + N_G, F)
    y = np.concatenate([np.ones(len(real)), np.zeros(len(synthetic))])
    clf = LogisticRegression(C=1.0 / l2, fit_intercept=False, tol=1e-10, max_iter=10_000)
    clf.fit(x, y)
    return clf.coef_[0].astype(float)


def coefficient_release(name: str, *, num_features: int, l2: float, adjacency: str, epsilon: float,
                        delta: float, noise: str = "laplace") -> Release:
    """The Laplace release of β (one noise draw per coefficient), calibrated to be (ε, δ)-DP on its own.

    The L1 sensitivity of β is S₁ = √F·Δ₂. The ledger's Laplace RDP curve (Mironov 2017, Prop. 6) is stated
    for a scalar; it holds for the vector too: the Rényi divergence of a product of independent Laplaces is the
    sum f(|Δ_1|/b) + … + f(|Δ_F|/b) of the scalar curve f(t) = 1/(α−1)·log(α/(2α−1)e^{(α−1)t} + (α−1)/(2α−1)e^{−αt}),
    which is convex (a log-sum-exp of linear functions) with f(0) = 0, hence superadditive and increasing on
    t ≥ 0, so the sum is at most f(‖Δ‖₁/b) ≤ f(S₁/b). Calibrating through the ledger's RDP conversion keeps the
    scale consistent with what the ledger will charge; for this single use it lands within a fraction of a
    percent of the pure-DP scale S₁/ε (RDP gains over pure DP only under composition, e.g. output perturbation).
    """
    delta2 = coefficient_sensitivity(l2, adjacency=adjacency)
    if noise == "gaussian":  # the L2 sensitivity itself: no √F, and Gaussian RDP composes well with the run
        sens, note = delta2, (f"Gaussian on the {num_features} logistic-regression coefficients; L2 sensitivity Δ₂ = "
                              f"{'1' if adjacency == 'add_remove' else '2'}/μ, μ = {l2:g} (rows in the unit ball)")
    else:
        sens = math.sqrt(num_features) * delta2
        note = (f"Laplace on the {num_features} logistic-regression coefficients; L1 sensitivity √F·Δ₂ with "
                f"Δ₂ = {'1' if adjacency == 'add_remove' else '2'}/μ, μ = {l2:g} (rows in the unit ball)")
    mechanism = "gaussian" if noise == "gaussian" else "laplace"

    def planned(sigma: float) -> list[Release]:
        return [Release(name=name, mechanism=mechanism, sensitivity=sens, noise_multiplier=sigma, note=note)]

    return planned(standalone_noise(planned, epsilon=epsilon, delta=delta))[0]


def perturbed_logistic(real: Tensor, synthetic: Tensor, *, l2: float, release: Release,
                       generator: torch.Generator) -> np.ndarray:
    """β̄ = β̂ + ζ: ζ_j ~ Laplace(0, b) iid with b = the release's noise multiplier × its L1 sensitivity, or (a
    ``gaussian`` release) ζ ~ N(0, s²I) with s = noise multiplier × the L2 sensitivity; (F,).

    Both row sets must be in the unit ball (the sensitivity needs it).

    Raises:
        ValueError: rows outside the unit ball, or a release that is not that noise on these F coefficients.
    """
    check_unit_ball(real, what="real rows")
    check_unit_ball(synthetic, what="synthetic rows")
    num_features = real.shape[1]
    expected = (1.0 if release.mechanism == "gaussian" else math.sqrt(num_features)) / l2
    if release.mechanism not in ("laplace", "gaussian") or not any(
            math.isclose(release.sensitivity, k * expected) for k in (1.0, 2.0)):
        raise ValueError(f"Release {release.name!r} does not describe Laplace (L1 sensitivity √F/μ or 2√F/μ) or "
                         f"Gaussian (L2 sensitivity 1/μ or 2/μ) noise on {num_features} coefficients with μ = {l2:g}; "
                         "pass the releases plan() returned.")
    beta = fit_logistic(_numpy(real), _numpy(synthetic), l2=l2)
    draw = gaussian_noise if release.mechanism == "gaussian" else laplace_noise
    noisy = draw(torch.from_numpy(beta), sensitivity=release.sensitivity, noise_multiplier=release.noise_multiplier,
                 generator=generator)
    return noisy.numpy()


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().double().numpy()


def check_l2(l2: float) -> float:
    """The penalty μ as a float.

    Raises:
        ConfigError: μ not a finite number > 0.
    """
    if not (isinstance(l2, int | float) and math.isfinite(l2) and l2 > 0):
        raise ConfigError(f"weights l2 (the L2 penalty μ of the logistic regression, sum convention) must be a finite "
                          f"number > 0, got {l2!r}; e.g. l2=50 (the paper's Λ = 0.1 times N_D ≈ 455).")
    return float(l2)


def check_plan_inputs(inputs: PlanInputs) -> None:
    """Refuse plan inputs no estimator here can use.

    Raises:
        ConfigError: an unknown adjacency, no feature, or a row count ≤ 0.
    """
    if inputs.adjacency not in ADJACENCIES:
        raise ConfigError(f"Unknown adjacency {inputs.adjacency!r}; valid: {', '.join(ADJACENCIES)}.")
    if inputs.num_features < 1 or inputs.num_real <= 0:
        raise ConfigError(f"The weights need at least one feature and a positive row count, got "
                          f"F={inputs.num_features}, ñ_D={inputs.num_real}.")


# ---------------------------------------------------------------------------------------------- estimators
class _Planned(WeightEstimator):
    """Shared plumbing: the planned inputs and releases, and the release check in ``fit``.

    ``plan`` keeps its inputs (``fit`` needs the DP row count for the prior term) and its releases (``fit``
    refuses any others), so one instance is planned, then fitted.
    """

    def __init__(self) -> None:
        self._inputs: PlanInputs | None = None
        self._planned: list[Release] | None = None

    def _remember(self, inputs: PlanInputs, releases: list[Release]) -> list[Release]:
        self._inputs, self._planned = inputs, list(releases)
        return list(releases)

    def _planned_inputs(self, real: Tensor | None, synthetic: Tensor) -> PlanInputs:
        if self._inputs is None:
            raise RuntimeError(f"{type(self).__name__}.fit called before plan(): plan the releases (and record them on "
                               "the ledger) first; fit needs the DP row count the plan was made with.")
        width = self._inputs.num_features
        for what, rows in (("real", real), ("synthetic", synthetic)):
            if rows is not None and rows.shape[1] != width:
                raise ValueError(f"The {what} rows have {rows.shape[1]} features but the plan was made for {width}.")
        return self._inputs

    def _matching(self, releases: list[Release]) -> list[Release]:
        """The recorded releases, checked against the planned ones (the noise drawn must be what was charged)."""
        keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "count")
        want = [tuple(getattr(r, k) for k in keys) for r in self._planned or []]
        got = [tuple(getattr(r, k) for k in keys) for r in releases]
        if want != got:
            raise ValueError(f"{type(self).__name__}.fit got releases {got} but plan() returned {want}: pass exactly "
                             "the releases plan() returned (and the ledger recorded), so the noise drawn is the noise "
                             "accounted for.")
        return list(releases)


class _Reference(_Planned):
    """A non-private reference estimator: it fits on the private rows without a mechanism and releases nothing."""

    private: ClassVar[bool] = False

    def plan(self, inputs: PlanInputs) -> list[Release]:
        """No release: the weights are private data (the run's DP claim is waived when they are used)."""
        check_plan_inputs(inputs)
        return self._remember(inputs, [])


class LogisticWeights(_Reference):
    """Non-private L2 logistic-regression weights (``logreg``, the paper's reference; Sec. 3.1).

    Args:
        l2: the penalty μ of the sum-convention objective (sklearn C = 1/μ); see the module docstring.
    """

    name: ClassVar[str] = "logreg"

    def __init__(self, *, l2: float = DEFAULT_L2) -> None:
        super().__init__()
        self.l2 = check_l2(l2)

    def fit(self, real: Tensor | None, synthetic: Tensor, *, releases: list[Release], generator: torch.Generator,
            model: Any = None) -> WeightFit:
        """log w = β̂ᵀx + log(N_G/ñ_D) for every synthetic row (N_G = ``len(synthetic)``)."""
        inputs = self._planned_inputs(real, synthetic)
        self._matching(releases)
        self.beta = fit_logistic(_numpy(real), _numpy(synthetic), l2=self.l2)
        self.prior = prior_log_ratio(inputs.num_real, len(synthetic))
        return WeightFit(log_w=self.log_weights(synthetic), private=False,
                         info={"estimator": self.name, "l2": self.l2, "prior": self.prior})

    def log_weights(self, x: Tensor) -> np.ndarray:
        """log w of any rows with the fitted β̂ and the fit's prior term (e.g. for calibration); (N,)."""
        return _numpy(x) @ self.beta + self.prior


class BetaNoised(_Planned):
    """Coefficient perturbation (``beta_noised``; Ji & Elkan 2013, Sec. 3.3 and Prop. 1 of the paper).

    β̄ = β̂ + ζ with ζ_j ~ Laplace(0, b) iid, b calibrated on the L1 sensitivity √F·Δ₂ so that β̄ alone is
    (ε, δ)-DP (:func:`coefficient_release`). log w̄(x) = β̄ᵀx + log(N_G/ñ_D); weights for any number of
    synthetic rows are post-processing. The shared ζ biases them: E_ζ[w̄(x)] = w(x)·Π_j 1/(1 − b²x_j²), a
    factor ≥ 1 that depends on x (reported in ``info`` as ``bias_factor_mean``/``bias_factor_max``).

    ``noise="gaussian"`` (not in the paper) draws ζ ~ N(0, s²I) on the L2 sensitivity Δ₂ instead: no √F factor,
    and a Gaussian's RDP curve composes with the run's other (Gaussian) releases far better than a pure-DP
    Laplace does, so the generator keeps more of the budget. Its bias factor is E[exp(ζᵀx)] = exp(s²‖x‖²/2).

    Args:
        epsilon: ε of this release alone (the run's ledger composes it with the rest).
        l2: the penalty μ (sum convention).
        debias: divide w̄ by the bias factor (not in the paper), which makes E_ζ[w̄(x)] = w(x); with Laplace noise
            it needs b|x_j| < 1 for every coordinate, which b < 1 guarantees for rows in the unit ball.
        noise: ``laplace`` (Ji & Elkan, the paper) or ``gaussian``.

    Raises:
        ConfigError: missing ε, μ ≤ 0, or (in ``check``/``plan``) ``debias`` with b ≥ 1.
    """

    name: ClassVar[str] = "beta_noised"

    def __init__(self, *, epsilon: float | None = None, l2: float = DEFAULT_L2, debias: bool = False,
                 noise: str = "laplace") -> None:
        super().__init__()
        self.l2 = check_l2(l2)
        self.epsilon = require_epsilon(self.name, epsilon)
        self.debias = bool(debias)
        if noise not in ("laplace", "gaussian"):
            raise ConfigError(f"weights.params.noise must be laplace (the paper) or gaussian, got {noise!r}.")
        self.noise = noise

    def _release(self, inputs: PlanInputs) -> Release:
        return coefficient_release(f"weights/{self.name}", num_features=inputs.num_features, l2=self.l2,
                                   adjacency=inputs.adjacency, epsilon=self.epsilon, delta=inputs.delta,
                                   noise=self.noise)

    def check(self, inputs: PlanInputs) -> None:
        """Refuse ``debias`` with Laplace noise when b ≥ 1 (the bias factor may not exist)."""
        check_plan_inputs(inputs)
        if self.debias and self.noise == "laplace":
            rel = self._release(inputs)
            b = rel.noise_multiplier * rel.sensitivity
            if b >= 1:
                raise ConfigError(f"weights=beta_noised with debias=true needs a Laplace scale b < 1, but ε={self.epsilon:g},"
                                  f" μ={self.l2:g}, F={inputs.num_features} give b={b:.3g}: raise weights.epsilon, "
                                  "raise l2, or set debias=false.")

    def plan(self, inputs: PlanInputs) -> list[Release]:
        """One Laplace release of the F coefficients."""
        self.check(inputs)
        return self._remember(inputs, [self._release(inputs)])

    def fit(self, real: Tensor | None, synthetic: Tensor, *, releases: list[Release], generator: torch.Generator,
            model: Any = None) -> WeightFit:
        """Fit, perturb β with the recorded release's noise, and weight every synthetic row."""
        inputs = self._planned_inputs(real, synthetic)
        (release,) = self._matching(releases)
        self.beta = perturbed_logistic(real, synthetic, l2=self.l2, release=release, generator=generator)
        self.b = release.noise_multiplier * release.sensitivity
        self.prior = prior_log_ratio(inputs.num_real, len(synthetic))
        factor = np.exp(self._log_factor(_numpy(synthetic)))
        if self.debias and not np.all(np.isfinite(factor)):
            raise ConfigError(f"weights=beta_noised with debias=true: some synthetic row has b|x_j| ≥ 1 (b={self.b:.3g}),"
                              " so the bias factor does not exist; raise weights.epsilon or l2, or set debias=false.")
        return WeightFit(log_w=self.log_weights(synthetic), releases=list(releases), info={
            "estimator": self.name, "epsilon": self.epsilon, "l2": self.l2, "delta2": coefficient_sensitivity(
                self.l2, adjacency=inputs.adjacency), "noise": self.noise,
            ("laplace_scale" if self.noise == "laplace" else "gaussian_std"): self.b, "debias": self.debias,
            "prior": self.prior,
            "beta": self.beta.tolist(), "bias_factor_mean": float(factor.mean()),
            "bias_factor_max": float(factor.max())})

    def log_weights(self, x: Tensor) -> np.ndarray:
        """log w̄ of any rows from the released β̄ (post-processing), debiased if asked; (N,)."""
        rows = _numpy(x)
        out = rows @ self.beta + self.prior
        if self.debias:
            out = out - self._log_factor(rows)
        return out

    def _log_factor(self, rows: np.ndarray) -> np.ndarray:
        """log E_ζ[exp(ζᵀx)] per row: Σ_j −log(1 − b²x_j²) (Laplace) or s²‖x‖²/2 (Gaussian); (N,)."""
        if self.noise == "gaussian":
            return 0.5 * self.b**2 * np.square(rows).sum(axis=1)
        return ji_elkan_log_factor(rows, self.b)


class _OutputPerturbation(_Planned):
    """Output perturbation (Theorem 2): log w*(x_i) = β̂ᵀx_i + prior + ζ_i, fresh ζ_i with E[e^ζ] = 1.

    Each log weight has sensitivity Δ₂, so the N_S weights are ``count = N_S`` uses of a scalar mechanism,
    composed in RDP (tighter than the paper's basic composition). The noise scale grows with N_S, so ``check``
    refuses an N_S whose noise breaks the family's condition and names the largest admissible one
    (:func:`max_rows`). The caller passes exactly the N_S synthetic rows it wants weighted.
    """

    mechanism: ClassVar[str] = ""

    def __init__(self, *, epsilon: float | None = None, l2: float = DEFAULT_L2) -> None:
        super().__init__()
        self.l2 = check_l2(l2)
        self.epsilon = require_epsilon(self.name, epsilon)

    def noise_scale(self, inputs: PlanInputs) -> float:
        """ρ (Laplace scale) or γ (Gaussian std) of each log weight for ``inputs.num_synthetic`` weights."""
        delta2 = coefficient_sensitivity(self.l2, adjacency=inputs.adjacency)
        return self._planned_release(inputs).noise_multiplier * delta2

    def _planned_release(self, inputs: PlanInputs) -> Release:
        delta2 = coefficient_sensitivity(self.l2, adjacency=inputs.adjacency)
        note = (f"{self.mechanism} noise on each of {inputs.num_synthetic} log weights; sensitivity Δ₂ = "
                f"{'1' if inputs.adjacency == 'add_remove' else '2'}/μ, μ = {self.l2:g} (rows in the unit ball)")

        def planned(sigma: float) -> list[Release]:
            return [Release(name=f"weights/{self.name}", mechanism=self.mechanism, sensitivity=delta2,
                            noise_multiplier=sigma, count=int(inputs.num_synthetic), note=note)]

        return planned(standalone_noise(planned, epsilon=self.epsilon, delta=inputs.delta))[0]

    def admissible(self, inputs: PlanInputs) -> bool:
        """True when ``inputs.num_synthetic`` weights meet the family's noise condition."""
        try:
            return self._scale_ok(self.noise_scale(inputs))
        except BudgetExceededError:  # not even the largest noise multiplier fits ε
            return False

    def _scale_ok(self, scale: float) -> bool:
        return True

    def _condition(self) -> str:
        return ""

    def check(self, inputs: PlanInputs) -> None:
        """Refuse an N_S whose noise breaks the condition; the message names the largest admissible N_S."""
        check_plan_inputs(inputs)
        if inputs.num_synthetic < 1:
            raise ConfigError(f"weights={self.name} needs at least one synthetic row to weight (N_S ≥ 1).")
        if self.admissible(inputs):
            return
        n_max = max_rows(inputs, estimator=self)
        raise ConfigError(
            f"weights={self.name}: N_S={inputs.num_synthetic} weights at ε={self.epsilon:g}, μ={self.l2:g} need noise "
            f"beyond {self._condition()}. The largest admissible N_S is {n_max}"
            + (" (none at these settings)" if n_max == 0 else "")
            + ": weight fewer synthetic rows, raise weights.epsilon, or raise l2.")

    def plan(self, inputs: PlanInputs) -> list[Release]:
        """One release of ``count = N_S`` scalar uses."""
        self.check(inputs)
        return self._remember(inputs, [self._planned_release(inputs)])

    @abstractmethod
    def _noise(self, n: int, release: Release, generator: torch.Generator) -> tuple[np.ndarray, dict[str, Any]]:
        """(n,) noise ζ drawn with the recorded ``release``, and public facts about it for ``info``."""

    def fit(self, real: Tensor | None, synthetic: Tensor, *, releases: list[Release], generator: torch.Generator,
            model: Any = None) -> WeightFit:
        """Fit β̂ on real vs these N_S synthetic rows and perturb each of their log weights with fresh noise."""
        inputs = self._planned_inputs(real, synthetic)
        (release,) = self._matching(releases)
        check_unit_ball(real, what="real rows")
        check_unit_ball(synthetic, what="synthetic rows")
        if len(synthetic) != release.count:
            raise ValueError(f"weights={self.name} was planned (and charged) for N_S={release.count} weights, but fit got "
                             f"{len(synthetic)} synthetic rows: pass exactly the N_S rows to weight.")
        beta = fit_logistic(_numpy(real), _numpy(synthetic), l2=self.l2)
        prior = prior_log_ratio(inputs.num_real, len(synthetic))
        zeta, info = self._noise(len(synthetic), release, generator)
        return WeightFit(log_w=_numpy(synthetic) @ beta + prior + zeta, keep=None, releases=list(releases), info={
            "estimator": self.name, "epsilon": self.epsilon, "l2": self.l2, "delta2": release.sensitivity,
            "num_weights": len(synthetic), "prior": prior, **info})


class OutputLaplace(_OutputPerturbation):
    """Log-Laplace output perturbation (``output_lapl``, Corollary 1).

    ζ_i ~ Laplace(log(1 − ρ²), ρ) iid, so E[e^ζ] = 1 and Var[e^ζ] = (1 − ρ²)²/(1 − 4ρ²) − 1 (the corollary prints λ
    for ρ). ρ is calibrated so that the N_S releases together are (ε, δ)-DP on their own (RDP; the paper's
    ρ = 2√d N_S/(N_D λ ε) is the basic-composition, pure-DP version). The paper leaves open which restriction
    picked N_S; here ρ < 1/2 (finite variance) by default, ρ < 1 (finite mean) with
    ``require_finite_variance=False``.

    Args:
        epsilon: ε of the N_S weights together.
        l2: the penalty μ (sum convention).
        require_finite_variance: demand ρ < 1/2 (default) rather than ρ < 1.
    """

    name: ClassVar[str] = "output_lapl"
    mechanism: ClassVar[str] = "laplace"

    def __init__(self, *, epsilon: float | None = None, l2: float = DEFAULT_L2,
                 require_finite_variance: bool = True) -> None:
        super().__init__(epsilon=epsilon, l2=l2)
        self.require_finite_variance = bool(require_finite_variance)

    def _scale_ok(self, scale: float) -> bool:
        return scale < laplace_scale_limit(finite_variance=self.require_finite_variance)

    def _condition(self) -> str:
        limit = laplace_scale_limit(finite_variance=self.require_finite_variance)
        return f"ρ < {limit:g} ({'finite variance' if self.require_finite_variance else 'finite mean'} of e^ζ)"

    def _noise(self, n: int, release: Release, generator: torch.Generator) -> tuple[np.ndarray, dict[str, Any]]:
        rho = release.noise_multiplier * release.sensitivity
        draw = laplace_noise(torch.zeros(n, dtype=torch.float64), sensitivity=release.sensitivity,
                             noise_multiplier=release.noise_multiplier, generator=generator)  # (N_S,)
        _, var = laplace_exp_moments(rho)
        return draw.numpy() + laplace_location(rho), {"rho": rho, "noise_variance": var}


class OutputGaussian(_OutputPerturbation):
    """Lognormal output perturbation (``output_norm``, Corollary 2).

    ζ_i ~ N(−γ²/2, γ²) iid, so E[e^ζ] = 1 and Var[e^ζ] = e^{γ²} − 1 (the paper states γ², its first-order
    approximation). γ is calibrated so that the N_S releases together are (ε, δ)-DP on their own, composed in
    RDP; the paper's "(N_S ε, δ)" is wrong: basic composition of N_S (ε, δ) releases gives (N_S ε, N_S δ).

    Args:
        epsilon: ε of the N_S weights together.
        l2: the penalty μ (sum convention).
        max_variance: when set, refuse an N_S with e^{γ²} − 1 above it (there is no hard limit otherwise, but
            the variance explodes).
    """

    name: ClassVar[str] = "output_norm"
    mechanism: ClassVar[str] = "gaussian"

    def __init__(self, *, epsilon: float | None = None, l2: float = DEFAULT_L2,
                 max_variance: float | None = None) -> None:
        super().__init__(epsilon=epsilon, l2=l2)
        if max_variance is not None and not (isinstance(max_variance, int | float) and max_variance > 0):
            raise ConfigError(f"weights=output_norm max_variance must be a number > 0 or null, got {max_variance!r}.")
        self.max_variance = None if max_variance is None else float(max_variance)

    def _scale_ok(self, scale: float) -> bool:
        return self.max_variance is None or math.expm1(scale**2) <= self.max_variance

    def _condition(self) -> str:
        return f"Var[e^ζ] = e^(γ²) − 1 ≤ max_variance = {self.max_variance:g}"

    def _noise(self, n: int, release: Release, generator: torch.Generator) -> tuple[np.ndarray, dict[str, Any]]:
        gamma = release.noise_multiplier * release.sensitivity
        draw = gaussian_noise(torch.zeros(n, dtype=torch.float64), sensitivity=release.sensitivity,
                              noise_multiplier=release.noise_multiplier, generator=generator)  # (N_S,)
        _, var = gaussian_exp_moments(gamma)
        return draw.numpy() - gamma**2 / 2, {"gamma": gamma, "noise_variance": var}


def max_rows(inputs: PlanInputs, *, estimator: OutputLaplace | OutputGaussian, upper: int = 10**7) -> int:
    """The largest N_S ≤ ``upper`` whose weights meet ``estimator``'s noise condition (0 when none does).

    The noise grows with N_S, so the condition is monotone: an exponential then a binary search on N_S, each
    step calibrating the noise for that many weights.
    """
    def ok(n: int) -> bool:
        return estimator.admissible(replace(inputs, num_synthetic=n))

    if not ok(1):
        return 0
    lo = 1
    while lo < upper and ok(min(2 * lo, upper)):
        lo = min(2 * lo, upper)
    if lo == upper:
        return upper
    hi = min(2 * lo, upper)  # fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


class MLPWeights(_Reference):
    """Non-private MLP weights (``mlp``, the paper's reference, Sec. 3.1): log w = logit + log(N_G/ñ_D).

    The paper's "two dense layers and ReLU" leaves widths and training open; here sklearn's ``MLPClassifier``
    with two hidden layers of 64, ReLU, Adam, no early stopping, 500 iterations.

    Args:
        seed: ``random_state`` of the MLP (initialisation and batches).
        hidden: hidden layer widths.
        max_iter: training epochs.
    """

    name: ClassVar[str] = "mlp"

    def __init__(self, *, seed: int = 0, hidden: tuple[int, ...] = (64, 64), max_iter: int = 500) -> None:
        super().__init__()
        self.seed, self.hidden, self.max_iter = int(seed), tuple(int(h) for h in hidden), int(max_iter)

    def fit(self, real: Tensor | None, synthetic: Tensor, *, releases: list[Release], generator: torch.Generator,
            model: Any = None) -> WeightFit:
        """Train the MLP, real (1) vs synthetic (0), and weight every synthetic row."""
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        inputs = self._planned_inputs(real, synthetic)
        self._matching(releases)
        x = np.concatenate([_numpy(real), _numpy(synthetic)])  # (N_D + N_G, F)
        y = np.concatenate([np.ones(len(real)), np.zeros(len(synthetic))])
        self.model = MLPClassifier(hidden_layer_sizes=self.hidden, activation="relu", early_stopping=False,
                                   max_iter=self.max_iter, random_state=self.seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            self.model.fit(x, y)
        converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        if not converged:
            log.info("weights=mlp: the MLP did not converge in %d iterations.", self.max_iter)
        self.prior = prior_log_ratio(inputs.num_real, len(synthetic))
        return WeightFit(log_w=self.log_weights(synthetic), private=False, info={
            "estimator": self.name, "hidden": list(self.hidden), "converged": converged, "prior": self.prior})

    def logit(self, x: Tensor) -> np.ndarray:
        """The MLP's output pre-activation (its logit of "real"), computed exactly, not from clipped probabilities."""
        h = _numpy(x)
        for w, b in zip(self.model.coefs_[:-1], self.model.intercepts_[:-1]):
            h = np.maximum(h @ w + b, 0.0)  # (N, H)
        return (h @ self.model.coefs_[-1] + self.model.intercepts_[-1])[:, 0]

    def log_weights(self, x: Tensor) -> np.ndarray:
        """log w of any rows with the fitted MLP and the fit's prior term; (N,)."""
        return self.logit(x) + self.prior
