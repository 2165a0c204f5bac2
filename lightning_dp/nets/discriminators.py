"""Plain discriminators (no Lightning) that DP-SGD can clip: no BatchNorm, one output per sample."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ConditionalDiscriminator(nn.Module):
    """``D(x, y)``: an MLP with LayerNorm + LeakyReLU over ``[x ; one_hot(y)]`` → one logit per row.

    LayerNorm normalises within a sample, so per-sample gradients stay per-sample (BatchNorm would mix
    the batch and break DP-SGD's sensitivity).
    """

    def __init__(self, *, n_continuous: int, block_sizes: Sequence[int] = (), num_classes: int = 1,
                 hidden: Sequence[int] = (256, 256), conditional: bool = True, **_: object) -> None:
        super().__init__()
        self.num_classes, self.conditional = num_classes, conditional and num_classes > 1
        in_dim = n_continuous + sum(block_sizes) + (num_classes if self.conditional else 0)
        layers: list[nn.Module] = []
        for a, b in zip([in_dim, *hidden[:-1]], hidden):
            layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.LeakyReLU(0.2)]
        layers.append(nn.Linear(hidden[-1] if hidden else in_dim, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        if self.conditional:
            x = torch.cat([x, F.one_hot(y, self.num_classes).to(x.dtype)], dim=1)
        return self.net(x).squeeze(1)  # (B,)
