"""GEM's level counts before any release (``GEM.possible_levels``): exact where the schema declares the cells, an
upper bound over every outcome of the DP cells release, and the two refusals that use them."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from lightning_dp.callbacks.adaptive_marginals import AdaptiveMarginals
from lightning_dp.data.dp_cells import cells_without_release, most_cells, release_cells
from lightning_dp.data.encoders import TabularEncoder, column_cells
from lightning_dp.data.schema import Column, Schema
from lightning_dp.errors import ConfigError
from lightning_dp.models.gem import GEM, MAX_LEVELS, Discretisation
from lightning_dp.nets.marginal_nets import ProductGenerator
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger

MODULE = {"bins": 32, "degree": 2}
LABEL = Column("y", "categorical", categories=["a", "b"])


def model_levels(schema: Schema, representation: str, bins: int = 32) -> list[int]:
    """The levels a run's GEM has for a complete schema (its encoder's layout, as the run builds it)."""
    layout = TabularEncoder(schema, representation=representation).layout
    return list(Discretisation.of(n_continuous=layout["n_continuous"], block_sizes=layout["block_sizes"],
                                  num_classes=layout["num_classes"], continuous_units=layout["continuous_units"],
                                  bins=bins, continuous_cells=layout["continuous_cells"]).levels)


def test_declared_cells_and_minmax_levels_are_counted_exactly():
    schema = Schema(columns=[
        Column("gain", "continuous", bounds=[0, 1000], integer=True, spikes=[0, 1000], bins=[0, 10, 100, 1000],
               missing=True),
        Column("hours", "continuous", bounds=[1, 99], integer=True, spikes=[40], bins=[1, 20, 40, 60, 99]),
        Column("premium", "continuous", bounds=[0.0, 5.0], decimals=2, spikes=[], bins=[0.0, 1.0, 5.0], missing=True),
        Column("age", "continuous", bounds=[17, 40], integer=True, spikes=[], bins=[17, 30, 40]),
        Column("work", "categorical", categories=["x", "y", "z"], missing=True),
        LABEL], label="y")
    for representation in ("cells", "minmax"):
        (levels,) = GEM.possible_levels(MODULE, schema, {"representation": representation})  # nothing to release
        assert Counter(levels) == Counter(model_levels(schema, representation)), representation
    # cells: 2 + 3 + 1 = 6, 1 + 4 = 5, 0 + 2 + 1 = 3, 2; the categories 3 + 1; the label 2. Min-max: 34 + the
    # missing indicator 2, 34, 34 + 2, 24 values, 4, 2 (the old count, also used under cells, said 34 + 2 for gain).
    assert sorted(GEM.possible_levels(MODULE, schema, {"representation": "cells"})[0]) == [2, 2, 3, 4, 5, 6]
    assert sorted(GEM.possible_levels(MODULE, schema, {"representation": "minmax"})[0]) == [2, 2, 2, 4, 24, 34, 34, 34]


def released_rows(column: Column, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows with point masses (the bounds, 0, a few integers), a heavy tail and missing values."""
    lo, hi = column.bounds
    v = lo + (hi - lo) * rng.beta(0.3, 2.0, n)
    heavy = rng.choice(np.unique([lo, hi, min(max(0.0, lo), hi), *rng.uniform(lo, hi, 8)]), n)
    v = np.where(rng.random(n) < rng.uniform(0.2, 0.9), heavy, v)
    if column.integer:
        v = np.round(v)
    if column.missing:
        v[rng.random(n) < 0.1] = np.nan
    return v


@pytest.mark.parametrize("data_bins", [4, 20, 50])
def test_released_cells_never_exceed_the_bound_and_too_few_rows_give_the_fallback(data_bins):
    rng = np.random.default_rng(data_bins)
    columns = [
        Column("short", "continuous", bounds=[0, 30], integer=True, missing=True),  # one grid point per integer
        Column("count", "continuous", bounds=[0, 12], integer=True),
        Column("money", "continuous", bounds=[0, 99999], integer=True, spikes=[0]),
        Column("ratio", "continuous", bounds=[-1.0, 3.0]),
        Column("rate", "continuous", bounds=[0.0, 1.0], bins=8, missing=True),
        Column("score", "continuous", bounds=[0.0, 100.0], bins=[0.0, 50.0, 90.0, 100.0]),
    ]
    schema = Schema(columns=columns)
    for seed in range(3):
        df = pd.DataFrame({c.name: released_rows(c, 20000, rng) for c in columns})
        ledger = PrivacyLedger(target_epsilon=4.0, delta=1e-5)
        released, minmax = release_cells(df, schema, ledger, epsilon=2.0, num_rows=20000.0, bins=data_bins,
                                         generator=mech.noise_generator(seed))
        assert not minmax and ledger.has("data/cells")
        for before, after in zip(columns, released.columns, strict=True):
            assert column_cells(after).size <= most_cells(before, bins=data_bins), (before.name, seed)
    if data_bins == 50:  # a smooth column's release above the old count (a min-max column: 32 bins + 2 bounds)
        smooth = Schema(columns=[Column("smooth", "continuous", bounds=[0.0, 1.0])])
        released, _ = release_cells(pd.DataFrame({"smooth": rng.uniform(0, 1, 20000)}), smooth,
                                    PrivacyLedger(target_epsilon=4.0, delta=1e-5), epsilon=2.0, num_rows=20000.0,
                                    bins=data_bins, generator=mech.noise_generator(0))
        assert 34 < column_cells(released["smooth"]).size <= most_cells(smooth["smooth"], bins=data_bins) == 51
    ledger = PrivacyLedger(target_epsilon=4.0, delta=1e-5)
    few, minmax = release_cells(df.head(50), schema, ledger, epsilon=0.1, num_rows=50.0, bins=data_bins,
                                generator=mech.noise_generator(0))
    assert not ledger.releases and minmax == ["short", "count", "ratio"]
    for before, after in zip(columns, few.columns, strict=True):
        expected = cells_without_release(before, bins=data_bins)
        assert (expected is None) == (before.name in minmax)
        if expected is not None:
            assert column_cells(after).size == expected, before.name


def test_memory_refusal_uses_the_upper_bound_and_the_released_layout_is_checked_again():
    edges = [float(x) for x in range(0, 901)]  # 900 declared bins: 900 cells, 34 levels as a min-max column
    schema = Schema(columns=[Column(f"c{i}", "continuous", bounds=[0.0, 900.0], spikes=[], bins=edges)
                             for i in range(10)])
    GEM.check_schema(MODULE, schema, data={"representation": "minmax"})  # 10 · 34 levels
    with pytest.raises(ConfigError, match="9,000 levels together, above 8,192"):
        GEM.check_schema(MODULE, schema, data={"representation": "cells"})
    # DP quantile bins: 41 columns of at most 2 + 200 cells (a release may give fewer; the refusal must not wait)
    wide = Schema(columns=[Column(f"c{i}", "continuous", bounds=[0.0, 1.0]) for i in range(41)])
    GEM.check_schema(MODULE, wide, data={"representation": "cells", "bins": 20})
    with pytest.raises(ConfigError, match="data.bins lower"):
        GEM.check_schema(MODULE, wide, data={"representation": "cells", "bins": 200})
    # a category list left to a DP release counts 2 before it; the run's own layout is checked when GEM is built
    levels = [MAX_LEVELS // 2 + 1, MAX_LEVELS // 2]
    with pytest.raises(ConfigError, match="8,193 levels"):
        GEM(ProductGenerator(level_sizes=levels, hidden=[4]), n_continuous=0, block_sizes=levels[:1],
            num_classes=levels[1])


def test_rounds_refusal_counts_the_fewest_columns_the_release_can_leave():
    # six continuous columns with missing values: under cells one column each (the missing value is a cell), as
    # min-max columns (too few rows for the cells release) two each; with the label 7 or 13 columns
    schema = Schema(columns=[*[Column(f"c{i}", "continuous", bounds=[0, 50], integer=True, missing=True)
                               for i in range(6)], LABEL], label="y")
    data = {"representation": "cells"}
    assert sorted(len(levels) for levels in GEM.possible_levels(MODULE, schema, data)) == [7, 13]
    for rounds in (7, 12):  # 7·0.9 ≤ 7: works when the cells are released (the old count, 13, refused it)
        AdaptiveMarginals.check_plan({"rounds": rounds}, GEM, MODULE, schema, data=data)
    with pytest.raises(ConfigError, match="at least 7"):
        AdaptiveMarginals.check_plan({"rounds": 6}, GEM, MODULE, schema, data=data)
    with pytest.raises(ConfigError, match="the 13 1-way marginals"):  # min-max: always 13 columns
        AdaptiveMarginals.check_plan({"rounds": 11}, GEM, MODULE, schema, data={"representation": "minmax"})
    released = Schema(columns=[Column(c.name, c.type, bounds=c.bounds, integer=True, missing=True, spikes=[],
                                      bins=[0, 10, 50]) if c.type == "continuous" else c for c in schema.columns],
                      label="y")
    assert len(model_levels(released, "cells")) == 7  # the run's own count after a release: the plan works
