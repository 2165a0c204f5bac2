"""Per-sample clipping by micro-batches of size 1: one autograd call per sample.

The definition of DP-SGD's clipped sum, with no assumption about the loss: it handles what the
one-backward engine (``clipping.py``) and Opacus' hooks cannot, such as a WGAN-GP gradient penalty,
whose parameter gradient needs a double backward. It costs B backward passes per step.

Each of those passes runs through the whole batch's graph unless the module says how to recompute one
row's loss alone (:func:`with_rows`): then each sample gets its own small forward and backward, several
times faster for the same result (e.g. PPEM's energies with their gradient penalties).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def with_rows(per_sample_loss: Tensor, loss_of_rows: Callable[..., Tensor], *rows: Tensor) -> Tensor:
    """Mark ``per_sample_loss`` as recomputable row by row: ``loss_of_rows(*(r[i:i+1] for r in rows))`` is ℓ_i.

    ``rows`` hold everything the loss of a row reads (its data and its draws of public noise), so the
    recomputed ℓ_i equals ``per_sample_loss[i]``. Returns ``per_sample_loss``.
    """
    per_sample_loss.loss_of_rows = (loss_of_rows, rows)  # type: ignore[attr-defined]
    return per_sample_loss


def microbatch_clipped_sum(per_sample_loss: Tensor, params: list[nn.Parameter], *, max_grad_norm: float) -> Tensor:
    """Write ``p.grad = Σ_i min(1, C/||∇ℓ_i||) ∇ℓ_i`` for ``params``; return the per-sample norms (B,).

    Parameters that a sample's loss does not reach get zero gradient from it.
    """
    sums = [torch.zeros_like(p) for p in params]
    norms = torch.zeros(len(per_sample_loss), device=per_sample_loss.device)
    recompute = getattr(per_sample_loss, "loss_of_rows", None)
    for i in range(len(per_sample_loss)):
        if recompute is None:
            grads = torch.autograd.grad(per_sample_loss[i], params, retain_graph=True, allow_unused=True)
        else:
            loss_of_rows, rows = recompute
            grads = torch.autograd.grad(loss_of_rows(*(r[i : i + 1] for r in rows)).sum(), params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        norm = torch.sqrt(sum(g.double().square().sum() for g in grads))  # over all private parameters
        norms[i] = norm.to(norms.dtype)
        scale = float(torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0))
        for s, g in zip(sums, grads):
            s.add_(g, alpha=scale)
    for p, s in zip(params, sums):
        p.grad = s
    return norms
