"""Plain generator networks (no Lightning): latent noise + one-hot label → a row in model space."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def mlp(sizes: Sequence[int], *, batch_norm: bool = True) -> nn.Sequential:
    """Linear → (BatchNorm) → ReLU stacks, no activation after the last layer."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            if batch_norm:
                layers.append(nn.BatchNorm1d(b))
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class ConditionalGenerator(nn.Module):
    """``G(z, y)`` for rows laid out as ``[continuous | one-hot blocks]`` (DP-MERF §4.1 architecture).

    Continuous outputs pass a sigmoid (the encoders scale them to [0, 1]); each one-hot block is a
    softmax. ``hard=True`` samples one category per block instead of returning probabilities.

    Args:
        n_continuous: width of the continuous block (pixels for images).
        block_sizes: sizes of the one-hot blocks.
        num_classes: label classes fed as a one-hot vector (1 = unconditional).
        latent_dim: noise dimension.
        hidden: hidden widths; ``None`` gives the paper's ``[4d, 2d]``.
    """

    def __init__(self, *, n_continuous: int, block_sizes: Sequence[int] = (), num_classes: int = 1,
                 latent_dim: int = 10, hidden: Sequence[int] | None = None, batch_norm: bool = True) -> None:
        super().__init__()
        self.n_continuous, self.block_sizes = n_continuous, list(block_sizes)
        self.num_classes, self.latent_dim = num_classes, latent_dim
        out_dim = n_continuous + sum(self.block_sizes)
        hidden = list(hidden) if hidden is not None else [min(4 * out_dim, 1024), min(2 * out_dim, 512)]
        self.net = mlp([latent_dim + num_classes, *hidden, out_dim], batch_norm=batch_norm)

    def forward(self, z: Tensor, y: Tensor, *, hard: bool = False, gumbel_tau: float | None = None) -> Tensor:
        """Rows in model space. ``hard`` samples one category per block (no gradient);
        ``gumbel_tau`` gives straight-through Gumbel-softmax one-hots (for a discriminator, which would
        otherwise tell soft blocks from real one-hot rows)."""
        h = self.net(torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], dim=1))  # (B, d)
        parts = [torch.sigmoid(h[:, : self.n_continuous])]
        for logits in torch.split(h[:, self.n_continuous :], self.block_sizes, dim=1):
            if gumbel_tau is not None:
                parts.append(F.gumbel_softmax(logits, tau=gumbel_tau, hard=True))
                continue
            probs = torch.softmax(logits, dim=1)  # (B, k)
            if hard:
                probs = F.one_hot(torch.multinomial(probs, 1).squeeze(1), probs.shape[1]).to(probs.dtype)
            parts.append(probs)
        return torch.cat(parts, dim=1)
