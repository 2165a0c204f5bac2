"""Chunked nearest neighbours equal brute force; the tabular encoder is fitted on one frame, applied to others."""

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import cdist
from scipy.special import logsumexp

from audits.distances import (
    TabularEncoder,
    distance_to_closest_record,
    gaussian_kernel_logsumexp,
    nearest_neighbors,
)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(1000, 7)), rng.normal(size=(1500, 7))


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize(("qc", "rc"), [(128, 100), (1000, 1500), (77, 13), (5000, 5000)])
def test_chunked_equals_brute_force(data, k, qc, rc):
    q, r = data
    d, i = nearest_neighbors(q, r, k=k, query_chunk=qc, ref_chunk=rc)
    full = cdist(q, r)  # (1000, 1500) direct differences
    want_i = np.argsort(full, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(d, np.take_along_axis(full, want_i, 1), rtol=1e-13, atol=0)


def test_chunk_sizes_do_not_change_a_bit(data):
    q, r = data
    one = nearest_neighbors(q, r, k=2, query_chunk=10_000, ref_chunk=10_000)  # a single block
    many = nearest_neighbors(q, r, k=2, query_chunk=33, ref_chunk=129)
    np.testing.assert_array_equal(one[0], many[0])
    np.testing.assert_array_equal(one[1], many[1])


def test_float32_selection_and_tensor_inputs(data):
    q, r = data
    d64, i64 = nearest_neighbors(q, r, k=1)
    d32, i32 = nearest_neighbors(torch.from_numpy(q), torch.from_numpy(r), k=1, dtype=torch.float32)
    np.testing.assert_array_equal(i32, i64)  # no near-ties at 1e-6 in this data
    np.testing.assert_array_equal(d32, d64)  # distances are recomputed in float64 either way


@pytest.mark.parametrize("k", [1, 4])
def test_torch_backend_agrees(data, k):
    q, r = data
    a = nearest_neighbors(q, r, k=k, ref_chunk=300)
    b = nearest_neighbors(q, r, k=k, ref_chunk=300, backend="torch")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="backend"):
        nearest_neighbors(q, r, backend="jax")


def test_near_duplicates_are_exact_despite_cancellation():
    rng = np.random.default_rng(1)
    r = 1e3 + rng.normal(size=(50, 20))  # large norms: ||a||^2 + ||b||^2 - 2ab cancels ~1e7
    q = r + 1e-7  # every coordinate shifted by 1e-7
    d = distance_to_closest_record(q, r, dtype=torch.float32)
    np.testing.assert_allclose(d, 1e-7 * np.sqrt(20), rtol=1e-6)
    assert (distance_to_closest_record(r, r) == 0.0).all()


def test_errors(data):
    q, r = data
    with pytest.raises(ValueError, match="features"):
        nearest_neighbors(q, r[:, :3])
    with pytest.raises(ValueError, match="k must be"):
        nearest_neighbors(q, r[:2], k=3)


def test_gaussian_kernel_logsumexp(data):
    q, r = data
    got = gaussian_kernel_logsumexp(q, r, gamma=0.3, query_chunk=100, ref_chunk=77)
    np.testing.assert_allclose(got, logsumexp(-0.3 * cdist(q, r) ** 2, axis=1), rtol=1e-12)


def test_encoder_hand_example():
    ref = pd.DataFrame(
        {"a": [1.0, 2.0, np.nan, 4.0], "b": ["x", "y", None, "x"], "c": [True, False, True, True]}
    )
    enc = TabularEncoder().fit(ref)
    assert enc.feature_names_ == ["a", "a__nan", "b=x", "b=y", "b=NaN", "c=False", "c=True"]
    # a: min 1, range 3; NaN -> mean 7/3 scaled = (7/3 - 1)/3 = 4/9, with indicator 1
    want = np.array(
        [
            [0.0, 0, 1, 0, 0, 0, 1],
            [1 / 3, 0, 0, 1, 0, 1, 0],
            [4 / 9, 1, 0, 0, 1, 0, 1],
            [1.0, 0, 1, 0, 0, 0, 1],
        ]
    )
    np.testing.assert_allclose(enc.transform(ref), want)
    # another frame (columns in another order) uses the reference's range; unseen category -> zeros
    other = pd.DataFrame({"c": [False], "b": ["z"], "a": [7.0]})
    np.testing.assert_allclose(enc.transform(other), [[2.0, 0, 0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(enc.feature_indices(["b", "a"]), [2, 3, 4, 0, 1])


def test_encoder_standard_scaling_and_constant_columns():
    ref = pd.DataFrame({"a": [0.0, 2.0], "k": [5, 5], "cat": [1, 2]})
    enc = TabularEncoder(scaling="standard", categorical_columns=["cat"]).fit(ref)
    np.testing.assert_allclose(enc.transform(ref), [[-1.0, 0.0, 1, 0], [1.0, 0.0, 0, 1]])


def test_encoder_column_mismatch_names_columns():
    enc = TabularEncoder().fit(pd.DataFrame({"a": [1.0], "b": ["x"]}))
    with pytest.raises(ValueError, match=r"missing \['b'\], extra \['z'\]"):
        enc.transform(pd.DataFrame({"a": [1.0], "z": [0]}))
    with pytest.raises(ValueError, match="not fitted"):
        TabularEncoder().transform(pd.DataFrame({"a": [1.0]}))
    with pytest.raises(ValueError, match="scaling"):
        TabularEncoder(scaling="robust")


def test_encoder_places_two_hundred_one_hot_columns_correctly():
    # 100 + 100 categories: the second column's one-hot block starts at 100 and ends at 199. pandas keeps the
    # category codes in int8 (below 128 categories), so start + code wrapped around past column 127 and wrote
    # the ones into the wrong columns
    a, b = [f"a{i:03d}" for i in range(100)], [f"b{i:03d}" for i in range(100)]
    frame = pd.DataFrame({"a": a, "b": b[::-1]})
    x = TabularEncoder().fit_transform(frame)
    assert x.shape == (100, 200) and (x.sum(1) == 2).all() and (x.sum(0) == 1).all()
    np.testing.assert_array_equal(x[:, :100].argmax(1), np.arange(100))
    np.testing.assert_array_equal(x[:, 100:].argmax(1), np.arange(100)[::-1])


def test_encoder_standard_scaling_survives_a_value_near_the_float_limit():
    ref = pd.DataFrame({"a": [1.0, 2.0, 3.0, 1e308]})
    x = TabularEncoder(scaling="standard").fit_transform(ref)
    assert np.isfinite(x).all()  # the std no longer overflows to inf (which left the column unscaled)
    assert x[3, 0] == pytest.approx(np.sqrt(3)) and np.abs(x[:3, 0] + 1 / np.sqrt(3)).max() < 1e-9
