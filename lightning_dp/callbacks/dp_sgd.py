"""DP-SGD as a mechanism for any LightningModule (Abadi et al. 2016, Alg. 1).

The module marks what is private by the *shape* of what it backpropagates: a per-sample loss of shape
``(B,)`` passed to ``self.manual_backward`` (manual optimization) or returned from ``training_step``
(automatic optimization) is a private loss over the Poisson-sampled private batch. For it, this
callback

1. records one Poisson-subsampled Gaussian release on the ledger (refused if over budget),
2. computes the per-sample clipped gradient sum ``Σ_i min(1, C/||g_i||) g_i`` of the private modules'
   parameters (``PerSampleClipper``: one backward, Opacus only where the fast path can't go),
3. sums it across ranks (DDP), adds ``N(0, σ²C²)`` once, with identical noise on every rank,
4. divides by the expected batch size ``L = q·N`` and adds it to ``p.grad``.

A term computed from the whole batch at once (``privacy/batch_terms.py``, e.g. PPEM's KSD penalty) is
clipped as a whole to its own norm C_P and added to the clipped sum before the noise; the step's
sensitivity is then Δ = C + 2·ΣC_P (proved there), and the noise and the ledger's release use Δ.

A scalar loss is public (e.g. a GAN's loss on generated samples, computed from the released state)
and is backpropagated normally. The generator of a GAN therefore sees data only through the private
discriminator's releases (post-processing).

Under DDP the callback owns gradient synchronisation of the module: each step runs inside DDP's
``no_sync`` and gradients are averaged across ranks just before each optimizer step, so the noisy
private part (already identical on every rank) is unchanged and public parts are averaged.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import Tensor, nn

from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.batch_terms import batch_terms
from lightning_dp.privacy.clipping import PerSampleClipper
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger, Release
from lightning_dp.privacy.metrics import declare_metrics
from lightning_dp.privacy.microbatch import microbatch_clipped_sum

log = logging.getLogger(__name__)

FEW_STEPS = 300  # below this many planned steps, a DP-SGD run is warned that it will train poorly


class DPSGD(Callback):
    """Per-sample clipping + Gaussian noise on the modules that see private data, Poisson sampling.

    Args:
        ledger: the run's ledger (adjacency must be ``add_remove``: Opacus' subsampled-Gaussian RDP
            is for add/remove neighbours with Poisson sampling).
        datamodule: the private data; its ``batch_size`` is the expected batch size L.
        max_grad_norm: clipping norm C.
        noise_multiplier: σ; ``None`` calibrates it so that the planned steps spend what the ledger
            has left (the planned steps come from the trainer's ``max_steps`` or ``max_epochs``).
        private_modules: attribute names of the submodules whose parameters see private data.
        mode: clipping engine, ``"auto"`` | ``"fast"`` | ``"opacus"`` (one backward, ``PerSampleClipper``)
            or ``"microbatch"`` (one autograd call per sample: any loss, e.g. a gradient penalty; B× slower).
        noise_seed: fix the privacy noise (tests only). Sampling is always seeded from OS entropy.
    """

    def __init__(self, *, ledger: PrivacyLedger, datamodule: Any, max_grad_norm: float = 1.0,
                 noise_multiplier: float | None = None, private_modules: list[str] | tuple[str, ...] = ("discriminator",),
                 mode: str = "auto", noise_seed: int | None = None) -> None:
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}.")
        if noise_multiplier is not None and noise_multiplier <= 0:
            raise ValueError(f"noise_multiplier must be > 0 (or null to calibrate), got {noise_multiplier}.")
        self.ledger, self.datamodule = ledger, datamodule
        self.max_grad_norm, self.noise_multiplier = float(max_grad_norm), noise_multiplier
        self.private_modules, self.mode, self.noise_seed = list(private_modules), mode, noise_seed
        self.sample_rate: float | None = None
        self.sensitivity = self.max_grad_norm  # C, plus 2·C_P per batch-coupled term (on_fit_start)
        self._terms: list[Any] = []
        self.name = "dp_sgd/" + "+".join(self.private_modules)
        self._clipper: PerSampleClipper | None = None
        self._released_this_batch = False
        self._no_sync: Any = None
        self._canaries: Any = None  # audits' gradient canaries (attach_canaries); never set by a config

    public_metrics = {
        "dp_sgd/noisy_grad_norm": "norm of the noised, averaged private gradient (the release itself)",
        "dp_sgd/noise_multiplier": "σ, calibrated from the DP row count",
    }

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        declare_metrics(pl_module, self.public_metrics)

    def _release(self, count: int) -> Release:
        note = f"clipped per-sample gradient sum of {', '.join(self.private_modules)}, C = {self.max_grad_norm:g}"
        if self._terms:
            note += (f", plus {len(self._terms)} batch-coupled term(s) clipped whole to C_P = "
                     f"{', '.join(f'{t.max_grad_norm:g}' for t in self._terms)}: Δ = C + 2·ΣC_P = {self.sensitivity:g}")
        return Release(name=self.name, mechanism="subsampled_gaussian", sensitivity=self.sensitivity,
                       noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, count=count, note=note)

    @property
    def steps_done(self) -> int:
        return sum(r.count for r in self.ledger.releases if r.name == self.name)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.ledger.adjacency != "add_remove":
            raise ValueError("DP-SGD's accounting (Poisson-subsampled Gaussian RDP) is for add/remove adjacency: "
                             "set privacy.adjacency=add_remove.")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("Gradient accumulation changes DP-SGD's logical batch and would be mis-accounted: set "
                             "trainer.accumulate_grad_batches=1 and raise data.batch_size instead.")
        self._terms = batch_terms(pl_module)  # registered by their callbacks' setup
        self.sensitivity = self.max_grad_norm + 2 * sum(float(t.max_grad_norm) for t in self._terms)
        n, world = self.datamodule.released_num_rows, trainer.world_size  # DP or public, never the exact count
        if world > 1 and trainer._accelerator_connector.use_distributed_sampler:
            raise ValueError("Under DDP, DP-SGD shards and Poisson-samples the data itself: set "
                             "trainer.use_distributed_sampler=false (configs/trainer/ddp.yaml does).")
        self.sample_rate = min(self.datamodule.batch_size / n, 1.0)  # q = L/ñ, a function of the DP count
        self._expected_batch = self.sample_rate * n  # L (or ñ when q = 1): the public normaliser
        steps_per_epoch = max(round(1 / self.sample_rate), 1)
        planned = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.max_epochs * steps_per_epoch
        remaining = max(planned - self.steps_done, 1)
        if self.noise_multiplier is None:
            self.noise_multiplier = self.ledger.calibrate(
                lambda s: [Release(name=self.name, mechanism="subsampled_gaussian", sensitivity=self.sensitivity,
                                   noise_multiplier=s, sample_rate=self.sample_rate, count=remaining)])
        next_epsilon = self.ledger.epsilon_if([self._release(1)])
        if next_epsilon > self.ledger.target_epsilon and self.steps_done:
            log.info("DP-SGD: the budget was spent by the %d steps before this resume; training is complete (%s).",
                     self.steps_done, self.ledger.summary())
            trainer.should_stop = True
        elif next_epsilon > self.ledger.target_epsilon:
            raise BudgetExceededError(
                f"Not one DP-SGD step fits in the budget: with noise multiplier {self.noise_multiplier:g} and sample rate "
                f"{self.sample_rate:.3g}, one step takes ε to {next_epsilon:.3g} > "
                f"{self.ledger.target_epsilon:g} ({self.ledger.summary()}). Raise the noise multiplier (or leave it null "
                "to calibrate it), lower data.batch_size, or raise privacy.epsilon.")
        self.datamodule.use_poisson_sampling(sample_rate=self.sample_rate, steps_per_epoch=steps_per_epoch,
                                             rank=trainer.global_rank, world_size=world,
                                             generator=mech.noise_generator())  # secret sampling randomness
        seed = self.noise_seed if self.noise_seed is not None else secrets.randbits(62)
        seed = int(trainer.strategy.broadcast(seed, src=0)) if world > 1 else seed
        self._noise = mech.noise_generator(seed + self.steps_done, device=pl_module.device)
        modules = nn.ModuleDict({name: getattr(pl_module, name) for name in self.private_modules})
        if self.mode == "auto" and (self._terms or getattr(pl_module, "needs_double_backward", False)):
            self.mode = "microbatch"  # a gradient penalty or a batch term: only micro-batches compute them
        if self._terms and self.mode != "microbatch":
            raise ValueError(f"A batch-coupled term ({type(self._terms[0]).__name__}) needs DP-SGD's mode=microbatch "
                             f"(or auto), got mode={self.mode}.")
        if self.mode != "microbatch":
            self._clipper = PerSampleClipper(modules, max_grad_norm=self.max_grad_norm, mode=self.mode)
        self._params = [p for p in modules.parameters() if p.requires_grad]
        self._original_backward = pl_module.backward
        pl_module.backward = self._backward  # the LightningModule.backward hook, for this module only
        if planned < FEW_STEPS and "discriminator" in self.private_modules and not self.steps_done:  # GANs; once a run
            log.warning("DP-SGD will take only %d steps (noise multiplier %.3g, sample rate %.3g): a GAN rarely learns in "
                        "fewer than a few hundred, so expect a poor model. Raise trainer.max_epochs (the noise is "
                        "recalibrated for the budget), or use a tuned experiment: experiment=bias_breast, "
                        "dp_cgan_adult, dp_cgan_cervical or dp_cgan_mnist.", planned, self.noise_multiplier,
                        self.sample_rate)
        log.info("DP-SGD on %s: q = %.4g, σ = %.4g, C = %g, %d planned steps (%d done); %s", self.private_modules,
                 self.sample_rate, self.noise_multiplier, self.max_grad_norm, planned, self.steps_done,
                 self.ledger.summary())

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._clipper is not None:
            self._clipper.detach()
        if hasattr(self, "_original_backward"):
            pl_module.backward = self._original_backward

    # ------------------------------------------------------------------ the private step
    def _backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        if loss.dim() == 0:
            return self._original_backward(loss, *args, **kwargs)
        if loss.dim() != 1:
            raise ValueError(f"A private loss must have shape (B,) (one loss per sample), got {tuple(loss.shape)}.")
        self.private_backward(loss)

    def private_backward(self, per_sample_loss: Tensor) -> None:
        """Add ``(Σ clip(g_i) + N(0, σ²C²)) / L`` to the private parameters' gradients."""
        if self._released_this_batch:
            raise RuntimeError("A second private backward on the same Poisson batch would be a second release of "
                               "the same sample, which the accountant cannot amplify: one private backward per batch.")
        self.ledger.record(self._release(1))  # before any noisy value exists; raises if over budget
        self._released_this_batch = True
        before = [p.grad for p in self._params]
        for p in self._params:
            p.grad = None
        if self._clipper is None:
            microbatch_clipped_sum(per_sample_loss, self._params, max_grad_norm=self.max_grad_norm)
        else:
            try:
                self._clipper.backward(per_sample_loss)  # p.grad = Σ_i c_i g_i; its per-sample norms stay here
            except RuntimeError as err:
                raise RuntimeError(f"{err}. If the private loss needs a double backward (a gradient penalty) or "
                                   "couples parameters across modules, use the DPSGD mechanism's mode=microbatch.") from err
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        for term in self._terms:  # batch-coupled terms: clipped whole, before the noise (batch_terms.py)
            self._add_clipped_term(term, per_sample_loss, grads)
        if self._canaries is not None:
            self._add_canaries(grads)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)  # the global clipped sum, before the noise
            grads = list(torch.split(flat, [g.numel() for g in grads]))
        sq_norm = torch.zeros((), device=grads[0].device if grads else None)
        for p, g, old in zip(self._params, grads, before):
            noisy = mech.gaussian_noise(g.reshape(p.shape), sensitivity=self.sensitivity,
                                        noise_multiplier=self.noise_multiplier, generator=self._noise,
                                        draw_dtype=None) / self._expected_batch
            sq_norm = sq_norm + noisy.detach().square().sum()
            p.grad = noisy if old is None else noisy + old
        self._noisy_norm = sq_norm.sqrt()
        if self._canaries is not None:  # the step's release in the sum convention: Σ clip(g_i) + N(0, σ²Δ²)
            self._canaries.observe(torch.cat([(p.grad if old is None else p.grad - old).detach().reshape(-1)
                                              for p, old in zip(self._params, before)]) * self._expected_batch)

    def _add_clipped_term(self, term: Any, per_sample_loss: Tensor, grads: list[Tensor]) -> None:
        """``grads += clip(L·∇term, C_P)`` over the private parameters (the term's gradient in the sum convention)."""
        value = term(per_sample_loss)
        if value is None or not value.requires_grad:
            return
        parts = torch.autograd.grad(value * self._expected_batch, self._params, allow_unused=True)
        parts = [torch.zeros_like(p) if g is None else g for p, g in zip(self._params, parts)]
        norm = torch.sqrt(sum(g.double().square().sum() for g in parts))
        scale = float(torch.clamp(float(term.max_grad_norm) / (norm + 1e-6), max=1.0))
        for g, part in zip(grads, parts):
            g.add_(part, alpha=scale)

    # ------------------------------------------------------------------ audit hook
    def attach_canaries(self, canaries: Any) -> None:
        """Insert gradient canaries: the white-box one-run audit (Steinke, Nasr and Jagielski, "Privacy Auditing with
        One (1) Training Run", 2023, §7, after Nasr et al. 2023's Dirac canaries), used by ``audits.white_box``.

        From the next private step on, ``canaries.draw()`` returns the per-example gradients of the canaries its
        own Poisson sampling put into this step, shape ``(k, P)`` over the private parameters (flattened in
        ``parameters()`` order), or None; each is clipped to C like a row's gradient and added to the clipped sum
        BEFORE the noise, and ``canaries.observe(release)`` then receives the step's release in the sum convention
        (``Σ clip(g_i) + N(0, σ²Δ²)``, shape ``(P,)``). The canaries receive nothing from the private rows but
        the release itself, and a data-independent vector added before the noise leaves the release's guarantee
        for the real rows unchanged. No config attaches canaries: only a caller of ``train(..., callbacks=...)``
        can. One process only (under DDP every rank would add them).
        """
        self._canaries = canaries

    def _add_canaries(self, grads: list[Tensor]) -> None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise RuntimeError("Gradient canaries are for one process: every DDP rank would add them.")
        extra = self._canaries.draw()
        if extra is None or len(extra) == 0:
            return
        extra = extra.detach().to(device=grads[0].device, dtype=grads[0].dtype)
        norms = extra.norm(dim=1, keepdim=True)
        extra = (extra * torch.clamp(self.max_grad_norm / (norms + 1e-12), max=1.0)).sum(0)  # each clipped to C
        for g, part in zip(grads, torch.split(extra, [g.numel() for g in grads])):
            g.add_(part.reshape(g.shape))

    # ------------------------------------------------------------------ per batch
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._released_this_batch = False
        model = trainer.strategy.model
        if trainer.world_size > 1 and hasattr(model, "no_sync"):
            self._no_sync = model.no_sync()
            self._no_sync.__enter__()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer) -> None:
        if trainer.world_size <= 1 or not dist.is_initialized():
            return
        for group in optimizer.param_groups:  # average what DDP did not: private parts are identical already
            for p in group["params"]:
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= trainer.world_size

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self._no_sync is not None:
            self._no_sync.__exit__(None, None, None)
            self._no_sync = None
        if self._released_this_batch:
            pl_module.log("dp_sgd/noisy_grad_norm", self._noisy_norm, on_step=True)
            pl_module.log("dp_sgd/noise_multiplier", float(self.noise_multiplier), on_step=True)
        if self.ledger.epsilon_if([self._release(1)]) > self.ledger.target_epsilon:
            log.info("DP-SGD: the next step would exceed ε = %g; stopping (%s).", self.ledger.target_epsilon,
                     self.ledger.summary())
            trainer.should_stop = True

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate,
                "max_grad_norm": self.max_grad_norm}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed run keeps its noise multiplier (the ledger, restored separately, keeps the steps)."""
        if state_dict.get("max_grad_norm") != self.max_grad_norm:
            raise ValueError(f"The checkpoint used max_grad_norm={state_dict.get('max_grad_norm')}; resume with the same.")
        self.noise_multiplier = state_dict["noise_multiplier"]

