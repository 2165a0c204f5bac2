"""DP-GAN (Xie et al. 2018) and DP-CGAN (Torkzadehmahani et al. 2019): a GAN whose discriminator is
trained with DP-SGD; the generator sees data only through the discriminator (post-processing)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dp.models.base import GeneratorModule


class DPGAN(GeneratorModule):
    """A (conditional) GAN for rows ``[continuous | one-hot blocks]`` with a private discriminator.

    The privacy mechanism is not in this module: the ``DPSGD`` callback clips and noises the
    per-sample loss the discriminator backpropagates on real rows (shape (B,)); the loss on generated
    rows is a scalar and public. ``LabelProportions`` releases the class counts that conditional
    sampling draws labels from.

    * ``conditional=True`` (DP-CGAN): ``G(z, y)`` and ``D(x, y)`` see the label.
    * ``conditional=False`` (DP-GAN): the label is generated jointly as one more one-hot block, so the
      whole row, label included, is protected the same way (``net_layout``).

    Losses: ``"bce"``, the non-saturating GAN loss, or ``"wgan_gp"``, the Wasserstein loss with a
    gradient penalty (Gulrajani et al. 2017). Under DP the penalty must be per sample: real row i gets
    ``ℓ_i = −D(x_i) + λ(||∇_x D(x̂_i)|| − 1)²`` with ``x̂_i = α_i x_i + (1 − α_i) G(z_i)`` (public α_i, z_i),
    so ℓ_i depends on x_i alone and its clipped gradient keeps the sensitivity at C. A batch-level penalty
    (one norm over mixed samples) would not. Its parameter gradient needs a double backward, which only
    DP-SGD's ``mode=microbatch`` computes; the other engines refuse it. Choices (specs silent): Adam
    (lr 2e-4, β = (0.5, 0.999)); categorical blocks through straight-through Gumbel-softmax at τ = 0.2
    so that the discriminator cannot tell real one-hot rows from soft ones; ``n_critic`` discriminator
    steps per generator step (each discriminator step is one private release).

    Args:
        generator, discriminator: networks built from the layout.
        n_continuous, block_sizes, num_classes: the data layout.
        conditional: DP-CGAN (True) or DP-GAN (False).
        batch_size: generated rows per step (the real batch is Poisson-sampled by DP-SGD).
    """

    uses_private_batches = True
    public_metrics = {
        "train/g_loss": "the DP discriminator on generated rows (post-processing)",
        "train/d_loss_fake": "the DP discriminator on generated rows (post-processing)",
    }

    def __init__(self, generator: nn.Module, discriminator: nn.Module, *, n_continuous: int,
                 block_sizes: list[int] | tuple[int, ...] = (), num_classes: int = 1, conditional: bool = True,
                 batch_size: int = 256, lr_g: float = 2e-4, lr_d: float = 2e-4, betas: tuple[float, float] = (0.5, 0.999),
                 n_critic: int = 1, gumbel_tau: float = 0.2, loss: str = "bce", gp_weight: float = 10.0) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["generator", "discriminator"])
        self.automatic_optimization = False
        self.generator, self.discriminator = generator, discriminator
        self.conditional = conditional
        self.init_label_buffer(num_classes)
        if loss not in ("bce", "wgan_gp"):
            raise ValueError(f"Unknown GAN loss {loss!r}; valid: bce, wgan_gp.")

    @staticmethod
    def exposed_networks(module_cfg: Any) -> list[str]:
        """The discriminator reads real rows; the generator only the discriminator's released parameters."""
        return ["discriminator"]

    @staticmethod
    def net_layout(layout: dict[str, Any], module_cfg: Any) -> dict[str, Any]:
        """Unconditional: the label becomes the last one-hot block of the generated row."""
        if module_cfg.get("conditional", True) or layout["num_classes"] <= 1:
            return layout
        return {**layout, "block_sizes": [*layout["block_sizes"], layout["num_classes"]], "num_classes": 1}

    # ---------------------------------------------------------------- rows with labels
    def _join(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """What the networks see: unconditional models carry the label as a block, label input 0."""
        if self.conditional:
            return x, y
        return torch.cat([x, F.one_hot(y, self.num_classes).to(x.dtype)], 1), torch.zeros_like(y)

    def _generate(self, n: int, *, hard: bool = False, gumbel: bool = False) -> tuple[Tensor, Tensor]:
        y = self.sample_labels(n) if self.conditional else torch.zeros(n, dtype=torch.long, device=self.device)
        z = torch.randn(n, self.generator.latent_dim, device=self.device)
        out = self.generator(z, y, hard=hard, gumbel_tau=self.hparams.gumbel_tau if gumbel else None)
        return out, y

    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.conditional:
            return super()._sample(n, labels)
        out, _ = self._generate(n, hard=True)
        c = self.num_classes
        return out[:, :-c], out[:, -c:].argmax(1)  # the label block → labels

    # ---------------------------------------------------------------- training
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch  # a Poisson sample of private rows; may be empty
        d_opt, g_opt = self.optimizers()
        fake, y_fake = self._generate(self.hparams.batch_size, gumbel=True)  # (B_f, d)

        d_opt.zero_grad()
        real_in, real_y = self._join(x, y)
        real = self._real_loss(real_in, real_y)  # (B,) private, per sample
        self.manual_backward(real)
        fake_logits = self.discriminator(fake.detach(), y_fake)
        if self.hparams.loss == "wgan_gp":
            fake_loss = fake_logits.mean()
        else:
            fake_loss = F.binary_cross_entropy_with_logits(fake_logits, torch.zeros(len(fake), device=self.device))
        self.manual_backward(fake_loss)  # public: generated rows
        d_opt.step()

        if (batch_idx + 1) % self.hparams.n_critic == 0:
            g_opt.zero_grad()
            logits = self.discriminator(fake, y_fake)
            g_loss = -logits.mean() if self.hparams.loss == "wgan_gp" else F.binary_cross_entropy_with_logits(
                logits, torch.ones(len(fake), device=self.device))
            self.manual_backward(g_loss)
            g_opt.step()
            self.log("train/g_loss", g_loss, prog_bar=True)
        self.log("train/d_loss_fake", fake_loss)  # the loss on real rows is private and never logged

    def _real_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample discriminator loss on real rows, shape (B,)."""
        logits = self.discriminator(x, y)
        if self.hparams.loss == "bce":
            return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
        with torch.no_grad():  # each real row's partner: a generated row (label block included when unconditional)
            z = torch.randn(len(x), self.generator.latent_dim, device=self.device)
            partner = self.generator(z, y, gumbel_tau=self.hparams.gumbel_tau)
        alpha = torch.rand(len(x), 1, device=self.device)
        x_hat = (alpha * x + (1 - alpha) * partner).requires_grad_(True)  # (B, d)
        grad_x = torch.autograd.grad(self.discriminator(x_hat, y).sum(), x_hat, create_graph=True)[0]  # per row
        return -logits + self.hparams.gp_weight * (grad_x.norm(dim=1) - 1).square()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        betas = tuple(self.hparams.betas)
        return [torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr_d, betas=betas),
                torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr_g, betas=betas)]
