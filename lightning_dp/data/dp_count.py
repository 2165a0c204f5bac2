"""The number of training rows, as a DP release or a public fact: the only n a run may use.

Under add/remove adjacency n itself is private (neighbouring data sets differ in size), so nothing a
run publishes may be a deterministic function of it: not DP-SGD's sample rate q = L/n (and the σ
calibrated from it), not the number of synthetic rows written, not the steps per epoch, not a log line.
Every such use goes through :func:`release_row_count`:

* a public count (``data.public_num_rows``, the data owner's statement that n is public) is used as
  given, after a check that it is the true count (the check reveals nothing when the statement is true);
* under replace-one adjacency n is public by definition (neighbours have the same size);
* otherwise one Gaussian release of n, sensitivity 1 (adding or removing a row changes n by one), is
  recorded on the ledger before the noise is drawn.

Its noise is set by a share ``f`` of the run's Rényi-DP budget rather than of ε: with σ₁ the noise
multiplier that would spend the whole remaining budget on one Gaussian release, the count gets
``σ = σ₁/√f``. A Gaussian release costs ``α/(2σ²)`` at every order α, so the count costs exactly the
fraction f of that curve and the releases calibrated after it keep ``1 − f`` (their noise grows by
``1/√(1 − f)``: 1% at f = 0.02). At ε = 1, δ = 1e-5, f = 0.02 gives σ ≈ 29 rows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from lightning_dp.data.schema import DataError
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release

log = logging.getLogger(__name__)

RELEASE_NAME = "data/num_rows"


@dataclass(frozen=True)
class RowCount:
    """What a run may know of its number of training rows.

    Attributes:
        value: the count to use (noisy unless ``source`` is ``"public"`` or ``"replace_one"``), ≥ 1.
        source: ``"dp"`` (a ledger release), ``"public"`` (stated in config) or ``"replace_one"``.
        std: standard deviation of the noise in ``value`` (0 when public).
    """

    value: float
    source: str
    std: float = 0.0

    def to_dict(self) -> dict[str, float | str]:
        return {"value": self.value, "source": self.source, "std": self.std}

    @classmethod
    def from_dict(cls, d: dict[str, float | str]) -> RowCount:
        return cls(value=float(d["value"]), source=str(d["source"]), std=float(d.get("std", 0.0)))

    def describe(self) -> str:
        if self.source == "dp":
            return f"about {self.value:.0f} training rows (a DP count, noise std {self.std:.3g})"
        return f"{self.value:.0f} training rows ({'public, stated in data.public_num_rows' if self.source == 'public' else 'public under replace-one adjacency'})"


def release_row_count(n: int, ledger: PrivacyLedger, *, budget_fraction: float, generator: torch.Generator,
                      public_num_rows: int | None = None) -> RowCount:
    """The run's count of training rows: public when stated, else one DP release on ``ledger``.

    Args:
        n: the true number of training rows (private).
        budget_fraction: share f of the Rényi-DP budget (module docstring); in (0, 1).
        generator: privacy noise generator.
        public_num_rows: the data owner's public statement of n, or ``None``.

    Raises:
        DataError: ``public_num_rows`` is not the true count.
    """
    if public_num_rows is not None:
        if int(public_num_rows) != n:
            raise DataError(f"data.public_num_rows={public_num_rows} is not the number of training rows. State the "
                            "exact public count (after the holdout split; give data.test_path and "
                            "data.holdout_fraction=0 to know it in advance), or leave it null to release a DP count.")
        return RowCount(value=float(n), source="public")
    if ledger.adjacency == "replace_one":
        return RowCount(value=float(n), source="replace_one")
    if not 0 < budget_fraction < 1:
        raise ValueError(f"privacy.count_budget_fraction must be in (0, 1), got {budget_fraction}.")

    def single(sigma: float) -> list[Release]:
        return [Release(name=RELEASE_NAME, mechanism="gaussian", sensitivity=1.0, noise_multiplier=sigma,
                        note="number of training rows (add/remove changes it by 1)")]

    sigma = ledger.calibrate(single) / math.sqrt(budget_fraction)
    ledger.record(single(sigma)[0])  # before the noise exists
    noisy = float(mech.gaussian_noise(torch.tensor(float(n), dtype=torch.float64), sensitivity=1.0,
                                      noise_multiplier=sigma, generator=generator))
    return RowCount(value=max(noisy, 1.0), source="dp", std=sigma)
