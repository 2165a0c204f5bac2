"""Batch-coupled private terms: a loss computed from a whole private batch at once (PPEM's KSD penalty).

DP-SGD's sensitivity argument needs a loss that is a sum over rows: adding or removing one row adds or
removes one clipped per-sample gradient, so the clipped sum moves by at most C. A term P(T) computed from
the whole batch T (pairs of rows, a normalisation over the batch) does not decompose: one row can move every
part of ∇P. Such a term is privatised as a whole. With L the expected batch size, the mechanism adds
``clip(L·∇P(T), C_P)`` (its gradient in DP-SGD's sum convention, clipped to norm C_P) to the clipped
per-sample sum before the one Gaussian draw. For batches T and T ∪ {x}:

    ‖f(T ∪ {x}) − f(T)‖ ≤ ‖clip_C(g_x)‖ + ‖clip_{C_P}(L∇P(T ∪ {x})) − clip_{C_P}(L∇P(T))‖ ≤ C + 2·C_P,

where f(T) = Σ_{i∈T} clip_C(g_i) + clip_{C_P}(L∇P(T)). So each step is the sampled Gaussian mechanism of
a function with add/remove sensitivity Δ = C + 2·ΣC_P, and the noise N(0, σ²Δ²) gives it exactly the RDP
of DP-SGD with noise multiplier σ. The RDP bound of the sampled Gaussian mechanism (Mironov, Talwar & Zhang
2019) holds for any f of sensitivity Δ, not only sums: the output on D ∪ {x} is the mixture over the same
Poisson sample T of N(f(T), σ²Δ²) and N(f(T ∪ {x}), σ²Δ²) with weights 1 − q and q, and since
exp((α−1)·D_α) is jointly convex in its pair of distributions, that mixture is no further from the output on D
than the worst single pair of Gaussians at distance ≤ Δ, which is the one-dimensional case the accountant
computes. Without a DP mechanism (``GeneratorModule.backward``) the term is simply added to the mean loss.

A term is any callable ``term(per_sample_loss) -> Tensor | None`` with a ``max_grad_norm`` attribute
(C_P), registered on the module with :func:`register_batch_term` when its callback is set up.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class BatchTerm(Protocol):
    """A scalar private term of the current batch, added to the mean per-sample loss."""

    max_grad_norm: float  # C_P: its gradient (sum convention) is clipped to this norm under DP-SGD

    def __call__(self, per_sample_loss: Tensor) -> Tensor | None: ...


def register_batch_term(module: Any, term: BatchTerm) -> None:
    """Attach ``term`` to ``module``'s private backward (once; registering it again is a no-op)."""
    terms = getattr(module, "_batch_terms", None)
    if terms is None:
        terms = []
        object.__setattr__(module, "_batch_terms", terms)
    if term not in terms:
        terms.append(term)


def batch_terms(module: Any) -> list[BatchTerm]:
    """The terms registered on ``module``, in registration order."""
    return list(getattr(module, "_batch_terms", []))
