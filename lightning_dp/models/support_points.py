"""Private support points ("Distribution Distance Measures in Generative and Privacy Models", Diesendruck 2019, Ch. 5).

Support points (Mak & Joseph 2018) are the n points that minimise the energy distance to the data (Eq. 5.6). The
private release is an exponential mechanism on the energy distance to them, sampled by Metropolis–Hastings
(``callbacks/private_support_points.py``), then expanded to any number of rows by a KDE with a DP bandwidth.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.errors import ConfigError
from lightning_dp.kernels.energy import check_norm, support_point_loss
from lightning_dp.models.base import GeneratorModule

log = logging.getLogger(__name__)

NOT_RELEASED, RELEASED, REFUSED = 0, 1, 2


class SupportPoints(GeneratorModule):
    """n support points in model space, optimised on private rows, of which only a DP draw ever leaves the run.

    Training minimises ``e(X_batch, Y)`` (Eq. 5.6, less its X-only term) over the points Y (Adam, then each point
    clipped to [0, 1]^D after every step; full batches when ``data.batch_size`` covers the rows). These optimised
    points Y* are *not* private: they are computed from the rows without noise. They are only the reference of the exponential mechanism (Algorithm 1, step 1), which the
    ``PrivateSupportPoints`` callback runs at the end of training; its draw Ỹ then replaces Y* in ``points``.
    Nothing computed from Y* or from the rows leaves the run otherwise:

    * every checkpoint holds ``points`` = NaN until the release (``on_save_checkpoint`` writes the placeholder,
      and drops Adam's moments, which are functions of the rows, from the optimizer state), and Ỹ after it;
    * the training loss is computed on private rows and is never logged (``public_metrics`` is empty);
    * ``exposed_networks`` is empty: no trained parameter of this module is released, only the mechanism's output,
      so DP-SGD has nothing to cover.

    A run resumed before the release finds the placeholder, restarts from the (public, seeded) initial points and
    catches up on the Adam steps it had taken, on the batches it has left (or, with none left, on full batches
    the mechanism hands it: ``catch_up``).

    Model space and categorical columns: a row is ``[continuous in [0, 1] | one-hot blocks]`` (public bounds,
    ``data/encoders.py``), and a labelled data set's label is one more one-hot block (so the label is released
    jointly with the row; conditional sampling is not offered). One-hot coordinates enter the energy distance, the
    optimisation and the MH chain as coordinates of [0, 1]^D like any other; the sensitivity uses the full width D.
    The released points therefore hold fractional values there. Sampling (the KDE expansion, Eq. 5.37) draws a
    centre uniformly from Ỹ, adds ``N(0, h² I)`` to its continuous coordinates (std h, clipped to [0, 1]) and draws
    each block's category from the centre's block values clamped at 0 and normalised (uniform when all are 0).

    Args:
        n_continuous, block_sizes, num_classes: the data layout.
        num_points: n, the size of the support set (the thesis' 5%, 10%, 20% of the training rows; public).
        p: norm order of the energy distance, in [1, 2] (the thesis' regression runs used 1).
        bandwidth: KDE standard deviation on [0, 1]-scaled columns, public (chosen without the data); ``None`` =
            a DP maximum-likelihood bandwidth released by the mechanism.
        lr: Adam learning rate (thesis: 0.01 on the 2-D mixtures; 0.005 reaches a lower energy on diabetes).
        num_steps: Adam steps in all, spread evenly over the trainer's batches (thesis: ≈300), so that the
            optimisation does not depend on ``trainer.max_epochs``.
        init_seed: seed of the initial points, uniform on [0.1, 0.9]^D (public: no data range is read).
    """

    uses_private_batches = True
    tabular_only = True
    public_metrics: dict[str, str] = {}

    def __init__(self, *, n_continuous: int, block_sizes: list[int] | tuple[int, ...] = (), num_classes: int = 1,
                 num_points: int = 35, p: float = 1.0, bandwidth: float | None = None, lr: float = 0.005,
                 num_steps: int = 300, init_seed: int = 0) -> None:
        super().__init__()
        check_settings(num_points=num_points, p=p, bandwidth=bandwidth, lr=lr, num_steps=num_steps)
        self.save_hyperparameters()
        self.n_continuous, self.block_sizes = n_continuous, list(block_sizes)
        self.init_label_buffer(num_classes)
        gen = torch.Generator().manual_seed(init_seed)
        self.points = nn.Parameter(0.1 + 0.8 * torch.rand(num_points, self.dim, generator=gen))  # (n, D)
        self.register_buffer("bandwidth", torch.tensor(math.nan if bandwidth is None else float(bandwidth)))
        self.register_buffer("release_state", torch.tensor(NOT_RELEASED))
        # the loop's batch count: ⌈ñ/B⌉ per epoch for the DP count ñ (the data module's loader), so DP, not the rows'
        self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))
        self._steps_done = 0  # Adam steps since the points were (re)initialised; 0 after a resume
        self.automatic_optimization = False

    @staticmethod
    def check_schema(module_cfg: Mapping[str, Any], schema: Any, data: Mapping[str, Any] | None = None) -> None:
        """Refuse settings out of range, before any release (images: ``tabular_only``).

        Raises:
            ConfigError: a setting the model cannot use, with the fix.
        """
        keys = ("num_points", "p", "bandwidth", "lr", "num_steps")
        check_settings(**{k: module_cfg[k] for k in keys if k in module_cfg})

    @staticmethod
    def minmax_columns(module_cfg: Mapping[str, Any], schema: Any) -> list[str]:
        """Every continuous column stays one min-max number: the points live in [0, 1]^D and the energy distance
        and MCMC are tuned for that space (cells would add a one-hot block per column)."""
        return [c.name for c in schema.features if c.type == "continuous"]

    @staticmethod
    def exposed_networks(module_cfg: Mapping[str, Any]) -> list[str]:
        """None: the optimised points read private rows but never leave the run (see the class docstring)."""
        return []

    # ---------------------------------------------------------------- layout
    @property
    def blocks(self) -> list[int]:
        """One-hot block sizes in model space, the label's last when the data set has one."""
        return self.block_sizes + ([self.num_classes] if self.num_classes > 1 else [])

    @property
    def dim(self) -> int:
        """D, the width of a point: continuous columns, one-hot blocks and the label block."""
        return self.n_continuous + sum(self.blocks)

    def embed(self, x: Tensor, y: Tensor) -> Tensor:
        """Rows ``(x, y)`` as points of [0, 1]^D: the label appended as a one-hot block, shape (B, D)."""
        if self.num_classes <= 1:
            return x
        return torch.cat([x, F.one_hot(y, self.num_classes).to(x.dtype)], 1)

    # ---------------------------------------------------------------- mechanism interface
    def is_released(self) -> bool:
        return int(self.release_state) == RELEASED

    def is_refused(self) -> bool:
        return int(self.release_state) == REFUSED

    def needs_bandwidth(self) -> bool:
        """A DP bandwidth is still to be released (none configured, and continuous columns to smooth)."""
        return bool(torch.isnan(self.bandwidth)) and self.n_continuous > 0

    def set_release(self, points: Tensor) -> None:
        """Replace the optimised points by the mechanism's draw Ỹ (n, D); from now on they are what is saved."""
        with torch.no_grad():
            self.points.copy_(points.to(self.points))
        self.release_state.fill_(RELEASED)

    def set_bandwidth(self, value: float) -> None:
        self.bandwidth.fill_(float(value))

    def refuse(self) -> None:
        """Mark the release refused (chains not mixed): the checkpoint then holds no points, only that fact."""
        self.release_state.fill_(REFUSED)

    def restore(self, points: Tensor, *, bandwidth: float | None = None) -> None:
        """Back to the state before a release that failed: the optimised ``points``, not released (and ``bandwidth``)."""
        with torch.no_grad():
            self.points.copy_(points.to(self.points))
        self.release_state.fill_(NOT_RELEASED)
        if bandwidth is not None:
            self.set_bandwidth(bandwidth)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Never save the optimised points or Adam's moments (functions of the private rows)."""
        if not self.is_released():
            checkpoint["state_dict"]["points"] = torch.full_like(self.points.detach(), math.nan)
        if "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"] = [{**state, "state": {}} for state in checkpoint["optimizer_states"]]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Before the release the saved points are the NaN placeholder: restart from the public initial points."""
        saved = checkpoint["state_dict"].get("points")
        if saved is not None and bool(torch.isnan(saved).any()):
            gen = torch.Generator().manual_seed(self.hparams.init_seed)
            checkpoint["state_dict"]["points"] = 0.1 + 0.8 * torch.rand(saved.shape, generator=gen)

    # ---------------------------------------------------------------- training (non-private: never leaves the run)
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Adam steps on ``e(X_batch, Y)`` (Eq. 5.6), ``num_steps`` in all, spread evenly over the run's batches.

        The loss is computed on private rows and is never logged. The step count is a function of public settings
        only (``num_steps``, the trainer's epochs and batches): with one full batch a step, the thesis' plain Adam.
        """
        x, y = batch  # private rows: one of ⌈ñ/B⌉ batches of the epoch (data module), possibly empty
        self.batches_seen += 1
        if len(x) == 0:  # the steps due are taken on the next batch, or on full batches at the release (catch_up)
            return
        self._adam_steps(self.embed(x, y), self.optimizers(), self.steps_expected(), self.manual_backward)

    def steps_expected(self) -> int:
        """Adam steps due after ``batches_seen`` of the trainer's batches: ``num_steps`` spread evenly over them."""
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        return min(math.ceil(self.hparams.num_steps * int(self.batches_seen) / total), self.hparams.num_steps)

    def steps_behind(self) -> int:
        """Adam steps due but not taken since the points were (re)initialised (0 unless resumed)."""
        return max(self.steps_expected() - self._steps_done, 0)

    def catch_up(self, rows: Tensor) -> int:
        """Take the Adam steps still due on full batches of ``rows`` (B, D); returns how many.

        After a resume that found the placeholder and had no batches left (e.g. a kill during the chains), the
        mechanism calls this so that its reference is optimised, not the initial points.
        """
        behind = self.steps_behind()
        if behind:
            with torch.enable_grad():
                opt = torch.optim.Adam([self.points], lr=self.hparams.lr)
                self._adam_steps(rows, opt, self._steps_done + behind, Tensor.backward)
        return behind

    def _adam_steps(self, rows: Tensor, opt: Any, until: int, backward: Callable[[Tensor], Any]) -> None:
        while self._steps_done < until:  # after a resume, catches up from the initial points
            opt.zero_grad()
            backward(support_point_loss(rows, self.points, self.hparams.p))
            opt.step()
            with torch.no_grad():
                self.points.clamp_(0.0, 1.0)
            self._steps_done += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam([self.points], lr=self.hparams.lr)

    # ---------------------------------------------------------------- sampling (the KDE expansion, post-processing)
    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        if labels is not None:
            raise ValueError("model=support_points generates the label with the row; it cannot condition on one.")
        if not self.is_released():
            what = "was refused (the chains did not mix)" if self.is_refused() else "has not happened"
            raise CheckpointError(f"This model holds no released support points: the release {what}. There is "
                                  "nothing to sample; train a new run.")
        if torch.isnan(self.bandwidth) and self.n_continuous > 0:
            raise CheckpointError("This model has no KDE bandwidth (neither configured nor released); retrain it.")
        centres = self.points[torch.randint(len(self.points), (n,), device=self.device)]  # (n, D)
        cont = centres[:, : self.n_continuous]
        if self.n_continuous:
            cont = (cont + self.bandwidth * torch.randn_like(cont)).clamp(0.0, 1.0)
        parts, offset = [cont], self.n_continuous
        for size in self.blocks:
            weights = centres[:, offset : offset + size].clamp_min(0.0)  # (n, K)
            weights = torch.where(weights.sum(1, keepdim=True) > 0, weights, torch.ones_like(weights))
            parts.append(F.one_hot(torch.multinomial(weights, 1).squeeze(1), size).to(cont.dtype))
            offset += size
        x = torch.cat(parts, 1)  # (n, D)
        if self.num_classes <= 1:
            return x, torch.zeros(n, dtype=torch.long, device=self.device)
        return x[:, : -self.num_classes], x[:, -self.num_classes :].argmax(1)


def check_settings(*, num_points: Any = 35, p: Any = 1.0, bandwidth: Any = None, lr: Any = 0.005,
                   num_steps: Any = 300) -> None:
    """The module's settings, checked before any release.

    Raises:
        ConfigError: the first setting out of range, named with a valid value.
    """
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 2:
        raise ConfigError(f"model.module.num_points must be a whole number >= 2 (the support-set size n, e.g. 10% of "
                          f"the training rows), got {num_points!r}.")
    try:
        check_norm(p)
    except ValueError as err:
        raise ConfigError(f"model.module.p: {err}") from None
    if bandwidth is not None and not (isinstance(bandwidth, int | float) and not isinstance(bandwidth, bool)
                                      and 0 < bandwidth <= 1):
        raise ConfigError(f"model.module.bandwidth must be null (a DP bandwidth) or a number in (0, 1] (a public KDE "
                          f"std on [0, 1]-scaled columns), got {bandwidth!r}.")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"model.module.lr must be a number > 0, got {lr!r}.")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
        raise ConfigError(f"model.module.num_steps must be a whole number >= 0 (Adam steps in all), got {num_steps!r}.")
