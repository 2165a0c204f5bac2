"""TSTR utility audit: perfect vs noise generators, the hard-label ROC identity, edge cases."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from sklearn.datasets import make_classification, make_regression
from sklearn.metrics import balanced_accuracy_score

from audits.utility import (
    CLASSIFIERS,
    PRESETS,
    UtilityResult,
    classification_metrics,
    fit_feature_encoder,
    plot_utility,
    tstr,
    tstr_over_seeds,
)

FAST = ["logistic_regression", "gaussian_nb", "random_forest"]
CHEAP = ["logistic_regression", "gaussian_nb", "decision_tree"]


N_FEATURES = 20


def _frame(x: np.ndarray, y: np.ndarray) -> pd.DataFrame:
    df = pd.DataFrame(x, columns=[f"x{i}" for i in range(x.shape[1])])
    df["colour"] = np.where(
        x[:, 0] > 0.3, "red", np.where(x[:, 1] > 0, "green", "blue")
    )  # informative category
    df["label"] = np.where(y == 1, "yes", "no")
    return df


@pytest.fixture(scope="module")
def three_splits() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """make_classification split in 3: real train, real test, and a 'perfect generator' sample."""
    x, y = make_classification(
        n_samples=2100, n_features=N_FEATURES, n_informative=8, flip_y=0.02, random_state=0
    )
    df = _frame(x, y)
    return df.iloc[:700], df.iloc[700:1400].reset_index(drop=True), df.iloc[1400:].reset_index(drop=True)


def _noise_like(df: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A useless generator: independent N(0, 1) features, uniform categories and labels."""
    rng = np.random.default_rng(seed)
    n = len(df)
    noise = pd.DataFrame(rng.normal(size=(n, N_FEATURES)), columns=[f"x{i}" for i in range(N_FEATURES)])
    noise["colour"] = rng.choice(["red", "green", "blue"], n)
    noise["label"] = rng.choice(["yes", "no"], n)
    return noise


def test_perfect_generator_scores_like_the_real_reference(three_splits):
    real_train, real_test, synthetic = three_splits
    result = tstr(synthetic, real_test, label="label", real_train=real_train, classifiers=FAST)
    avg, real_avg = result.summary["average"], result.summary["real_average"]
    assert result.summary["task"] == "binary" and result.summary["pos_label"] == "yes"
    assert real_avg["roc_auc_hard"] > 0.8
    assert abs(avg["roc_auc_hard"] - real_avg["roc_auc_hard"]) < 0.04
    assert abs(avg["roc_auc"] - real_avg["roc_auc"]) < 0.03
    assert abs(avg["prc"] - real_avg["prc"]) < 0.04
    assert avg["roc_auc"] > avg["roc_auc_hard"]  # scores rank better than 0/1 predictions


def test_noise_generator_scores_near_chance(three_splits):
    """A model fitted on noise projects the real data on a random direction: chance on average over draws."""
    real_train, real_test, synthetic = three_splits
    noise = {seed: _noise_like(synthetic, seed) for seed in range(5)}
    result = tstr_over_seeds(noise, real_test, label="label", real_train=real_train, classifiers=CHEAP)
    assert abs(result.summary["average"]["roc_auc_hard"]["mean"] - 0.5) < 0.05
    assert abs(result.summary["average"]["roc_auc"]["mean"] - 0.5) < 0.07
    assert (result.table["roc_auc_hard_mean"] < 0.6).all()
    assert result.summary["real_average"]["roc_auc_hard"]["mean"] > 0.75


@pytest.mark.parametrize("seed", range(25))
def test_hard_label_roc_auc_equals_balanced_accuracy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 500))
    y_true = rng.random(n) < rng.uniform(0.05, 0.95)
    y_true[:2] = [True, False]  # both classes present
    y_pred = np.where(rng.random(n) < rng.uniform(0, 1), y_true, rng.random(n) < 0.5)
    labels = np.array(["neg", "pos"])
    got = classification_metrics(
        labels[y_true.astype(int)], labels[y_pred.astype(int)], task="binary", pos_label="pos"
    )
    assert got["roc_auc_hard"] == pytest.approx(balanced_accuracy_score(y_true, y_pred), abs=1e-12)
    assert np.isnan(got["roc_auc"])  # no scores given


def test_score_orientation_does_not_depend_on_the_positive_class(three_splits):
    """ROC-AUC from scores is symmetric in the positive class; a sign error in decision_function breaks this."""
    real_train, real_test, synthetic = three_splits
    models = ["linear_svm", "logistic_regression"]
    yes = tstr(synthetic, real_test, label="label", classifiers=models, pos_label="yes").table
    no = tstr(synthetic, real_test, label="label", classifiers=models, pos_label="no").table
    np.testing.assert_allclose(yes["roc_auc"], no["roc_auc"], atol=1e-12)
    np.testing.assert_allclose(yes["roc_auc_hard"], no["roc_auc_hard"], atol=1e-12)
    assert (yes["roc_auc"] > 0.85).all()


def test_single_class_synthetic_gives_nan_with_reason_and_valid_json(three_splits):
    real_train, real_test, synthetic = three_splits
    collapsed = synthetic.assign(label="no")
    result = tstr(
        collapsed, real_test, label="label", real_train=real_train, classifiers=["lda", "decision_tree"]
    )
    assert result.table["roc_auc_hard"].isna().all()
    assert result.table["error"].str.contains("single class").all()
    assert result.table["real_roc_auc_hard"].notna().all()
    assert result.summary["average"]["roc_auc_hard"] is None
    assert set(result.summary["failed"]) == {"lda", "decision_tree"}
    assert any("missing from synthetic" in w for w in result.summary["warnings"])
    json.dumps(result.to_dict(), allow_nan=False)


def test_multiclass_with_labels_on_one_side_only():
    x, y = make_classification(n_samples=900, n_features=6, n_informative=4, n_classes=3, random_state=1)
    df = pd.DataFrame(x, columns=list("abcdef")).assign(y=y.astype(float))  # float labels 0.0, 1.0, 2.0
    synthetic = df.iloc[:300].assign(
        y=np.where(y[:300] == 2, 7, y[:300])
    )  # class 2 never generated; 7 is new
    result = tstr(synthetic, df.iloc[300:600], label="y", real_train=df.iloc[600:], classifiers=FAST)
    assert result.summary["task"] == "multiclass"
    assert set(result.table.columns) >= {"f1_weighted", "accuracy", "f1_macro", "real_f1_weighted"}
    assert result.table["f1_weighted"].notna().all()
    assert (result.table["f1_weighted"] < result.table["real_f1_weighted"]).all()
    warnings = " ".join(result.summary["warnings"])
    assert "['2']" in warnings and "['7']" in warnings


def test_regression_target():
    x, y = make_regression(n_samples=900, n_features=5, noise=10.0, random_state=0)
    df = pd.DataFrame(x, columns=list("abcde")).assign(target=100 * y + 5000)
    real_train, real_test, synthetic = df.iloc[:300], df.iloc[300:600], df.iloc[600:]
    models = ["ridge", "random_forest"]
    good = tstr(synthetic, real_test, label="target", real_train=real_train, classifiers=models)
    noise = synthetic.assign(target=np.random.default_rng(0).permutation(synthetic["target"].to_numpy()))
    bad = tstr(noise, real_test, label="target", classifiers=models)
    assert good.summary["task"] == "regression"
    assert abs(good.summary["average"]["r2"] - good.summary["real_average"]["r2"]) < 0.05
    assert good.summary["average"]["r2"] > 0.8
    assert bad.summary["average"]["r2"] < 0.05
    assert tstr(synthetic, real_test, label="target").summary["models"][0] == "linear_regression"


def test_dp_merf_protocol_runs_all_twelve_models():
    x, y = make_classification(n_samples=600, n_features=6, n_informative=4, random_state=2)
    df = _frame(x, y)
    df.loc[::9, "x2"] = np.nan
    df.loc[::11, "colour"] = None
    synthetic, real_test = df.iloc[:300], df.iloc[300:].copy()
    real_test.loc[real_test.index[:5], "colour"] = "purple"  # category never seen in training
    result = tstr(synthetic, real_test, label="label", real_train=synthetic)
    has_boosting = any(importlib.util.find_spec(m) for m in ("xgboost", "lightgbm"))
    assert len(PRESETS["dp_merf"]) == 12
    assert result.skipped == ([] if has_boosting else ["xgboost"])
    assert len(result.table) + len(result.skipped) == 12
    assert result.table[["roc_auc_hard", "prc_hard", "roc_auc", "prc"]].notna().all().all()
    assert result.table["error"].isna().all()
    assert 0.7 < result.summary["average"]["roc_auc_hard"] <= 1.0
    json.dumps(result.to_dict(), allow_nan=False)


def test_presets_and_unknown_names():
    assert PRESETS["pearl"] == [n for n in PRESETS["dp_merf"] if n not in ("random_forest", "xgboost")]
    assert set(PRESETS["dp_merf"]) <= set(CLASSIFIERS)
    df = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0], "y": [0, 1, 0, 1]})
    with pytest.raises(ValueError, match=r"valid names: \[.*'logistic_regression'"):
        tstr(df, df, label="y", classifiers=["logistic_regresion"])
    with pytest.raises(ValueError, match="lacks columns"):
        tstr(df[["y"]], df, label="y")


def test_sample_weights_reach_models_that_accept_them(three_splits):
    real_train, real_test, synthetic = three_splits
    ones = tstr(
        synthetic,
        real_test,
        label="label",
        classifiers=["gaussian_nb", "lda"],
        sample_weight=np.ones(len(synthetic)),
    )
    plain = tstr(synthetic, real_test, label="label", classifiers=["gaussian_nb", "lda"])
    pd.testing.assert_series_equal(ones.table["roc_auc"], plain.table["roc_auc"])
    assert any("lda: does not accept sample_weight" in w for w in ones.summary["warnings"])
    only_yes = (synthetic["label"] == "yes").to_numpy().astype(float) + 1e-9  # weight ~ 0 on one class
    skewed = tstr(synthetic, real_test, label="label", classifiers=["gaussian_nb"], sample_weight=only_yes)
    assert skewed.table.loc["gaussian_nb", "accuracy"] < 0.6  # predicts "yes" almost everywhere


def test_over_seeds_aggregates_mean_and_std(three_splits):
    real_train, real_test, synthetic = three_splits
    pairs = [(0, synthetic.iloc[:350]), (1, synthetic.iloc[350:]), (2, _noise_like(synthetic, 2))]
    result = tstr_over_seeds(pairs, real_test, label="label", real_train=real_train, classifiers=CHEAP)
    assert isinstance(result, UtilityResult)
    assert list(result.table.index) == CHEAP
    per_seed_avg = result.per_seed.groupby("seed")["roc_auc_hard"].mean()
    assert result.summary["average"]["roc_auc_hard"]["mean"] == pytest.approx(per_seed_avg.mean())
    assert result.summary["average"]["roc_auc_hard"]["std"] == pytest.approx(per_seed_avg.std(ddof=0))
    assert (result.table["roc_auc_hard_std"] > 0.1).all()  # the noise seed drags every model down
    lr = result.per_seed.query("model == 'logistic_regression'")["real_roc_auc_hard"]
    assert result.table.loc["logistic_regression", "real_roc_auc_hard_std"] == pytest.approx(lr.std(ddof=0))
    assert result.summary["seeds"] == [0, 1, 2]
    json.dumps(result.to_dict(), allow_nan=False)


def test_encoder_is_fitted_on_the_training_side_only():
    train = pd.DataFrame({"n": [1.0, np.nan, 3.0, 5.0], "c": [1.0, 2.0, np.nan, 1.0]})
    test = pd.DataFrame({"n": [np.nan, 3.0], "c": [1, 9]})  # int 1 is the same category as 1.0; 9 is unseen
    encoder = fit_feature_encoder(train, categorical=["c"])
    out = encoder.transform(test)
    assert out.shape == (2, 2 + 3)  # scaled n, missing indicator, one-hot {1, 2, missing}
    assert out[0, 0] == pytest.approx(out[1, 0])  # NaN imputed by the training median (3.0)
    assert out[0, 1] > 0 and out[1, 1] < 0  # indicator (standardised) flags the NaN row
    np.testing.assert_array_equal(out[:, 2:], [[1, 0, 0], [0, 0, 0]])


def test_plot_utility(three_splits, tmp_path):
    real_train, real_test, synthetic = three_splits
    result = tstr(synthetic, real_test, label="label", real_train=real_train, classifiers=["gaussian_nb"])
    fig = plot_utility(result)
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].patches) == 2  # synthetic and real bar
    fig.savefig(tmp_path / "utility.png")
    assert (tmp_path / "utility.png").stat().st_size > 1000
