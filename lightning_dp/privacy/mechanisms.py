"""Pure noise mechanisms and their Rényi-DP curves.

Every function here is stateless. The ledger (``ledger.py``) composes the RDP curves returned by
``*_rdp``; the callbacks draw noise with the matching ``*_noise`` function, so the noise that is
added is exactly the noise that is accounted for.

Conventions:
    * ``sensitivity`` is the L2 (Gaussian) or L1 (Laplace) sensitivity of the released statistic
      under the ledger's adjacency relation.
    * ``noise_multiplier`` is the noise scale divided by the sensitivity: the Gaussian standard
      deviation is ``noise_multiplier * sensitivity``; the Laplace scale b is
      ``noise_multiplier * sensitivity``.

Floating-point caveat (Mironov 2012): noise drawn with IEEE doubles leaks through its low bits. We
draw in float64 and leave this attack out of scope, as Opacus does.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import numpy as np
import torch
from opacus.accountants.analysis import rdp as opacus_rdp
from torch import Tensor

# Opacus' default orders (they reproduce its golden values) extended to large orders, which the
# optimum needs at small epsilon and large noise.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 160, 192, 256, 384, 512, 1024]
)


def noise_generator(seed: int | None = None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for privacy noise: seeded from OS entropy unless ``seed`` is given (tests, DDP)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63) if seed is None else int(seed))
    return gen


def gaussian_noise(
    value: Tensor, *, sensitivity: float, noise_multiplier: float, generator: torch.Generator,
    draw_dtype: torch.dtype | None = torch.float64,
) -> Tensor:
    """Gaussian mechanism: ``value + N(0, (noise_multiplier * sensitivity)^2 I)`` (Dwork & Roth, App. A).

    Noise is drawn in ``draw_dtype`` (float64 by default; ``None`` = ``value``'s dtype, which DP-SGD
    uses per step for speed) on the generator's device and cast back to ``value``'s dtype.
    """
    std = float(noise_multiplier) * float(sensitivity)
    dtype = value.dtype if draw_dtype is None else draw_dtype
    noise = torch.randn(value.shape, generator=generator, dtype=dtype, device=generator.device)
    return value + (std * noise).to(dtype=value.dtype, device=value.device)


def laplace_noise(value: Tensor, *, sensitivity: float, noise_multiplier: float, generator: torch.Generator) -> Tensor:
    """Laplace mechanism: ``value + Lap(b)`` with ``b = noise_multiplier * L1-sensitivity``.

    Drawn as the difference of two exponentials, which needs only uniforms from ``generator``.
    """
    b = float(noise_multiplier) * float(sensitivity)
    u = torch.rand((2, *value.shape), generator=generator, dtype=torch.float64, device=generator.device)
    noise = b * (torch.log1p(-u[0]) - torch.log1p(-u[1]))
    return value + noise.to(dtype=value.dtype, device=value.device)


def exponential_mechanism(
    utilities: Tensor, *, epsilon: float, sensitivity: float, generator: torch.Generator
) -> int:
    """Exponential mechanism (McSherry & Talwar 2007): pick i with probability ∝ exp(ε u_i / (2Δu)).

    ε-DP for a utility whose per-candidate sensitivity is ``sensitivity``. Sampled with the Gumbel-max
    trick so that no probabilities underflow.
    """
    logits = utilities.double() * (epsilon / (2.0 * sensitivity))
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=generator.device)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
    return int(torch.argmax(logits.cpu() + gumbel.cpu()))


def gaussian_rdp(
    orders: Sequence[float], *, noise_multiplier: float, sample_rate: float = 1.0, steps: int = 1
) -> np.ndarray:
    """RDP of ``steps`` Poisson-subsampled Gaussian mechanisms (Mironov et al. 2019).

    With ``sample_rate = 1`` this is the plain Gaussian mechanism, ``steps * α / (2σ²)``.
    """
    if noise_multiplier <= 0:
        return np.full(len(orders), np.inf)
    return np.asarray(
        opacus_rdp.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=list(orders)),
        dtype=float,
    )


def laplace_rdp(orders: Sequence[float], *, noise_multiplier: float, steps: int = 1) -> np.ndarray:
    """RDP of the Laplace mechanism with scale ``b = noise_multiplier * Δ1`` (Mironov 2017, Prop. 6).

    ``ε(α) = 1/(α−1) · log( α/(2α−1) · e^{(α−1)/λ} + (α−1)/(2α−1) · e^{−α/λ} )`` with λ = b/Δ1.
    """
    lam = float(noise_multiplier)
    out = []
    for a in orders:
        log_terms = np.logaddexp(
            math.log(a / (2 * a - 1)) + (a - 1) / lam, math.log((a - 1) / (2 * a - 1)) - a / lam
        )
        out.append(log_terms / (a - 1))
    return steps * np.minimum(np.asarray(out), 1.0 / lam)


def pure_dp_rdp(orders: Sequence[float], *, epsilon: float, steps: int = 1) -> np.ndarray:
    """RDP of an ε-DP mechanism: ``min(ε, α ε²/2)`` (ε-DP ⇒ ε²/2-zCDP, Bun & Steinke 2016, Prop. 3.3)."""
    a = np.asarray(orders, dtype=float)
    return steps * np.minimum(epsilon, a * epsilon**2 / 2.0)


def rdp_to_epsilon(orders: Sequence[float], rdp: np.ndarray, delta: float) -> float:
    """Convert an RDP curve to ε at ``delta`` (Balle et al. 2020, Thm. 21; Opacus' conversion)."""
    if delta <= 0:
        return math.inf
    rdp = np.asarray(rdp, dtype=float)
    if np.all(rdp == 0):
        return 0.0
    a = np.asarray(orders, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = rdp - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    eps = eps[np.isfinite(eps)]
    return float(max(eps.min(), 0.0)) if eps.size else math.inf
