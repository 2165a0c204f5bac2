"""Fidelity audit: exact values on toy columns, zero on identical data, shifts detected, FID/KID on digits."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from sklearn.datasets import load_digits
from torchmetrics.image.fid import FrechetInceptionDistance

from audits.feature_net import FeatureNet, load_feature_net, save_feature_net, train_feature_net
from audits.fidelity import (
    discretise,
    image_fidelity,
    median_heuristic,
    mmd2,
    numeric_distances,
    plot_marginals,
    range_query_error,
    tabular_fidelity,
    total_variation,
    two_way_marginal_error,
)


def _table(n: int, *, seed: int, age_shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "age": rng.normal(40 + age_shift, 10, n),
            "gain": np.where(rng.random(n) < 0.9, 0.0, rng.exponential(1000, n)),
            "education": rng.choice(["hs", "bsc", "msc"], n, p=[0.5, 0.3, 0.2]),
            "smoker": rng.random(n) < 0.3,
            "label": rng.integers(0, 2, n),
        }
    )
    df.loc[df.index[::10], "age"] = np.nan
    return df


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The nets are tiny: one thread is faster than two contending ones on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def real() -> pd.DataFrame:
    return _table(2000, seed=0)


def test_exact_values_on_toy_columns():
    assert total_variation(pd.Series(list("aabb")), pd.Series(list("aaab"))) == pytest.approx(0.25)
    assert total_variation(pd.Series(["a", None]), pd.Series(["a", "a"])) == pytest.approx(
        0.5
    )  # NaN is a level
    dist = numeric_distances(pd.Series([0.0, 10.0]), pd.Series([5.0, 5.0]))
    assert dist["w1"] == pytest.approx(0.5)  # scaled by the real range 10
    assert dist["ks"] == pytest.approx(0.5)
    real_codes, syn_codes, levels = discretise(
        pd.Series([1.0, 2.0, 3.0, 4.0, np.nan]), pd.Series([-5.0, 9.0]), categorical=False, n_bins=2
    )
    assert levels == 3  # two quantile bins + NaN
    np.testing.assert_array_equal(real_codes, [0, 0, 1, 1, 2])  # median 2.5 splits; NaN last
    np.testing.assert_array_equal(syn_codes, [0, 1])  # out-of-range values fall in the end bins
    pair = two_way_marginal_error(
        pd.DataFrame({"a": list("xxyy"), "b": list("uvuv")}),
        pd.DataFrame({"a": list("xxxx"), "b": list("uuvv")}),
    )
    assert pair["mean"] == pytest.approx(1.0)  # cells (x,u),(x,v),(y,u),(y,v): |.25-.5|*2 + .25*2


def test_identical_data_scores_zero(real):
    result = tabular_fidelity(real, real.copy(), n_range_queries=200)
    for column in result["columns"].values():
        assert all(v == 0.0 for k, v in column.items() if k != "type")
    assert result["mean_tv"] == result["mean_w1"] == result["mean_ks"] == 0.0
    assert result["two_way_marginal"]["mean"] == 0.0
    assert result["range_query"]["mean_abs_error"] == 0.0
    assert abs(result["mmd"]["mmd2"]) < 1e-3
    json.dumps(result, allow_nan=False)


def test_shifted_column_is_clearly_farther(real):
    same = tabular_fidelity(real, _table(2000, seed=1), n_range_queries=300)
    shifted = tabular_fidelity(real, _table(2000, seed=1, age_shift=10.0), n_range_queries=300)
    age_same, age_shifted = same["columns"]["age"], shifted["columns"]["age"]
    assert age_shifted["w1"] > 0.1 > 5 * age_same["w1"]  # 1 std of a ~70-wide range is ~0.14
    assert age_shifted["ks"] > 0.3 > 5 * age_same["ks"]
    assert shifted["columns"]["education"]["tv"] == same["columns"]["education"]["tv"]  # same draw elsewhere
    assert shifted["two_way_marginal"]["mean"] > same["two_way_marginal"]["mean"] + 0.1
    assert shifted["range_query"]["mean_abs_error"] > 1.5 * same["range_query"]["mean_abs_error"]
    assert shifted["mmd"]["mmd2"] > 0.03 > 10 * same["mmd"]["mmd2"]


def test_mmd_same_distribution_vs_shift_and_median_bandwidth():
    rng = np.random.default_rng(0)
    x, y, z = (
        rng.normal(size=(500, 5)),
        rng.normal(size=(500, 5)),
        rng.normal(size=(500, 5)) + [1, 0, 0, 0, 0],
    )
    h = median_heuristic(y)
    assert h == pytest.approx(np.sqrt(2 * 5), rel=0.1)  # E||a-b||^2 = 2d for standard normals
    assert abs(mmd2(x, y, bandwidth=h)) < 0.005
    assert mmd2(z, y, bandwidth=h) > 0.05
    assert mmd2(x, y, bandwidth=h, weights=np.full(500, 3.0)) == pytest.approx(mmd2(x, y, bandwidth=h))


def test_importance_weights_reduce_mmd_of_a_biased_sample():
    """Bias-mitigation §5: weighting a biased sample by p_real / p_syn brings it closer to the real data."""
    rng = np.random.default_rng(1)
    real, syn = rng.normal(0.5, 1.0, size=(600, 1)), rng.normal(0.0, 1.0, size=(600, 1))
    weights = np.exp(0.5 * syn[:, 0] - 0.125)  # N(0.5, 1) / N(0, 1) density ratio
    h = median_heuristic(real)
    assert mmd2(syn, real, bandwidth=h, weights=weights) < 0.3 * mmd2(syn, real, bandwidth=h)


def test_range_queries_are_seeded(real):
    other = _table(2000, seed=3)
    a = range_query_error(real, other, n_queries=100, seed=5)
    b = range_query_error(real, other, n_queries=100, seed=5)
    c = range_query_error(real, other, n_queries=100, seed=6)
    assert a == b and a["mean_abs_error"] != c["mean_abs_error"]
    assert a["n_attributes"] == 3
    assert 0.02 < a["mean_real_answer"] < 0.5  # queries are neither empty nor everything


def test_plot_marginals(real, tmp_path):
    fig = plot_marginals(real, _table(500, seed=2, age_shift=5.0))
    assert isinstance(fig, Figure)
    assert sum(ax.get_visible() for ax in fig.axes) == 5
    fig.savefig(tmp_path / "marginals.png")


# ------------------------------------------------------------------------------------------------ images
@pytest.fixture(scope="module")
def digits() -> dict[str, np.ndarray]:
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    images, labels = data.images[order] / 16.0, data.target[order]  # (1797, 8, 8) in [0, 1]
    return {
        "train": images[:900],
        "train_y": labels[:900],
        "test": images[900:1350],
        "test_y": labels[900:1350],
        "held": images[1350:],
        "held_y": labels[1350:],
    }


def test_feature_net_follows_torchmetrics_input_conventions(digits):
    net = FeatureNet(10).eval()
    floats = torch.tensor(digits["train"][:16], dtype=torch.float32)  # (N, H, W) in [0, 1]
    uint8 = (floats * 255).round().to(torch.uint8).unsqueeze(1)  # (N, 1, H, W) in [0, 255]
    with torch.no_grad():
        torch.testing.assert_close(net(floats), net(uint8), atol=1e-2, rtol=0)
        assert net(uint8.expand(-1, 3, -1, -1)).shape == (16, 64)  # RGB is averaged
        assert net(torch.rand(4, 1, 28, 28)).shape == (4, 64)  # any image size
    fid = FrechetInceptionDistance(feature=net, normalize=False)  # uint8 path, num_features read from the net
    fid.update(uint8, real=True)
    fid.update(uint8, real=False)
    assert abs(float(fid.compute())) < 1e-3


def test_feature_net_trains_and_round_trips(digits, tmp_path):
    net = train_feature_net(digits["train"], digits["train_y"], epochs=10, seed=0)
    again = train_feature_net(digits["train"], digits["train_y"], epochs=10, seed=0)
    x = torch.tensor(digits["test"], dtype=torch.float32)
    torch.testing.assert_close(net(x), again(x))  # seeded
    path = tmp_path / "feature_net.pt"
    save_feature_net(net, path)
    torch.testing.assert_close(load_feature_net(path)(x), net(x))
    torch.save(net.state_dict(), tmp_path / "bare.pt")
    torch.testing.assert_close(load_feature_net(tmp_path / "bare.pt")(x), net(x))


def test_fid_kid_real_split_beats_noise_and_downstream_accuracy(digits, tmp_path):
    common = {
        "real_train_labels": digits["train_y"],
        "real_test_labels": digits["test_y"],
        "epochs": 15,
        "kid_subsets": 20,
        "kid_subset_size": 200,
    }
    good = image_fidelity(
        digits["train"], digits["test"], digits["held"], synthetic_labels=digits["held_y"], **common
    )
    rng = np.random.default_rng(0)
    noise = rng.random((450, 1, 8, 8))
    bad = image_fidelity(
        digits["train"], digits["test"], noise, synthetic_labels=rng.integers(0, 10, 450), **common
    )
    assert good["feature_extractor"].startswith(
        "small CNN trained on real training split, 900 images, acc 0.9"
    )
    assert good["fid"] < 2.0 < 10 * good["fid"] < bad["fid"]
    assert good["kid_mean"] < 0.01 < 10 * max(good["kid_mean"], 0.001) < bad["kid_mean"]
    assert good["reference"]["fid"] < 2.0
    for kind in ("cnn", "logistic_regression"):
        assert good["downstream"][kind]["accuracy"] > 0.85
        assert bad["downstream"][kind]["accuracy"] < 0.25
        assert bad["downstream"][kind]["real_accuracy"] > 0.85
    json.dumps(bad, allow_nan=False)
    path = tmp_path / "net.pt"
    save_feature_net(train_feature_net(digits["train"], digits["train_y"], epochs=2), path)
    user = image_fidelity(
        digits["train"],
        digits["test"],
        digits["held"],
        real_train_labels=digits["train_y"],
        feature_weights=str(path),
    )
    assert user["feature_extractor"] == f"user weights: {path}"
    assert user["downstream"] == {} and "downstream_skipped" in user
