"""The α-LMDP penalty of PPEM (eq. 18) as a mechanism any energy module can use.

"Privacy-Preserving Energy-Based Generative Models for Marginal Distribution Protection" (Tillman, Balch &
Veloso, TMLR 2023) adds to the marginal energy's loss

    P^α = λ_α · [F⁻¹_{χ²₁}(1 − α) − Ŝ_{l,n}(x′, s_ξ)]₊,   s_ξ = −∇_{x′} E_ξ(x′),

Ŝ_{l,n} the non-negative normalised linear KSD (eq. 17) of the real batch's sensitive columns x′. The penalty
vanishes once the batch-level χ²₁ test rejects "x′ ~ p_ξ" at level α, and grows as rejection weakens.

Why a callback and not a mixin: the penalty is a *mechanism* added to a module's private loss, like DP-SGD,
and must compose with it (under DP-SGD it is a batch-coupled term, clipped whole before the noise; proof in
``privacy/batch_terms.py``). As a callback it is switched on from config, registers the same way with or
without DP, and the module only exposes what is tested: ``sensitive_part(x)`` (x′ of a batch) and
``sensitive_energy(x′)`` (E_ξ, shape (B,)). A mixin would write the penalty into the module's class.

Scale (the paper's Algorithm 1 and its public code disagree by a factor of n): ``scale: per_sample`` adds
P^α/n to each of the n per-sample losses, so the mean loss gets P^α/n (Algorithm 1; effective weight λ_α/n);
``scale: per_batch`` adds P^α once to the mean loss (effective weight λ_α). The score is computed with
``create_graph`` so that the penalty's gradient reaches ξ; the RBF bandwidth (median of the linear pairs'
squared distances) is detached, and the batch is shuffled before pairing (a Poisson batch comes sorted).

Metrics (``ksd/statistic``, ``ksd/penalty``, ``ksd/p_value``, ``ksd/rejected_fraction``) are raw statistics
of real batches. They are logged only in a run that makes no DP claim (``privacy=none``: its ledger says so);
under DP they would be private values outside the mechanism, and are not logged.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from scipy.stats import chi2
from torch import Tensor

from lightning_dp.kernels.stein import ksd_linear_normalized, median_bandwidth
from lightning_dp.privacy.batch_terms import register_batch_term
from lightning_dp.privacy.metrics import declare_metrics

log = logging.getLogger(__name__)

SCALES = ("per_sample", "per_batch")
MIN_ROWS = 4  # two pairs: Ŝ_{l,n} needs B ≥ 2


class KSDPenalty(Callback):
    """λ_α·[χ²₁(1−α) − Ŝ_{l,n}]₊ on a module's ``sensitive_energy`` over its ``sensitive_part`` of each batch.

    Args:
        ledger: the run's ledger (read: does the run make a DP claim?).
        datamodule: the run's data (unused; every mechanism is given it).
        weight: λ_α (10).
        alpha: level α of the batch test (0.05).
        scale: ``per_sample`` (Algorithm 1: P^α/n per sample) or ``per_batch`` (P^α on the mean loss).
        max_grad_norm: C_P, the norm the penalty's gradient is clipped to as a whole under DP-SGD.
        eps: added to Ŝ_{l,n}'s denominator.
    """

    def __init__(self, *, ledger: Any, datamodule: Any = None, weight: float = 10.0, alpha: float = 0.05,
                 scale: str = "per_sample", max_grad_norm: float = 1.0, eps: float = 1e-12) -> None:
        if weight < 0:
            raise ValueError(f"KSDPenalty weight must be >= 0, got {weight}.")
        if not 0 < alpha < 1:
            raise ValueError(f"KSDPenalty alpha must be in (0, 1), got {alpha}.")
        if scale not in SCALES:
            raise ValueError(f"KSDPenalty scale={scale!r}; valid: {', '.join(SCALES)}.")
        if max_grad_norm <= 0:
            raise ValueError(f"KSDPenalty max_grad_norm must be > 0, got {max_grad_norm}.")
        self.ledger, self.weight, self.alpha, self.scale = ledger, float(weight), float(alpha), scale
        self.max_grad_norm, self.eps = float(max_grad_norm), float(eps)
        self.critical = float(chi2.ppf(1 - alpha, df=1))  # 3.8415 at α = 0.05
        self._module: Any = None
        self._x: Tensor | None = None
        self._batches = self._rejected = 0

    public_metrics = {
        "ksd/statistic": "PRIVATE: Ŝ_{l,n} of the real batch; logged only when the run makes no DP claim",
        "ksd/penalty": "PRIVATE: λ_α[c − Ŝ_{l,n}]₊ of the real batch; logged only when the run makes no DP claim",
        "ksd/p_value": "PRIVATE: χ²₁ p-value of the batch test; logged only when the run makes no DP claim",
        "ksd/rejected_fraction": "PRIVATE: share of this epoch's batches whose test rejected; logged only when "
                                 "the run makes no DP claim",
    }

    @property
    def logs_metrics(self) -> bool:
        """Only a run without a DP claim logs the batch statistics (they are raw functions of real rows)."""
        return not self.ledger.dp_claim

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        missing = [a for a in ("sensitive_part", "sensitive_energy") if not callable(getattr(pl_module, a, None))]
        if missing:
            raise ValueError(f"KSDPenalty needs a module with an energy on named columns; {type(pl_module).__name__} "
                             f"has no {', '.join(missing)}.")
        self._module = pl_module
        register_batch_term(pl_module, self)
        if self.logs_metrics:
            declare_metrics(pl_module, self.public_metrics)
        else:
            log.info("KSD penalty: its batch statistics are private under DP and are not logged; the α-LMDP audit "
                     "(python -m audits CKPT ...) tests the trained model.")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._batches = self._rejected = 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._x = pl_module.sensitive_part(batch[0]).detach()

    def statistic(self, x_sensitive: Tensor) -> Tensor:
        """Ŝ_{l,n} of ``x_sensitive`` under the module's energy, differentiable in its parameters."""
        x = x_sensitive[torch.randperm(len(x_sensitive), device=x_sensitive.device)].requires_grad_(True)
        energy = self._module.sensitive_energy(x)
        score = -torch.autograd.grad(energy.sum(), x, create_graph=True)[0]  # s_ξ = −∇E_ξ, (B, d′)
        return ksd_linear_normalized(x, score, bandwidth=median_bandwidth(x, pairs="linear"), eps=self.eps)

    def __call__(self, per_sample_loss: Tensor) -> Tensor | None:
        """The term added to the mean loss of this private backward (None for a batch under 4 rows)."""
        x = self._x
        if x is None or len(x) < MIN_ROWS:
            return None
        with torch.enable_grad():
            stat = self.statistic(x)
            penalty = self.weight * torch.relu(self.critical - stat)
        term = penalty / len(x) if self.scale == "per_sample" else penalty
        if self.logs_metrics:
            value = float(stat.detach())
            self._batches += 1
            self._rejected += value > self.critical
            module = self._module
            module.log("ksd/statistic", value, on_step=True)
            module.log("ksd/penalty", float(penalty.detach()), on_step=True)
            module.log("ksd/p_value", float(chi2.sf(value, df=1)), on_step=True)
            module.log("ksd/rejected_fraction", self._rejected / self._batches, on_step=True, prog_bar=True)
        return term
