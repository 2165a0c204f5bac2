"""Random Fourier features for the Gaussian kernel (Rahimi & Recht 2007; DP-MERF eq. 3)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def rff(x: Tensor, omega: Tensor) -> Tensor:
    """``φ(x) = sqrt(2/D) [cos(x ωᵀ), sin(x ωᵀ)]`` with ω of shape (D/2, d).

    ``||φ(x)||² = (2/D) Σ_j (cos² + sin²) = 1`` exactly, for every x: the DP sensitivities of
    DP-MERF and PEARL rest on this.
    """
    proj = x @ omega.T  # (n, D/2)
    return torch.cat([torch.cos(proj), torch.sin(proj)], dim=1) * math.sqrt(1.0 / omega.shape[0])  # (n, D)


class RandomFourierFeatures(nn.Module):
    """Fixed Gaussian-kernel feature map ``k(x, x') = exp(-||x - x'||² / (2ℓ²)) ≈ φ(x)ᵀφ(x')``.

    The frequencies ω = ω₀/ℓ with ω₀ ~ N(0, I) drawn from a public seed; the bandwidth ℓ is a buffer
    set from config or from a DP release before any private data is embedded.

    Args:
        in_dim: input dimension d.
        num_features: D (even).
        bandwidth: ℓ, or ``None`` until a DP estimate sets it.
        seed: seed of ω₀ (data-independent).
    """

    def __init__(self, in_dim: int, num_features: int, *, bandwidth: float | None = None, seed: int = 0) -> None:
        super().__init__()
        if num_features % 2:
            raise ValueError(f"num_features must be even (cos and sin halves), got {num_features}.")
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("omega0", torch.randn(num_features // 2, in_dim, generator=gen))  # (D/2, d)
        self.register_buffer("bandwidth", torch.tensor(float("nan") if bandwidth is None else float(bandwidth)))

    @property
    def num_features(self) -> int:
        return 2 * self.omega0.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        if torch.isnan(self.bandwidth):
            raise RuntimeError("The RFF bandwidth is not set: give model.bandwidth or let the DP estimate run first.")
        return rff(x, self.omega0 / self.bandwidth)
