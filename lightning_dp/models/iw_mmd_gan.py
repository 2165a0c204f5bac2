"""Importance-weighted generative networks (IWGN) of "Distribution Distance Measures in Generative and Privacy
Models" (Diesendruck 2019, Ch. 3): train on data from MP, generate the target P, by weighting each data row's
share of the loss by w(x) = 1/M(x) (``models/importance.py``: known, or estimated up to a constant).

Two modules, both with ``estimator`` ∈ {standard, iw, miw, sniw, id} (``kernels/mmd.py``: Eqs. 3.3–3.5 and
importance duplication):

* :class:`IWMMDGenerator` (``model=iw_gmmn``): a generator only, trained on MMD² to the data with a fixed RBF
  mixture on standardised rows, σ ∈ {0.01, 1, 2} as variances (the thesis' synthetic runs, a GMMN);
* :class:`IWMMDGAN` (``model=iw_mmd_gan``): the MMD-GAN of Li et al. 2017 with the autoencoder discriminator,
  "same regularisers and schedule", every data term weighted (Table 3.1): the data half of the MMD², the mean
  code of real rows in the one-sided hinge and their reconstruction error.

**Privacy of the GMMN** (the thesis makes no DP claim; this is the DP variant). The generator G_θ reads private
rows directly: its loss is an MMD² to the real batch. For the U- (or V-) statistic with weights known per row,
its gradient splits into

    ∇_θ MMD²_IW = ∇_θ (1/(m(m−1))) Σ_{j≠l} k(G(z_j), G(z_l))  +  (1/n) Σ_i ∇_θ ℓ_i,
    ℓ_i = −(2/m) w(x_i) Σ_j k(x_i, G(z_j)),

(the data-only term has no θ-gradient). The first part reads only public noise; ℓ_i reads row i alone (its w
included) and the generated rows, which are a function of θ and public noise. So ℓ (shape (B,)) is a
per-sample loss: DP-SGD clips each ∇ℓ_i to C and adds N(0, σ²C²) to their sum, sensitivity C under add/remove,
and the public part is added after the noise. A large weight cannot raise the sensitivity, but its row's
gradient is clipped, which biases the estimate toward MP where w·∇k exceeds C. The generator's BatchNorm mixes
generated rows only. Per-sample gradients through the shared generated batch need DP-SGD's micro-batch engine
(``needs_double_backward`` makes its auto mode pick it). Refused under DP, before any release, with the reason:
``sniw`` (normalised by the batch's weight sum: one row moves every row's share), ``miw`` (a median over random
groups of the batch), ``id`` (a row duplicated ⌈w⌉ times would contribute several clipped gradients), estimated
weights (the weighting network trains on labelled private rows without noise) and ``standardize=data``.

**The MMD-GAN** reads the real batch through pair terms and twice per step and is never DP (``mmd_gan_ae.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dp.errors import ConfigError
from lightning_dp.kernels.mmd import (
    ESTIMATORS,
    duplication_counts,
    mmd2_estimate,
    rbf_kernel,
    weighted_mean,
)
from lightning_dp.models.mmd_base import RowMMDModule
from lightning_dp.models.mmd_gan_ae import AEMMDModule

PER_SAMPLE = ("iw", "standard")  # estimators whose generator gradient is a mean of per-row terms


def check_estimator(estimator: str, groups: int) -> None:
    """Raises ConfigError for an unknown estimator or a group count below 1."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"model.module.estimator={estimator!r}; valid: {', '.join(ESTIMATORS)}.")
    if groups < 1:
        raise ConfigError(f"model.module.groups={groups}: MIW needs at least 1 group (the thesis: 4 or 8).")


def min_rows(estimator: str, groups: int) -> int:
    """Real rows a batch needs for the estimator (2 per U-statistic, per group for MIW)."""
    return 2 * groups if estimator == "miw" else 2


class IWMMDGenerator(RowMMDModule):
    """The generator-only importance-weighted MMD network (a GMMN with a fixed kernel; the thesis' Ch. 3 runs).

    Args:
        generator: z → a standardised row (``ResidualELUGenerator``, the thesis' code: width 10, 2 blocks).
        n_continuous, block_sizes, num_classes: the data layout (supplied by the run).
        estimator: ``standard`` | ``iw`` | ``miw`` | ``sniw`` | ``id``.
        weights: ``model.weights`` (``models/importance.py``); None is w ≡ 1.
        statistic: ``u`` (Eq. 3.3 and 3.5) or ``v`` (Table 3.1's V form).
        groups: MIW's number of groups (4 of 16 in the thesis' synthetic runs).
        max_copies: ID's optional cap on copies (an extension; off by default).
        bandwidths, sigma_is: the RBF mixture on standardised rows ({0.01, 1, 2} as variances).
        standardize: ``data`` (z-scores from the training rows; no DP claim) or ``none``.
        batch_size: generated rows m per step. lr: RMSProp learning rate (10⁻⁴).
    """

    needs_double_backward = True  # not a double backward: the per-row losses share the generated batch (see above)
    private_metrics = {
        "train/mmd2": "PRIVATE: the weighted MMD² between the real batch and generated rows; logged only without a "
                      "DP claim",
    }

    def __init__(self, generator: nn.Module, *, n_continuous: int, block_sizes: Sequence[int] = (),
                 num_classes: int = 1, estimator: str = "iw", weights: Mapping[str, Any] | None = None,
                 statistic: str = "u", groups: int = 4, max_copies: int | None = None,
                 bandwidths: Sequence[float] = (0.01, 1.0, 2.0), sigma_is: str = "variance",
                 standardize: str = "data", batch_size: int = 64, lr: float = 1e-4) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["generator"])
        self.automatic_optimization = False
        check_estimator(estimator, groups)
        AEMMDModule._check_common(batch_size=batch_size, statistic=statistic)
        self.generator = generator
        self.setup_rows(n_continuous=n_continuous, block_sizes=block_sizes, num_classes=num_classes,
                        standardize=standardize, weights=weights)
        self.kernel = rbf_kernel(list(bandwidths), sigma_is=sigma_is)

    @classmethod
    def check_settings(cls, module_cfg: Mapping[str, Any]) -> None:
        check_estimator(module_cfg.get("estimator", "iw"), module_cfg.get("groups", 4))

    @classmethod
    def dp_networks(cls, module_cfg: Mapping[str, Any]) -> list[str]:
        return ["generator"]

    @classmethod
    def dp_blockers(cls, module_cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
        estimator = module_cfg.get("estimator", "iw")
        reasons = {
            "sniw": "estimator=sniw divides by the batch's weight sum, so one row moves every row's share of the loss",
            "miw": "estimator=miw takes a median over random groups of the batch, so one row can change which group "
                   "is used",
            "id": "estimator=id duplicates a row ⌈w⌉ times, so one person would contribute several clipped gradients",
        }
        out = []
        if estimator in reasons:
            out.append(("generator", reasons[estimator] + " (use estimator=iw or standard)"))
        return [*out, *super().dp_blockers(module_cfg)]

    def on_fit_start(self) -> None:
        super().on_fit_start()
        from lightning_dp.callbacks.dp_sgd import DPSGD

        for cb in self.trainer.callbacks:
            if isinstance(cb, DPSGD) and cb.mode != "microbatch":
                raise ConfigError(f"model=iw_gmmn's per-row losses share the generated batch: only DP-SGD's micro-batch "
                                  f"engine computes their gradients; set privacy.dp_sgd.mode=auto (got {cb.mode}).")

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch  # private rows (a Poisson sample under DP-SGD; possibly empty)
        estimator = self.hparams.estimator
        per_sample = estimator in PER_SAMPLE
        if not per_sample and len(x) < min_rows(estimator, self.hparams.groups):
            return  # too few rows for this estimator (only without DP: DP allows the per-sample ones only)
        opt = self.optimizers()
        opt.zero_grad()
        real = self.standardizer(self.join(x, y))  # (B, d)
        fake = self.generator(self.noise(self.hparams.batch_size))  # (m, d)
        w = self.row_weights(x, y, real)
        if per_sample:
            loss = self.row_losses(real, fake, None if estimator == "standard" else w)  # (B,): private
            self.manual_backward(loss, retain_graph=True)
            fake_term = self.fake_term(fake)  # scalar: generated rows only, public
            self.manual_backward(fake_term)
            if self._log_private and len(x) >= 2:
                with torch.no_grad():
                    value = mmd2_estimate(real, fake, w, self.kernel, estimator=estimator,
                                          statistic=self.hparams.statistic)
                self.log_private("train/mmd2", value, prog_bar=True)
        else:
            loss = mmd2_estimate(real, fake, w, self.kernel, estimator=estimator, statistic=self.hparams.statistic,
                                 groups=self.hparams.groups, max_copies=self.hparams.max_copies)
            self.manual_backward(loss)
            self.log_private("train/mmd2", loss, prog_bar=True)
        opt.step()

    def row_losses(self, real: Tensor, fake: Tensor, w: Tensor | None) -> Tensor:
        """ℓ_i = −(2/m) w_i Σ_j k(x_i, G(z_j)), shape (B,): the data rows' part of MMD²'s θ-gradient."""
        loss = -2 * self.kernel(real, fake).mean(1)  # (B,)
        return loss if w is None else loss * w

    def fake_term(self, fake: Tensor) -> Tensor:
        """The generated rows' within term of MMD² (U: pairs j ≠ l; V: all pairs)."""
        gram = self.kernel(fake, fake)  # (m, m)
        m = len(fake)
        if self.hparams.statistic == "v":
            return gram.mean()
        return (gram.sum() - gram.diagonal().sum()) / (m * (m - 1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(self.generator.parameters(), lr=self.hparams.lr)


class IWMMDGAN(AEMMDModule):
    """The importance-weighted MMD-GAN with the autoencoder discriminator (Li et al. 2017's recipe, Ch. 3).

    Discriminator step (maximise; before it, the encoder's weights are clamped to [−c, c]):
    ``errD = √ReLU(MMD²_est(f(x), f(y))) + λ_rg·one_side(w̄f(x) − mean f(y)) − λ_AE_X·AE_w(x) − λ_AE_Y·AE(y)``,
    one_side(v) = −mean(ReLU(−v)); generator step (minimise): ``errG = √ReLU(MMD²_est) + λ_rg·one_side(...)``.
    w̄f(x) and AE_w(x) are weighted means (IW: (1/n)Σw·, SNIW: Σw·/Σw, ID: ⌈w⌉ as SNIW weights, MIW: IW). A
    round is ``d_iters`` discriminator steps then one generator step, each on its own real batch; ``d_iters_warmup``
    (100) replaces ``d_iters`` (5) for the first ``warmup_gen_iters`` (25) generator steps and every
    ``warmup_every`` (500)-th. √ is taken of ReLU(·) + 10⁻¹², so the gradient at 0 is finite.

    Args (beyond :class:`~lightning_dp.models.mmd_gan_ae.MMDGANAE`'s): estimator, weights, groups, max_copies as
        :class:`IWMMDGenerator`;
        lambda_rg (16), lambda_ae_x (8), lambda_ae_y (8); clamp (0.01; ``null`` for none); the schedule.
    """

    private_metrics = {
        "train/mmd2": "PRIVATE: the weighted MMD² between real and generated codes; logged only without a DP claim",
        "train/d_loss": "PRIVATE: −errD on the real batch; logged only without a DP claim",
        "train/g_loss": "PRIVATE: errG against the real batch; logged only without a DP claim",
        "train/ae_loss": "PRIVATE: weighted reconstruction error of the real batch; logged only without a DP claim",
    }

    def __init__(self, generator: nn.Module, discriminator: nn.Module, *, n_continuous: int,
                 block_sizes: Sequence[int] = (), num_classes: int = 1, estimator: str = "iw",
                 weights: Mapping[str, Any] | None = None, statistic: str = "u", groups: int = 4,
                 max_copies: int | None = None, bandwidths: Sequence[float] = (1.0, 2.0, 4.0, 8.0, 16.0),
                 sigma_is: str = "std", standardize: str = "data", batch_size: int = 64, lr: float = 5e-5,
                 lambda_rg: float = 16.0, lambda_ae_x: float = 8.0, lambda_ae_y: float = 8.0,
                 clamp: float | None = 0.01, d_iters: int = 5, d_iters_warmup: int = 100, warmup_gen_iters: int = 25,
                 warmup_every: int = 500) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["generator", "discriminator"])
        self.automatic_optimization = False
        check_estimator(estimator, groups)
        self._check_common(batch_size=batch_size, statistic=statistic)
        if min(d_iters, d_iters_warmup, warmup_every) < 1 or warmup_gen_iters < 0:
            raise ConfigError("model.module.d_iters, d_iters_warmup and warmup_every must be ≥ 1 and warmup_gen_iters "
                              f"≥ 0; got {d_iters}, {d_iters_warmup}, {warmup_every}, {warmup_gen_iters}.")
        self.generator, self.discriminator = generator, discriminator
        self.setup_rows(n_continuous=n_continuous, block_sizes=block_sizes, num_classes=num_classes,
                        standardize=standardize, weights=weights, feature_dim=discriminator.code_dim)
        self.kernel = rbf_kernel(list(bandwidths), sigma_is=sigma_is)
        self.register_buffer("gen_iters", torch.zeros((), dtype=torch.long))  # across epochs and resumes
        self.register_buffer("d_done", torch.zeros((), dtype=torch.long))  # discriminator steps of this round

    @classmethod
    def check_settings(cls, module_cfg: Mapping[str, Any]) -> None:
        check_estimator(module_cfg.get("estimator", "iw"), module_cfg.get("groups", 4))

    # ------------------------------------------------------------------ weighted pieces
    def mmd2_codes(self, real_codes: Tensor, fake_codes: Tensor, w: Tensor | None = None) -> Tensor:
        h = self.hparams
        return mmd2_estimate(real_codes, fake_codes, w, self.kernel, estimator=h.estimator, statistic=h.statistic,
                             groups=h.groups, max_copies=h.max_copies)

    def _mean_weights(self, w: Tensor | None) -> tuple[Tensor | None, bool]:
        """Weights and normalisation of the weighted means (one-sided hinge, reconstruction) for the estimator."""
        estimator = self.hparams.estimator
        if w is None or estimator == "standard":
            return None, False
        if estimator == "id":
            return duplication_counts(w, max_copies=self.hparams.max_copies).to(w.dtype), True
        return w, estimator == "sniw"

    def _terms(self, real: Tensor, fake: Tensor, w: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(√MMD², one_side, AE_w(x), AE(y), MMD²) of a real and a generated batch."""
        real_codes, real_recon = self.discriminator(real)
        fake_codes, fake_recon = self.discriminator(fake)
        mean_w, normalized = self._mean_weights(w)
        mmd = self.mmd2_codes(real_codes, fake_codes, w)
        gap = weighted_mean(real_codes, mean_w, self_normalized=normalized) - fake_codes.mean(0)  # (code_dim,)
        one_side = -F.relu(-gap).mean()
        ae_x = weighted_mean((real - real_recon).square().mean(1), mean_w, self_normalized=normalized)
        ae_y = (fake - fake_recon).square().mean()
        return torch.sqrt(F.relu(mmd) + 1e-12), one_side, ae_x, ae_y, mmd

    def d_iters_now(self) -> int:
        """Discriminator steps in the current round (Li et al. 2017's schedule)."""
        g, h = int(self.gen_iters), self.hparams
        return h.d_iters_warmup if g < h.warmup_gen_iters or g % h.warmup_every == 0 else h.d_iters

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        if len(x) < min_rows(self.hparams.estimator, self.hparams.groups):
            return
        d_opt, g_opt = self.optimizers()
        real = self.standardizer(self.join(x, y))  # (B, d)
        h = self.hparams
        if int(self.d_done) < self.d_iters_now():
            if h.clamp is not None:
                with torch.no_grad():
                    for p in self.discriminator.encoder.parameters():
                        p.clamp_(-h.clamp, h.clamp)
            d_opt.zero_grad()
            w = self.row_weights(x, y, real)
            with torch.no_grad():
                fake = self.generator(self.noise(h.batch_size))
            root, one_side, ae_x, ae_y, mmd = self._terms(real, fake, w)
            err_d = root + h.lambda_rg * one_side - h.lambda_ae_x * ae_x - h.lambda_ae_y * ae_y
            self.manual_backward(-err_d)  # maximise errD
            d_opt.step()
            self.d_done += 1
            self.log_private("train/d_loss", -err_d)
            self.log_private("train/ae_loss", ae_x)
            self.log_private("train/mmd2", mmd, prog_bar=True)
            return
        g_opt.zero_grad()
        w = self.row_weights(x, y, real)
        root, one_side, _, _, _ = self._terms(real, self.generator(self.noise(h.batch_size)), w)
        err_g = root + h.lambda_rg * one_side
        self.manual_backward(err_g)
        g_opt.step()
        self.gen_iters += 1
        self.d_done.zero_()
        self.log_private("train/g_loss", err_g)
