"""Streaming sums of private rows and pure functions that turn their noisy versions into estimates."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor


def class_feature_sums(
    batches: Iterable[tuple[Tensor, Tensor]], features: Callable[[Tensor], Tensor], num_classes: int
) -> tuple[Tensor, Tensor]:
    """One pass over ``batches`` of (x, y): ``S[c] = Σ_{i: y_i = c} features(x_i)`` and class counts.

    Memory is O(chunk·D + C·D) whatever the number of rows. Each chunk is summed with one matmul in
    the features' dtype; the running sums are float64.
    """
    sums, counts = None, torch.zeros(num_classes, dtype=torch.float64)
    for x, y in batches:
        h = features(x)  # (B, D)
        onehot = torch.nn.functional.one_hot(y.to(h.device), num_classes).to(h.dtype)  # (B, C)
        part = (onehot.T @ h).double()  # (C, D)
        if sums is None:
            sums = torch.zeros_like(part)
            counts = counts.to(h.device)
        sums += part
        counts += onehot.sum(0).double()
    if sums is None:
        raise ValueError("The private data set is empty: nothing to embed.")
    return sums, counts


def moment_sums(batches: Iterable[Tensor]) -> Tensor:
    """``[Σx (d) ; Σ||x||² ; n]`` over rows in [0, 1]^d, float64, one pass, on the rows' device."""
    acc = None
    for x in batches:
        x = x.double()
        part = torch.cat([x.sum(0), x.square().sum().reshape(1), torch.tensor([x.shape[0]], dtype=x.dtype, device=x.device)])
        acc = part if acc is None else acc + part
    if acc is None:
        raise ValueError("The private data set is empty.")
    return acc


def mean_squared_distance(sum_x: Tensor, sum_sq: float, n: float) -> float:
    """Mean squared distance over distinct pairs, ``E||x − x'||² = 2n/(n−1) · (Σ||x||²/n − ||Σx/n||²)``."""
    n = max(float(n), 2.0)
    return float(2.0 * n / (n - 1.0) * (sum_sq / n - (sum_x / n).square().sum()))
