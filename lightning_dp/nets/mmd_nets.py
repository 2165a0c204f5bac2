"""Plain networks of the thesis' MMD generators ("Distribution Distance Measures in Generative and Privacy
Models", Diesendruck 2019, Ch. 3 and 4): no Lightning.

Rows here are whole model-space rows ``[continuous | one-hot blocks | label block]`` of width ``d`` (the
modules put the label in as a last block), in standardised units; the networks never see the layout beyond d.

* :class:`ResidualELUGenerator`: dense(width, ELU), then residual blocks h ← h + ELU(BN(Linear(h))), then a
  linear head (the thesis' code: width 10 with 2 blocks for Ch. 3, width 100 with 3 blocks for Ch. 4).
* :class:`AEDiscriminator`: the autoencoder discriminator of Ch. 4, encoder d → 3×100 → 64, decoder
  64 → 3×100 → d, ELU; the MMD is computed between codes.
* :class:`Standardizer`: z-scores of the continuous columns (buffers, saved in the checkpoint).
* :class:`WeightNet`: the estimated weighting function of §3.2 (a positive regressor, softplus output).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _row_width(n_continuous: int, block_sizes: Sequence[int]) -> int:
    return n_continuous + sum(block_sizes)


def elu_mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear → ELU stacks, no activation after the last layer."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ELU())
    return nn.Sequential(*layers)


class _ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(width, width), nn.BatchNorm1d(width)

    def forward(self, h: Tensor) -> Tensor:
        return h + F.elu(self.bn(self.fc(h)))


class ResidualELUGenerator(nn.Module):
    """``G(z)``: dense(width, ELU) + ``blocks`` residual BN blocks + a linear head to a row of width d.

    Args:
        n_continuous, block_sizes: the row layout (the label already a block); only their width is used.
        latent_dim: noise dimension (z ~ N(0, I)).
        width: hidden width; blocks: number of residual blocks.
    """

    def __init__(self, *, n_continuous: int, block_sizes: Sequence[int] = (), num_classes: int = 1,
                 latent_dim: int = 10, width: int = 100, blocks: int = 3) -> None:
        super().__init__()
        self.latent_dim, self.out_dim = latent_dim, _row_width(n_continuous, block_sizes)
        self.inp = nn.Linear(latent_dim, width)
        self.blocks = nn.Sequential(*[_ResidualBlock(width) for _ in range(blocks)])
        self.head = nn.Linear(width, self.out_dim)

    def forward(self, z: Tensor) -> Tensor:
        return self.head(self.blocks(F.elu(self.inp(z))))  # (B, d)


class AEDiscriminator(nn.Module):
    """The autoencoder discriminator: ``encoder`` d → hidden → code, ``decoder`` code → reversed hidden → d (ELU).

    No normalisation layer, so each row's code depends on that row alone.
    """

    def __init__(self, *, n_continuous: int, block_sizes: Sequence[int] = (), num_classes: int = 1,
                 hidden: Sequence[int] = (100, 100, 100), code_dim: int = 64) -> None:
        super().__init__()
        d = _row_width(n_continuous, block_sizes)
        self.code_dim = code_dim
        self.encoder = elu_mlp([d, *hidden, code_dim])
        self.decoder = elu_mlp([code_dim, *reversed(list(hidden)), d])

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(code (B, code_dim), reconstruction (B, d))``."""
        code = self.encoder(x)
        return code, self.decoder(code)


class Standardizer(nn.Module):
    """``(x − μ) / s`` on the first ``n_continuous`` columns; one-hot columns pass unchanged (μ = 0, s = 1)."""

    def __init__(self, dim: int, n_continuous: int) -> None:
        super().__init__()
        self.n_continuous = n_continuous
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def fit(self, total: Tensor, total_sq: Tensor, count: float) -> None:
        """Set μ and s of the continuous columns from column sums, sums of squares and the row count."""
        c = self.n_continuous
        mean = total[:c] / count
        var = (total_sq[:c] / count - mean.square()).clamp_min(0)
        std = var.sqrt()
        self.mean[:c] = mean
        self.std[:c] = torch.where(std > 1e-6, std, torch.ones_like(std))  # a constant column is left unscaled
        self.fitted.fill_(True)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def inverse(self, h: Tensor) -> Tensor:
        return h * self.std + self.mean


class WeightNet(nn.Module):
    """The estimated weighting function ŵ(f) > 0 of the thesis (§3.2, unknown T): an ELU MLP with a softplus
    output, on features f (standardised rows, or the discriminator's codes)."""

    def __init__(self, in_dim: int, hidden: Sequence[int] = (32, 32)) -> None:
        super().__init__()
        self.net = elu_mlp([in_dim, *hidden, 1])

    def forward(self, features: Tensor) -> Tensor:
        return F.softplus(self.net(features)).squeeze(1) + 1e-6  # (B,)
