"""Gaussian KDE log-likelihoods on a bandwidth grid, for the DP maximum-likelihood bandwidth.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019), §5.6, option 2: the data's
log-likelihood under ``(1/n) Σ_j N(x | ỹ_j, h² I)`` (Eq. 5.37 with h a standard deviation; the author's code mixes
std and variance, we use std throughout) is evaluated on a grid of h and its arg-max is released with noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor


def bandwidth_grid(low: float, high: float, size: int) -> Tensor:
    """``size`` bandwidths spaced geometrically from ``low`` to ``high`` (float64)."""
    if not 0 < low < high or size < 2:
        raise ValueError(f"A bandwidth grid needs 0 < low < high and size >= 2, got {low}, {high}, {size}.")
    return torch.logspace(math.log10(low), math.log10(high), size, dtype=torch.float64)


def kde_log_likelihood(x: Tensor, centres: Tensor, bandwidths: Tensor) -> Tensor:
    """``Σ_i log((1/n) Σ_j N(x_i | c_j, h² I))`` for each h, shape (G,), from x (B, d) and centres (n, d)."""
    x, centres, h = x.double(), centres.double(), bandwidths.double().to(x.device)
    sq = torch.cdist(x, centres).square()  # (B, n)
    d = x.shape[1]
    log_kernel = -sq.unsqueeze(0) / (2 * h.view(-1, 1, 1) ** 2)  # (G, B, n)
    log_norm = -0.5 * d * torch.log(2 * math.pi * h**2) - math.log(len(centres))  # (G,)
    return (torch.logsumexp(log_kernel, dim=2) + log_norm.view(-1, 1)).sum(1)


def mle_bandwidth(chunks: Iterable[Tensor], centres: Tensor, bandwidths: Tensor) -> float:
    """The grid bandwidth of largest log-likelihood of all rows in ``chunks`` (streamed, memory O(chunk·n·G))."""
    total = torch.zeros(len(bandwidths), dtype=torch.float64)
    for x in chunks:
        total += kde_log_likelihood(x, centres, bandwidths).cpu()
    return float(bandwidths[int(torch.argmax(total))])
