"""PPEM's four networks (Privacy-Preserving Energy-Based Generative Models for Marginal Distribution
Protection, §3.8 and Fig. 1): plain ``nn.Module``s, no Lightning.

* :class:`EnergyMLP` E_ξ(x′) and :class:`ConditionalEnergy` E_γ(x* | x′): MLPs with LeakyReLU and no
  normalisation layer, so that each row's energy depends on that row alone (DP-SGD's per-sample gradients,
  the per-row gradient penalty). The paper defines E: X → R₊ but enforces nothing (its pitfall of an
  energy drifting below zero under the E(x_real) term); here the last layer is a softplus, so energies are
  non-negative, the margin m compares like with like, and the gradient never dies as it would under a ReLU.
* :class:`ResidualGenerator` G_ω(z) and :class:`ConditionalResidualGenerator` G_υ(z′ | x′): CTGAN-style
  residual blocks h ← [LeakyReLU(BN(Linear(h))) ; h] (concatenation; the paper does not say which residual),
  then a linear head. Continuous outputs pass a sigmoid (model space scales them to [0, 1]); one-hot blocks
  are softmax probabilities, straight-through Gumbel one-hots (training, so that the energy cannot tell soft
  rows from real one-hot rows) or sampled categories (``hard``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SLOPE = 0.2  # LeakyReLU slope (unspecified by the paper; the usual GAN value)


def _leaky_mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.LeakyReLU(SLOPE)]
    return nn.Sequential(*layers)


class EnergyMLP(nn.Module):
    """E(x) ≥ 0 for rows of width ``in_dim``: [Linear → LeakyReLU] × len(hidden) → Linear → softplus, shape (B,).

    With ``fourier > 0`` the input first passes random Fourier features [sin 2πxB, cos 2πxB], B ~ N(0, s²) of
    shape (in_dim, fourier), a fixed buffer (Tancik et al. 2020, "Fourier features let networks learn high
    frequency functions in low dimensional domains"): a plain MLP on [0, 1]^d′ is too smooth to follow a
    marginal with a spike (Adult's 40 hours a week) at the resolution the α-LMDP tests see.
    """

    def __init__(self, in_dim: int, hidden: Sequence[int] = (256, 256, 256), *, fourier: int = 0,
                 fourier_scale: float = 20.0) -> None:
        super().__init__()
        if fourier < 0 or fourier_scale <= 0:
            raise ValueError(f"fourier must be >= 0 and fourier_scale > 0, got {fourier}, {fourier_scale}.")
        self.register_buffer("fourier_matrix", torch.randn(in_dim, fourier) * fourier_scale if fourier else None)
        width = 2 * fourier if fourier else in_dim
        self.body = _leaky_mlp([width, *hidden])
        self.head = nn.Linear(hidden[-1] if hidden else width, 1)

    def forward(self, x: Tensor) -> Tensor:
        if self.fourier_matrix is not None:
            phase = 2 * math.pi * x @ self.fourier_matrix  # (B, fourier)
            x = torch.cat([phase.sin(), phase.cos()], 1)
        return F.softplus(self.head(self.body(x))).squeeze(1)


class ConditionalEnergy(nn.Module):
    """E_γ(x* | x′) ≥ 0: one input layer per part ("initial sets of neurons connected only to the conditional
    and unconditional attributes"), concatenated, then as :class:`EnergyMLP`."""

    def __init__(self, target_dim: int, condition_dim: int, hidden: Sequence[int] = (256, 256, 256)) -> None:
        super().__init__()
        width = hidden[0]
        self.target_in = nn.Sequential(nn.Linear(target_dim, width), nn.LeakyReLU(SLOPE))
        self.condition_in = nn.Sequential(nn.Linear(condition_dim, width), nn.LeakyReLU(SLOPE))
        self.energy = EnergyMLP(2 * width, hidden[1:] or (width,))

    def forward(self, x_target: Tensor, x_condition: Tensor) -> Tensor:
        return self.energy(torch.cat([self.target_in(x_target), self.condition_in(x_condition)], 1))


class _Residual(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(in_dim, out_dim), nn.BatchNorm1d(out_dim)

    def forward(self, h: Tensor) -> Tensor:
        return torch.cat([F.leaky_relu(self.bn(self.fc(h)), SLOPE), h], 1)


class _RowHead(nn.Module):
    """Linear head → ``[sigmoid(continuous) | one-hot blocks]``."""

    def __init__(self, in_dim: int, n_continuous: int, block_sizes: Sequence[int]) -> None:
        super().__init__()
        self.n_continuous, self.block_sizes = n_continuous, list(block_sizes)
        self.fc = nn.Linear(in_dim, n_continuous + sum(self.block_sizes))

    def forward(self, h: Tensor, *, hard: bool = False, gumbel_tau: float | None = None) -> Tensor:
        out = self.fc(h)
        parts = [torch.sigmoid(out[:, : self.n_continuous])]
        for logits in torch.split(out[:, self.n_continuous :], self.block_sizes, dim=1):
            if gumbel_tau is not None:
                parts.append(F.gumbel_softmax(logits, tau=gumbel_tau, hard=True))
            elif hard:
                idx = torch.multinomial(torch.softmax(logits, 1), 1).squeeze(1)
                parts.append(F.one_hot(idx, logits.shape[1]).to(logits.dtype))
            else:
                parts.append(torch.softmax(logits, 1))
        return torch.cat(parts, 1)


class ResidualGenerator(nn.Module):
    """G(z) → rows ``[continuous | one-hot blocks]``: residual blocks of ``hidden`` widths, then the head."""

    def __init__(self, latent_dim: int, n_continuous: int, block_sizes: Sequence[int] = (),
                 hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.latent_dim = latent_dim
        blocks, width = [], latent_dim
        for h in hidden:
            blocks.append(_Residual(width, h))
            width += h
        self.body = nn.Sequential(*blocks)
        self.head = _RowHead(width, n_continuous, block_sizes)

    def forward(self, z: Tensor, *, hard: bool = False, gumbel_tau: float | None = None) -> Tensor:
        return self.head(self.body(z), hard=hard, gumbel_tau=gumbel_tau)


class ConditionalResidualGenerator(nn.Module):
    """G_υ(z′ | x′): separate input layers for z′ and x′, concatenated, then as :class:`ResidualGenerator`."""

    def __init__(self, latent_dim: int, condition_dim: int, n_continuous: int, block_sizes: Sequence[int] = (),
                 hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.latent_dim, width = latent_dim, hidden[0]
        self.z_in = nn.Linear(latent_dim, width)
        self.condition_in = nn.Linear(condition_dim, width)
        self.generator = ResidualGenerator(2 * width, n_continuous, block_sizes, hidden[1:] or (width,))

    def forward(self, z: Tensor, x_condition: Tensor, *, hard: bool = False, gumbel_tau: float | None = None) -> Tensor:
        h = torch.cat([self.z_in(z), self.condition_in(x_condition)], 1)
        return self.generator(h, hard=hard, gumbel_tau=gumbel_tau)
