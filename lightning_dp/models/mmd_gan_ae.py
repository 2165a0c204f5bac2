"""The MMD-GAN for synthetic medical records of "Distribution Distance Measures in Generative and Privacy Models"
(Diesendruck 2019, Ch. 4): a same-size synthetic copy of a mixed continuous/binary table.

The discriminator is an autoencoder (encoder d → 3×100 → 64, decoder 64 → 3×100 → d, ELU); the MMD is taken
between the codes of real and generated rows with the RBF mixture σ ∈ {0.1, 0.5, 1} (σ a standard deviation).
Per batch, one discriminator step and one generator step (the thesis' code):

* discriminator: minimise ``L_D = AE(x) − λ_MMD · MMD²(f(x), f(G(z)))`` with λ_MMD = 0.1 ("the MMD term in the
  discriminator loss is weighted by 0.1") and AE(x) the mean squared reconstruction error of real rows; the
  encoder's gradients are clipped elementwise to [−0.01, 0.01];
* generator: minimise ``L_G = MMD²(f(x), f(G(z)))``.

RMSProp, lr 10⁻³, for both. Rows are z-scored (continuous columns) and unstandardised at sampling, where
binary columns are rounded (``mmd_base.py``).

Departure (``block_output: gumbel``, the default; ``linear`` is the thesis' code): the generator's one-hot blocks
(categories, cells, the label) are straight-through Gumbel-softmax samples (Jang et al. 2017, "Categorical
reparameterization with Gumbel-softmax", Eq. 2, with the hard one-hot forward pass), in training and at sampling.
With a linear head the generator matches a block's *mean* (e.g. [0.94, 0.06] for a 6% label) and rounding at
sampling turns every row into the majority category: on Cervical every synthetic row had Biopsy = 0 and TSTR fell
below a coin flip. With hard samples the discriminator compares one-hot rows with one-hot rows and the MMD can
only be closed by the right proportions.

Departure (``weight_clip``, ``row_mmd_weight``): the thesis' code clips the encoder's *gradients* to ±0.01, which
does not bound the codes under RMSProp (RMSProp divides each step by the gradient's running magnitude, so a clipped
gradient moves the weights as far as an unclipped one): real codes collapsed (median pairwise distance 0.055) while
generated codes sat 3.4 away, so every RBF of σ ≤ 1 saturated and the generator got no gradient. MMD-GAN (Li et al.
2017, "MMD GAN: Towards deeper understanding of moment matching network", Algorithm 1) clips the encoder's
*weights* instead, which bounds its Lipschitz constant and so the codes, with σ ∈ {1, 2, 4, 8, 16} on them. The
row term (``row_mmd_weight``) makes the generator's kernel characteristic whatever the encoder learned (an MMD on
the rows themselves, as a GMMN's). ``label_kernel`` multiplies both kernels by the label's delta kernel: the label
is one block among many, so an RBF on whole rows (or their codes) barely sees whether it goes with the right
features, while the product measures the label's joint with the rest (``kernels.mmd.label_product_kernel``;
DP-MERF's construction). Measured on Cervical (500 epochs, seed 0, ROC of the audit's three classifiers, score):
the thesis' code 0.46, weight clipping and σ ∈ {1…16} 0.67, + the row term (λ_row 10) 0.65, + the label kernel
0.74 (real rows 0.74). On Adult the adversarial code term still drifts: with λ_row = 10 the score ROC peaked at
0.73 and wandered between 0.65 and 0.73 over 16 epochs (real 0.80; logistic regression held at about 0.84 while
naive Bayes fell to 0.45), while with λ_row = 100, where the row MMD dominates the generator's loss, it reached
0.79–0.81 from epoch 4 to 10 (seed 0, 8,000 rows every 2 epochs); Cervical with λ_row = 100: 0.81 at 500 epochs
(seed 0). The config's defaults are these departures (λ_row = 100); the thesis' code is ``block_output=linear
bandwidths=[0.1,0.5,1.0] weight_clip=null row_mmd_weight=0 label_kernel=false``. The thesis leaves out the batch size (its code: 200), the kernel
(its code's), the estimator (U here; ``statistic``) and the iteration count.

**Privacy.** The thesis makes no DP claim and neither does this model: both losses read the real batch through
MMD²(f(x), f(G(z))), whose within-data term couples every pair of real rows (k(f(x_i), f(x_j))) and whose
generator side needs the real batch a second time in each step, while DP-SGD releases one clipped per-sample
gradient sum per Poisson batch. So ``unprotected_networks`` names both networks (and the z-scores, read from the
training rows): ``privacy=dp_sgd`` is refused before any release, and ``privacy=none`` (the model config's
default) records the waiver in the ledger, the log and the report. For a DP generator use ``model=iw_gmmn``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dp.errors import ConfigError
from lightning_dp.kernels.mmd import STATISTICS, label_product_kernel, mmd2, rbf_kernel
from lightning_dp.models.mmd_base import RowMMDModule

BLOCK_OUTPUTS = ("gumbel", "linear")
GAN_BLOCKERS = [
    ("discriminator", "its MMD² between real and generated codes couples every pair of real rows"),
    ("generator", "its generator reads the real batch again, outside DP-SGD's one release per batch"),
]
GAN_REFUSAL = ("its MMD² between real and generated codes couples every pair of real rows and its generator reads "
               "the real batch again, outside DP-SGD's one release per batch. Use privacy=none (no DP claim), or for a "
               "DP generator model=iw_gmmn model.module.standardize=none privacy=dp_sgd")


class AEMMDModule(RowMMDModule):
    """What the MMD-GANs with an autoencoder discriminator share: the DP statement, the codes as the weighting
    function's features, MMD² between codes and RMSProp for both networks (subclasses set ``self.kernel``)."""

    @staticmethod
    def _check_common(*, batch_size: int, statistic: str) -> None:
        if batch_size < 2:
            raise ConfigError(f"model.module.batch_size={batch_size}: MMD² needs at least 2 generated rows.")
        if statistic not in STATISTICS:
            raise ConfigError(f"model.module.statistic={statistic!r}; valid: u (Eq. 3.2), v (Eq. 2.3).")

    @classmethod
    def dp_blockers(cls, module_cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
        return [*GAN_BLOCKERS, *super().dp_blockers(module_cfg)]

    @classmethod
    def unprotected_reason(cls, module_cfg: Mapping[str, Any]) -> str:
        return GAN_REFUSAL

    def weight_features(self, rows: Tensor) -> Tensor:
        """The encoder's codes (the thesis' weighting function reads encoded data)."""
        return self.discriminator.encoder(rows)

    def mmd2_codes(self, real_codes: Tensor, fake_codes: Tensor, w: Tensor | None = None) -> Tensor:
        """MMD² between codes (unweighted here; the IW MMD-GAN weights the real side)."""
        return mmd2(real_codes, fake_codes, self.kernel, statistic=self.hparams.statistic)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        lr = self.hparams.lr
        return [torch.optim.RMSprop(self.discriminator.parameters(), lr=lr),
                torch.optim.RMSprop(self.generator.parameters(), lr=lr)]


class MMDGANAE(AEMMDModule):
    """Ch. 4's MMD-GAN with the autoencoder discriminator, for whole rows (label as a block).

    Args:
        generator: z → a standardised row (``ResidualELUGenerator``); discriminator: ``AEDiscriminator``.
        n_continuous, block_sizes, num_classes: the data layout (supplied by the run).
        batch_size: generated rows per step (the real batch is ``data.batch_size``).
        lr: RMSProp learning rate of both networks (10⁻³).
        mmd_weight: λ_MMD in the discriminator's loss (0.1).
        bandwidths, sigma_is: the RBF mixture on the codes (σ ∈ {0.1, 0.5, 1}, standard deviations).
        statistic: ``u`` or ``v`` estimator of MMD².
        grad_clip: elementwise clip of the encoder's gradients (0.01); ``null`` for none.
        standardize: ``data`` (z-scores from the training rows, the thesis) or ``none``.
        block_output: ``gumbel`` (hard straight-through Gumbel-softmax one-hot blocks; see above) or ``linear``.
        gumbel_tau: the Gumbel-softmax temperature.
        weight_clip: after each discriminator step, clip the encoder's weights to [−c, c] (MMD-GAN, Li et al. 2017,
            Algorithm 1); ``None``: none (the thesis' code). See the module docstring.
        row_mmd_weight: λ_row ≥ 0: the generator minimises ``MMD²(f(x), f(G(z))) + λ_row·MMD²(x, G(z))``, the second
            on the standardised rows themselves with the RBF mixture ``row_bandwidths`` (0: the thesis' loss).
        row_bandwidths: σ's (standard deviations) of that mixture.
        label_kernel: both MMDs use the kernel times the label's delta kernel (``label_product_kernel``), so they
            measure the joint of label and row, not mostly the many feature blocks.
    """

    private_metrics = {
        "train/mmd2": "PRIVATE: MMD² between the real batch's and generated codes; logged only without a DP claim",
        "train/ae_loss": "PRIVATE: reconstruction error of the real batch; logged only without a DP claim",
        "train/d_loss": "PRIVATE: the discriminator's loss on the real batch; logged only without a DP claim",
        "train/g_loss": "PRIVATE: the generator's MMD² to the real batch; logged only without a DP claim",
    }

    def __init__(self, generator: nn.Module, discriminator: nn.Module, *, n_continuous: int,
                 block_sizes: Sequence[int] = (), num_classes: int = 1, batch_size: int = 200, lr: float = 1e-3,
                 mmd_weight: float = 0.1, bandwidths: Sequence[float] = (0.1, 0.5, 1.0), sigma_is: str = "std",
                 statistic: str = "u", grad_clip: float | None = 0.01, standardize: str = "data",
                 block_output: str = "linear", gumbel_tau: float = 0.5, weight_clip: float | None = None,
                 row_mmd_weight: float = 0.0, row_bandwidths: Sequence[float] = (1.0, 2.0, 4.0, 8.0),
                 label_kernel: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["generator", "discriminator"])
        self.automatic_optimization = False
        self._check_common(batch_size=batch_size, statistic=statistic)
        if block_output not in BLOCK_OUTPUTS:
            raise ConfigError(f"model.module.block_output={block_output!r}; valid: {', '.join(BLOCK_OUTPUTS)}.")
        if not gumbel_tau > 0:
            raise ConfigError(f"model.module.gumbel_tau={gumbel_tau} must be > 0.")
        if weight_clip is not None and not weight_clip > 0:
            raise ConfigError(f"model.module.weight_clip={weight_clip} must be > 0 (or null for none).")
        if not row_mmd_weight >= 0:
            raise ConfigError(f"model.module.row_mmd_weight={row_mmd_weight} must be ≥ 0.")
        self.generator, self.discriminator = generator, discriminator
        self.setup_rows(n_continuous=n_continuous, block_sizes=block_sizes, num_classes=num_classes,
                        standardize=standardize, weights=None)
        self.kernel = rbf_kernel(list(bandwidths), sigma_is=sigma_is)
        self.row_kernel = rbf_kernel(list(row_bandwidths), sigma_is="std")
        if label_kernel and num_classes > 1:  # inputs carry the label one-hot last (see with_label)
            self.kernel = label_product_kernel(self.kernel, num_classes)
            self.row_kernel = label_product_kernel(self.row_kernel, num_classes)

    def generate(self, n: int) -> Tensor:
        """``n`` generated rows in standardised units (B, d); one-hot blocks as hard Gumbel samples under
        ``block_output: gumbel``."""
        rows = self.generator(self.noise(n))
        if self.hparams.block_output == "linear" or not self.row_blocks:
            return rows
        c = self.n_continuous
        blocks = [F.gumbel_softmax(b, tau=self.hparams.gumbel_tau, hard=True)
                  for b in torch.split(rows[:, c:], self.row_blocks, dim=1)]
        return torch.cat([rows[:, :c], *blocks], 1)

    def with_label(self, codes: Tensor, rows: Tensor) -> Tensor:
        """Codes (B, c) with the rows' label one-hot appended under ``label_kernel`` (the kernel's input), else the
        codes."""
        if not (self.hparams.label_kernel and self.num_classes > 1):
            return codes
        return torch.cat([codes, rows[:, -self.num_classes:]], 1)

    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        """As the other row MMD models, the blocks drawn by :meth:`generate` (argmax of a one-hot is itself)."""
        if labels is not None:
            raise ValueError(f"{type(self).__name__} generates the label with the row; it cannot condition on one.")
        return self.split(self.round_rows(self.standardizer.inverse(self.generate(n))))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        if len(x) < 2:  # a last batch of one row has no U-statistic
            return
        d_opt, g_opt = self.optimizers()
        real = self.standardizer(self.join(x, y))  # (B, d)

        d_opt.zero_grad()
        with torch.no_grad():
            fake = self.generate(self.hparams.batch_size)  # (m, d)
        real_codes, recon = self.discriminator(real)
        ae = (real - recon).square().mean()
        mmd = self.mmd2_codes(self.with_label(real_codes, real), self.with_label(self.discriminator.encoder(fake), fake))
        d_loss = ae - self.hparams.mmd_weight * mmd
        self.manual_backward(d_loss)
        if self.hparams.grad_clip is not None:
            nn.utils.clip_grad_value_(self.discriminator.encoder.parameters(), self.hparams.grad_clip)
        d_opt.step()
        if self.hparams.weight_clip is not None:
            with torch.no_grad():
                for w in self.discriminator.encoder.parameters():
                    w.clamp_(-self.hparams.weight_clip, self.hparams.weight_clip)

        g_opt.zero_grad()
        with torch.no_grad():
            real_codes = self.with_label(self.discriminator.encoder(real), real)
        fake = self.generate(self.hparams.batch_size)
        g_loss = self.mmd2_codes(real_codes, self.with_label(self.discriminator.encoder(fake), fake))
        if self.hparams.row_mmd_weight > 0:
            g_loss = g_loss + self.hparams.row_mmd_weight * mmd2(real, fake, self.row_kernel,
                                                                 statistic=self.hparams.statistic)
        self.manual_backward(g_loss)
        g_opt.step()
        values = {"train/mmd2": mmd, "train/ae_loss": ae, "train/d_loss": d_loss, "train/g_loss": g_loss}
        for name, value in values.items():
            self.log_private(name, value, prog_bar=name == "train/g_loss")
