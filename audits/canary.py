"""Empirical ε lower bounds of our mechanisms from a planted canary (Jagielski et al. 2020, Nasr et al. 2021).

The game, under add/remove adjacency (the ledger's default): a small data set D is fixed and a canary row c
is either added (D ∪ {c}) or not (D). A *trial* runs the mechanism once, with fresh privacy noise from
``seed``, and returns the attacker's score::

    Trial = Callable[[bool, int], float]        # trial(with_canary, seed) -> score

:func:`audit_trials` runs many trials of each kind and converts the scores with
:func:`audits.empirical_dp.audit_mechanism` into a lower bound on ε at δ, valid with probability
``confidence``. A bound above the mechanism's claimed ε means the claim (or the code) is wrong; a bound far
below it says only that this attack at this number of trials cannot tell. Any mechanism plugs in as a trial:
DP-SGD would train on D or D ∪ {c} with noise seed ``seed`` and return e.g. minus the canary's loss.

DP-MERF's one-shot release (:class:`EmbeddingCanary`) is audited on the released statistics themselves (at
small scale the strongest attack): the model config's mechanisms, i.e. the real ``SanitizedEmbedding``
callback as ``train()`` instantiates it, release the class-wise feature sums ``S̃ = S + N(0, σ²Δ_S²)`` and
counts ``ñ = n + N(0, σ²Δ_n²)``. The attacker knows D (as the DP game allows) and computes its exact
statistics under the released feature map, then scores the residual along the canary's feature vector
``h = h(c)`` in its class ``y``::

    score = ⟨S̃_y − S_y(D), h⟩ / Δ_S² + (ñ_y − n_y(D)) / Δ_n²

With ``‖h‖ = Δ_S`` (every DP-MERF row has the same feature norm) the score is N(0, 2σ²) without the canary
and N(2, 2σ²) with it: the Neyman–Pearson statistic of the two Gaussian releases together (μ = √2/σ).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from audits.empirical_dp import EmpiricalDPResult, audit_mechanism

log = logging.getLogger(__name__)

Trial = Callable[[bool, int], float]


def audit_trials(
    trial: Trial,
    *,
    trials: int,
    delta: float,
    confidence: float = 0.95,
    seed: int = 0,
    torch_threads: int | None = 1,
) -> EmpiricalDPResult:
    """ε lower bound of the mechanism behind ``trial`` from ``trials`` runs with and ``trials`` without the canary.

    Args:
        trial: ``trial(with_canary, seed) -> score`` (higher = canary more likely present, or lower: the
            rule's direction is chosen on the first half of the trials).
        trials: runs per side (>= 4); half choose the threshold, half evaluate it.
        delta: the δ of the mechanism's (ε, δ) claim.
        confidence: confidence of the Clopper–Pearson bound.
        seed: base seed (run i with the canary gets ``seed + i``, without ``seed + trials + i``).
        torch_threads: torch's intra-op threads during the trials, restored afterwards (tiny trials run
            several times faster on one thread than on a busy pool); None leaves it alone.

    Returns:
        The :class:`~audits.empirical_dp.EmpiricalDPResult`.
    """
    before = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        return audit_mechanism(
            lambda s: trial(True, s),
            lambda s: trial(False, s),
            trials=trials,
            delta=delta,
            confidence=confidence,
            seed=seed,
        )
    finally:
        torch.set_num_threads(before)


class _Rows:
    """The ``private_batches`` view of fixed model-space rows (what the callback reads from a data module)."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def private_batches(
        self, *, chunk_size: int = 4096, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[Tensor, Tensor]]:
        idx = torch.arange(rank, len(self.x), world_size)
        for start in range(0, len(idx), chunk_size):
            part = idx[start : start + chunk_size]
            yield self.x[part], self.y[part]


_ONE_PROCESS = SimpleNamespace(global_rank=0, world_size=1)  # what the callback reads from a Trainer


class EmbeddingCanary:
    """A :data:`Trial` of DP-MERF's (or PEARL's) one-shot sanitized embedding on D or D ∪ {canary}.

    Args:
        model_cfg: the ``model`` config group (``name``, ``module``, ``generator``, ``mechanisms``), e.g.
            ``compose("train").model``; its mechanisms are instantiated exactly as ``train()`` does.
        layout: the data layout (``n_continuous``, ``block_sizes``, ``num_classes``).
        x: D in model space, shape (n, d); y: its labels, shape (n,).
        canary: the canary row in model space, shape (d,), and its label.
        epsilon, delta: the run's (ε, δ) target; the ledger calibrates the noise to it. A huge ε gives a tiny
            noise multiplier: the same mechanism with the noise switched off.
        accountant: the ledger's accountant.

    Raises:
        ValueError: shapes that do not match the layout.
    """

    def __init__(
        self,
        *,
        model_cfg: Mapping[str, Any],
        layout: dict[str, Any],
        x: Tensor,
        y: Tensor,
        canary: tuple[Tensor, int],
        epsilon: float,
        delta: float,
        accountant: str = "rdp",
    ) -> None:
        width = layout["n_continuous"] + sum(layout.get("block_sizes", []))
        canary_x, canary_y = canary
        if x.ndim != 2 or x.shape[1] != width or canary_x.shape != (width,) or len(y) != len(x):
            raise ValueError(
                f"x must be (n, {width}) with n labels and the canary ({width},) for this layout; got "
                f"x {tuple(x.shape)}, y {tuple(y.shape)}, canary {tuple(canary_x.shape)}."
            )
        if not 0 <= int(canary_y) < layout["num_classes"]:
            raise ValueError(f"canary label {canary_y} is not in [0, {layout['num_classes']}).")
        self.model_cfg, self.layout = model_cfg, layout
        self.x, self.y = x.float(), y.long()
        self.canary_x, self.canary_y = canary_x.float(), int(canary_y)
        self.epsilon, self.delta, self.accountant = epsilon, delta, accountant
        self.noise_multiplier: float | None = None  # of the embedding release in the last trial

    def release(self, with_canary: bool, seed: int) -> tuple[Any, dict[str, Tensor], Any]:
        """Run the mechanisms once: ``(module, {"sums", "counts"} as released, ledger)``."""
        from hydra.utils import instantiate

        from lightning_dp.models import build_model
        from lightning_dp.privacy.ledger import PrivacyLedger

        x, y = self.x, self.y
        if with_canary:
            x, y = torch.cat([x, self.canary_x[None]]), torch.cat([y, torch.tensor([self.canary_y])])
        ledger = PrivacyLedger(target_epsilon=self.epsilon, delta=self.delta, accountant=self.accountant)
        module = build_model(self.model_cfg, self.layout)
        released: dict[str, Tensor] = {}
        set_release = module.set_release

        def capture(sums: Tensor, counts: Tensor) -> None:
            # the noisy values as released, before the module post-processes them into targets
            released.update(sums=sums.detach().double().cpu(), counts=counts.detach().double().cpu())
            set_release(sums, counts)

        module.set_release = capture
        for spec in self.model_cfg["mechanisms"]:
            instantiate(spec, ledger=ledger, datamodule=_Rows(x, y), noise_seed=seed).on_fit_start(
                _ONE_PROCESS, module
            )
        if not released:
            raise ValueError(
                f"Model {self.model_cfg['name']!r} released no embedding: EmbeddingCanary audits "
                "one-shot sanitized embeddings (dp_merf, pearl)."
            )
        return module, released, ledger

    def __call__(self, with_canary: bool, seed: int) -> float:
        """One trial: the attack score of one release (see the module docstring)."""
        from lightning_dp.privacy.sensitivity import count_sensitivity, embedding_sum_sensitivity
        from lightning_dp.privacy.statistics import class_feature_sums

        module, released, ledger = self.release(with_canary, seed)
        name = module.embedding_name
        self.noise_multiplier = next(r.noise_multiplier for r in ledger.releases if r.name == name)
        with torch.no_grad():  # the attacker's knowledge: D's exact statistics under the released feature map
            sums_d, counts_d = class_feature_sums(
                _Rows(self.x, self.y).private_batches(), module.features, module.num_classes
            )
            h = module.features(self.canary_x[None])[0].double()  # (D',)
        d_sum = embedding_sum_sensitivity(feature_norm=module.feature_norm_bound, adjacency=ledger.adjacency)
        d_count = count_sensitivity(adjacency=ledger.adjacency)
        c = self.canary_y
        residual = released["sums"][c] - sums_d[c].cpu()  # (D',)
        return float(residual @ h / d_sum**2 + (released["counts"][c] - counts_d[c].cpu()) / d_count**2)


def full_batch_dp_sgd(ledger: Any, *, rows: int, steps: int, **kwargs: Any) -> tuple[Any, SimpleNamespace]:
    """The real ``DPSGD`` callback over ``rows`` rows sampled at q = 1 (every row in every batch, on both sides of
    the game), and the trainer stub it reads in ``on_fit_start`` for ``steps`` planned steps.

    Args:
        ledger: the trial's ledger.
        rows: N = L, the same with and without the canary.
        steps: planned private steps (for the calibration of σ).
        **kwargs: ``DPSGD``'s own arguments (``max_grad_norm``, ``noise_multiplier``, ``noise_seed``, ...).
    """
    from lightning_dp.callbacks.dp_sgd import DPSGD

    data = SimpleNamespace(released_num_rows=rows, batch_size=rows, use_poisson_sampling=lambda **_: None)
    stub = SimpleNamespace(max_steps=steps, max_epochs=1, world_size=1, global_rank=0, accumulate_grad_batches=1,
                           strategy=None, _accelerator_connector=SimpleNamespace(use_distributed_sampler=False))
    return DPSGD(ledger=ledger, datamodule=data, **kwargs), stub


class SGDCanary:
    """DP-SGD (the real ``DPSGD`` callback) audited on its released noisy gradients.

    A small per-sample-loss model is fixed (public initialisation); each trial runs ``steps`` private
    backwards of the callback on D or D ∪ {c} with the model held still, so every step releases
    ``Σ_i clip(∇ℓ_i) + N(0, σ²C²)``. The attacker knows D and the model, removes D's exact clipped sum,
    and projects the residual on the direction ``u`` of the canary's clipped gradient::

        score = Σ_t ⟨L·g̃_t − S_D, u⟩ / C

    With the canary's gradient norm ≥ C the score is N(T, Tσ²) with it and N(0, Tσ²) without, the
    Neyman–Pearson statistic of the T composed releases. Sampling is full-batch (q = 1): the audit then
    tests clipping, noise and accounting without relying on the secrecy of the sampling.

    Args:
        rows: D in model space, (n, d).
        canary: the planted row, (d,).
        epsilon, delta: the claim; σ is calibrated by the callback for ``steps`` steps.
        steps: private steps per trial.
        max_grad_norm: C.
    """

    def __init__(
        self,
        rows: Tensor,
        canary: Tensor,
        *,
        epsilon: float,
        delta: float,
        steps: int = 4,
        max_grad_norm: float = 1.0,
    ) -> None:
        from torch import nn

        self.rows, self.canary = rows.float(), canary.float().reshape(1, -1)
        self.epsilon, self.delta, self.steps, self.max_grad_norm = epsilon, delta, steps, max_grad_norm
        torch.manual_seed(0)  # public initialisation, the same in every trial
        self.net = nn.Sequential(nn.Linear(rows.shape[1], 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 1))
        self._init = {k: v.clone() for k, v in self.net.state_dict().items()}
        self.clean_sum = self._clipped_sum(self.rows)
        canary_grad = self._clipped_sum(self.canary)
        self.direction = canary_grad / canary_grad.norm()  # u, unit vector (P,)
        self.noise_multiplier: float | None = None

    def _per_sample_loss(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(1).square()  # (B,)

    def _clipped_sum(self, x: Tensor) -> Tensor:
        from lightning_dp.privacy.microbatch import microbatch_clipped_sum

        params = list(self.net.parameters())
        microbatch_clipped_sum(self._per_sample_loss(x), params, max_grad_norm=self.max_grad_norm)
        out = torch.cat([p.grad.reshape(-1) for p in params]).detach().clone()
        for p in params:
            p.grad = None
        return out

    def __call__(self, with_canary: bool, seed: int) -> float:
        from pytorch_lightning import LightningModule

        from lightning_dp.privacy.ledger import PrivacyLedger

        self.net.load_state_dict(self._init)
        module = LightningModule()
        module.discriminator = self.net
        data = torch.cat([self.rows, self.canary]) if with_canary else self.rows
        n = len(self.rows) + 1  # the same q = L/N = 1 on both sides: every row is in every batch
        mech, stub = full_batch_dp_sgd(PrivacyLedger(target_epsilon=self.epsilon, delta=self.delta), rows=n,
                                       steps=self.steps, max_grad_norm=self.max_grad_norm, noise_seed=seed)
        mech.on_fit_start(stub, module)
        self.noise_multiplier = mech.noise_multiplier
        score = 0.0
        for _ in range(self.steps):
            mech._released_this_batch = False
            for p in self.net.parameters():
                p.grad = None
            module.backward(self._per_sample_loss(data))
            released = torch.cat([p.grad.reshape(-1) for p in self.net.parameters()]) * n  # L·g̃_t
            score += float((released - self.clean_sum) @ self.direction) / self.max_grad_norm
        mech.on_fit_end(stub, module)
        return score


class PPEMCanary:
    """PPEM under DP-SGD (the real ``PPEM`` module, ``KSDPenalty`` and ``DPSGD``), audited on its released gradients.

    Each trial takes ``steps`` private steps of both energies on D or D ∪ {c} (full batches, the model held
    still), with the KSD penalty as a batch-coupled term, so every step releases
    ``f(T) + N(0, σ²Δ²)``, f(T) = Σ_i clip_C(∇ℓ_i) + clip_{C_P}(L·∇P(T)) and Δ = C + 2·C_P. The public
    randomness (generated rows, interpolation weights, the penalty's pairing) is seeded per step and known to
    the attacker, who also knows D and the model: it computes both noiseless releases f(D) and f(D ∪ {c}) and
    projects the residual on their difference, the Neyman–Pearson statistic of the T releases::

        score = Σ_t ⟨L·g̃_t − f_t(D), u_t⟩,   u_t = (f_t(D ∪ {c}) − f_t(D)) / ‖f_t(D ∪ {c}) − f_t(D)‖.

    The audit tests what the proof in ``privacy/batch_terms.py`` claims: however the canary moves the penalty
    through every pair and the normalisation, the release moves by at most Δ.

    Args:
        rows: D in model space, (n, d); ``labels`` (n,).
        canary: the planted row (d,) and its label.
        layout: PPEM's layout (``n_continuous``, ``block_sizes``, ``num_classes``, ``continuous_names``), the
            ``sensitive`` names and any other PPEM argument (``marginal_objective``, ``dequantise``, ...).
        epsilon, delta: the claim; σ is calibrated by the callback for ``steps`` steps.
        steps: private steps per trial.
        max_grad_norm, penalty_norm: C and C_P.
        penalty_weight: λ_α (large, so that the penalty's gradient reaches C_P).
    """

    def __init__(self, rows: Tensor, labels: Tensor, canary: tuple[Tensor, int], *, layout: Mapping[str, Any],
                 epsilon: float, delta: float, steps: int = 3, max_grad_norm: float = 1.0,
                 penalty_norm: float = 0.5, penalty_weight: float = 1e3) -> None:
        from lightning_dp.models.ppem import PPEM

        self.rows, self.labels = rows.float(), labels.long()
        self.canary = (canary[0].float().reshape(1, -1), torch.tensor([int(canary[1])]))
        self.epsilon, self.delta, self.steps = epsilon, delta, steps
        self.max_grad_norm, self.penalty_norm, self.penalty_weight = max_grad_norm, penalty_norm, penalty_weight
        torch.manual_seed(0)  # public initialisation, the same in every trial
        self.module = PPEM(**layout, hidden=[16, 16], latent_dim=8)
        self._init = {k: v.clone() for k, v in self.module.state_dict().items()}
        self.noise_multiplier: float | None = None
        with_c = self._data(True)
        self.clean = [self._releases(self._data(False), noise_multiplier=1e-12, seed=0),
                      self._releases(with_c, noise_multiplier=1e-12, seed=0)]
        self.directions = [(b - a) / (b - a).norm() for a, b in zip(*self.clean)]

    def _data(self, with_canary: bool) -> tuple[Tensor, Tensor]:
        if not with_canary:
            return self.rows, self.labels
        return torch.cat([self.rows, self.canary[0]]), torch.cat([self.labels, self.canary[1]])

    def _releases(self, data: tuple[Tensor, Tensor], *, noise_multiplier: float | None, seed: int) -> list[Tensor]:
        """L·g̃_t of each step on ``data`` (``noise_multiplier=None``: calibrated to the claim)."""
        from lightning_dp.callbacks.ksd_penalty import KSDPenalty
        from lightning_dp.privacy.ledger import PrivacyLedger

        module = self.module
        module.load_state_dict(self._init)
        for name in list(vars(module)):  # a fresh module state: no terms or hooks of an earlier trial
            if name in ("_batch_terms", "backward", "_declared_metrics"):
                delattr(module, name)
        n = len(self.rows) + 1  # the same q = L/N = 1 on both sides: every row is in every batch
        epsilon = self.epsilon if noise_multiplier is None else 1e30
        ledger = PrivacyLedger(target_epsilon=epsilon, delta=self.delta)
        ksd = KSDPenalty(ledger=ledger, weight=self.penalty_weight, scale="per_batch", max_grad_norm=self.penalty_norm)
        mech, stub = full_batch_dp_sgd(ledger, rows=n, steps=self.steps, max_grad_norm=self.max_grad_norm,
                                       noise_multiplier=noise_multiplier, noise_seed=seed,
                                       private_modules=["energy", "conditional_energy"])
        ksd.setup(stub, module, "fit")
        mech.on_fit_start(stub, module)
        if noise_multiplier is None:
            self.noise_multiplier = mech.noise_multiplier
        params = [p for name in ("energy", "conditional_energy") for p in getattr(module, name).parameters()]
        out = []
        for t in range(self.steps):
            torch.manual_seed(10_000 + t)  # the step's public randomness, the same on both sides
            ksd.on_train_batch_start(stub, module, data, t)
            mech._released_this_batch = False
            for p in module.parameters():
                p.grad = None
            module.backward(module.energy_loss(*data))
            out.append(torch.cat([p.grad.reshape(-1) for p in params]).detach() * n)
        mech.on_fit_end(stub, module)
        return out

    def __call__(self, with_canary: bool, seed: int) -> float:
        released = self._releases(self._data(with_canary), noise_multiplier=None, seed=seed)
        return sum(float((r - c) @ u) for r, c, u in zip(released, self.clean[0], self.directions))


class IWGMMNCanary:
    """The DP importance-weighted GMMN (``model=iw_gmmn``, ``standardize=none``, ``privacy=dp_sgd``) audited on
    its released generator gradients.

    The generator reads private rows directly through MMD² ("Distribution Distance Measures in Generative and
    Privacy Models", Diesendruck 2019, Eq. 3.3); its θ-gradient is a public within-generated term plus the mean
    of per-row terms ℓ_i = −(2/m) w_i Σ_j k(x_i, G(z_j)), which DP-SGD clips (``models/iw_mmd_gan.py``). Each trial
    runs ``steps`` calls of the real ``IWMMDGenerator.training_step`` under the real ``DPSGD`` callback (its
    micro-batch engine, full batches, the model held still) on D or D ∪ {c}, so every step releases
    ``L·g̃_t = Σ_i clip_C(∇ℓ_i) + N(0, σ²C²) + L·∇(public term)``. The generated batch (z of step t) is seeded
    and public; the attacker knows D, the weights and the model, computes the noiseless releases f_t(D) and
    f_t(D ∪ {c}) and projects the residual on their difference, as :class:`PPEMCanary`::

        score = Σ_t ⟨L·g̃_t − f_t(D), u_t⟩,   u_t = (f_t(D ∪ {c}) − f_t(D)) / ‖f_t(D ∪ {c}) − f_t(D)‖.

    Give the canary a large weight (``weights``) to test that a weight cannot raise the sensitivity: the
    canary's gradient is clipped like any other row's, so the release still moves by at most C.

    Args:
        rows: D as whole model-space rows in [0, 1]^d (the label, if any, one-hot inside), (n, d).
        canary: the planted row, (d,).
        weights: the known weights w(x) of a batch of rows, (B, d) → (B,) (the role of ``model.weights``);
            None is w ≡ 1.
        estimator: ``iw`` or ``standard`` (the estimators the DP variant allows).
        epsilon, delta: the claim; σ is calibrated by the callback for ``steps`` steps.
        steps: private steps per trial.
        max_grad_norm: C.
        batch_size: generated rows m per step.

    Raises:
        ValueError: an estimator the DP variant refuses, or rows and canary of different widths.
    """

    def __init__(self, rows: Tensor, canary: Tensor, *, weights: Callable[[Tensor], Tensor] | None = None,
                 estimator: str = "iw", epsilon: float, delta: float, steps: int = 2, max_grad_norm: float = 1.0,
                 batch_size: int = 16) -> None:
        from lightning_dp.models.iw_mmd_gan import PER_SAMPLE, IWMMDGenerator
        from lightning_dp.nets.mmd_nets import ResidualELUGenerator

        if estimator not in PER_SAMPLE:
            raise ValueError(f"estimator={estimator!r}: the DP iw_gmmn allows {', '.join(PER_SAMPLE)} only.")
        if rows.ndim != 2 or canary.shape != (rows.shape[1],):
            raise ValueError(f"rows must be (n, d) and the canary (d,); got {tuple(rows.shape)} and "
                             f"{tuple(canary.shape)}.")
        self.rows, self.canary = rows.float(), canary.float().reshape(1, -1)
        self.weights, self.epsilon, self.delta = weights, epsilon, delta
        self.steps, self.max_grad_norm = steps, max_grad_norm
        d = rows.shape[1]
        torch.manual_seed(0)  # public initialisation, the same in every trial
        generator = ResidualELUGenerator(n_continuous=d, latent_dim=10, width=10, blocks=2)  # model=iw_gmmn's
        self.module = IWMMDGenerator(generator, n_continuous=d, estimator=estimator, standardize="none",
                                     batch_size=batch_size)
        self._init = {k: v.clone() for k, v in self.module.state_dict().items()}
        self.noise_multiplier: float | None = None
        self.clean = [self._releases(False, noise_multiplier=1e-12, seed=0),
                      self._releases(True, noise_multiplier=1e-12, seed=0)]
        self.directions = [(b - a) / (b - a).norm() for a, b in zip(*self.clean)]

    def _releases(self, with_canary: bool, *, noise_multiplier: float | None, seed: int) -> list[Tensor]:
        """L·g̃_t of each step on D or D ∪ {c} (``noise_multiplier=None``: calibrated to the claim)."""
        from lightning_dp.privacy.ledger import PrivacyLedger

        module = self.module
        module.load_state_dict(self._init)
        x = torch.cat([self.rows, self.canary]) if with_canary else self.rows
        y = torch.zeros(len(x), dtype=torch.long)
        n = len(self.rows) + 1  # the same q = L/N = 1 on both sides: every row is in every batch
        ledger = PrivacyLedger(target_epsilon=self.epsilon if noise_multiplier is None else 1e30, delta=self.delta)
        mech, stub = full_batch_dp_sgd(ledger, rows=n, steps=self.steps, max_grad_norm=self.max_grad_norm,
                                       noise_multiplier=noise_multiplier, noise_seed=seed, private_modules=["generator"])
        mech.on_fit_start(stub, module)
        if mech.mode != "microbatch":  # what IWMMDGenerator.on_fit_start insists on
            raise RuntimeError(f"DP-SGD chose mode={mech.mode}; the generator's per-row losses need microbatch.")
        if noise_multiplier is None:
            self.noise_multiplier = mech.noise_multiplier
        params = list(module.generator.parameters())
        # what the trainer supplies to training_step: its optimizer (held still: no step) and manual_backward
        module.optimizers = lambda: SimpleNamespace(zero_grad=lambda: [setattr(p, "grad", None) for p in params],
                                                    step=lambda: None)
        module.manual_backward = lambda loss, *args, **kwargs: module.backward(loss, *args, **kwargs)
        module._known_weights = None if self.weights is None else (lambda rows, _y: self.weights(rows))
        out = []
        for t in range(self.steps):
            torch.manual_seed(10_000 + t)  # the step's generated batch, public and the same on both sides
            mech._released_this_batch = False
            module.training_step((x, y), t)
            out.append(torch.cat([p.grad.reshape(-1) for p in params]).detach() * n)
        mech.on_fit_end(stub, module)
        return out

    def __call__(self, with_canary: bool, seed: int) -> float:
        """One trial: the attack score of ``steps`` releases (see the class docstring)."""
        released = self._releases(with_canary, noise_multiplier=None, seed=seed)
        return sum(float((r - c) @ u) for r, c, u in zip(released, self.clean[0], self.directions))
