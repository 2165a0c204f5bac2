"""White-box attacks of the one-run privacy audit (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
Training Run", 2023): canary scores computed from what a run releases, not from its synthetic rows.

The bound of :func:`audits.one_run.audit_scores` holds for ANY score computed from the run's output and from
what does not depend on the inclusion bits (their Theorem 3.1: the non-canary rows are fixed, so an auditor may
know them, as in every DP game). The stronger the score, the closer the bound comes to the claimed ε; a score
that sees only synthetic rows (the black-box attack) can have no power at all, even with the noise off.

* **Embedding (DP-MERF)**: the checkpoint holds the released class-wise target ``T_c = S̃_c / ñ_c`` with
  ``S̃_c = S_c(D) + Σ_{j ∈ c, s_j = 1} h(c_j) + N(0, σ²Δ²)`` (DP-MERF, Harder et al. 2021, eq. 12-13). Knowing D
  (the rows without canaries) and the public feature map h, the auditor removes ``S_c(D)``'s direction and solves
  the rest, ``T_c ≈ α Σ_j s_j h(c_j)``, by least squares over the D' feature coordinates
  (:func:`embedding_scores`); the estimate of ``s_j`` is canary j's score (exact when the noise is off and the
  canaries' features are independent: canaries spread uniformly over the public domain are far apart against
  the kernel's bandwidth, so their random features are nearly orthogonal, as long as there are fewer canaries
  per class than D'). With the noise on, the estimate carries the release's noise.
* **Gradient canaries (DP-SGD)**: the white-box audit of DP-SGD in their §7 with Nasr et al.'s ("Tight Auditing of
  Differentially Private Machine Learning", 2023) Dirac canaries: canary j is an example whose gradient is
  ``C·e_{k_j}`` (one coordinate k_j of the private parameters, magnitude C = the clipping norm), Poisson-sampled
  into each step at DP-SGD's rate q when included. DP-SGD's :meth:`~lightning_dp.callbacks.dp_sgd.DPSGD.attach_canaries`
  adds the sampled canaries to the clipped sum before the noise; the auditor sees every step's release (the
  white-box threat model: all intermediate iterates). Their score ``Σ_t release_t[k_j] / C`` is about ``q·T``
  larger when included, but the real rows' gradients in the same coordinate swamp it; an included canary adds
  exactly C in each of the few steps that sample it, so the score used is the spike likelihood ratio of the
  detrended per-step series (:func:`spike_scores`; :meth:`DiracCanaries.attack_scores`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import Tensor

log = logging.getLogger(__name__)

RCOND = 1e-2  # relative cut-off of the embedding attack's least squares (embedding_scores)
SPIKE_WINDOW = 11  # steps of the running median that detrends a gradient canary's coordinate (spike_scores)
SPARSE_RATE = 0.1  # at most this sample rate, gradient canaries are scored by their spikes (else by their sum)


# ------------------------------------------------------------------------------------------ DP-MERF embedding
def embedding_scores(
    target: np.ndarray, base_sums: np.ndarray, canary_features: np.ndarray, canary_labels: np.ndarray
) -> np.ndarray:
    """Each canary's estimated inclusion bit from a released class-wise mean embedding.

    Per class c, the release is ``T_c = (S_c(D) + H_c s + noise) / ñ_c`` with ``H_c`` (D', m_c) the canaries'
    features and ``s`` their bits. Projecting out the direction ``u`` of ``S_c(D)`` (``P = I − u uᵀ``) leaves
    ``P T_c = α (P H_c s + P noise)`` with the unknown normaliser ``α = 1/ñ_c`` (the count is released with
    noise), solved for ``β ≈ α s`` by least squares; then ``α̂ = (⟨T_c, u⟩ − ⟨u, H_c β⟩) / ‖S_c(D)‖`` and the score
    is ``β / α̂`` (= s exactly when the noise is off and ``P H_c`` has full column rank).

    Args:
        target: released targets ``T = S̃ / ñ``, shape (C, D').
        base_sums: exact class-wise feature sums of the rows without canaries, (C, D').
        canary_features: ``h(c_j)``, shape (m, D').
        canary_labels: class of each canary, (m,).

    Singular values below ``RCOND`` times the largest are dropped (minimum-norm solution): with many canaries per
    class or a low-dimensional feature map, tiny singular values would otherwise multiply the release's noise.

    Returns:
        Scores, shape (m,) (higher = guessed "in").
    """
    target, base_sums = np.asarray(target, float), np.asarray(base_sums, float)
    feats, labels = np.asarray(canary_features, float), np.asarray(canary_labels)
    if target.shape != base_sums.shape or feats.ndim != 2 or feats.shape[1] != target.shape[1]:
        raise ValueError(f"shapes do not match: target {target.shape}, base sums {base_sums.shape}, canary "
                         f"features {feats.shape}.")
    scores = np.zeros(len(feats))
    for c in range(len(target)):
        mine = np.flatnonzero(labels == c)
        norm2 = float(base_sums[c] @ base_sums[c])
        if not len(mine):
            continue
        u = base_sums[c] / np.sqrt(norm2) if norm2 > 0 else np.zeros_like(base_sums[c])
        design = feats[mine].T - np.outer(u, u @ feats[mine].T)  # P H_c, (D', m_c)
        rhs = target[c] - u * (u @ target[c])  # P T_c
        beta = np.linalg.lstsq(design, rhs, rcond=RCOND)[0]  # ≈ α s
        if norm2 > 0:  # ⟨T_c, u⟩ = α (‖S_c(D)‖ + ⟨u, H_c s⟩ + ⟨u, noise⟩)
            alpha = (float(target[c] @ u) - float(u @ (feats[mine].T @ beta))) / np.sqrt(norm2)
        else:  # no base row in this class: the scale is immaterial within the class
            alpha = 1.0
        scores[mine] = beta / (alpha if abs(alpha) > 1e-300 else 1e-300)
    return scores


def dp_merf_embedding_scores(checkpoint: str, base_rows: Any, canaries: Any, schema: Any) -> np.ndarray:
    """:func:`embedding_scores` of a DP-MERF run: its released target and feature map from ``checkpoint`` (loaded
    safely, :func:`lightning_dp.checkpoint.load_run`), ``base_rows`` (the training rows without canaries) and the
    ``canaries``, both read as the run read them (validated against ``schema``, rows of categories the run did not
    release dropped, encoded with the run's released schema). A canary the run could not have kept gets the
    median score (it is then rarely guessed; the bound stays valid).

    Raises:
        ValueError: the checkpoint's model releases no DP-MERF embedding.
    """
    from lightning_dp.checkpoint import load_run
    from lightning_dp.data.encoders import TabularEncoder
    from lightning_dp.data.schema import validate
    from lightning_dp.privacy.statistics import class_feature_sums

    run = load_run(checkpoint)
    model = run.model
    if getattr(model, "embedding_name", None) != "dp_merf/embedding" or not bool(model.released):
        raise ValueError("the white-box embedding attack reads a released DP-MERF embedding; this checkpoint has "
                         "none (use model=dp_merf).")
    encoder = TabularEncoder.from_state_dict(run.data_state)
    base = validate(base_rows, schema, source="the one-run audit's training rows")
    x_d, y_d = encoder.transform(base[encoder.keep_mask(base)].reset_index(drop=True))
    rows = validate(canaries, schema, source="the one-run audit's canaries")
    kept = encoder.keep_mask(rows)
    x_c, y_c = encoder.transform(rows[kept].reset_index(drop=True))
    with torch.no_grad():
        chunks = ((x_d[i : i + 4096].float(), y_d[i : i + 4096].long()) for i in range(0, len(x_d), 4096))
        sums, _ = class_feature_sums(chunks, model.features, model.num_classes)
        feats = model.features(x_c.float())
    scores = np.empty(len(rows))
    scores[kept] = embedding_scores(model.target.double().numpy(), sums.double().numpy(), feats.double().numpy(),
                                    y_c.numpy())
    scores[~kept] = np.median(scores[kept]) if kept.any() else 0.0
    return scores


# ------------------------------------------------------------------------------------------ DP-SGD Dirac canaries
class DiracCanaries:
    """m Dirac gradient canaries (Nasr et al. 2023; Steinke et al. 2023 §7) and their white-box scores.

    Canary j has gradient ``C·e_{k_j}``; an included canary is Poisson-sampled into each private step with
    probability q (DP-SGD's sample rate, so that it is an example like any other), by a generator of its own
    that the scores never read. :meth:`observe` adds each step's release at the canaries' coordinates, divided
    by C: ``scores[j] = Σ_t release_t[k_j] / C``.

    Args:
        coordinates: k_j, distinct flat indices into the private parameters, (m,).
        included: the inclusion bits S_j, (m,).
        size: P, the number of private parameters.
        sample_rate: q.
        max_grad_norm: C (the canary's gradient norm; DP-SGD clips it to C, i.e. not at all).
        seed: seed of the canaries' sampling.
    """

    def __init__(self, coordinates: np.ndarray, included: np.ndarray, *, size: int, sample_rate: float,
                 max_grad_norm: float, seed: int = 0) -> None:
        coordinates, included = np.asarray(coordinates, np.int64), np.asarray(included, bool)
        if coordinates.shape != included.shape or len(np.unique(coordinates)) != len(coordinates):
            raise ValueError("coordinates must be distinct, one per canary (as many as the inclusion bits).")
        if len(coordinates) and not 0 <= coordinates.min() <= coordinates.max() < size:
            raise ValueError(f"coordinates must lie in [0, {size}).")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}.")
        self.coordinates, self.included, self.size = coordinates, included, int(size)
        self.sample_rate, self.max_grad_norm = float(sample_rate), float(max_grad_norm)
        self.scores = np.zeros(len(coordinates))
        # per step, the release at the canaries' coordinates / C (float32): kept only where the spike scores read it
        self.history: list[np.ndarray] = []
        self.steps = 0
        self.sampled = 0  # canary examples put into steps, over the run
        self._rng = np.random.default_rng(seed)

    def draw(self) -> Tensor | None:
        """This step's sampled included canaries' gradients, (k, P), or None."""
        pick = self.coordinates[self.included & (self._rng.random(len(self.coordinates)) < self.sample_rate)]
        self.sampled += len(pick)
        if not len(pick):
            return None
        out = torch.zeros(len(pick), self.size)
        out[torch.arange(len(pick)), torch.as_tensor(pick)] = self.max_grad_norm
        return out

    def attack_scores(self, window: int = SPIKE_WINDOW) -> np.ndarray:
        """The white-box scores: :func:`spike_scores` of the history when canaries are sparse in time
        (q ≤ ``SPARSE_RATE``), else the plain sum ``Σ_t release_t[k_j] / C`` (the choice depends on public q only)."""
        if self.sample_rate <= SPARSE_RATE and self.steps >= window:
            return spike_scores(np.stack(self.history), sample_rate=self.sample_rate, window=window)
        return self.scores.copy()

    def observe(self, release: Tensor) -> None:
        """Add one step's release (the noisy clipped sum, (P,)) at the canaries' coordinates."""
        seen = release.detach().double().cpu().numpy()[self.coordinates] / self.max_grad_norm
        self.scores += seen
        if self.sample_rate <= SPARSE_RATE:
            self.history.append(seen.astype(np.float32))
        self.steps += 1


def spike_scores(history: np.ndarray, *, sample_rate: float, window: int = SPIKE_WINDOW) -> np.ndarray:
    """Per-canary log-likelihood ratio of "a spike of 1 in a sampled step" over the run, from the per-step
    releases at the canaries' coordinates divided by C (``history``, (T, m)).

    The real rows' gradients in a coordinate drift slowly with the model and dwarf a canary's total ``q·T`` (on
    Adult's DP-GAN their sum's spread is ~500 C against ~4 C), but an included canary adds exactly 1 in the few
    steps that sample it. So each coordinate's series is detrended by its running median over ``window`` steps
    (rare spikes do not move a median), its residual scale ``s`` estimated robustly (1.4826 × median absolute
    deviation), and each step scored as a two-component mixture against the null:
    ``Σ_t log(1 − q + q·exp((x_t − ½) / s²))``, the likelihood ratio of ``x_t ~ N(B_t, s²)`` with ``B_t ~
    Bernoulli(q)`` against ``N(0, s²)``. With the noise on, s ≈ σ and the score is as weak as DP-SGD makes it.

    Args:
        history: (T, m) releases at the canaries' coordinates, in units of C.
        sample_rate: q, the canaries' per-step inclusion probability when included.
        window: steps of the running median (odd).

    Returns:
        Scores, (m,) (higher = guessed "in").
    """
    from scipy.ndimage import median_filter

    history = np.asarray(history, float)
    if history.ndim != 2 or not 0 < sample_rate < 1:
        raise ValueError(f"history must be (T, m) and 0 < q < 1; got {history.shape}, q = {sample_rate}.")
    resid = history - median_filter(history, size=(window, 1), mode="nearest")
    scale = 1.4826 * np.median(np.abs(resid - np.median(resid, 0)), 0) + 1e-6  # (m,)
    return np.logaddexp(np.log1p(-sample_rate), np.log(sample_rate) + (resid - 0.5) / scale**2).sum(0)


def private_parameters(dpsgd: Any, module: LightningModule) -> list[Tensor]:
    """DP-SGD's private parameters in the order of its flat release (its ``private_modules``, then
    ``parameters()``)."""
    from torch import nn

    modules = nn.ModuleDict({name: getattr(module, name) for name in dpsgd.private_modules})
    return [p for p in modules.parameters() if p.requires_grad]


class InsertDiracCanaries(Callback):
    """Attach :class:`DiracCanaries` to the run's DP-SGD mechanism at the start of training (pass to
    ``train(cfg, callbacks=[...])``; it runs after the mechanisms, once σ and q are set).

    The m coordinates are drawn uniformly without replacement among the private parameters (public: they depend on
    the seed and the network's size only), and the inclusion bits are fair coins, both from ``seed``.

    Args:
        canaries: m (at least 20; at most the number of private parameters, fewer are used on a smaller network).
        seed: seed of the coordinates, bits and sampling.
        required: raise when the run has no DP-SGD mechanism; otherwise insert nothing (``canaries`` stays None).
    """

    def __init__(self, *, canaries: int, seed: int = 0, required: bool = True) -> None:
        if canaries < 20:
            raise ValueError(f"gradient canaries must be at least 20 (the bound needs guesses), got {canaries}.")
        self.m, self.seed, self.required = int(canaries), int(seed), required
        self.canaries: DiracCanaries | None = None
        self.noise_multiplier: float | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from lightning_dp.callbacks.dp_sgd import DPSGD

        found = [cb for cb in trainer.callbacks if isinstance(cb, DPSGD)]
        if not found and not self.required:
            return
        if len(found) != 1:
            raise ValueError(f"gradient canaries need exactly one DP-SGD mechanism in the run, found {len(found)} "
                             "(use a model trained with DP-SGD, e.g. model=dp_gan).")
        if trainer.world_size > 1:
            raise ValueError("the gradient-canary audit runs in one process (trainer.devices=1).")
        dpsgd = found[0]
        size = sum(p.numel() for p in private_parameters(dpsgd, pl_module))
        m = min(self.m, size)
        if m < 20:
            raise ValueError(f"the DP-SGD network has {size} private parameters: too few for 20 gradient canaries.")
        rng = np.random.default_rng([self.seed, 28])
        coordinates = rng.choice(size, m, replace=False)
        included = rng.random(m) < 0.5
        self.canaries = DiracCanaries(coordinates, included, size=size, sample_rate=dpsgd.sample_rate,
                                      max_grad_norm=dpsgd.max_grad_norm, seed=int(rng.integers(2**62)))
        self.noise_multiplier = float(dpsgd.noise_multiplier)
        dpsgd.attach_canaries(self.canaries)
        log.info("gradient canaries: %d Dirac canaries (%d included) among %d private parameters, q = %.4g",
                 m, int(included.sum()), size, dpsgd.sample_rate)
