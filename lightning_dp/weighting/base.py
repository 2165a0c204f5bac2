"""One interface for importance-weight estimators: ``plan`` the releases, then ``fit(real, synthetic) → log w``.

Bias mitigation (Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic
Data: A Cautionary Tale"): DP synthetic data is a sample of p_G, not of p_D, and the importance weight
w(x) = p_D(x)/p_G(x) turns synthetic averages into unbiased estimates of real ones (Eq. 2). The weight is
read off a classifier of real (y = 1) against synthetic (y = 0) rows (Eq. 1, in log space):

    log w(x) = logit p̂(real | x) + log(N_G / N_D)

The paper prints the prior term as log(N_D/N_G) (Sec. 3.1, A.4); Bayes' rule with class priors N_D/(N_D+N_G)
and N_G/(N_D+N_G) gives log(N_G/N_D), which is what :func:`prior_log_ratio` returns. It is a constant, so it
cancels under self-normalisation, but it matters for unnormalised weights whenever N_S ≠ N_D.

An estimator is used in two steps so that nothing is released, and no private row is read, before the
ledger has accepted the cost:

1. :meth:`WeightEstimator.plan` builds the releases from public facts only (:class:`PlanInputs`: the run's
   DP row count, the number of synthetic rows, the feature width, δ). The caller checks them against the
   ledger (``epsilon_if``) and records them.
2. :meth:`WeightEstimator.fit` fits on the real and synthetic rows, draws the noise the recorded releases
   describe, and returns a :class:`WeightFit`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.privacy.ledger import PrivacyLedger, Release


@dataclass(frozen=True)
class PlanInputs:
    """Public facts an estimator may plan with (no private row is read to build them).

    Attributes:
        num_real: the run's DP (or public) count of training rows, ñ_D; never the exact count.
        num_synthetic: synthetic rows the caller wants weights for (N_S requested).
        num_features: width of the classifier's input (:func:`lightning_dp.weighting.features.joint_features`).
        delta: the run's δ (the ledger's).
        adjacency: the ledger's adjacency (``add_remove`` or ``replace_one``).
    """

    num_real: float
    num_synthetic: int
    num_features: int
    delta: float
    adjacency: str = "add_remove"


@dataclass
class WeightFit:
    """What an estimator returns.

    Attributes:
        log_w: (N_S,) log importance weights of the synthetic rows in ``keep`` (unnormalised, prior term included).
        keep: indices of the synthetic rows that have a weight; ``None`` means all of them, in order.
            Output perturbation weights only N_S rows (its noise grows with N_S), so it returns a subset.
        releases: the releases this fit made (already on the ledger).
        private: ``False`` for the reference estimators (non-private LR and MLP): their weights are private data.
        info: public facts about the fit for the report (noise scales, N_S, the mechanism's conditions).
    """

    log_w: np.ndarray
    keep: np.ndarray | None = None
    releases: list[Release] = field(default_factory=list)
    private: bool = True
    info: dict[str, Any] = field(default_factory=dict)


class WeightEstimator(ABC):
    """Base class of the weight estimators (registry: :data:`lightning_dp.weighting.ESTIMATORS`).

    Class attributes:
        name: registry name (``beta_noised``, ``output_lapl``, ...).
        private: ``False`` for reference estimators that fit on private rows without a mechanism; they are
            refused unless the user allows them, and then the run's DP claim is waived.
        reads_private: ``False`` when the estimator reads no private row (the DP-GAN discriminator: the
            weights are post-processing of the released discriminator).
        needs_model: ``True`` when ``fit`` needs the trained module (``model=``).
    """

    name: ClassVar[str] = ""
    private: ClassVar[bool] = True
    reads_private: ClassVar[bool] = True
    needs_model: ClassVar[bool] = False

    def check(self, inputs: PlanInputs) -> None:  # noqa: B027 - optional hook
        """Refuse settings that cannot work for ``inputs`` (raise :class:`~lightning_dp.errors.ConfigError`)."""

    @abstractmethod
    def plan(self, inputs: PlanInputs) -> list[Release]:
        """The releases a fit with ``inputs`` will make; built from public facts only, before any data is read."""

    @abstractmethod
    def fit(self, real: Tensor | None, synthetic: Tensor, *, releases: list[Release], generator: torch.Generator,
            model: Any = None) -> WeightFit:
        """Fit on ``real`` (y = 1) against ``synthetic`` (y = 0) rows and return their log weights.

        Args:
            real: (N_D, F) private rows as :func:`~lightning_dp.weighting.features.joint_features` (``None`` for
                estimators that read no private row).
            synthetic: (N_G, F) synthetic rows, the same features.
            releases: what :meth:`plan` returned, already recorded on the ledger; the noise drawn must be theirs.
            generator: the privacy noise generator.
            model: the trained module (only for ``needs_model`` estimators).
        """


def prior_log_ratio(num_real: float, num_synthetic: float) -> float:
    """log(N_G / N_D): the class-prior term of Eq. 1 (the paper prints its inverse; see the module docstring).

    ``num_real`` must be public or DP (the run's released count), never the exact private count.
    """
    return math.log(num_synthetic / num_real)


def standalone_noise(planned: Any, *, epsilon: float, delta: float) -> float:
    """Smallest noise multiplier σ with which ``planned(σ)`` is (ε, δ)-DP on its own (RDP, as the ledger composes).

    The run's ledger then composes the release with everything else; this only fixes the share it gets.
    """
    return PrivacyLedger(target_epsilon=epsilon, delta=delta).calibrate(planned)


def require_epsilon(name: str, epsilon: float | None) -> float:
    """``weights.epsilon`` of a private estimator: a finite ε > 0.

    Raises:
        ConfigError: missing or not positive.
    """
    if epsilon is None or not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"The {name} weights need their own budget: set weights.epsilon=E (train.py) or "
                          f"--weights-epsilon E (python -m lightning_dp.sample) to a number > 0, got {epsilon!r}.")
    return float(epsilon)
