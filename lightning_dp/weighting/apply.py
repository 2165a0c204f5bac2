"""Weights on a run's ledger: plan and reserve before training, fit after it, write the ``weight`` column.

Used by ``train.py ... weights=ESTIMATOR`` (the budget is reserved before the generator's mechanisms
calibrate, and spent at the end of the run) and by ``python -m lightning_dp.sample CKPT --weights ESTIMATOR``
(spent from the checkpoint's own ledger). In both, the releases are checked against the ledger before any
private row is read, recorded (and saved) before the noisy weights exist, and the written weights are
post-processing of them: tempered (w^τ), Pareto-smoothed (PSIS, optional), then self-normalised to mean one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger, Release
from lightning_dp.synthetic import sample_in_chunks
from lightning_dp.weighting import build_estimator, estimator_class
from lightning_dp.weighting.base import PlanInputs, WeightEstimator
from lightning_dp.weighting.features import feature_radius, joint_features, unit_ball

log = logging.getLogger(__name__)

KEYS = ("estimator", "epsilon", "params", "temper", "psis", "calibration_epsilon", "allow_non_private")


@dataclass(frozen=True)
class WeightsConfig:
    """The ``weights`` config group (``configs/weights/*.yaml``).

    Attributes:
        estimator: a name in :data:`lightning_dp.weighting.ESTIMATORS`.
        epsilon: ε of the weights on their own (their release is (ε, δ)-DP by itself); the run's ledger composes
            it with everything else. ``None`` for estimators that release nothing (``discriminator``).
        params: the estimator's own parameters.
        temper: τ in [0, 1]: weights w^τ (τ = 0 is uniform).
        psis: Pareto-smooth the weights (Vehtari et al.); k̂ is reported either way.
        calibration_epsilon: ε of a private beta calibration of the classifier (``None``: no calibration).
        allow_non_private: allow the reference estimators (``logreg``, ``mlp``) and nominal modes, which fit on
            private rows without a mechanism: the run then makes no DP claim.
    """

    estimator: str
    epsilon: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    temper: float = 1.0
    psis: bool = True
    calibration_epsilon: float | None = None
    allow_non_private: bool = False

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> WeightsConfig:
        """Validate a config node (unknown keys, τ range, the estimator name).

        Raises:
            ConfigError: a bad key or value.
        """
        node = dict(node)
        unknown = sorted(set(node) - set(KEYS))
        if unknown:
            raise ConfigError(f"Unknown weights setting(s) {unknown}; valid: {', '.join(KEYS)}.")
        if not node.get("estimator"):
            raise ConfigError("weights.estimator is missing: choose one of weights=beta_noised, output_lapl, "
                              "output_norm, priv_mlp, discriminator.")
        estimator_class(node["estimator"])  # the name is known
        temper = node.get("temper", 1.0)
        if not (isinstance(temper, int | float) and 0.0 <= temper <= 1.0):
            raise ConfigError(f"weights.temper must be in [0, 1] (w^τ; 1 keeps the weights), got {temper!r}.")
        for key in ("epsilon", "calibration_epsilon"):
            value = node.get(key)
            if value is not None and not (isinstance(value, int | float) and not isinstance(value, bool)
                                          and math.isfinite(value) and value > 0):
                raise ConfigError(f"weights.{key} must be a number > 0 (or null), got {value!r}.")
        return cls(estimator=node["estimator"], epsilon=node.get("epsilon"), params=dict(node.get("params") or {}),
                   temper=float(temper), psis=bool(node.get("psis", True)),
                   calibration_epsilon=node.get("calibration_epsilon"),
                   allow_non_private=bool(node.get("allow_non_private", False)))


@dataclass
class WeightedSample:
    """Synthetic rows with their weights (mean one), and what the report needs about them (all public)."""

    x: Tensor
    y: Tensor
    weights: np.ndarray
    summary: dict[str, Any]


class Weighting:
    """One weighting of one run's synthetic data.

    Args:
        config: the ``weights`` settings.
        layout: the run's model-space layout (public).
        model_name: the run's model (``discriminator`` needs ``dp_gan``/``dp_cgan`` with a BCE discriminator).
        model_cfg: the run's ``model`` config node (for that check).
        data_kind: ``tabular`` or ``image`` (images are refused).

    Raises:
        ConfigError: settings that cannot work, found before anything is released.
    """

    def __init__(self, config: WeightsConfig, *, layout: dict[str, Any] | None, model_name: str,
                 model_cfg: Mapping[str, Any] | None = None, data_kind: str = "tabular") -> None:
        self.config, self.layout = config, layout
        if data_kind != "tabular":
            raise ConfigError(f"weights={config.estimator} weights tabular rows; this run generates {data_kind} data. "
                              "Drop the weights setting for image data.")
        params = dict(config.params)
        cls = estimator_class(config.estimator)
        if cls.private and cls.reads_private:
            params["epsilon"] = config.epsilon
        elif config.epsilon is not None:
            log.info("weights=%s releases nothing new (weights.epsilon=%s is not used).", config.estimator,
                     config.epsilon)
        self.estimator: WeightEstimator = build_estimator(config.estimator, **params)
        if config.estimator == "discriminator":
            _check_discriminator(model_name, model_cfg or {})
        if self.no_guarantee and not config.allow_non_private:
            raise ConfigError(f"weights={config.estimator} {self.no_guarantee}. Choose a private estimator "
                              "(beta_noised, output_lapl, output_norm, priv_mlp, discriminator), or set "
                              "weights.allow_non_private=true to fit it anyway: the run then makes no DP claim.")
        if config.calibration_epsilon is not None:
            from lightning_dp.weighting.calibration import PrivateBetaCalibration

            if not hasattr(self.estimator, "log_weights"):
                raise ConfigError(f"weights.calibration_epsilon: weights={config.estimator} has no released score "
                                  "function to calibrate (the calibration scores real rows with it). Calibrate "
                                  "weights=beta_noised, or set weights.calibration_epsilon=null.")
            self.calibration: Any = PrivateBetaCalibration()
        else:
            self.calibration = None

    @property
    def no_guarantee(self) -> str | None:
        """Why these weights would carry no DP guarantee, or ``None``."""
        if not self.estimator.private:
            return "is a non-private reference estimator (it fits on the private rows without a mechanism)"
        nominal = getattr(self.estimator, "nominal_guarantee", None)
        return f"has no DP guarantee: {nominal}" if nominal else None

    # ------------------------------------------------------------------ planning
    def num_features(self) -> int:
        """Width of the classifier input: ``[x | one-hot(y) | 1]``."""
        k = int(self.layout.get("num_classes", 1))
        width = int(self.layout["n_continuous"]) + sum(self.layout.get("block_sizes", []))
        return width + (k if k > 1 else 0) + 1

    def inputs(self, *, num_real: float, num_rows: int, ledger: PrivacyLedger) -> PlanInputs:
        return PlanInputs(num_real=float(num_real), num_synthetic=int(num_rows), num_features=self.num_features(),
                          delta=ledger.delta, adjacency=ledger.adjacency)

    def default_rows(self, *, num_real: float, ledger: PrivacyLedger) -> int:
        """Rows to weight when the run names none: ñ_D, or the most output perturbation admits (the paper's choice)."""
        rows = max(round(num_real), 1)
        if hasattr(self.estimator, "admissible"):  # output perturbation: its noise grows with the number of rows
            from lightning_dp.weighting.logistic import max_rows

            inputs = self.inputs(num_real=num_real, num_rows=rows, ledger=ledger)
            rows = min(rows, max_rows(inputs, estimator=self.estimator, upper=rows))
            if rows == 0:
                raise ConfigError(f"weights={self.config.estimator}: not even one weight meets the noise condition at "
                                  f"weights.epsilon={self.config.epsilon}. Raise weights.epsilon or params.l2.")
        return rows

    def plan(self, *, num_real: float, num_rows: int, ledger: PrivacyLedger) -> list[Release]:
        """Check the settings for ``num_rows`` weights and return every release they will make (public facts only).

        Raises:
            ConfigError: e.g. output perturbation with more rows than its noise admits (the message names the
                largest number).
        """
        return [r for part in self._plan_parts(num_real=num_real, num_rows=num_rows, ledger=ledger) for r in part]

    def _plan_parts(self, *, num_real: float, num_rows: int, ledger: PrivacyLedger) -> tuple[list[Release], list[Release]]:
        inputs = self.inputs(num_real=num_real, num_rows=num_rows, ledger=ledger)
        self.estimator.check(inputs)
        calibration = ([] if self.calibration is None else
                       list(self.calibration.plan(inputs, self.config.calibration_epsilon)))
        return list(self.estimator.plan(inputs)), calibration

    def check_budget(self, releases: list[Release], ledger: PrivacyLedger) -> None:
        """Refuse, before anything is read or released, weights that would take the ledger past its target.

        Raises:
            BudgetExceededError: with the ε spent, the ε the weights would add, and what to do.
        """
        after = ledger.epsilon_if(releases)
        if after > ledger.target_epsilon * (1 + 1e-9):
            alone = PrivacyLedger(target_epsilon=1e9, delta=ledger.delta).epsilon(releases) if releases else 0.0
            raise BudgetExceededError(
                f"weights={self.config.estimator} (ε = {alone:.3g} on its own) would take the run from ε = "
                f"{ledger.spent:.4g} to {after:.4g}, above its target ε = {ledger.target_epsilon:g}. Nothing was read "
                "or released. Ask for a smaller --weights-epsilon, use weights=discriminator (free for dp_gan/dp_cgan), "
                "or train with weights=ESTIMATOR so that the budget is split before training.")

    # ------------------------------------------------------------------ fitting
    def run(self, *, model: Any, real: tuple[Tensor, Tensor] | None, num_rows: int, num_real: float,
            ledger: PrivacyLedger, generator: torch.Generator, seed: int | None = None,
            waive: bool = True) -> WeightedSample:
        """Sample ``num_rows`` rows, spend the planned releases on ``ledger`` and fit their weights.

        Args:
            model: the trained generator module.
            real: the private training rows in model space (``None`` for estimators that read none).
            num_rows: synthetic rows to weight (N_S; public).
            num_real: the run's DP (or public) row count ñ_D.
            ledger: the run's ledger (reserved budget is used up by the matching releases).
            generator: the privacy noise generator.
            seed: seed of the synthetic sample.
            waive: for weights without a guarantee (``no_guarantee``), record on ``ledger`` that the run makes no DP
                claim (its own artefacts hold them: ``train.py``). ``False`` when they go to a separate file that the
                caller labels private instead (``python -m lightning_dp.sample``), leaving the run's claim intact.

        Raises:
            BudgetExceededError: the releases do not fit (checked before the private rows are touched).
        """
        own, calibration = self._plan_parts(num_real=num_real, num_rows=num_rows, ledger=ledger)
        self.check_budget(own + calibration, ledger)
        x, y = sample_in_chunks(model, num_rows, seed=seed)
        radius = feature_radius(self.layout)
        synthetic = unit_ball(joint_features(x, y, self.layout), radius)  # (N_S, F)
        real_features = None
        if self.estimator.reads_private:
            if real is None:
                raise ValueError(f"weights={self.config.estimator} needs the run's private rows.")
            real_features = unit_ball(joint_features(real[0], real[1], self.layout), radius)  # (N_D, F)
        if self.no_guarantee and waive:
            ledger.waive(f"weights/{self.config.estimator}", f"importance weights that {self.no_guarantee}")
        records_itself = getattr(self.estimator, "records_own_releases", False)
        with ledger.durable():  # on disk before the noisy weights exist
            for release in ([] if records_itself else own) + calibration:
                ledger.record(release)
        extra = {"rows": (x, y)} if getattr(self.estimator, "needs_model", False) else {}
        if records_itself:  # DP-SGD records each step before its noise is drawn; nothing leaves until the block ends,
            self.estimator.ledger = ledger  # so the steps are saved once, at its end (not a checkpoint per step)
            with ledger.durable():
                fit = self.estimator.fit(real_features, synthetic, releases=own, generator=generator, model=model)
        else:
            fit = self.estimator.fit(real_features, synthetic, releases=own, generator=generator, model=model, **extra)
        log_w = np.asarray(fit.log_w, dtype=np.float64)
        if fit.keep is not None:
            x, y, synthetic = x[fit.keep], y[fit.keep], synthetic[fit.keep]
        if self.calibration is not None:  # beta calibration: real rows vs a fresh synthetic sample, scored alike
            fresh_x, fresh_y = sample_in_chunks(model, num_rows, seed=None if seed is None else seed + 7919)
            fresh = unit_ball(joint_features(fresh_x, fresh_y, self.layout), radius)
            log_w = self.calibration.apply(real_log_w=self.estimator.log_weights(real_features),
                                           fresh_log_w=self.estimator.log_weights(fresh), log_w=log_w,
                                           prior=fit.info["prior"], releases=calibration, generator=generator)
        return WeightedSample(x=x, y=y, **self._post_process(log_w, fit))

    def _post_process(self, log_w: np.ndarray, fit: Any) -> dict[str, Any]:
        from lightning_dp.weighting import postprocess as pp

        raw = pp.summarise(log_w)
        log_w = pp.temper(log_w, self.config.temper)
        k_hat = raw["psis_k"]
        if self.config.psis:
            log_w, k_hat = pp.psis(log_w)
        weights = pp.self_normalise(log_w)
        summary = {"estimator": self.config.estimator, "private": self.no_guarantee is None,
                   "epsilon": self.config.epsilon, "temper": self.config.temper, "psis": self.config.psis,
                   "calibrated": self.calibration is not None, "raw": raw, **pp.summarise(np.log(weights)),
                   "psis_k": float(k_hat), "estimator_info": _public(fit.info)}
        if summary["psis_k"] > pp.PSIS_THRESHOLD:
            log.warning("The weights' PSIS k̂ = %.2f > %.1f: they are unreliable (the synthetic data misses parts of the "
                        "real distribution). Improve the generator before releasing weighted data.", summary["psis_k"],
                        pp.PSIS_THRESHOLD)
        return {"weights": weights, "summary": summary}


def _check_discriminator(model_name: str, model_cfg: Mapping[str, Any]) -> None:
    """``weights=discriminator`` from the run's config, before anything is released (the module is checked again).

    Raises:
        ConfigError: no DP discriminator (models other than dp_gan, dp_cgan), or a WGAN critic.
    """
    from lightning_dp.weighting.discriminator import MODELS_WITH_DISCRIMINATOR

    if model_name not in MODELS_WITH_DISCRIMINATOR:
        raise ConfigError(f"weights=discriminator needs a GAN with a DP discriminator (model="
                          f"{' or model='.join(MODELS_WITH_DISCRIMINATOR)}), not model={model_name}. Use a separate "
                          "estimator, e.g. weights=priv_mlp or weights=beta_noised.")
    loss = (model_cfg.get("module") or {}).get("loss", "bce")
    if loss != "bce":
        raise ConfigError(f"weights=discriminator: model.module.loss={loss} trains a WGAN critic, which is not a "
                          "probability. Train with model.module.loss=bce, or use weights=priv_mlp.")


def _public(info: Mapping[str, Any]) -> dict[str, Any]:
    """Plain numbers and strings of an estimator's public ``info`` (for JSON)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, bool | int | str) or value is None:
            out[key] = value
        elif isinstance(value, float | np.floating):
            out[key] = float(value) if math.isfinite(float(value)) else str(value)
    return out


def weighted_frame(data_state: dict[str, Any], sample: WeightedSample) -> pd.DataFrame:
    """The user's columns of the weighted rows plus a ``weight`` column (mean one)."""
    from lightning_dp.data.datamodule import decode_samples

    frame = decode_samples(data_state, sample.x, sample.y)
    if "weight" in frame.columns:
        raise ConfigError("The data set has a column named 'weight'; rename it in the schema before weighting.")
    frame["weight"] = sample.weights
    return frame
