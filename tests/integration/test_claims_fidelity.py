"""A claims-like table through train(cfg) at ε = 1: the three properties the minmax representation lost.

DP-MERF (the default model) with ``policy`` as the label, on 5,000 rows. The generator below writes what insurance
exports look like: ``annual_premium`` is money in cents with 35% zeros
(policies without a premium this year) and a log-normal tail; ``vehicle_age`` is an integer 0..20, missing exactly
when ``policy`` is not ``vehicle``. The schema declares only public facts (bounds, integer, decimals, missing):
the spike at 0 and the quantile bins are released with DP (``dp_cells.py``).

Tolerances (stated here; the synthetic table has as many rows as the DP count of the real one, and is compared with
the real rows it was trained on):
* zero share of ``annual_premium`` within ±0.05 of the real one; every value in whole cents; median of the
  non-zero premiums within 25% of the real median;
* ``vehicle_age`` integers inside [0, 20], KS to the real column ≤ 0.15, the maximum ≥ 18;
* ``vehicle_age`` missing in ≥ 90% of the synthetic non-vehicle rows and ≤ 10% of the vehicle rows.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import ks_2samp

from lightning_dp.train import train
from tests.conftest import make_cfg

SCHEMA = {
    "label": "policy",
    "missing_values": [""],
    "columns": [
        {"name": "annual_premium", "type": "continuous", "bounds": [0, 20000], "decimals": 2},
        {"name": "vehicle_age", "type": "continuous", "bounds": [0, 20], "integer": True, "missing": True},
        {"name": "policy", "type": "categorical", "categories": ["home", "vehicle", "travel"]},
    ],
}


def claims_table(n: int, seed: int = 0) -> pd.DataFrame:
    """Seeded claims-like rows (module docstring)."""
    rng = np.random.default_rng(seed)
    policy = rng.choice(["home", "vehicle", "travel"], n, p=[0.35, 0.5, 0.15])
    premium = np.round(np.exp(rng.normal(6.9, 0.7, n)) * (1 + (policy == "vehicle")), 2)
    premium = np.where(rng.random(n) < 0.35, 0.0, np.clip(premium, 0.01, 20000))
    age = np.where(rng.random(n) < 0.7, np.minimum(rng.poisson(5.0, n), 20), rng.integers(0, 21, n)).astype(float)
    age[policy != "vehicle"] = np.nan
    return pd.DataFrame({"annual_premium": premium, "vehicle_age": age, "policy": policy})


@pytest.fixture(scope="module")
def claims(tmp_path_factory):
    folder = tmp_path_factory.mktemp("claims")
    real = claims_table(5000)
    real.to_csv(folder / "claims.csv", index=False)
    claims_table(500, seed=1).to_csv(folder / "holdout.csv", index=False)  # so the run trains on every real row
    (folder / "claims.yaml").write_text(yaml.safe_dump(SCHEMA))
    cfg = make_cfg(folder / "run", "model=dp_merf", "data=csv", f"data.path={folder / 'claims.csv'}",
                   f"data.test_path={folder / 'holdout.csv'}", f"data.schema={folder / 'claims.yaml'}",
                   "privacy.noise_seed=0", "seed=0", "model.module.steps_per_epoch=300",
                   "model.module.num_features=500", "model.module.batch_size=1000")
    result = train(cfg)
    return real, pd.read_csv(result["synthetic"]), result


def test_zero_inflated_money_in_cents(claims):
    real, syn, _ = claims
    p = syn["annual_premium"].to_numpy(float)
    assert abs((p == 0).mean() - (real["annual_premium"] == 0).mean()) <= 0.05
    assert np.allclose(np.round(p * 100), p * 100, rtol=0, atol=1e-6) and p.min() >= 0 and p.max() <= 20000
    real_median = real["annual_premium"][real["annual_premium"] > 0].median()
    assert abs(np.median(p[p > 0]) / real_median - 1) <= 0.25


def test_integer_vehicle_age_keeps_its_range(claims):
    real, syn, _ = claims
    age = syn["vehicle_age"].dropna().to_numpy(float)
    assert np.all(age == np.round(age)) and age.min() >= 0 and age.max() <= 20
    assert age.max() >= 18
    assert ks_2samp(age, real["vehicle_age"].dropna()).statistic <= 0.15


def test_missing_exactly_when_not_a_vehicle(claims):
    _, syn, result = claims
    missing = syn["vehicle_age"].isna()
    vehicle = syn["policy"] == "vehicle"
    assert missing[~vehicle].mean() >= 0.9 and missing[vehicle].mean() <= 0.1
    ledger = yaml.safe_load(Path(result["ledger"]).read_text())
    assert "data/cells" in [r["name"] for r in ledger["releases"]] and ledger["epsilon"] <= 1.0
