"""A generator over discretised columns: latent noise → one categorical distribution per column (GEM, §4)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class ProductGenerator(nn.Module):
    """``G(z)`` = a product of per-column softmaxes; B latent draws give a mixture of B product distributions.

    "Iterative Methods for Private Synthetic Data: Unifying Framework and New Methods" (Liu, Vietri & Wu 2021),
    §4: a feed-forward net maps z ~ N(0, I) to the logits of every column; the mixture's marginals are averages
    of outer products (``privacy/marginals.product_marginal``), differentiable in the net's weights.

    The output layer's weights start at zero, so every column starts at its bias (uniform, or the released 1-way
    proportions that the module sets) and a pair the fit never sees stays as independent as the 1-way fits make it
    (rather than a random initialisation's arbitrary dependence).

    Args:
        level_sizes: levels of each discretised column (the label included).
        latent_dim: noise dimension.
        hidden: hidden widths (ReLU, residual where widths match).
    """

    def __init__(self, *, level_sizes: Sequence[int], latent_dim: int = 64, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.level_sizes, self.latent_dim = [int(k) for k in level_sizes], int(latent_dim)
        widths = [self.latent_dim, *[int(h) for h in hidden]]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.out = nn.Linear(widths[-1], sum(self.level_sizes))
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, z: Tensor) -> list[Tensor]:
        """Level probabilities of each column, a list of (B, k_c)."""
        h = z  # (B, latent_dim)
        for layer in self.layers:
            step = torch.relu(layer(h))
            h = h + step if step.shape == h.shape else step
        logits = self.out(h)  # (B, Σ k_c)
        return [torch.softmax(part, dim=1) for part in torch.split(logits, self.level_sizes, dim=1)]
