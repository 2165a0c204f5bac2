"""Per-sample clipping by micro-batches of size 1: one autograd call per sample.

The definition of DP-SGD's clipped sum, with no assumption about the loss: it handles what the
one-backward engine (``clipping.py``) and Opacus' hooks cannot, such as a WGAN-GP gradient penalty,
whose parameter gradient needs a double backward. It costs B backward passes per step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def microbatch_clipped_sum(per_sample_loss: Tensor, params: list[nn.Parameter], *, max_grad_norm: float) -> Tensor:
    """Write ``p.grad = Σ_i min(1, C/||∇ℓ_i||) ∇ℓ_i`` for ``params``; return the per-sample norms (B,).

    Parameters that a sample's loss does not reach get zero gradient from it.
    """
    sums = [torch.zeros_like(p) for p in params]
    norms = torch.zeros(len(per_sample_loss), device=per_sample_loss.device)
    for i in range(len(per_sample_loss)):
        grads = torch.autograd.grad(per_sample_loss[i], params, retain_graph=True, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        norm = torch.sqrt(sum(g.double().square().sum() for g in grads))  # over all private parameters
        norms[i] = norm.to(norms.dtype)
        scale = float(torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0))
        for s, g in zip(sums, grads):
            s.add_(g, alpha=scale)
    for p, s in zip(params, sums):
        p.grad = s
    return norms
