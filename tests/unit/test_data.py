import numpy as np
import pandas as pd
import pytest

from lightning_dp.data.dp_preprocessing import release_schema
from lightning_dp.data.encoders import TabularEncoder
from lightning_dp.data.schema import Column, DataError, Schema, validate
from lightning_dp.data.sources import load_source
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger
from tests.conftest import shared


def toy_schema(**overrides) -> Schema:
    cols = [
        Column("age", "continuous", bounds=[0, 100], integer=True),
        Column("income", "continuous", bounds=[0, 1000], missing=True),
        Column("city", "categorical", categories=["a", "b", "c"], missing=True),
        Column("label", "categorical", categories=["no", "yes"]),
    ]
    return Schema(columns=cols, label="label", missing_values=["?"], **overrides)


def toy_frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "age": rng.integers(18, 90, n).astype(str),
            "income": np.round(rng.uniform(0, 1000, n), 2).astype(str),
            "city": rng.choice(["a", "b", "c"], n),
            "label": rng.choice(["no", "yes"], n),
        }
    )
    df.loc[rng.random(n) < 0.3, "income"] = "?"
    df.loc[rng.random(n) < 0.1, "city"] = "?"
    return df


def test_unknown_and_absent_columns_are_named():
    df = toy_frame().rename(columns={"city": "town"})
    with pytest.raises(DataError, match=r"not in the schema: \['town'\].*missing from the file: \['city'\]"):
        validate(df, toy_schema())


def test_non_numeric_value_names_column_rows_and_fix():
    df = toy_frame()
    df.loc[[3, 7], "age"] = "forty"
    with pytest.raises(DataError, match=r"'age'.*'forty'.*lines 5, 9.*declare the column categorical"):  # row indices 3, 7: file lines 5, 9
        validate(df, toy_schema())


def test_missing_values_where_not_allowed():
    df = toy_frame()
    df.loc[5, "label"] = "?"
    with pytest.raises(DataError, match=r"'label' has missing values.*lines 7.*missing: true"):
        validate(df, toy_schema())


def test_round_trip_keeps_columns_dtypes_and_missing():
    schema = toy_schema()
    df = validate(toy_frame(), schema)
    enc = TabularEncoder(schema)
    x, y = enc.transform(df)
    assert x.shape == (200, 2 + 2 + 4)  # 2 continuous, income indicator (2), city + <missing> (4)
    back = enc.inverse_transform(x, y)
    assert list(back.columns) == schema.names
    assert back["age"].dtype == np.int64 and back["income"].dtype == float
    assert back["income"].isna().equals(df["income"].isna())
    np.testing.assert_allclose(back["income"].dropna(), df["income"].dropna(), rtol=1e-5)
    assert (back["age"] == df["age"]).all()
    assert back["city"].fillna("NA").equals(df["city"].fillna("NA"))
    assert (back["label"] == df["label"]).all()


def test_one_hot_blocks_have_one_one_each():
    enc = TabularEncoder(toy_schema())
    x, _ = enc.transform(validate(toy_frame(), toy_schema()))
    cat = x[:, enc.n_continuous :]
    assert float(cat.sum(1).unique().item()) == len(enc.blocks)


def test_dp_release_of_missing_bounds_and_categories_is_charged():
    rng = np.random.default_rng(1)
    n = 20_000
    df = pd.DataFrame(
        {
            "x": rng.normal(50, 10, n).round(3).astype(str),
            "c": rng.choice(["p", "q", "r"], n, p=[0.5, 0.3, 0.2]),
            "y": rng.choice(["0", "1"], n),
        }
    )
    df.loc[0, "c"] = "unique-person"  # a value held by one row must not be released
    schema = Schema(
        columns=[Column("x", "continuous"), Column("c", "categorical"), Column("y", "categorical")], label="y"
    )
    data = validate(df, schema)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-6)
    out = release_schema(
        data, schema, ledger, epsilon=0.5, num_rows=n + 12.0, generator=mech.noise_generator(0)
    )
    assert out["c"].categories == ["p", "q", "r"] and out["y"].categories == ["0", "1"]
    lo, hi = out["x"].bounds
    assert 15 <= lo <= 35 and 65 <= hi <= 90
    names = [r.name for r in ledger.releases]
    assert names == ["data/bounds", "data/categories"]
    assert ledger.releases[1].delta > 0
    assert 0 < ledger.spent <= 0.5 * 1.0001
    enc = TabularEncoder(out)
    assert not enc.keep_mask(data)[0] and enc.keep_mask(data)[1:].all()


def test_adult_loader_reads_both_splits():
    shared("adult")
    src = load_source("adult")
    assert len(src.train) == 32561 and len(src.test) == 16281
    assert set(src.test["income"]) == {"<=50K", ">50K"}
    df = validate(src.train, src.schema)
    assert df["workclass"].isna().sum() == 1836  # '?' cells are modelled, not dropped


def test_cervical_has_missing_values_modelled():
    shared("cervical")
    src = load_source("cervical")
    df = validate(src.train, src.schema)
    assert len(df) == 858 and df.isna().any().sum() == 26


def test_bundled_data_set_takes_a_modified_schema(tmp_path):
    """data.schema=PATH replaces a bundled data set's shipped schema (its keys changed, the same column names); a
    schema naming other columns is refused with the fix, before anything is read from rows."""
    import yaml

    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.data.sources import bundled_schema

    shipped = bundled_schema("breast_cancer").to_dict()
    radius = next(c for c in shipped["columns"] if c["name"] == "mean radius")
    assert radius["bounds"] != [0.0, 50.0]
    radius["bounds"] = [0.0, 50.0]
    mine = tmp_path / "breast_cancer.yaml"
    mine.write_text(yaml.safe_dump(shipped))
    dm = PrivateDataModule(name="breast_cancer", schema=str(mine), holdout_fraction=0.0, public_num_rows=569,
                           representation="minmax")
    dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=1e-5), generator=mech.noise_generator(0))
    released = dm.state_dict()["schema"]
    assert next(c for c in released["columns"] if c["name"] == "mean radius")["bounds"] == [0.0, 50.0]
    assert load_source("breast_cancer").schema["mean radius"].bounds == bundled_schema("breast_cancer")[
        "mean radius"].bounds  # without data.schema: the shipped one

    radius["name"] = "radius"
    mine.write_text(yaml.safe_dump(shipped))
    with pytest.raises(DataError, match=r"must name exactly the breast_cancer columns: missing \['mean radius'\], "
                                        r"unknown \['radius'\]"):
        load_source("breast_cancer", schema=mine)
