"""Importance weights that correct DP synthetic data towards the real distribution (bias mitigation).

Estimators by name (:data:`ESTIMATORS`), each ``plan`` → ``fit(real, synthetic) → log w``
(``base.py``); the pipeline that charges them on a run's ledger and writes the ``weight`` column is
``apply.py``; post-processing (tempering, PSIS, self-normalisation, ESS) is ``postprocess.py``.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_dp.errors import ConfigError

# name -> "module:Class" (imported when used, so that `import lightning_dp.weighting` stays light)
ESTIMATORS = {
    "logreg": "lightning_dp.weighting.logistic:LogisticWeights",
    "beta_noised": "lightning_dp.weighting.logistic:BetaNoised",
    "output_lapl": "lightning_dp.weighting.logistic:OutputLaplace",
    "output_norm": "lightning_dp.weighting.logistic:OutputGaussian",
    "mlp": "lightning_dp.weighting.logistic:MLPWeights",
    "priv_mlp": "lightning_dp.weighting.dp_mlp:DPSGDWeights",
    "discriminator": "lightning_dp.weighting.discriminator:DiscriminatorWeights",
}


def estimator_class(name: str) -> type:
    """The estimator class registered as ``name``.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones).
    """
    if name not in ESTIMATORS:
        raise ConfigError(f"Unknown weights estimator {name!r}; valid: {', '.join(ESTIMATORS)}.")
    module, cls = ESTIMATORS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_estimator(name: str, **params: Any) -> Any:
    """An estimator by name with its parameters (``epsilon`` for the private ones).

    Raises:
        ConfigError: an unknown name or parameter, or a bad value.
    """
    cls = estimator_class(name)
    try:
        return cls(**params)
    except TypeError as err:
        raise ConfigError(f"weights={name}: {err}. Check the weights.params keys against the estimator's "
                          "docstring.") from None
