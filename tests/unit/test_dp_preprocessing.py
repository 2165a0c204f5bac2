import math

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dp.data.dp_preprocessing import (
    DEFAULT_MAX_ABS,
    dp_bounds,
    dp_quantile,
    quantile_intervals,
    quantile_level,
    release_schema,
)
from lightning_dp.data.schema import Column, DataError, Schema, validate
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger


def log_density(values: np.ndarray, q: float, epsilon: float, t: np.ndarray) -> np.ndarray:
    """Exact log-density in t = asinh(x) of the mechanism's output, from its interval probabilities."""
    edges, log_prob = quantile_intervals(values, q, epsilon=epsilon)
    i = np.searchsorted(edges, t, side="right") - 1  # interval holding each t
    return log_prob[i] - np.log(edges[i + 1] - edges[i])


def continuous_frame(n: int, k: int, seed: int = 0) -> tuple[pd.DataFrame, Schema]:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({f"x{j}": rng.normal(100 * (j + 1), 10, n) for j in range(k)})
    schema = Schema(columns=[Column(f"x{j}", "continuous") for j in range(k)])
    return validate(df, schema), schema


@pytest.mark.parametrize("q", [0.05, 0.5, 0.9])
def test_quantile_is_accurate_at_large_epsilon(q):
    values = np.random.default_rng(0).normal(50, 10, 10_000)
    true = np.quantile(values, q)
    for s in range(20):
        x = dp_quantile(values, q, epsilon=2.0, generator=mech.noise_generator(s))
        rank = (values < x).sum()
        assert abs(rank - q * len(values)) <= 30  # expected rank error 2/ε = 1
        assert abs(x - true) < 0.25  # 30 ranks near these quantiles span < 0.25


def test_interval_probabilities_sum_to_one_and_ties_get_none():
    values = np.array([3.0, 1.0, 1.0, 1.0, 7.0])
    edges, log_prob = quantile_intervals(values, 0.5, epsilon=1.0)
    assert edges.shape == (7,) and log_prob.shape == (6,)
    assert edges[0] == pytest.approx(-math.asinh(DEFAULT_MAX_ABS)) and edges[-1] == -edges[0]
    assert np.exp(log_prob).sum() == pytest.approx(1.0, abs=1e-12)
    assert np.isneginf(log_prob[1:3]).all()  # [z_1, z_2] and [z_2, z_3] are ties of 1.0


def test_sampler_draws_from_the_interval_probabilities():
    values = np.array([-2.0, 0.5, 4.0, 30.0])
    edges, log_prob = quantile_intervals(values, 0.5, epsilon=1.0)
    gen = mech.noise_generator(0)
    draws = np.array([dp_quantile(values, 0.5, epsilon=1.0, generator=gen) for _ in range(4000)])
    counts = np.bincount(np.searchsorted(edges, np.arcsinh(draws)) - 1, minlength=len(log_prob))
    expected = 4000 * np.exp(log_prob)
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected) + 1)


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("extra", [-5.0, 1.0, 3.0, 1e12])
def test_output_density_ratio_is_at_most_e_to_the_epsilon(q, extra):
    # D and D plus one row (a tie, a value outside the public range, ...): the exact densities of the
    # output differ by at most e^ε everywhere (add/remove adjacency), and likewise for replace-one.
    eps = 0.7
    d = np.array([0.3, 1.0, 1.0, 2.5, 7.0])
    neighbours = [np.append(d, extra), np.where(np.arange(5) == 4, extra, d)]
    end = math.asinh(DEFAULT_MAX_ABS)
    t = np.concatenate([np.random.default_rng(1).uniform(-end, end, 2000), np.linspace(-1, 3, 2001) + 1e-7])
    base = log_density(d, q, eps, t)
    for other in neighbours:
        gap = np.abs(log_density(other, q, eps, t) - base)
        assert np.isfinite(gap).all() and gap.max() <= eps * (1 + 1e-9)
        if q == 0.5 and extra == -5.0:
            assert gap.max() > 0.45 * eps  # the check sees the privacy loss (at most ≈ ε/2 on this data)


def test_quantile_level_post_processes_the_noisy_count():
    assert quantile_level(0.0085, 32_561) == pytest.approx(0.0796, abs=1e-3)  # Adult at the default share
    assert quantile_level(1.0, 1e6) == 0.01
    assert quantile_level(0.0038, 455) > 0.25
    assert quantile_level(0.1, 0.0) == math.inf and quantile_level(0.1, -3.0) == math.inf
    with pytest.raises(ValueError, match="num_rows"):
        quantile_level(0.1, float("nan"))


@pytest.mark.parametrize(
    "values,integer",
    [
        (np.random.default_rng(0).normal(0, 1, 20), False),
        (np.full(20, 3.0), True),
        (np.full(20, 3.0), False),
        (np.array([-1e15, 1e15, 5.0]), False),
        (np.array([]), True),
    ],
)
def test_bounds_at_small_epsilon_are_finite_and_ordered(values, integer):
    gen = mech.noise_generator(0)
    for _ in range(200):
        lo, hi = dp_bounds(values, 0.25, epsilon=0.01, generator=gen, integer=integer)
        assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
        assert lo >= -DEFAULT_MAX_ABS - 1 and hi <= DEFAULT_MAX_ABS + 1
        if integer:
            assert lo == math.floor(lo) and hi == math.ceil(hi)


def test_refuses_a_too_small_share_before_recording_anything():
    df, schema = continuous_frame(455, 30)
    ledger, gen = PrivacyLedger(target_epsilon=1.0, delta=1e-5), mech.noise_generator(0)
    state = gen.get_state()
    with pytest.raises(DataError, match=r"Declare bounds: \[lo, hi\].*preprocessing_epsilon_fraction"):
        release_schema(df, schema, ledger, epsilon=0.1, num_rows=455.0, generator=gen)
    assert ledger.releases == [] and ledger.spent == 0.0
    assert torch.equal(gen.get_state(), state)  # no noise drawn


def test_decisions_follow_num_rows_not_the_exact_count():
    df, schema = continuous_frame(5000, 1)
    with pytest.raises(DataError, match="about 50 rows"):
        release_schema(
            df,
            schema,
            PrivacyLedger(target_epsilon=1.0, delta=1e-5),
            epsilon=0.5,
            num_rows=50.0,
            generator=mech.noise_generator(0),
        )
    out = release_schema(
        df,
        schema,
        PrivacyLedger(target_epsilon=1.0, delta=1e-5),
        epsilon=0.5,
        num_rows=4990.0,
        generator=mech.noise_generator(0),
    )
    lo, hi = out["x0"].bounds
    assert 60 < lo < 85 and 115 < hi < 140  # the 1% and 99% quantiles are 76.7 and 123.3


def test_bounds_release_is_on_the_ledger_with_count_2k():
    rng = np.random.default_rng(2)
    n = 5000
    df = pd.DataFrame(
        {
            "a": rng.normal(0, 1, n),
            "b": rng.integers(18, 90, n),
            "c": rng.lognormal(10, 1, n),
            "d": rng.choice(["u", "v"], n),
        }
    )
    schema = Schema(
        columns=[
            Column("a", "continuous"),
            Column("b", "continuous", integer=True),
            Column("c", "continuous"),
            Column("d", "categorical", categories=["u", "v"]),
        ]
    )
    data = validate(df, schema)
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    out = release_schema(
        data, schema, ledger, epsilon=1.0, num_rows=n + 17.0, generator=mech.noise_generator(3)
    )
    [release] = ledger.releases
    assert (release.name, release.mechanism, release.count) == ("data/bounds", "exponential", 6)
    assert ledger.spent == pytest.approx(1.0, rel=1e-3) and ledger.spent <= 1.0 * (1 + 1e-9)
    q = quantile_level(release.epsilon, n + 17.0)
    for name in "abc":
        x, (lo, hi) = data[name], out[name].bounds
        assert lo < x.quantile(3 * q) and hi > x.quantile(1 - 3 * q)  # rank error below 2q·n
        # not in the outer intervals [−R, min], [max, R] (where a bound is uniform in asinh)
        assert np.arcsinh(lo) > np.arcsinh(x.min()) - 0.5 and np.arcsinh(hi) < np.arcsinh(x.max()) + 0.5
    lo, hi = out["b"].bounds
    assert lo == int(lo) and hi == int(hi)
    assert out["d"].categories == ["u", "v"]
