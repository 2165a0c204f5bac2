"""``discriminator``: importance weights read off a DP-GAN's discriminator, at no privacy cost.

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary
Tale", Sec. 3.4: when the generator is a GAN whose discriminator D was trained with DP, D is itself a
real-vs-synthetic classifier, and

    log w(x, y) = logit D(x, y) + prior

evaluated on the synthetic rows is post-processing of the released discriminator: no extra budget, no
private row read.

The prior term (derivation). The discriminator of :class:`~lightning_dp.models.dp_gan.DPGAN` (``loss=bce``)
descends, per step, the private part ``(Σ_{i ∈ lot} clip ∇ℓ_i + noise) / L`` (DPSGD divides the clipped
sum over the Poisson lot by the *expected* lot size L = q·ñ_D) plus the gradient of the *mean* BCE over the
``batch_size`` generated rows. Without clipping and noise, the first term has expectation
(q/L) Σ_{i ≤ n_D} ∇ℓ_i = (n_D/ñ_D) · E_{p_D}[∇ℓ], and the second is E_{p_G}[∇ℓ_fake]. So D minimises
E_{p_D}[−log D] + E_{p_G}[−log(1 − D)] with the two classes weighted equally, whose optimum is
D* = p_D/(p_D + p_G), i.e. logit D* = log p_D/p_G: the prior term is log 1 = 0. It would be
log(B_fake/L) only if both losses were sums over their rows; they are means. (The factor n_D/ñ_D, exact over
DP count, is private and ≈ 1; it is left out.)

Only a discriminator that outputs a probability qualifies: a WGAN critic (``loss=wgan_gp``) gives an
unbounded score, and D/(1 − D) means nothing for it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.privacy.ledger import Release
from lightning_dp.weighting.base import PlanInputs, WeightEstimator, WeightFit

log = logging.getLogger(__name__)

MODELS_WITH_DISCRIMINATOR = ("dp_gan", "dp_cgan")
PRIOR_LOG_RATIO = 0.0  # balanced real and fake terms per discriminator step (module docstring)


class DiscriminatorWeights(WeightEstimator):
    """``discriminator``: log w = logit D(x, y) on the synthetic rows of a BCE DP-GAN (zero budget).

    ``fit`` reads the model-space rows ``(x, y)`` of the synthetic data (``rows=``), not the joint features:
    the discriminator takes the rows as the GAN generated them. ``real`` and ``synthetic`` are not used.

    Args:
        epsilon: ignored (accepted so that every estimator takes ``weights.epsilon``): this one spends nothing.
    """

    name = "discriminator"
    reads_private = False
    needs_model = True

    def __init__(self, *, epsilon: float | None = None) -> None:
        if epsilon is not None:
            log.info("weights=discriminator spends no budget (post-processing of the DP discriminator); "
                     "weights.epsilon=%s is not used.", epsilon)

    @staticmethod
    def check_model(model: Any) -> None:
        """Refuse a model whose discriminator (if any) is not a DP probability classifier.

        Raises:
            ConfigError: no discriminator (models other than dp_gan, dp_cgan), or a WGAN critic.
        """
        from lightning_dp.models.dp_gan import DPGAN

        if not isinstance(model, DPGAN):
            raise ConfigError(f"weights=discriminator needs a GAN with a DP discriminator (model="
                              f"{' or model='.join(MODELS_WITH_DISCRIMINATOR)}), but the model is "
                              f"{type(model).__name__}. Use a separate estimator, e.g. weights=priv_mlp.")
        if model.hparams.loss != "bce":
            raise ConfigError(f"weights=discriminator: the model was trained with loss={model.hparams.loss}, and a "
                              "WGAN critic is not a probability (its logit is meaningless). Train with "
                              "model.module.loss=bce, or use weights=priv_mlp.")

    def plan(self, inputs: PlanInputs) -> list[Release]:
        """Nothing: the weights are post-processing of the released discriminator."""
        return []

    def fit(self, real: Tensor | None, synthetic: Tensor | None, *, releases: list[Release],
            generator: torch.Generator, model: Any = None,
            rows: tuple[Tensor, Tensor] | None = None) -> WeightFit:
        """``logit D(x, y) + 0`` for the synthetic model-space rows ``rows = (x, y)``.

        Args:
            real: not read (this estimator reads no private row).
            synthetic: the joint features of the same rows; only their count is checked.
            releases: ``[]`` (what :meth:`plan` returned).
            generator: unused (no noise is drawn).
            model: the trained :class:`~lightning_dp.models.dp_gan.DPGAN` (``loss=bce``).
            rows: (N_G, d) model-space rows and their (N_G,) labels, as ``model.sample`` returns them.

        Raises:
            ConfigError: the model has no probability discriminator (:meth:`check_model`).
            ValueError: ``rows`` missing or of another length than ``synthetic``.
        """
        self.check_model(model)
        if rows is None:
            raise ValueError("weights=discriminator needs the synthetic rows in model space: fit(..., rows=(x, y)).")
        x, y = rows
        if synthetic is not None and len(synthetic) != len(x):
            raise ValueError(f"rows has {len(x)} rows but synthetic has {len(synthetic)}; they must be the same rows.")
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                d_in, d_y = model._join(x.to(model.device).float(), y.to(model.device).long())  # what D was trained on
                logits = model.discriminator(d_in, d_y)  # (N_G,)
        finally:
            model.train(was_training)
        log_w = logits.double().cpu().numpy() + PRIOR_LOG_RATIO
        info = {"prior_log_ratio": PRIOR_LOG_RATIO, "num_synthetic": len(x), "loss": model.hparams.loss,
                "conditional": bool(model.conditional)}
        return WeightFit(log_w=np.asarray(log_w), releases=[], private=True, info=info)
