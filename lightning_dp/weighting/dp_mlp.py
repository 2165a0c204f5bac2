"""``priv_mlp``: importance weights from an MLP classifier trained with DP-SGD on real ∪ synthetic rows.

Ghalebikesabi et al., "Bias Mitigated Learning from Differentially Private Synthetic Data: A Cautionary
Tale", Sec. 3.4 and Algorithm 1 ("relaxed DP-SGD"): a classifier of real (y = 1) against synthetic (y = 0)
rows is trained on the *union* of the private real rows and the synthetic rows, lots are Poisson samples of
the union at rate q = L/(ñ_D + N_G), every example (synthetic ones too) is clipped to C, and the weights are
read off its logit (Eq. 1, in log space):

    log w(x) = f_θ(x) + log(N_G / ñ_D)            (x a synthetic row; see ``base.py`` for the prior's sign)

Two readings of Algorithm 1's noise line (``noise=``):

* ``"per_lot"`` (default): one N(0, σ²C²I) draw per lot, always. This is standard DP-SGD (Abadi et al.
  2016) on the union data set, run through the project's :class:`~lightning_dp.callbacks.dp_sgd.DPSGD`
  mechanism. It is (ε, δ)-DP under add/remove adjacency: the synthetic rows are the same in both
  neighbours (they are public, a post-processing of the generator), so the union data sets differ in one
  private row, each example's clipped gradient has norm ≤ C, and the Poisson-subsampled Gaussian
  accountant at q = L/(ñ_D + N_G) applies as it does to any DP-SGD run. The only "relaxation" is that q is
  taken over the union.
* ``"per_private_example"``: the paper's line 9 read literally, one N(0, σ²C²I) draw per *private* row in
  the lot (none on all-synthetic lots). It has no standard guarantee (:attr:`DPSGDWeights.nominal_guarantee`
  says why); the run that uses it makes no DP claim.

Hyperparameters. The paper's start configuration (tf_privacy: 1 epoch, batch size 1 with 20 microbatches,
clip 1, noise multiplier 5.2, lr 0.1) is inconsistent (a batch of 1 cannot hold 20 microbatches, and
Sec. 4.1 recommends lr ≈ 0.01 instead), and its widths and optimiser are unspecified. We use per-example
clipping (microbatches of one row, what "20 microbatches" approximates), C = 1, lot size L = 64, 20 epochs
(T = 20·round(1/q) steps), Adam at lr 0.01 (the Sec. 4.1 value), two hidden ReLU layers of width 64, and
calibrate σ for the estimator's own (ε, δ) instead of searching by hand.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dp.data.sampling import PoissonBatchSampler
from lightning_dp.errors import ConfigError
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.clipping import PerSampleClipper
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.weighting.base import (
    PlanInputs,
    WeightEstimator,
    WeightFit,
    prior_log_ratio,
    require_epsilon,
    standalone_noise,
)

log = logging.getLogger(__name__)

NOISE_MODES = ("per_lot", "per_private_example")
OPTIMIZERS = ("adam", "sgd")
RELEASE_NAME = "dp_sgd/classifier"  # what DPSGD(private_modules=["classifier"]) names its steps


class WeightMLP(nn.Module):
    """The real-vs-synthetic classifier: two dense ReLU layers and a linear output, one logit per row.

    No normalisation layer, so per-sample gradients stay per sample (DP-SGD's clipping needs it).
    """

    def __init__(self, num_features: int, *, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(1)  # (B,) logits of p(real | x)


class WeightClassifier(pl.LightningModule):
    """Training logic of the classifier: a per-sample BCE loss, which DPSGD clips and noises.

    The loss has shape (B,), the mark of a private loss for :class:`~lightning_dp.callbacks.dp_sgd.DPSGD`.
    An empty Poisson lot gives an empty loss that still goes through DPSGD, which then releases pure noise:
    skipping the step would make whether a step happened depend on the private rows, and leave the ledger
    with fewer steps than planned.
    """

    def __init__(self, classifier: nn.Module, *, lr: float = 1e-2, optimizer: str = "adam") -> None:
        super().__init__()
        self.classifier, self.lr, self.optimizer_name = classifier, lr, optimizer

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch  # a Poisson lot of real (y = 1) and synthetic (y = 0) rows; may be empty
        return F.binary_cross_entropy_with_logits(self.classifier(x), y, reduction="none")  # (B,)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.optimizer_name, self.classifier.parameters(), lr=self.lr)

    def log(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is logged: the trainer has no logger, and Lightning's logging costs more than a step here."""


def make_optimizer(name: str, params: Any, *, lr: float) -> torch.optim.Optimizer:
    """Adam or plain SGD on ``params``."""
    return torch.optim.Adam(params, lr=lr) if name == "adam" else torch.optim.SGD(params, lr=lr)


class UnionData(pl.LightningDataModule):
    """Real (y = 1) ∪ synthetic (y = 0) rows, Poisson-sampled by the DP-SGD mechanism.

    Args:
        real: (n_D, F) private rows.
        synthetic: (N_G, F) synthetic rows (public: the same in both neighbours).
        batch_size: the expected lot size L.
        released_num_rows: ñ_D + N_G, from the run's DP count ñ_D (never the exact n_D): q = L / it.
    """

    def __init__(self, real: Tensor, synthetic: Tensor, *, batch_size: int, released_num_rows: float) -> None:
        super().__init__()
        self.x = torch.cat([real, synthetic]).float()  # (n_D + N_G, F)
        self.y = torch.cat([torch.ones(len(real)), torch.zeros(len(synthetic))])  # (n_D + N_G,)
        self.batch_size, self.released_num_rows = batch_size, float(released_num_rows)
        self._poisson: dict[str, Any] | None = None

    @property
    def num_rows(self) -> int:
        """The exact number of rows (private: for the sampler only, never for a release)."""
        return len(self.x)

    def use_poisson_sampling(self, *, sample_rate: float, steps_per_epoch: int, rank: int = 0, world_size: int = 1,
                             generator: torch.Generator) -> None:
        """Make ``train_dataloader`` Poisson-sample this rank's shard (set by the DP-SGD mechanism)."""
        self._poisson = {"sample_rate": sample_rate, "steps": steps_per_epoch, "generator": generator,
                         "indices": torch.arange(rank, self.num_rows, world_size)}

    def train_dataloader(self) -> DataLoader:
        if self._poisson is None:
            raise RuntimeError("UnionData is private: it is only read through Poisson lots (use_poisson_sampling).")
        p = self._poisson
        sampler = PoissonBatchSampler(p["indices"], sample_rate=p["sample_rate"], steps=p["steps"],
                                      generator=p["generator"])
        return DataLoader(TensorDataset(self.x, self.y), sampler=sampler, batch_size=None)  # index lists


class DPSGDWeights(WeightEstimator):
    """``priv_mlp``: log weights from a 2-layer ReLU MLP trained with DP-SGD on real ∪ synthetic rows.

    Usage: ``plan(inputs)`` gives one release (``dp_sgd/classifier``, count T); the caller checks it against
    the run's ledger (``epsilon_if``) but does *not* record it; then it sets ``estimator.ledger`` to the
    run's ledger and calls ``fit``: the DPSGD mechanism records the T steps one by one on that ledger, each
    another use of exactly the planned release, before its noise is drawn. With
    ``noise="per_private_example"`` the caller must first waive the run's DP claim
    (``ledger.waive("weights/priv_mlp", estimator.nominal_guarantee)``); ``fit`` refuses otherwise.

    Args:
        epsilon: ε of the weights alone (the paper's ε_w = 3); σ is calibrated so that the T steps spend it
            at the run's δ (the ledger composes it with the generator's spend).
        lot_size: expected lot size L.
        epochs: passes over the union; T = epochs · round(1/q) steps.
        lr: learning rate.
        max_grad_norm: per-example clipping norm C (all examples, synthetic ones too).
        hidden: width of both hidden layers.
        optimizer: ``"adam"`` or ``"sgd"``.
        noise: ``"per_lot"`` (standard DP-SGD, default) or ``"per_private_example"`` (the paper's Algorithm 1
            read literally; no standard guarantee).

    Raises:
        ConfigError: a missing ε, or a setting out of range.
    """

    name = "priv_mlp"
    records_own_releases = True  # the DPSGD mechanism records each step itself (the caller only reserves the plan)

    def __init__(self, *, epsilon: float | None = None, lot_size: int = 64, epochs: int = 20, lr: float = 1e-2,
                 max_grad_norm: float = 1.0, hidden: int = 64, optimizer: str = "adam",
                 noise: str = "per_lot") -> None:
        self.epsilon = require_epsilon(self.name, epsilon)
        if noise not in NOISE_MODES:
            raise ConfigError(f"weights.params.noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}.")
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"weights.params.optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}.")
        for key, value in (("lot_size", lot_size), ("epochs", epochs), ("hidden", hidden)):
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"weights.params.{key} must be an integer >= 1, got {value!r}.")
        for key, value in (("lr", lr), ("max_grad_norm", max_grad_norm)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"weights.params.{key} must be a finite number > 0, got {value!r}.")
        self.lot_size, self.epochs, self.lr = lot_size, epochs, float(lr)
        self.max_grad_norm, self.hidden, self.optimizer, self.noise = float(max_grad_norm), hidden, optimizer, noise
        self.ledger: PrivacyLedger | None = None  # set by the caller to the run's ledger before fit
        self._inputs: PlanInputs | None = None

    @property
    def nominal_guarantee(self) -> str | None:
        """Why the ε of ``noise="per_private_example"`` is nominal only; ``None`` for standard DP-SGD."""
        if self.noise == "per_lot":
            return None
        return ("priv_mlp with noise=per_private_example (the paper's relaxed DP-SGD, Algorithm 1 read literally) "
                "has no standard (ε, δ) guarantee: each lot gets k independent N(0, σ²C²) draws for its k private "
                "rows, so the noise variance differs between neighbouring data sets (kσ²C² vs (k+1)σ²C²), which the "
                "subsampled-Gaussian accountant does not model, and a lot with no private row gets no noise at all "
                "(without the changed row that happens with probability (1−q)^(n−1), with it (1−q)^n, a difference "
                "no noise hides). The ε reported for it is the paper's nominal value; use noise=per_lot for a "
                "guarantee.")

    @property
    def nominal(self) -> bool:
        """True in the mode without a standard guarantee (the caller waives the run's DP claim)."""
        return self.nominal_guarantee is not None

    # ------------------------------------------------------------------ planning
    def check(self, inputs: PlanInputs) -> None:
        if self.noise == "per_lot" and inputs.adjacency != "add_remove":
            raise ConfigError("priv_mlp's DP-SGD is accounted for add/remove adjacency (Poisson-subsampled Gaussian): "
                              "set privacy.adjacency=add_remove.")
        if inputs.num_real <= 0 or inputs.num_synthetic < 1:
            raise ConfigError(f"priv_mlp needs real and synthetic rows, got ñ_D = {inputs.num_real:g} and "
                              f"N_G = {inputs.num_synthetic}.")

    def sample_rate(self, inputs: PlanInputs) -> float:
        """q = L/(ñ_D + N_G), computed exactly as DPSGD computes it from :class:`UnionData`."""
        return min(self.lot_size / float(inputs.num_real + inputs.num_synthetic), 1.0)

    def steps(self, inputs: PlanInputs) -> int:
        """T = epochs · round(1/q)."""
        return self.epochs * max(round(1 / self.sample_rate(inputs)), 1)

    def _release(self, sigma: float, q: float, count: int) -> Release:
        return Release(name=RELEASE_NAME, mechanism="subsampled_gaussian", sensitivity=self.max_grad_norm,
                       noise_multiplier=sigma, sample_rate=q, count=count)

    def plan(self, inputs: PlanInputs) -> list[Release]:
        """One release: T Poisson-subsampled Gaussian steps, σ calibrated for (ε, δ) on its own."""
        self.check(inputs)
        q, steps = self.sample_rate(inputs), self.steps(inputs)
        sigma = standalone_noise(lambda s: [self._release(s, q, steps)], epsilon=self.epsilon, delta=inputs.delta)
        self._inputs = inputs
        return [self._release(sigma, q, steps)]

    # ------------------------------------------------------------------ fitting
    def fit(self, real: Tensor | None, synthetic: Tensor, *, releases: list[Release], generator: torch.Generator,
            model: Any = None) -> WeightFit:
        """Train the classifier with DP-SGD on ``real`` ∪ ``synthetic`` and return the synthetic rows' log weights.

        Raises:
            RuntimeError: ``plan`` was not called, no ledger is set, or (nominal mode) the run still claims DP.
            ValueError: ``releases`` or ``synthetic`` differ from what was planned.
        """
        inputs, planned = self._check_fit(real, synthetic, releases)
        sigma, q, steps = float(planned.noise_multiplier), planned.sample_rate, planned.count
        data = UnionData(real, synthetic, batch_size=self.lot_size,
                         released_num_rows=inputs.num_real + inputs.num_synthetic)
        before = self._steps_on_ledger(planned)
        # the noise comes from the run's privacy generator; the initialisation from a separate draw of it, so that
        # no value the noise is computed from is tied to the initial weights
        init_seed, noise_seed = torch.randint(0, 2**62, (2,), generator=generator).tolist()
        with torch.random.fork_rng(devices=[]):  # the caller's global random state is left as it was
            torch.manual_seed(init_seed)
            net = WeightMLP(synthetic.shape[1], hidden=self.hidden)
            if self.noise == "per_lot":
                self._train_dp_sgd(net, data, sigma=sigma, steps=steps, noise_seed=noise_seed)
            else:
                self._train_per_private_example(net, data, planned, generator=generator)
        taken = self._steps_on_ledger(planned) - before
        if taken != steps:
            log.warning("priv_mlp took %d of its %d planned DP-SGD steps (the run's budget stopped it).", taken, steps)
        with torch.no_grad():
            logits = net(synthetic.float()).double().numpy()  # (N_G,) post-processing of the released θ
        prior = prior_log_ratio(inputs.num_real, len(synthetic))
        info = {"noise": self.noise, "noise_multiplier": sigma, "sample_rate": q, "steps": taken,
                "planned_steps": steps, "lot_size": self.lot_size, "max_grad_norm": self.max_grad_norm,
                "epochs": self.epochs, "hidden": self.hidden, "lr": self.lr, "optimizer": self.optimizer,
                "prior_log_ratio": prior, "num_synthetic": len(synthetic)}
        if self.nominal:
            info["nominal_guarantee"] = self.nominal_guarantee
        return WeightFit(log_w=logits + prior, releases=[replace(planned, count=taken)], private=True, info=info)

    def _check_fit(self, real: Tensor | None, synthetic: Tensor, releases: list[Release]) -> tuple[PlanInputs, Release]:
        if self._inputs is None:
            raise RuntimeError("priv_mlp: call plan(inputs) before fit (it fixes ñ_D, N_G and the noise).")
        if self.ledger is None:
            raise RuntimeError("priv_mlp: set estimator.ledger to the run's ledger before fit; DP-SGD records its "
                               "steps there.")
        if self.nominal and self.ledger.dp_claim:
            raise RuntimeError("priv_mlp with noise=per_private_example has no DP guarantee: waive the run's DP "
                               "claim first (ledger.waive('weights/priv_mlp', estimator.nominal_guarantee)).")
        if real is None or real.dim() != 2 or synthetic.dim() != 2 or real.shape[1] != synthetic.shape[1]:
            raise ValueError("priv_mlp needs real and synthetic feature matrices of the same width.")
        if len(synthetic) != self._inputs.num_synthetic:
            raise ValueError(f"priv_mlp was planned for N_G = {self._inputs.num_synthetic} synthetic rows (q depends "
                             f"on it) but fit got {len(synthetic)}.")
        q, steps = self.sample_rate(self._inputs), self.steps(self._inputs)
        if len(releases) != 1 or not releases[0].same_mechanism(self._release(releases[0].noise_multiplier, q, steps)) \
                or releases[0].count != steps:
            raise ValueError("priv_mlp.fit must get exactly the release its plan returned.")
        return self._inputs, releases[0]

    def _steps_on_ledger(self, planned: Release) -> int:
        assert self.ledger is not None
        return sum(r.count for r in self.ledger.releases if r.same_mechanism(planned))

    def _train_dp_sgd(self, net: WeightMLP, data: UnionData, *, sigma: float, steps: int, noise_seed: int) -> None:
        """Standard DP-SGD through the project's DPSGD mechanism: it records every step it takes."""
        from lightning_dp.callbacks.dp_sgd import DPSGD
        from lightning_dp.callbacks.progress_lines import ProgressLines

        dpsgd = DPSGD(ledger=self.ledger, datamodule=data, max_grad_norm=self.max_grad_norm, noise_multiplier=sigma,
                      private_modules=["classifier"], mode="auto", noise_seed=noise_seed)
        trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[ProgressLines([dpsgd], label="weights (priv_mlp)"), dpsgd])
        trainer.fit(WeightClassifier(net, lr=self.lr, optimizer=self.optimizer), datamodule=data)

    def _train_per_private_example(self, net: WeightMLP, data: UnionData, planned: Release, *,
                                   generator: torch.Generator) -> None:
        """Algorithm 1 read literally: (Σ clip(g_i) + Σ_{private i} N(0, σ²C²)) / L per lot.

        The k independent draws of a lot with k private rows are drawn as one N(0, kσ²C²) (the same law).
        Each step is recorded on the ledger as another use of the planned release (its ε is nominal).
        """
        assert self.ledger is not None
        q, sigma, steps = planned.sample_rate, float(planned.noise_multiplier), planned.count
        expected_lot = q * data.released_num_rows  # L (or ñ_D + N_G when q = 1): the public normaliser
        data.use_poisson_sampling(sample_rate=q, steps_per_epoch=max(round(1 / q), 1),
                                  generator=mech.noise_generator())  # secret sampling randomness
        clipper = PerSampleClipper(net, max_grad_norm=self.max_grad_norm)
        opt = make_optimizer(self.optimizer, net.parameters(), lr=self.lr)
        done = 0
        try:
            while done < steps:
                for x, y in data.train_dataloader():
                    if done == steps:
                        break
                    self.ledger.record(replace(planned, count=1))  # before the noisy step; raises if over budget
                    opt.zero_grad(set_to_none=True)
                    clipper.backward(F.binary_cross_entropy_with_logits(net(x), y, reduction="none"))  # Σ clip(g_i)
                    k = int(y.sum())  # private rows in the lot
                    for p in clipper.params:
                        g = p.grad if p.grad is not None else torch.zeros_like(p)
                        if k:
                            g = mech.gaussian_noise(g, sensitivity=self.max_grad_norm,
                                                    noise_multiplier=sigma * math.sqrt(k), generator=generator)
                        p.grad = g / expected_lot
                    opt.step()
                    done += 1
        finally:
            clipper.detach()
