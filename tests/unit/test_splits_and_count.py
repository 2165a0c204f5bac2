"""The run's view of its rows: a split that moves no other row, and n only as a DP or public count."""

import math

import numpy as np
import pandas as pd
import pytest

from lightning_dp.data.canonical import canonical_frame, canonical_images
from lightning_dp.data.dp_count import RELEASE_NAME, RowCount, release_row_count
from lightning_dp.data.schema import Column, DataError, Schema
from lightning_dp.data.splits import holdout_mask, row_uniforms, subsample_mask
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.privacy.mechanisms import noise_generator

SCHEMA = Schema([Column("x", "continuous", missing=True), Column("c", "categorical", missing=True)])


def _raw(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"x": rng.normal(size=n).round(6).astype(str), "c": rng.choice(list("abc"), n)})


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    return canonical_frame(_raw(n, seed), SCHEMA)


def test_adding_or_removing_a_row_moves_no_other_row():
    d = _frame(2000)
    held = holdout_mask(d, fraction=0.2, seed=0)
    assert abs(held.mean() - 0.2) < 0.03
    plus = pd.concat([d.iloc[:700], _frame(1, seed=9), d.iloc[700:]], ignore_index=True)  # a row in the middle
    held_plus = holdout_mask(plus, fraction=0.2, seed=0)
    assert np.array_equal(np.delete(held_plus, 700), held)
    assert np.array_equal(holdout_mask(d.iloc[1:], fraction=0.2, seed=0), held[1:])  # removal
    assert np.array_equal(holdout_mask(d.iloc[::-1], fraction=0.2, seed=0), held[::-1])  # order is irrelevant


def test_the_seed_is_a_key_and_purposes_are_independent():
    d = _frame(5000)
    a, b = holdout_mask(d, fraction=0.5, seed=0), holdout_mask(d, fraction=0.5, seed=1)
    assert 0.4 < (a == b).mean() < 0.6  # independent assignments agree half the time
    u, v = row_uniforms(d, purpose="holdout", seed=0), row_uniforms(d, purpose="subsample", seed=0)
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.05
    assert ((u >= 0) & (u <= 1)).all()
    assert abs(subsample_mask(d, rate=0.1, seed=0).mean() - 0.1) < 0.02


def test_images_are_hashed_by_their_pixels_not_their_position():
    images = np.random.default_rng(0).random((300, 8, 8)).astype(np.float32)
    rows = canonical_images(images, np.arange(300) % 10)
    held = holdout_mask(rows, fraction=0.3, seed=0)
    assert np.array_equal(holdout_mask(rows[::-1], fraction=0.3, seed=0), held[::-1])
    with pytest.raises(ValueError, match="holdout_fraction"):
        holdout_mask(rows, fraction=1.0, seed=0)


def test_an_image_row_does_not_depend_on_the_file_dtype():
    pixels = np.random.default_rng(1).integers(0, 256, size=(50, 8, 8))
    as_bytes = pixels.astype(np.uint8).astype(np.float32) / np.float32(255.0)  # an 8-bit file
    as_floats = (pixels / 255.0).astype(np.float64).astype(np.float32)  # the same pixels saved as floats
    labels = np.arange(50) % 10
    assert np.array_equal(canonical_images(as_bytes, labels), canonical_images(as_floats, labels))


def test_a_row_does_not_move_when_another_row_changes_the_file_format(tmp_path):
    """One missing value makes pandas write every integer of the column as ``79.0``, and Parquet store it as
    float64: the canonical rows, and so the split, are the same."""
    d = pd.DataFrame({"x": np.arange(300) % 90, "c": np.random.default_rng(0).choice(list("ab"), 300)})
    plus = pd.concat([d, pd.DataFrame({"x": [np.nan], "c": ["a"]})], ignore_index=True)
    d.to_csv(tmp_path / "d.csv", index=False)
    plus.to_csv(tmp_path / "p.csv", index=False)
    d.to_parquet(tmp_path / "d.parquet")
    plus.to_parquet(tmp_path / "p.parquet")
    from lightning_dp.data.sources import read_table

    assert "79.0" in (tmp_path / "p.csv").read_text() and "79.0" not in (tmp_path / "d.csv").read_text()
    assert read_table(tmp_path / "d.parquet")["x"].dtype != read_table(tmp_path / "p.parquet")["x"].dtype
    masks = [holdout_mask(canonical_frame(read_table(tmp_path / f), SCHEMA), fraction=0.3, seed=0)
             for f in ("d.csv", "p.csv", "d.parquet", "p.parquet")]
    assert np.array_equal(masks[0], masks[1][:-1]) and np.array_equal(masks[0], masks[2])
    assert np.array_equal(masks[0], masks[3][:-1])


def test_the_count_is_released_on_the_ledger_with_a_share_of_the_renyi_budget():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    alone = ledger.calibrate(lambda s: [Release(name="g", mechanism="gaussian", sensitivity=1.0, noise_multiplier=s)])
    values = [release_row_count(458, PrivacyLedger(target_epsilon=1.0, delta=1e-5), budget_fraction=0.02,
                                generator=noise_generator(s)) for s in range(300)]
    assert values[0].source == "dp" and values[0].std == pytest.approx(alone / math.sqrt(0.02), rel=1e-3)
    draws = np.array([v.value for v in values])
    assert draws.mean() == pytest.approx(458, abs=4 * values[0].std / math.sqrt(300))
    assert draws.std() == pytest.approx(values[0].std, rel=0.15)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    count = release_row_count(458, ledger, budget_fraction=0.02, generator=noise_generator(0))
    assert [r.name for r in ledger.releases] == [RELEASE_NAME] and ledger.releases[0].sensitivity == 1.0
    # what is left buys a Gaussian with noise grown by exactly 1/√(1 − f)
    rest = ledger.calibrate(lambda s: [Release(name="g", mechanism="gaussian", sensitivity=1.0, noise_multiplier=s)])
    assert rest == pytest.approx(alone / math.sqrt(0.98), rel=2e-3)
    assert RowCount.from_dict(count.to_dict()) == count


def test_a_public_count_is_checked_and_replace_one_spends_nothing():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    assert release_row_count(458, ledger, budget_fraction=0.02, generator=noise_generator(0),
                             public_num_rows=458) == RowCount(458.0, "public")
    with pytest.raises(DataError, match="public_num_rows=455 is not the number of training rows"):
        release_row_count(458, ledger, budget_fraction=0.02, generator=noise_generator(0), public_num_rows=455)
    replace = PrivacyLedger(target_epsilon=1.0, delta=1e-5, adjacency="replace_one")
    assert release_row_count(458, replace, budget_fraction=0.02, generator=noise_generator(0)).source == "replace_one"
    assert not ledger.releases and not replace.releases


def test_a_csv_without_schema_is_refused_with_a_template(tmp_path):
    from lightning_dp.data.sources import load_csv

    path = tmp_path / "rows.csv"
    pd.DataFrame({"age": ["31", "45"], "job": ["a", "b"]}).to_csv(path, index=False)
    with pytest.raises(DataError, match="needs data.schema=PATH") as err:
        load_csv(path=str(path))
    assert '- {name: "age", type: continuous, integer: true}' in str(err.value) and '"job"' in str(err.value)
    assert "31" not in str(err.value)  # types proposed from the rows for the operator, never a value


def test_npz_classes_come_from_config_not_from_the_labels(tmp_path):
    from lightning_dp.data.sources import load_npz

    path = tmp_path / "x.npz"
    np.savez(path, images=np.zeros((4, 2, 2), np.uint8), labels=np.array([0, 1, 1, 0]))
    with pytest.raises(DataError, match="data.num_classes"):
        load_npz(path=str(path))
    assert load_npz(path=str(path), num_classes=10).classes == [str(i) for i in range(10)]
    with pytest.raises(DataError, match=r"labels must be integers in 0..0"):
        load_npz(path=str(path), num_classes=1)


def test_max_rows_is_a_hash_subsample_at_a_rate_from_the_released_count(tmp_path):
    from lightning_dp.data.datamodule import PrivateDataModule

    schema = tmp_path / "s.yaml"
    schema.write_text("columns:\n  - {name: x, type: continuous, bounds: [-10, 10]}\n"
                      "  - {name: c, type: categorical, categories: [a, b, c]}\n")
    d = _frame(3000)
    d.to_csv(tmp_path / "d.csv", index=False)
    pd.concat([_frame(1, seed=5), d], ignore_index=True).to_csv(tmp_path / "p.csv", index=False)
    kept = []
    for name in ("d", "p"):
        dm = PrivateDataModule(name="csv", path=str(tmp_path / f"{name}.csv"), schema=str(schema), max_rows=500,
                               public_num_rows=None, holdout_fraction=0.0)
        dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=1e-5), generator=noise_generator(0))
        kept.append(set(dm.train_frame["x"].astype(str) + dm.train_frame["c"]))
        assert dm.row_count.source == "dp" and abs(dm.row_count.value - 500) < 1
    assert len(kept[1] - kept[0]) <= 1 and not kept[0] - kept[1]  # the same noise: the same rate, one row more at most
    assert 380 < len(kept[0]) < 620
