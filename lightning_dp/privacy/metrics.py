"""Only declared metrics leave a run: the one place that decides what may be logged.

Metrics reach the progress bar, ``logs/*/metrics.csv`` and checkpoints through ``LightningModule.log``
and the trainer's logger. A value computed from private rows without a mechanism (the discriminator's
loss on real rows, the median per-sample gradient norm) must not go there. So every key that may be
logged is *declared* by the class that logs it, with the reason it is safe:

.. code-block:: python

    class DPMERF(GeneratorModule):
        public_metrics = {"train/mmd2": "generated rows vs the released embedding (post-processing)"}

``GeneratorModule.log`` refuses an undeclared key (:class:`UndeclaredMetricError`) and
:class:`GuardedCSVLogger` refuses one that reaches the logger by any other path. Callbacks declare
their keys on the module they log to (:func:`declare_metrics`) when they are set up.

Lightning weights an epoch-level metric by the batch size it infers from the batch, and a Poisson
batch's size is private: the module's ``log`` therefore always passes ``batch_size=1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytorch_lightning.loggers import CSVLogger

# Keys Lightning adds itself: counters of the training loop, public.
LOOP_KEYS = frozenset({"epoch", "step"})


class UndeclaredMetricError(RuntimeError):
    """A metric that no class declared public or DP was about to be logged."""


def check_declared(name: str, declared: Mapping[str, str]) -> None:
    """Raise unless ``name`` is declared (or a key of the training loop itself).

    Raises:
        UndeclaredMetricError: with the list of declared keys and how to declare one.
    """
    if name in declared or name in LOOP_KEYS:
        return
    raise UndeclaredMetricError(
        f"Metric {name!r} is not declared, so it may be computed from private rows and cannot be logged. "
        f"Declared: {sorted(declared)}. If it is public or DP (a function of released values and generated "
        "rows only), add it to the logging class's `public_metrics` with the reason."
    )


def declare_metrics(module: Any, metrics: Mapping[str, str]) -> None:
    """Declare ``metrics`` (key → why it is safe) on ``module``, for callbacks that log to it."""
    extra = getattr(module, "_declared_metrics", None)
    if extra is None:
        extra = {}
        object.__setattr__(module, "_declared_metrics", extra)
    extra.update(metrics)


def declared_metrics(module: Any) -> dict[str, str]:
    """Every key ``module`` may log: its class's ``public_metrics`` plus those callbacks declared on it."""
    return {**getattr(type(module), "public_metrics", {}), **getattr(module, "_declared_metrics", {})}


class GuardedCSVLogger(CSVLogger):
    """A ``CSVLogger`` that writes only declared metrics (``declared`` is read at every call).

    Args:
        declared: returns the current declarations (the module's :func:`declared_metrics`).
    """

    def __init__(self, *args: Any, declared: Callable[[], Mapping[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._declared = declared

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        allowed = self._declared()
        for name in metrics:
            check_declared(name, allowed)
        super().log_metrics(metrics, step)
