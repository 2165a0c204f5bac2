"""Cells (spikes, quantile bins, missing) and their DP release: exact round trips, exact decoding, the ledger."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dp.data.dp_cells import cells_from_counts, fine_grid, needs_cells, release_cells
from lightning_dp.data.encoders import TabularEncoder
from lightning_dp.data.representation import Cells, round_within
from lightning_dp.data.schema import Column, DataError, Schema, validate
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger


def test_integer_cells_round_trip_exactly_and_skip_spikes():
    cells = Cells(spikes=(0.0, 5.0), edges=(0.0, 3.0, 10.0, 20.0), integer=True)
    v = np.arange(0, 21, dtype=float)
    idx, pos = cells.to_cells(v)
    assert list(idx[[0, 5]]) == [0, 1]  # spikes first
    assert list(idx[[1, 2, 3, 9, 10, 20]]) == [2, 2, 3, 3, 4, 4]  # bins [0, 3) [3, 10) [10, 20]
    assert np.all((pos >= 0) & (pos <= 1))
    np.testing.assert_array_equal(cells.from_cells(idx, pos), v)
    # any position in the bin [3, 10) decodes to one of its non-spike integers, never the spike 5
    out = cells.from_cells(np.full(1001, 3), np.linspace(0, 1, 1001))
    assert set(out) == {3.0, 4.0, 6.0, 7.0, 8.0, 9.0}


def test_continuous_cells_with_missing_and_decimals():
    cells = Cells(spikes=(0.0,), edges=(0.0, 10.0, 1000.0), missing=True, decimals=2)
    v = np.array([0.0, 0.01, 9.99, 10.0, 999.99, 1000.0, np.nan])
    idx, pos = cells.to_cells(v)
    assert list(idx) == [0, 1, 1, 2, 2, 2, 3]
    np.testing.assert_allclose(cells.from_cells(idx, pos), v, equal_nan=True)
    out = cells.from_cells(np.full(500, 2), np.random.default_rng(0).random(500))
    assert np.allclose(np.round(out * 100), out * 100, rtol=0, atol=1e-6) and out.min() >= 10 and out.max() <= 1000
    assert cells.names == ("=0", "[0, 10)", "[10, 1000]", "<missing>")


def test_rounding_never_leaves_the_bounds():
    out = round_within(np.array([-5.0, 0.004, 10.006, 99.0]), lo=0.004, hi=10.006, decimals=2)
    np.testing.assert_allclose(out, [0.01, 0.01, 10.0, 10.0])


def test_schema_keys_are_checked():
    with pytest.raises(DataError, match="spikes"):
        Column("a", "continuous", bounds=[0, 10], spikes=[11])
    with pytest.raises(DataError, match="integers"):
        Column("a", "continuous", bounds=[0, 10], integer=True, bins=[0, 2.5, 10])
    with pytest.raises(DataError, match="bounds"):
        Column("a", "continuous", bounds=[0, 10], bins=[1, 5, 10])
    with pytest.raises(DataError, match="continuous columns only"):
        Column("a", "categorical", categories=["x"], spikes=[0])
    with pytest.raises(DataError, match="decimals"):
        Column("a", "continuous", bounds=[0, 1], decimals=-1)
    col = Column("a", "continuous", bins=[0, 1, 5])
    assert col.bounds == [0.0, 5.0]
    # a schema without the new keys writes the same dict as before them (older data states)
    assert "spikes" not in Schema([Column("a", "continuous", bounds=[0, 1])]).to_dict()["columns"][0]


def claims_like(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    vehicle = rng.random(n) < 0.6
    premium = np.where(rng.random(n) < 0.4, 0.0, np.round(np.exp(rng.normal(6.5, 0.8, n)), 2))
    return pd.DataFrame({"premium": np.clip(premium, 0, 20000).astype(str),
                         "vehicle_age": np.where(vehicle, rng.integers(0, 21, n).astype(str), "?"),
                         "kind": np.where(vehicle, "vehicle", "home")})


def claims_schema(**premium) -> Schema:
    return Schema([Column("premium", "continuous", bounds=[0, 20000], decimals=2, **premium),
                   Column("vehicle_age", "continuous", bounds=[0, 30], integer=True, missing=True),
                   Column("kind", "categorical", categories=["home", "vehicle"])], missing_values=["?"])


def test_dp_release_finds_the_spike_and_quantile_bins_and_is_charged():
    schema = claims_schema()
    df = validate(claims_like(20000), schema)
    assert [c.name for c in needs_cells(schema)] == ["premium", "vehicle_age"]
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    released, minmax = release_cells(df, schema, ledger, epsilon=0.1, num_rows=20000,
                                     generator=mech.noise_generator(0))
    assert minmax == []
    (rel,) = ledger.releases
    assert rel.name == "data/cells" and rel.sensitivity == pytest.approx(math.sqrt(2))
    assert ledger.spent == pytest.approx(0.1, rel=1e-2)
    premium = released["premium"]
    assert premium.spikes == [0.0]  # the 40% zeros, found with DP
    edges = np.asarray(premium.bins)
    inner = df["premium"][df["premium"] > 0]
    shares = np.histogram(inner, bins=edges)[0] / len(inner)
    assert len(edges) - 1 >= 8 and shares.max() < 0.25  # quantile bins, not equal width (one would hold ~all)
    assert released["vehicle_age"].bins[0] == 0 and released["vehicle_age"].bins[-1] == 30


def test_too_few_rows_release_nothing_and_keep_unknown_columns_minmax():
    schema = claims_schema(spikes=[0])
    df = validate(claims_like(300), schema)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    released, minmax = release_cells(df, schema, ledger, epsilon=0.1, num_rows=300, generator=mech.noise_generator(0))
    assert ledger.releases == [] and released["premium"].spikes == [0.0]
    assert released["premium"].bins == pytest.approx(np.linspace(0, 20000, 11).tolist())
    assert minmax == ["vehicle_age"] and released["vehicle_age"].bins is None  # nothing known: one min-max number


def test_declared_cells_release_nothing_and_encode_missing_as_a_cell():
    schema = claims_schema(spikes=[0], bins=[0, 100, 1000, 20000])
    schema = Schema([schema["premium"], Column("vehicle_age", "continuous", bounds=[0, 30], integer=True,
                                                missing=True, spikes=[], bins=[0, 5, 10, 30]), schema["kind"]],
                    missing_values=["?"])
    assert needs_cells(schema) == []
    df = validate(claims_like(500), schema)
    enc = TabularEncoder(schema, representation="cells")
    x, _ = enc.transform(df)
    assert enc.n_continuous == 2 and enc.block_sizes == [4, 4, 2]  # =0 + 3 bins; 3 bins + missing; kind
    back = enc.inverse_transform(x)
    pd.testing.assert_frame_equal(back, df.assign(vehicle_age=df["vehicle_age"].astype("Int64")), check_dtype=False)


def test_preflight_layout_counts_declared_cells_and_lower_bounds_released_ones():
    from lightning_dp.preflight import schema_layout

    declared = Schema([Column("premium", "continuous", bounds=[0, 20000], spikes=[0], bins=[0, 100, 1000, 20000]),
                       Column("vehicle_age", "continuous", bounds=[0, 30], integer=True, missing=True),
                       Column("kind", "categorical", categories=["home", "vehicle"])], missing_values=["?"])
    width = lambda layout: layout["n_continuous"] + sum(layout["block_sizes"])  # noqa: E731
    assert width(schema_layout(declared)) == 2 + 2 + 2  # minmax: two numbers, vehicle_age's indicator, kind
    cells = schema_layout(declared, "cells")
    # premium's 4 cells are exact; vehicle_age's cells come from a later release: counted as its min-max width
    assert cells["block_sizes"] == [2, 4, 2] and width(cells) == 2 + 8
    assert schema_layout(declared, "cells", ["premium"])["block_sizes"] == [2, 2]  # as a model's min-max column
    released = TabularEncoder(Schema([declared["premium"], Column("vehicle_age", "continuous", bounds=[0, 30],
                                                                  integer=True, missing=True, spikes=[], bins=[0, 30]),
                                      declared["kind"]], missing_values=["?"]), representation="cells")
    assert released.dim >= width(cells)  # the fewest cells a release gives (one bin + missing) is not narrower


def test_fine_grid_of_a_short_integer_column_is_every_value():
    col = Column("h", "continuous", bounds=[1, 99], integer=True)
    grid = fine_grid(col)
    assert len(grid.edges) == 0 and len(grid.points) == 99
    counts = np.zeros(99)
    counts[39] = 5000  # 40 hours
    counts += 100
    spikes, edges = cells_from_counts(col, grid, counts, std=1.0, bins=10)
    assert spikes == [40.0] and edges[0] == 1 and edges[-1] == 99


def test_checkpoint_state_without_representation_decodes_as_minmax():
    schema = claims_schema(spikes=[0], bins=[0, 100, 20000])
    state = {"kind": "tabular", "schema": schema.to_dict()}  # written before cells
    enc = TabularEncoder.from_state_dict(state)
    assert enc.representation == "minmax" and enc.block_sizes == [2, 2]
    x = torch.tensor([[0.5, 0.1, 1.0, 0.0, 0.0, 1.0]])
    assert enc.inverse_transform(x)["premium"].iloc[0] == 10000.0


def test_csv_without_schema_proposes_types_without_bounds(tmp_path):
    from lightning_dp.data.sources import load_csv

    rows = claims_like(400)
    rows.to_csv(tmp_path / "claims.csv", index=False)
    with pytest.raises(DataError) as err:
        load_csv(tmp_path / "claims.csv")
    text = str(err.value)
    assert '{name: "premium", type: continuous, decimals: 2, spikes: [0]}' in text
    (age,) = [line for line in text.splitlines() if '"vehicle_age"' in line]
    assert "type: continuous, integer: true" in age and "missing: true" in age
    assert '{name: "kind", type: categorical}' in text and "shown only to you" in text
    assert "bounds: [" not in text.split("columns:")[-1]  # no private extremes in the proposal


def test_grid_histograms_of_neighbouring_tables_differ_by_at_most_the_stated_sensitivity():
    """dp_cells' sensitivity: one row more (or less) moves one count per column by one, so the concatenated
    histogram moves by √K in L2; replacing a row moves two counts per column: √(2K)."""
    schema = claims_schema()
    df = validate(claims_like(2000, seed=3), schema)
    cols = needs_cells(schema)
    grids = [fine_grid(c) for c in cols]

    def hist(frame: pd.DataFrame) -> np.ndarray:
        return np.concatenate([g.counts(frame[c.name].to_numpy(dtype=float)) for c, g in zip(cols, grids)])

    base = hist(df)
    extreme = pd.DataFrame({"premium": [20000.0], "vehicle_age": [30.0], "kind": ["vehicle"]})
    for i in (0, 7, 1999):
        removed = hist(df.drop(index=i))
        added = hist(pd.concat([df, extreme], ignore_index=True))
        replaced = hist(pd.concat([df.drop(index=i), extreme], ignore_index=True))
        assert np.linalg.norm(base - removed) <= math.sqrt(len(cols)) + 1e-9
        assert np.linalg.norm(base - added) <= math.sqrt(len(cols)) + 1e-9
        assert np.linalg.norm(base - replaced) <= math.sqrt(2 * len(cols)) + 1e-9


@pytest.mark.parametrize("rep", ["cells", {"kind": "fancy"}, {"kind": "cells", "minmax_columns": "premium"}])
def test_a_malformed_saved_representation_is_refused_in_one_line(rep):
    state = {"kind": "tabular", "schema": claims_schema(spikes=[0], bins=[0, 100, 20000]).to_dict(),
             "representation": rep}
    with pytest.raises(DataError):
        TabularEncoder.from_state_dict(state)
