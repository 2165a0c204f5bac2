"""Characteristic-function (CF) features and the (weighted) CF distance of PEARL (§3).

Notation (spec §1–2): K frequency vectors ``t_i`` (rows of ``freqs``, shape (K, d)) give 2K real
coordinates. The empirical CF of a sample at ``t_i`` is ``Φ̂(t_i) = mean_j exp(i t_iᵀx_j)``; it is kept
as the real vector ``[Re Φ̂(t_1..K) | Im Φ̂(t_1..K)]`` of length 2K. The per-row feature
``z(x) = [cos(Tx); sin(Tx)] / √K`` has ``||z(x)|| = 1`` exactly, so a sum of features over rows has
L2 sensitivity 1 under add/remove and 2 under replace-one (:func:`cf_sum_sensitivity`).

All functions are pure and differentiable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dp.privacy.sensitivity import embedding_sum_sensitivity

CF_FEATURE_NORM = 1.0  # ||z(x)||, exactly, for every x


def sample_frequencies(num_frequencies: int, dim: int, *, seed: int) -> Tensor:
    """Standard-normal base frequencies ``ω0 ~ N(0, I)`` of shape (K, d) from a public seed.

    The frequencies of the CF are ``t_i = ω0_i / ℓ``, i.e. ``t ~ N(0, diag(σ0²))`` with ``σ0 = 1/ℓ``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(num_frequencies, dim, generator=gen)  # (K, d)


def cf_features(x: Tensor, freqs: Tensor) -> Tensor:
    """Unit-norm per-row CF features ``z(x) = [cos(Tx); sin(Tx)] / √K`` (spec §2.1).

    Args:
        x: rows, shape (n, d).
        freqs: frequencies T, shape (K, d).

    Returns:
        Features of shape (n, 2K), each row of L2 norm 1.
    """
    proj = x @ freqs.T  # (n, K)
    return torch.cat([torch.cos(proj), torch.sin(proj)], dim=1) / math.sqrt(freqs.shape[0])  # (n, 2K)


def empirical_cf(x: Tensor, freqs: Tensor) -> Tensor:
    """Empirical CF ``[Re Φ̂(t_i) | Im Φ̂(t_i)]`` of the rows of ``x`` (Def. 3), shape (2K,).

    Equal to ``√K · mean_j z(x_j)``.
    """
    proj = x @ freqs.T  # (n, K)
    return torch.cat([torch.cos(proj).mean(0), torch.sin(proj).mean(0)])  # (2K,)


def cf_sum_sensitivity(*, adjacency: str) -> float:
    """L2 sensitivity of (class-wise) sums of :func:`cf_features`: 1 (add/remove) or 2 (replace-one)."""
    return embedding_sum_sensitivity(feature_norm=CF_FEATURE_NORM, adjacency=adjacency)


def frequency_discrepancy(phi_p: Tensor, phi_q: Tensor) -> Tensor:
    """``|Φ_P(t_i) − Φ_Q(t_i)|²`` per frequency from two CFs in ``[Re | Im]`` form.

    Args:
        phi_p: CF of P, shape (..., 2K).
        phi_q: CF of Q, shape (..., 2K) (broadcastable).

    Returns:
        Shape (..., K).
    """
    diff = phi_p - phi_q  # (..., 2K)
    re, im = diff.chunk(2, dim=-1)  # (..., K) each
    return re.square() + im.square()  # (..., K)


def cf_distance(phi_p: Tensor, phi_q: Tensor, weights: Tensor | None = None) -> Tensor:
    """The (weighted) empirical CF distance ``Ĉ² = Σ_i α_i |Φ_P(t_i) − Φ_Q(t_i)|²``.

    With uniform weights ``α_i = 1/K`` this is Eq. 7, ``(1/K) Σ_i |ΔΦ(t_i)|²``, which equals
    ``||mean z_P − mean z_Q||²`` for the unit-norm features (spec pitfall 5: the paper's
    ``||φ̂_P − φ̂_Q||²`` misses the 1/K). With the critic's self-normalised importance weights it is the
    estimate of ``C²_ω`` under the critic's ω (Eq. 1 and Lemma 1).

    Args:
        phi_p: CF of P, shape (..., 2K).
        phi_q: CF of Q, shape (..., 2K).
        weights: α, shape (K,), a probability vector; ``None`` means uniform.

    Returns:
        Shape (...).
    """
    disc = frequency_discrepancy(phi_p, phi_q)  # (..., K)
    if weights is None:
        return disc.mean(-1)
    return disc @ weights  # (...)


def importance_logits(omega0: Tensor, log_precision_ratio: Tensor) -> Tensor:
    """Log importance ratios ``log ω(t_i)/ω0(t_i)`` up to a constant, for diagonal Gaussians.

    ``ω0 = N(0, diag(1/p0))`` (precision p0 = ℓ², isotropic) and the critic's ``ω = N(0, diag(1/p))`` with
    ``p_d = p0 · exp(r_d)``. With ``t_i = ω0_i/ℓ``:
    ``log ω(t)/ω0(t) = ½ Σ_d t_d² (p0 − p_d) + const = ½ Σ_d ω0_{id}² (1 − exp(r_d)) + const``
    (spec §6 item 6; the log-determinant term is the same for every i and cancels on normalising).

    Args:
        omega0: standard-normal base frequencies, shape (K, d).
        log_precision_ratio: r = log(p/p0), shape (d,).

    Returns:
        Logits of shape (K,).
    """
    return 0.5 * omega0.square() @ (1.0 - torch.exp(log_precision_ratio))  # (K,)


def importance_weights(omega0: Tensor, log_precision_ratio: Tensor) -> Tensor:
    """Self-normalised importance weights ``α_i ∝ ω(t_i)/ω0(t_i)`` (a probability vector of shape (K,)).

    ``r = 0`` (ω = ω0) gives uniform weights ``1/K``.
    """
    return torch.softmax(importance_logits(omega0, log_precision_ratio), dim=0)  # (K,)


def effective_sample_size(weights: Tensor) -> Tensor:
    """Kish's effective number of frequencies ``1 / Σ α_i²`` (K at uniform weights, 1 when degenerate)."""
    return 1.0 / weights.square().sum()
