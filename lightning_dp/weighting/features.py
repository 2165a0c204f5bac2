"""The weight classifier's input: the joint (x, y) of a model-space row, scaled into the unit ball.

The weights must correct the joint distribution of features and label (the bias-mitigation paper's
downstream tasks are supervised, and its Bayesian section needs p_D(x, y)/p_G(x, y)), so the label's one-hot
is part of the input.

Sensitivity (the paper's §3.3 and A.4, after Chaudhuri et al. 2011) needs ‖x‖₂ ≤ 1, not only x ∈ [0, 1]^d:
on [0, 1]^d the log-weight sensitivity can be d times larger than the paper's bound. Model space already
holds every coordinate in [0, 1] with public (or DP-released) bounds, and each one-hot block has exactly one
1, so a row's squared norm is at most R² = n_continuous + number of one-hot blocks (+1 for the label block,
+1 for the intercept). :func:`unit_ball` appends the constant intercept feature, divides by R and then
projects any row still outside the ball back onto it, so ‖x‖₂ ≤ 1 holds for every row by construction
(the projection changes nothing for rows the encoder produced, and keeps the bound for anything else).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def joint_features(x: Tensor, y: Tensor, layout: dict[str, Any]) -> Tensor:
    """``[x | one-hot(y)]`` for model-space rows, each coordinate clipped to [0, 1]; (N, d + K) or (N, d) when K = 1.

    Generated rows may hold soft one-hots or values a hair outside [0, 1]; clipping is a fixed public map.
    """
    x = x.float().clamp(0.0, 1.0)  # (N, d)
    k = int(layout.get("num_classes", 1))
    if k <= 1:
        return x
    return torch.cat([x, torch.nn.functional.one_hot(y.long(), k).float()], dim=1)  # (N, d + K)


def feature_radius(layout: dict[str, Any], *, intercept: bool = True) -> float:
    """R with ‖joint_features(row)‖₂ ≤ R for every encoded row (plus the intercept feature when asked)."""
    blocks = len(layout.get("block_sizes", [])) + (1 if int(layout.get("num_classes", 1)) > 1 else 0)
    return math.sqrt(int(layout["n_continuous"]) + blocks + (1 if intercept else 0))


def unit_ball(features: Tensor, radius: float, *, intercept: bool = True) -> Tensor:
    """Append the constant intercept feature (1), divide by ``radius`` and project onto ‖·‖₂ ≤ 1; (N, F [+1]).

    The intercept is a penalised coordinate like any other: sklearn's unpenalised intercept would break the
    strong convexity the sensitivity bound needs (the bias-mitigation spec, §2.9).
    """
    if intercept:
        features = torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype)], dim=1)
    scaled = features / radius
    norms = scaled.norm(dim=1, keepdim=True).clamp_min(1.0)  # (N, 1): > 1 only for rows outside the ball
    return scaled / norms


def check_unit_ball(features: Tensor, *, what: str = "rows") -> None:
    """Refuse inputs with ‖x‖₂ > 1: the logistic-regression sensitivity bounds assume them.

    Raises:
        ValueError: some row is outside the unit ball (the message says how to scale them).
    """
    worst = float(features.norm(dim=1).max()) if len(features) else 0.0
    if worst > 1.0 + 1e-6:
        raise ValueError(f"The private logistic regression needs every row in the unit ball (‖x‖₂ ≤ 1), but some of "
                         f"the {what} have norm {worst:.3g}: scale them with lightning_dp.weighting.features.unit_ball "
                         "(the sensitivity 1/μ of the weights holds only then).")
