"""The private release of support points: an exponential mechanism sampled by MH, and a DP KDE bandwidth.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019), Algorithm 1 and §5.6. This
callback is the only code whose output leaves a ``model=support_points`` run; the module's optimised points are
its private input, replaced by the released draw before anything is saved (``models/support_points.py``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.errors import ConfigError, UserError
from lightning_dp.io import atomic_write_text
from lightning_dp.kernels.kde import bandwidth_grid, mle_bandwidth
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.energy_mh import ChainSettings, diagnose, run_chains
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.privacy.sensitivity import energy_range_sensitivity, energy_sensitivity

log = logging.getLogger(__name__)

SENSITIVITIES = ("support_set", "score_range")
DIAGNOSTICS_FILE = "support_points_mcmc.json"
CHAIN_KEYS = ("burn_in", "thin", "draws", "num_chains", "trace_every", "init_step", "adapt_every")


class ChainsNotMixedError(UserError, RuntimeError):
    """A checkpoint's release was refused (written before releases became unconditional): its budget is spent."""


class PrivateSupportPoints(Callback):
    """Release n private support points Ỹ ~ exp(−ε e(Ỹ, Y*)/(2Δf)) by MH, and a DP KDE bandwidth.

    Runs once, when training ends. Releases (one durable block, in this order, on the run's ledger):

    1. ``support_points/points`` (mechanism ``exponential``): one draw of the exponential mechanism whose score is
       the negative energy distance to the module's optimised support points Y* (Eq. 5.19, uniform prior on
       [0, 1]^{n×D}), sampled by ``num_chains`` Metropolis–Hastings chains (``privacy/energy_mh.py``); the
       released set is the last draw of chain 0, the other chains serve the diagnostics. Its ε is calibrated so
       that the ledger ends at the run's target with the bandwidth release below.
    2. ``support_points/bandwidth`` (``laplace``, only when the module has no public bandwidth): the grid
       bandwidth of largest KDE log-likelihood of the private rows around Ỹ (§5.6, option 2), plus Laplace
       noise, clipped to the grid. Sensitivity: the arg-max lies in the grid ``[h_min, h_max]`` whatever the data,
       so two neighbouring data sets give values at most ``h_max − h_min`` apart, under either adjacency (the
       thesis' (0, 1/8] gives 1/8; it writes the Laplace scale as 1/α instead of Δ/α, we use Δ/ε). It spends
       ``bandwidth_epsilon_fraction`` of the run's ε, in pure ε.

    Sensitivity of the exponential mechanism (``sensitivity``):

    * ``"support_set"`` (the thesis'): ``Δf = 2 d^{1/p}(2n − 1)/n²`` (Eqs. 5.8–5.10) with the
      support-set size n (Remark 1 and the author's code; using the data size N would give less noise and
      overstate privacy). This bound is rigorous for a change of one *reference* point. That one changed row
      moves at most one support point is the thesis' heuristic (§5.4.1), not a proof: the guarantee is NOMINAL.
      A DP run refuses it; with ``privacy=none`` the ledger records that the run makes no DP claim
      (:meth:`nominal_guarantee`, ``privacy/coverage.py``). It is used under both adjacencies.
    * ``"score_range"`` (the default): ``Δ = 2 d^{1/p}``, the range of ``e(Y, ·)`` on [0, 1]^D, which holds for a
      reference computed from the rows by any procedure: sound, with about n/2 times more noise.

    What a finite MCMC run guarantees: the exponential mechanism is ε-DP for an *exact* draw from its target π_X.
    A chain run for T steps returns a draw from ``P_X^T``; if ``||P_X^T − π_X||_TV <= τ`` for every data set, the
    release is (ε, (1 + e^ε)τ)-DP, but τ is unknown and is not bounded here. R̂ near 1 is evidence that the chains
    forgot their (data-independent) start, not a proof: nothing formal is claimed for a finite run.

    Non-mixing is not observable: the draw is released whatever the chains' R̂ (rank-normalised folded split-R̂ of
    the energy traces). Whether the chains mixed is a function of every chain, so of the rows, and is on no ledger:
    refusing to release when R̂ > ``max_rhat`` (exit 2 instead of points) would publish that bit outside the
    mechanism. ``max_rhat`` therefore only labels the private diagnostics (``"mixed"``), which the operator reads
    before using the points; the log says where they are, never what they say. (Checkpoints written before this
    choice may hold a refused release; resuming or sampling them still refuses.)

    The diagnostics (R̂, between/within-chain variance of the energy traces, acceptance rates, step sizes) are
    written to ``support_points_mcmc.json`` in the run's folder, and nowhere else (not in the checkpoint, the log
    or error messages, which say only whether the chains mixed: the release's own outcome). They are functions of
    the chains, so of the rows, and are not covered by the exponential mechanism's proof (any diagnostic of an
    MCMC run is, like the finite-run caveat): the file says so in its ``privacy`` entry, and should be handled
    like the audit report. The energy traces and every chain's states other than the released draw never
    leave the process.

    Args:
        ledger: the run's ledger.
        datamodule: the private data (``private_batches``), for the bandwidth release.
        burn_in, thin, draws, num_chains, trace_every, init_step, adapt_every: chain settings
            (``privacy.energy_mh.ChainSettings``; thesis code: burn-in 25,000, thinning 1000, 5 chains).
        max_rhat: the largest R̂ at which the chains count as mixed.
        sensitivity: ``"support_set"`` or ``"score_range"`` (above).
        bandwidth_epsilon_fraction: share of the run's ε for the bandwidth release.
        bandwidth_grid: ``[h_min, h_max, size]`` of the geometric bandwidth grid (thesis: (0, 1/8], floor 0.001).
        chunk_size: rows per streamed chunk of the bandwidth's likelihood pass.
        noise_seed: fix the chains' and the noise's randomness (tests only); default OS entropy.
    """

    name = "support_points/points"
    bandwidth_name = "support_points/bandwidth"

    def __init__(self, *, ledger: PrivacyLedger, datamodule: Any, burn_in: int = 25_000, thin: int = 1000,
                 draws: int = 50, num_chains: int = 5, trace_every: int = 100, init_step: float = 1e-2,
                 adapt_every: int = 50, max_rhat: float = 1.1, sensitivity: str = "score_range",
                 bandwidth_epsilon_fraction: float = 0.1,
                 bandwidth_grid: list[float] | tuple[float, ...] = (0.001, 0.125, 40), chunk_size: int = 4096, noise_seed: int | None = None) -> None:
        self.settings = self.check_settings(dict(
            burn_in=burn_in, thin=thin, draws=draws, num_chains=num_chains, trace_every=trace_every,
            init_step=init_step, adapt_every=adapt_every, max_rhat=max_rhat, sensitivity=sensitivity,
            bandwidth_epsilon_fraction=bandwidth_epsilon_fraction, bandwidth_grid=bandwidth_grid))
        self.ledger, self.datamodule = ledger, datamodule
        self.max_rhat, self.sensitivity = float(max_rhat), sensitivity
        self.bandwidth_epsilon_fraction = float(bandwidth_epsilon_fraction)
        self.grid = bandwidth_grid_of(bandwidth_grid)
        self.chunk_size, self.noise_seed = chunk_size, noise_seed
        self.diagnostics: dict[str, Any] | None = None

    @staticmethod
    def nominal_guarantee(node: Mapping[str, Any]) -> str | None:
        """Why the release's ε is nominal with these settings (``privacy/coverage.py``), or None when it is proved."""
        if node.get("sensitivity", "score_range") == "support_set":
            return ("PrivateSupportPoints sensitivity=support_set uses the thesis' Δf, which assumes one row moves at "
                    "most one support point (not proved); sensitivity=score_range is sound")
        return None

    @staticmethod
    def check_settings(node: Mapping[str, Any]) -> ChainSettings:
        """The mechanism's settings (a config node), checked before any release; returns the chain settings.

        Raises:
            ConfigError: the first setting out of range, with what to set.
        """
        where = "PrivateSupportPoints (model.mechanisms)"
        try:
            settings = ChainSettings(**{k: node[k] for k in CHAIN_KEYS if k in node})
            settings.check()
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where}: {err}") from None
        rhat = node.get("max_rhat", 1.1)
        if isinstance(rhat, bool) or not isinstance(rhat, int | float) or not 1 < rhat < math.inf:
            raise ConfigError(f"{where}: max_rhat must be a number > 1 (1.1 is usual, 1.01 strict), got {rhat!r}.")
        if node.get("sensitivity", "support_set") not in SENSITIVITIES:
            raise ConfigError(f"{where}: sensitivity={node.get('sensitivity')!r} is unknown; valid: "
                              f"{', '.join(SENSITIVITIES)}.")
        frac = node.get("bandwidth_epsilon_fraction", 0.1)
        if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac < 1:
            raise ConfigError(f"{where}: bandwidth_epsilon_fraction must be in (0, 1), got {frac!r}.")
        try:
            bandwidth_grid_of(node.get("bandwidth_grid", (0.001, 0.125, 40)))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where}: bandwidth_grid: {err}") from None
        return settings

    # ---------------------------------------------------------------- hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise ConfigError("model=support_points runs in one process (its MH chains are sequential); use trainer=cpu "
                              "or trainer.devices=1.")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if pl_module.is_released():
            if not self.ledger.has(self.name):
                raise RuntimeError(f"The checkpoint holds released {self.name!r} that its ledger does not list: the "
                                   "checkpoint is inconsistent and cannot be trusted. Start a new run.")
            log.info("%s was released before this resume; it is not released again.", self.name)
        elif pl_module.is_refused():
            raise ChainsNotMixedError(f"This run's release of {self.name!r} was refused (the MH chains did not mix) "
                                      "and its budget is spent. Start a new run with longer chains.")
        elif self.ledger.has(self.name):
            raise CheckpointError(f"The ledger lists {self.name!r} as released but this checkpoint has no released "
                                  "points: it is older than the release. Resume from the run's checkpoints/last.ckpt, "
                                  "or start a new run.")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if pl_module.is_released() or pl_module.is_refused():
            return
        if pl_module.steps_behind() > 0:  # resumed with no batches left: Y* is in no checkpoint
            chunks = self.datamodule.private_batches(chunk_size=self.chunk_size)
            steps = pl_module.catch_up(torch.cat([pl_module.embed(x, y) for x, y in chunks]).to(pl_module.device))
            log.info("Re-optimised the support points from their initial values (%d Adam steps, full batches): a "
                     "checkpoint never holds them.", steps)
        self._release(pl_module)
        if trainer.is_global_zero:
            atomic_write_text(Path(trainer.default_root_dir) / DIAGNOSTICS_FILE,
                              json.dumps(self.diagnostics, indent=2, default=float) + "\n")

    # ---------------------------------------------------------------- the releases
    def _points_release(self, epsilon: float, sensitivity: float, n: int, dim: int, p: float) -> Release:
        if self.sensitivity == "support_set":
            note = (f"exponential mechanism, score −e(Y, Y*) over {n}×{dim} sets in [0,1], sampled by MH; "
                    f"Δf = 2·d^(1/p)(2n−1)/n² (d={dim}, p={p:g}, n={n} support points; thesis Remark 1). NOMINAL: "
                    "assumes one row moves at most one support point (thesis §5.4.1, unproved); exact sampling assumed")
        else:
            note = (f"exponential mechanism, score −e(Y, Y*) over {n}×{dim} sets in [0,1], sampled by MH; "
                    f"Δ = 2·d^(1/p) (d={dim}, p={p:g}), the score's range: holds for any reference; exact sampling "
                    "assumed")
        return Release(name=self.name, mechanism="exponential", sensitivity=sensitivity, epsilon=epsilon, note=note)

    def _bandwidth_release(self) -> Release:
        lo, hi = float(self.grid[0]), float(self.grid[-1])
        return Release(name=self.bandwidth_name, mechanism="laplace", sensitivity=hi - lo,
                       noise_multiplier=1.0 / (self.bandwidth_epsilon_fraction * self.ledger.target_epsilon),
                       note=f"KDE bandwidth: arg-max of the rows' log-likelihood on a grid in [{lo:g}, {hi:g}] (so "
                            "Δ = h_max − h_min under either adjacency) + Laplace, clipped to the grid")

    def _release(self, module: Any) -> bool:
        """Record and draw the releases in one durable block; returns whether the chains mixed (private)."""
        reference = module.points.detach().double().clone()  # Y*: computed from the rows without noise, (n, D)
        n, dim = reference.shape
        p = float(module.hparams.p)
        sens = (energy_sensitivity(n_ref=n, d=dim, p=p) if self.sensitivity == "support_set"
                else energy_range_sensitivity(d=dim, p=p))
        needs_bw = module.needs_bandwidth()
        bw_release = self._bandwidth_release() if needs_bw else None

        def planned(s: float) -> list[Release]:  # s = 1/ε of the exponential release
            return [self._points_release(1.0 / s, sens, n, dim, p), *([bw_release] if needs_bw else [])]

        s = self.ledger.calibrate(planned)  # refuses, before any chain runs, when the budget is spent
        eps, beta = 1.0 / s, 1.0 / (s * 2.0 * sens)
        gen = mech.noise_generator(self.noise_seed)
        try:
            with self.ledger.durable():  # the checkpoint with Ỹ (or the refusal) and the ledger are saved before use
                self.ledger.record(planned(s)[0])
                result = run_chains(reference.to(module.device), n=n, beta=beta, p=p, settings=self.settings,
                                    generator=gen)
                diag = diagnose(result)
                mixed = diag.mixed(self.max_rhat)
                self.diagnostics = {"release": self.name, "mixed": mixed, "max_rhat": self.max_rhat,
                                    **diag.to_dict(), "epsilon": eps, "sensitivity": sens,
                                    "sensitivity_basis": self.sensitivity, "beta": beta, "num_points": n, "dim": dim,
                                    "p": p, "chains": asdict(self.settings),
                                    "privacy": "PRIVATE: functions of all chains, which read the rows through the "
                                               "optimised points; not covered by the run's (ε, δ). Handle like the "
                                               "audit report, not like the released points"}
                module.set_release(result.final[0])  # whatever R̂ says: whether the chains mixed is not released
                if needs_bw:
                    self.ledger.record(bw_release)
                    self._release_bandwidth(module, bw_release, gen)
                self.diagnostics["bandwidth"] = float(module.bandwidth)
                log.info("Released %d private support points: ε = %.4g, Δf = %.4g (%s), KDE bandwidth %.4g (%s); "
                         "the chains' diagnostics (private: R̂, and whether it is within max_rhat, which the points "
                         "should not be used without) are in %s; %s", n, eps, sens, self.sensitivity,
                         float(module.bandwidth), "DP" if needs_bw else "public", DIAGNOSTICS_FILE,
                         self.ledger.summary())
                if self.sensitivity == "support_set":
                    log.warning("The support points' DP guarantee is nominal: Δf assumes one row moves at most "
                                "one support point (thesis §5.4.1). sensitivity=score_range is sound.")
        except BaseException:
            module.restore(reference, bandwidth=math.nan if needs_bw else None)  # nothing was released
            self.diagnostics = None
            raise
        return mixed

    def _release_bandwidth(self, module: Any, release: Release, gen: torch.Generator) -> None:
        k = module.n_continuous
        centres = module.points.detach()[:, :k]
        chunks = (x[:, :k].to(centres.device) for x, _ in self.datamodule.private_batches(chunk_size=self.chunk_size))
        with torch.no_grad():
            h = mle_bandwidth(chunks, centres, self.grid)
        noisy = mech.laplace_noise(torch.tensor(h, dtype=torch.float64), sensitivity=release.sensitivity,
                                   noise_multiplier=release.noise_multiplier, generator=gen)
        module.set_bandwidth(float(noisy.clamp(float(self.grid[0]), float(self.grid[-1]))))


def bandwidth_grid_of(spec: Any) -> torch.Tensor:
    """The bandwidth grid of a ``[h_min, h_max, size]`` setting.

    Raises:
        ValueError: not three numbers with 0 < h_min < h_max <= 1 and a whole size >= 2.
    """
    if not isinstance(spec, list | tuple) or len(spec) != 3:
        raise ValueError(f"expected [h_min, h_max, size], got {spec!r}.")
    lo, hi, size = spec
    if isinstance(size, bool) or not isinstance(size, int) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi)) or not 0 < lo < hi <= 1:
        raise ValueError(f"expected [h_min, h_max, size] with 0 < h_min < h_max <= 1 and a whole size, got {spec!r}.")
    return bandwidth_grid(float(lo), float(hi), size)

