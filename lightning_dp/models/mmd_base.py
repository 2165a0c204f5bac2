"""What the thesis' MMD generators share: whole rows with the label as a block, z-scores, rounding at sampling,
importance weights, and the statement of which networks read private rows.

"Distribution Distance Measures in Generative and Privacy Models" (Diesendruck 2019): Ch. 3's importance-weighted
generators and Ch. 4's MMD-GAN for medical records both model the whole row, standardise continuous columns
(z-scores) and undo it at sampling, where binary columns, modelled as continuous outputs, are rounded. Here each
one-hot block (a binary column is a block of two) is rounded to its nearest one-hot vector (the arg-max), which
for a binary column is rounding its indicator at 0.5; continuous values are clipped to the public bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.models.base import GeneratorModule
from lightning_dp.models.importance import KnownWeights, check_weights, describe_weights, weight_form
from lightning_dp.nets.mmd_nets import Standardizer, WeightNet
from lightning_dp.privacy.metrics import declare_metrics

log = logging.getLogger(__name__)

STANDARDIZE = ("data", "none")
NO_CLAIM = "; or use privacy=none to train without a DP claim"


class RowMMDModule(GeneratorModule):
    """Base of :class:`IWMMDGenerator`, :class:`IWMMDGAN` and :class:`MMDGANAE` (not a model by itself).

    Subclasses call :meth:`setup_rows` in ``__init__``, set ``self.generator`` (z → a standardised row) and list
    their losses' private values in ``private_metrics`` (logged only by a run without a DP claim).
    """

    uses_private_batches = True
    private_metrics: ClassVar[dict[str, str]] = {}

    def setup_rows(self, *, n_continuous: int, block_sizes: Sequence[int], num_classes: int, standardize: str,
                   weights: Mapping[str, Any] | None, feature_dim: int | None = None) -> None:
        """The row layout, the standardiser and (for estimated weights) the weighting network on ``feature_dim``."""
        self.check_schema({"standardize": standardize}, None)
        self.n_continuous, self.block_sizes = n_continuous, list(block_sizes)
        self.init_label_buffer(num_classes)
        self.row_blocks = self.block_sizes + ([num_classes] if num_classes > 1 else [])
        self.row_dim = n_continuous + sum(self.row_blocks)
        self.standardizer = Standardizer(self.row_dim, n_continuous)
        self.weight_form = weight_form(weights)
        self.weight_spec = weights
        self.weight_net = None
        if self.weight_form == "estimated":
            hidden = list(weights["estimated"].get("hidden", [32, 32]))
            self.weight_net = WeightNet(feature_dim or self.row_dim, hidden)
        self._known_weights: KnownWeights | None = None
        self._log_private = False

    @staticmethod
    def net_layout(layout: dict[str, Any], module_cfg: Any) -> dict[str, Any]:
        """The networks see whole rows: the label is the last one-hot block."""
        if layout["num_classes"] <= 1:
            return layout
        return {**layout, "block_sizes": [*layout["block_sizes"], layout["num_classes"]], "num_classes": 1}

    @classmethod
    def check_schema(cls, module_cfg: Mapping[str, Any], schema: Any, data: Mapping[str, Any] | None = None) -> None:
        """Refuse settings and weights that cannot apply to this (public) schema, before any release."""
        standardize = module_cfg.get("standardize", "data")
        if standardize not in STANDARDIZE:
            raise ConfigError(f"model.module.standardize={standardize!r}; valid: data (z-scores from the training rows, "
                              "the thesis; no DP claim), none (the public [0, 1] scaling).")
        cls.check_settings(module_cfg)
        check_weights(module_cfg.get("weights"), schema)

    @classmethod
    def check_settings(cls, module_cfg: Mapping[str, Any]) -> None:
        """The module's own settings (estimator, groups...), checked before any release."""

    # ------------------------------------------------------------------ privacy statement (privacy/coverage.py)
    @classmethod
    def dp_blockers(cls, module_cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(network, why DP-SGD cannot cover it)`` for this config; the shared ones are the standardiser and
        the weighting network."""
        out = []
        if module_cfg.get("standardize", "data") == "data":
            out.append(("standardizer", "standardize=data z-scores with the rows' exact means and deviations (use "
                                        "model.module.standardize=none)"))
        if weight_form(module_cfg.get("weights")) == "estimated":
            out.append(("weight_net", "weights.estimated fits a network on labelled private rows without noise (give "
                                      "known weights: piecewise or logistic)"))
        return out

    @classmethod
    def dp_networks(cls, module_cfg: Mapping[str, Any]) -> list[str]:
        """Networks that read private rows through a per-sample loss DP-SGD can clip (none by default)."""
        return []

    @classmethod
    def exposed_networks(cls, module_cfg: Mapping[str, Any]) -> list[str]:
        blocked = {name for name, _ in cls.dp_blockers(module_cfg)}
        return [n for n in cls.dp_networks(module_cfg) if n not in blocked]

    @classmethod
    def unprotected_networks(cls, module_cfg: Mapping[str, Any]) -> list[str]:
        return list(dict.fromkeys(name for name, _ in cls.dp_blockers(module_cfg)))

    @classmethod
    def unprotected_reason(cls, module_cfg: Mapping[str, Any]) -> str:
        """Why a DP run of this config is refused, and the fix (``privacy/coverage.py`` prints it)."""
        return "; ".join(reason for _, reason in cls.dp_blockers(module_cfg)) + NO_CLAIM

    # ------------------------------------------------------------------ rows
    def join(self, x: Tensor, y: Tensor) -> Tensor:
        """Model-space rows and labels → whole rows (B, d), the label one-hot last."""
        if self.num_classes <= 1:
            return x
        return torch.cat([x, F.one_hot(y, self.num_classes).to(x.dtype)], 1)

    def split(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        if self.num_classes <= 1:
            return rows, torch.zeros(len(rows), dtype=torch.long, device=rows.device)
        return rows[:, : -self.num_classes], rows[:, -self.num_classes :].argmax(1)

    def round_rows(self, rows: Tensor) -> Tensor:
        """Continuous columns clipped to [0, 1]; each one-hot block (a binary column included) to its nearest
        one-hot vector."""
        c = self.n_continuous
        parts = [rows[:, :c].clamp(0, 1)]
        for block in torch.split(rows[:, c:], self.row_blocks, dim=1):
            parts.append(F.one_hot(block.argmax(1), block.shape[1]).to(rows.dtype))
        return torch.cat(parts, 1)

    def noise(self, n: int) -> Tensor:
        return torch.randn(n, self.generator.latent_dim, device=self.device)

    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        """z ~ N(0, I) → G(z) → unstandardise → round (the thesis' "rescale outputs at simulation time")."""
        if labels is not None:
            raise ValueError(f"{type(self).__name__} generates the label with the row; it cannot condition on one.")
        return self.split(self.round_rows(self.standardizer.inverse(self.generator(self.noise(n)))))

    # ------------------------------------------------------------------ fit start: standardiser, weights, log
    def on_fit_start(self) -> None:
        from lightning_dp.callbacks.dp_sgd import DPSGD

        dp = [cb for cb in self.trainer.callbacks if isinstance(cb, DPSGD)]
        self._log_private = not dp  # no DP mechanism: the run makes no DP claim (privacy/coverage.py)
        if self._log_private:
            declare_metrics(self, self.private_metrics)
        if self.hparams.standardize == "data" and not bool(self.standardizer.fitted):
            self._fit_standardizer()
        if self.weight_form in ("piecewise", "logistic"):
            self._known_weights = KnownWeights(self.weight_spec, self.trainer.datamodule.encoder)
        log.info("%s: estimator=%s, weights: %s; standardize=%s.", type(self).__name__,
                 self.hparams.get("estimator", "standard"), describe_weights(self.weight_spec), self.hparams.standardize)
        if self.weight_form == "estimated" and self.hparams.get("estimator") not in ("sniw", "miw", "id"):
            log.warning("Estimated weights are known only up to a constant; estimator=sniw is invariant to it (the "
                        "thesis' choice), estimator=%s is not.", self.hparams.get("estimator"))

    @torch.no_grad()
    def _fit_standardizer(self) -> None:
        """Column means and standard deviations of the training rows (exact: this run makes no DP claim)."""
        total = total_sq = None
        count = 0
        for x, y in self.trainer.datamodule.private_batches():
            rows = self.join(x.to(self.device), y.to(self.device)).double()
            part, part_sq = rows.sum(0), rows.square().sum(0)
            total = part if total is None else total + part
            total_sq = part_sq if total_sq is None else total_sq + part_sq
            count += len(rows)
        if count:
            self.standardizer.fit(total.float(), total_sq.float(), float(count))

    # ------------------------------------------------------------------ weights
    def weight_features(self, rows: Tensor) -> Tensor:
        """What the estimated weighting function reads: standardised rows (subclasses: the codes)."""
        return rows

    def row_weights(self, x: Tensor, y: Tensor, rows: Tensor) -> Tensor | None:
        """w of the real batch (B,), or None for w ≡ 1; never differentiated."""
        if self._known_weights is not None:
            return self._known_weights(x, y)
        if self.weight_net is not None:
            with torch.no_grad():
                return self.weight_net(self.weight_features(rows))
        return None

    def log_private(self, name: str, value: Tensor | float, **kwargs: Any) -> None:
        """Log a value computed from real rows, only in a run without a DP claim."""
        if self._log_private:
            self.log(name, float(value.detach()) if isinstance(value, Tensor) else value, **kwargs)
