"""bench/peers.py scores synthetic CSVs against real frames in the schema's category strings (Cervical's 0/1
columns came back from ``read_csv`` as 0 / 0.0 and mismatched every real category: 2-way TV 0.71)."""

import io

import numpy as np
import pandas as pd

from audits.fidelity import two_way_marginal_error
from bench.peers import MISSING, as_categories


def test_numeric_looking_categories_read_back_as_the_schema_strings():
    real = pd.DataFrame({"smokes": ["0", "1", np.nan, "0"], "dx": ["1", "0", "0", "1"],
                         "age": [20.0, 31.0, 45.0, 27.0]}).astype({"smokes": object, "dx": object})
    back = pd.read_csv(io.StringIO(real.to_csv(index=False)))  # smokes: 0.0/1.0/NaN, dx: 0/1 (numbers)
    assert back["smokes"].dtype == float and back["dx"].dtype == np.int64
    raw = two_way_marginal_error(real, back.astype({"smokes": object, "dx": object}), categorical=["smokes", "dx"])
    assert raw["mean"] > 0.5  # the bug: nothing matches
    for c in ("smokes", "dx"):
        back[c] = as_categories(back[c], ["0", "1"])
    assert back["smokes"].tolist()[:2] == ["0", "1"] and pd.isna(back["smokes"][2])
    assert back["dx"].tolist() == real["dx"].tolist()
    assert two_way_marginal_error(real, back, categorical=["smokes", "dx"])["mean"] == 0.0


def test_peer_tokens_and_text_categories():
    col = pd.Series(["<=50K", MISSING, ">50K", np.nan], dtype=object)
    out = as_categories(col, ["<=50K", ">50K"])
    assert out[0] == "<=50K" and out[2] == ">50K" and pd.isna(out[1]) and pd.isna(out[3])
    assert as_categories(pd.Series([2.0, 1.0]), ["1", "2"]).tolist() == ["2", "1"]


def test_the_wide_tables_seeds_draw_rows_of_one_population():
    # the seed drew the categorical weights too, so held-out rows (seed 1) came from another table: real-vs-real
    # 2-way TV 0.20 in the bench
    from bench.wide_table import wide_table

    a, b = wide_table(4000, seed=0), wide_table(4000, seed=1)
    assert not a.equals(b)
    for c in [c for c in a.columns if c.startswith("cat_")]:
        pa, pb = a[c].value_counts(normalize=True), b[c].value_counts(normalize=True)
        assert (pa.sub(pb, fill_value=0).abs().sum() / 2) < 0.05, c


def test_a_synthetic_label_of_one_class_scores_as_a_constant_predictor_not_a_crash():
    # AIM-48 on Cervical (seed 2) drew no positive row: every classifier failed and the bench stopped with a TypeError
    from types import SimpleNamespace

    from bench.peers import score

    schema = SimpleNamespace(label="y", columns=[SimpleNamespace(name="a", type="categorical", categories=["0", "1"]),
                                                 SimpleNamespace(name="y", type="categorical", categories=["0", "1"])])
    test = pd.DataFrame({"a": ["0", "1", "1", "0"], "y": ["0", "1", "1", "0"]}, dtype=object)
    synth = pd.DataFrame({"a": ["0", "1", "0", "1"], "y": ["0", "0", "0", "0"]}, dtype=object)
    out = score(synth, test, schema, seed=0)
    assert out["roc_hard"] == out["roc_score"] == 0.5 and out["one_class"] is True and 0 <= out["tv2"] <= 1
