"""Metropolis–Hastings for the exponential mechanism on the energy distance, and its convergence diagnostics.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019), §5.3–5.5: the target is
``π(Y) ∝ exp(−β e(Y, R))`` with ``β = ε/(2Δf)`` (Eq. 5.19) over sets Y of n points under the uniform prior on
[0, 1]^{n×D}. One step moves a single point ``y_i → y_i + s·N(0, I)`` (symmetric, so prior and proposal cancel,
Eq. 5.20) and accepts with ``log u < −β Δe`` (Eq. 5.21 in log space). Choices the thesis leaves open, each in the
direction of a valid chain:

* a proposal outside [0, 1]^D is rejected (the prior is 0 there), never clipped (clipping makes the proposal
  asymmetric and puts mass on the faces; spec pitfall 19);
* points are visited cyclically, ``i = t mod n`` (the author's code); each single-point kernel keeps π invariant
  (detailed balance), so their cycle does too;
* the step size of each chain adapts every ``adapt_every`` steps towards 30% acceptance (×2 above 40%, ×1.2 in
  (30%, 40%], ×0.8 in (20%, 30%], ×0.5 below) during burn-in only, then stays frozen at the geometric mean of
  its values over the second half of burn-in (the rule oscillates by factors of 2 on 50-step windows, so its
  last value is a poor choice): adaptation for the whole chain, as in the author's code, breaks invariance;
* the chains start uniform on [0, 1]^{n×D}, independently of the data.

Diagnostics (§5.5): the rank-normalised, folded split-R̂ of Vehtari et al. (2021) on the chains' energy traces,
and the between-chain (variance of chain means) and within-chain (mean chain variance) variances, ddof = 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_dp.kernels.energy import energy_distance

RANDOM_BLOCK = 1024  # MH steps whose random numbers are drawn at once


@dataclass(frozen=True)
class ChainSettings:
    """Length and tuning of the chains.

    Attributes:
        burn_in: steps before the step size is frozen and the trace starts (thesis: 5000 on the 2-D mixtures,
            25,000 in the author's regression runs).
        thin: steps between the thinned draws ``y[burn_in::thin]`` (thesis 2000, code 1000).
        draws: thinned draws per chain; a chain runs ``burn_in + thin·(draws − 1)`` steps and its last draw is
            its output (code: 10 draws, 34,001 states).
        num_chains: independent chains (code: 5), for R̂.
        trace_every: steps between two energies of the trace R̂ is computed on (code: 100).
        init_step: initial proposal standard deviation (code: 1e-2).
        adapt_every: steps between step-size adaptations during burn-in (code: 50).
        min_step, max_step: bounds of the step size.
    """

    burn_in: int = 25_000
    thin: int = 1000
    draws: int = 10
    num_chains: int = 5
    trace_every: int = 100
    init_step: float = 1e-2
    adapt_every: int = 50
    min_step: float = 1e-5
    max_step: float = 1.0

    @property
    def num_steps(self) -> int:
        """MH steps of each chain."""
        return self.burn_in + self.thin * (self.draws - 1)

    @property
    def trace_length(self) -> int:
        """Energies per chain in the trace (states ``burn_in, burn_in + trace_every, ...``)."""
        return (self.num_steps - self.burn_in) // self.trace_every + 1

    def check(self) -> None:
        """Raises ValueError naming the first setting out of range."""
        whole = {"burn_in": (self.burn_in, 0), "thin": (self.thin, 1), "draws": (self.draws, 1),
                 "num_chains": (self.num_chains, 2), "trace_every": (self.trace_every, 1),
                 "adapt_every": (self.adapt_every, 1)}
        for name, (value, low) in whole.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}.")
        if not 0 < self.min_step <= self.init_step <= self.max_step:
            raise ValueError(f"Step sizes must satisfy 0 < min_step <= init_step <= max_step, got "
                             f"{self.min_step}, {self.init_step}, {self.max_step}.")
        if self.trace_length < 4:
            raise ValueError(f"The chains record {self.trace_length} energies after burn-in (thin·(draws − 1)/"
                             f"trace_every + 1); split-R̂ needs at least 4: lengthen the chains or lower trace_every.")


@dataclass
class ChainResult:
    """What the chains produced: their last states, the energy trace and the tuning they ended with.

    Attributes:
        final: last state of each chain, (K, n, D).
        trace: energies ``e(Y_t, R)`` every ``trace_every`` steps after burn-in, (K, S).
        acceptance: acceptance rate after burn-in, (K,).
        step_size: frozen step size, (K,).
    """

    final: Tensor
    trace: Tensor
    acceptance: Tensor
    step_size: Tensor


def _distances(a: Tensor, b: Tensor, p: float) -> Tensor:
    """``||a_k − b_kj||_p`` for a (K, D) and b (K, m, D) or (m, D); shape (K, m)."""
    diff = a.unsqueeze(-2) - b  # (K, m, D)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return diff.square().sum(-1).sqrt()
    return diff.abs().pow(p).sum(-1).pow(1.0 / p)


def delta_energy(points: Tensor, index: int, proposal: Tensor, cross: Tensor, reference: Tensor,
                 p: float) -> tuple[Tensor, Tensor]:
    """Change of ``e(Y, R)`` when point ``index`` of each chain moves to ``proposal`` (thesis §5.3), O(n + m).

    ``Δe = (2/(n m)) Σ_l (||y'_i − r_l|| − ||y_i − r_l||) − (2/n²) Σ_{j≠i} (||y'_i − y_j|| − ||y_i − y_j||)``.

    Args:
        points: current sets Y, (K, n, D).
        index: the point i that moves.
        proposal: its proposed positions y'_i, (K, D).
        cross: cached ``Σ_l ||y_j − r_l||`` of every point, (K, n).
        reference: R, (m, D).
        p: norm order.

    Returns:
        ``(Δe, Σ_l ||y'_i − r_l||)``, both (K,).
    """
    n, m = points.shape[1], reference.shape[0]
    cross_new = _distances(proposal, reference, p).sum(-1)  # (K,)
    own = _distances(proposal, points, p) - _distances(points[:, index], points, p)  # (K, n)
    own[:, index] = 0.0  # j = i: ||y'_i − y_i|| against 0 is not a pair of the new set
    return 2.0 / (n * m) * (cross_new - cross[:, index]) - 2.0 / n**2 * own.sum(1), cross_new


def accept(delta: Tensor, log_u: Tensor, inside: Tensor, beta: float) -> Tensor:
    """MH acceptance in log space: ``log u < −β Δe`` for proposals inside the domain (Eq. 5.21), (K,) bool."""
    return inside & (log_u < -beta * delta)


def adapted_steps(step: Tensor, rate: Tensor, settings: ChainSettings) -> Tensor:
    """The author's rule towards 30% acceptance: ×2 above 0.4, ×1.2 in (0.3, 0.4], ×0.8 in (0.2, 0.3], else ×0.5."""
    factor = torch.where(rate > 0.4, 2.0, torch.where(rate > 0.3, 1.2, torch.where(rate > 0.2, 0.8, 0.5)))
    return (step * factor).clamp(settings.min_step, settings.max_step)


def run_chains(reference: Tensor, *, n: int, beta: float, p: float, settings: ChainSettings,
               generator: torch.Generator) -> ChainResult:
    """Run ``settings.num_chains`` MH chains for ``π(Y) ∝ exp(−β e(Y, R))`` over n-point sets in [0, 1]^D.

    All randomness (initial states, proposals, uniforms) comes from ``generator``; the chains run on
    ``reference``'s device, in float64.

    Args:
        reference: R, (m, D), in [0, 1].
        n: points per set.
        beta: inverse temperature ``ε/(2Δf)``.
        p: norm order of the energy distance.
        settings: chain length and tuning (checked here).
        generator: source of every random number.
    """
    settings.check()
    ref = reference.detach().to(torch.float64)
    dev, k, dim = ref.device, settings.num_chains, ref.shape[1]

    def draw(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=generator, dtype=torch.float64, device=generator.device).to(dev)

    points = draw(k, n, dim)  # uniform initial states, (K, n, D)
    cross = torch.stack([_distances(points[:, j], ref, p).sum(-1) for j in range(n)], 1)  # (K, n)
    step = torch.full((k,), float(settings.init_step), dtype=torch.float64, device=dev)
    window = torch.zeros(k, dtype=torch.float64, device=dev)
    log_steps, kept = torch.zeros(k, dtype=torch.float64, device=dev), 0  # Σ log step, second half of burn-in
    accepted_after = torch.zeros(k, dtype=torch.float64, device=dev)
    trace = [energy_distance(points, ref, p)] if settings.burn_in == 0 else []
    for t in range(settings.num_steps):
        if t % RANDOM_BLOCK == 0:
            size = min(RANDOM_BLOCK, settings.num_steps - t)
            noise = torch.randn(size, k, dim, generator=generator, dtype=torch.float64,
                                device=generator.device).to(dev)  # (B, K, D)
            log_u = torch.log(draw(size, k))  # (B, K)
        i, b = t % n, t % RANDOM_BLOCK
        proposal = points[:, i] + step.unsqueeze(1) * noise[b]  # (K, D)
        inside = ((proposal >= 0) & (proposal <= 1)).all(1)
        delta, cross_new = delta_energy(points, i, proposal, cross, ref, p)
        ok = accept(delta, log_u[b], inside, beta)
        points[:, i] = torch.where(ok.unsqueeze(1), proposal, points[:, i])
        cross[:, i] = torch.where(ok, cross_new, cross[:, i])
        done = t + 1
        if done <= settings.burn_in:
            window += ok
            if done % settings.adapt_every == 0:
                step = adapted_steps(step, window / settings.adapt_every, settings)
                window.zero_()
                if 2 * done > settings.burn_in:
                    log_steps, kept = log_steps + step.log(), kept + 1
            if done == settings.burn_in and kept:
                step = (log_steps / kept).exp()  # frozen from here on
        else:
            accepted_after += ok
        if done >= settings.burn_in and (done - settings.burn_in) % settings.trace_every == 0:
            trace.append(energy_distance(points, ref, p))  # exact, so no drift from summed Δe
    after = max(settings.num_steps - settings.burn_in, 1)
    return ChainResult(final=points, trace=torch.stack(trace, 1), acceptance=accepted_after / after, step_size=step)


# ---------------------------------------------------------------------------------------------- diagnostics
def split_rhat(draws: np.ndarray) -> float:
    """Split-R̂ (Gelman et al., BDA3 §11.4) of draws (K, S): each chain halved, the middle draw of an odd S dropped.

    Returns NaN when the within-chain variance is 0 (chains that never moved: not evidence of mixing).
    """
    draws = np.asarray(draws, dtype=float)
    half = draws.shape[1] // 2
    chains = np.concatenate([draws[:, :half], draws[:, draws.shape[1] - half :]])  # (2K, S/2)
    within = chains.var(axis=1, ddof=1).mean()
    if not within > 0:
        return math.nan
    between = half * chains.mean(axis=1).var(ddof=1)
    return float(math.sqrt(((half - 1) / half * within + between / half) / within))


def rank_normalize(draws: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled ranks, ``Φ⁻¹((r − 3/8)/(S + 1/4))`` (Vehtari et al. 2021, Eq. 14), ties averaged."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    draws = np.asarray(draws, dtype=float)
    ranks = rankdata(draws, method="average").reshape(draws.shape)
    return ndtri((ranks - 0.375) / (draws.size + 0.25))


def rhat(draws: np.ndarray) -> float:
    """Rank-normalised, folded split-R̂ (Vehtari et al. 2021): the larger of the bulk and the tail R̂.

    NaN when undefined (constant chains), which callers must read as "not mixed".
    """
    draws = np.asarray(draws, dtype=float)
    bulk = split_rhat(rank_normalize(draws))
    tail = split_rhat(rank_normalize(np.abs(draws - np.median(draws))))
    return math.nan if math.isnan(bulk) or math.isnan(tail) else max(bulk, tail)


@dataclass(frozen=True)
class Diagnostics:
    """Convergence summary of a set of chains (thesis §5.5).

    Attributes:
        rhat: rank-normalised folded split-R̂ of the energy traces (NaN = undefined).
        between_variance: variance of the chains' mean energies (ddof = 1).
        within_variance: mean of the chains' energy variances (ddof = 1).
        acceptance: acceptance rate of each chain after burn-in.
        step_size: frozen step size of each chain.
        trace_length: energies per chain the three figures above come from.
    """

    rhat: float
    between_variance: float
    within_variance: float
    acceptance: list[float]
    step_size: list[float]
    trace_length: int

    def mixed(self, max_rhat: float) -> bool:
        """R̂ is defined and at most ``max_rhat``."""
        return math.isfinite(self.rhat) and self.rhat <= max_rhat

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def diagnose(result: ChainResult) -> Diagnostics:
    """R̂ and the between/within variances of ``result.trace``, with the chains' acceptance and step sizes."""
    trace = result.trace.detach().cpu().numpy()  # (K, S)
    return Diagnostics(rhat=rhat(trace), between_variance=float(trace.mean(axis=1).var(ddof=1)),
                       within_variance=float(trace.var(axis=1, ddof=1).mean()),
                       acceptance=[float(a) for a in result.acceptance.cpu()],
                       step_size=[float(s) for s in result.step_size.cpu()], trace_length=int(trace.shape[1]))
