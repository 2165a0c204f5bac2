import math

import numpy as np
import pytest
import torch

from lightning_dp.kernels.rff import RandomFourierFeatures, rff
from lightning_dp.models.dp_merf import DPMERF
from lightning_dp.nets.generators import ConditionalGenerator
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.sensitivity import (
    count_sensitivity,
    embedding_sum_sensitivity,
    mean_embedding_sensitivity,
)
from lightning_dp.privacy.statistics import class_feature_sums


def test_rff_norm_is_exactly_one():
    x = torch.randn(500, 7) * 10
    phi = rff(x, torch.randn(64, 7))
    assert torch.allclose(phi.norm(dim=1), torch.ones(500), atol=1e-6)


def test_rff_approximates_the_gaussian_kernel():
    feats = RandomFourierFeatures(5, 40_000, bandwidth=1.3, seed=1)
    x, y = torch.rand(20, 5), torch.rand(20, 5)
    approx = (feats(x) * feats(y)).sum(1)
    exact = torch.exp(-(x - y).square().sum(1) / (2 * 1.3**2))
    assert torch.allclose(approx, exact, atol=0.02)


def test_paper_sensitivities():
    m = 1000
    assert mean_embedding_sensitivity(feature_norm=1.0, n=m) == pytest.approx(2 / m)  # Def. 3.2
    assert mean_embedding_sensitivity(feature_norm=math.sqrt(2), n=m) == pytest.approx(
        2 * math.sqrt(2) / m
    )  # eq. 17
    assert count_sensitivity(adjacency="replace_one") / m == pytest.approx(math.sqrt(2) / m)  # eq. 10
    assert embedding_sum_sensitivity(feature_norm=math.sqrt(2), adjacency="add_remove") == pytest.approx(
        math.sqrt(2)
    )


def _merf(blocks):
    gen = ConditionalGenerator(n_continuous=3, block_sizes=blocks, num_classes=2)
    return DPMERF(gen, n_continuous=3, block_sizes=blocks, num_classes=2, num_features=100, bandwidth=0.5)


def _rows(n, blocks, gen):
    con = torch.rand(n, 3, generator=gen)
    onehots = [
        torch.nn.functional.one_hot(torch.randint(0, k, (n,), generator=gen), k).float() for k in blocks
    ]
    return torch.cat([con, *onehots], 1), torch.randint(0, 2, (n,), generator=gen)


@pytest.mark.parametrize("blocks", [[], [3, 2, 4]])
def test_feature_norm_bound_is_attained_and_never_exceeded(blocks):
    model = _merf(blocks)
    x, _ = _rows(300, blocks, torch.Generator().manual_seed(0))
    norms = model.features(x).norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, model.feature_norm_bound), atol=1e-5)


@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_empirical_sensitivity_of_the_sums_by_brute_force(adjacency):
    blocks = [3, 2]
    model = _merf(blocks)
    gen = torch.Generator().manual_seed(1)
    x, y = _rows(40, blocks, gen)
    base = class_feature_sums([(x, y)], model.features, 2)
    bound_s = embedding_sum_sensitivity(feature_norm=model.feature_norm_bound, adjacency=adjacency)
    bound_c = count_sensitivity(adjacency=adjacency)
    worst_s = worst_c = 0.0
    for _ in range(200):
        i = int(torch.randint(0, 40, (1,), generator=gen))
        if adjacency == "add_remove":
            keep = torch.arange(40) != i
            s, c = class_feature_sums([(x[keep], y[keep])], model.features, 2)
        else:
            x2, y2 = x.clone(), y.clone()
            new_x, new_y = _rows(1, blocks, gen)
            x2[i], y2[i] = new_x[0], new_y[0]
            s, c = class_feature_sums([(x2, y2)], model.features, 2)
        worst_s = max(worst_s, float((s - base[0]).norm()))
        worst_c = max(worst_c, float((c - base[1]).norm()))
    assert worst_s <= bound_s + 1e-5 and worst_c <= bound_c + 1e-9  # float32 features
    assert worst_s > 0.5 * bound_s  # the bound is not vacuous


def test_gaussian_noise_has_the_accounted_std():
    gen = mech.noise_generator(3)
    noisy = mech.gaussian_noise(torch.zeros(200_000), sensitivity=0.5, noise_multiplier=3.0, generator=gen)
    assert float(noisy.std()) == pytest.approx(1.5, rel=0.01)
    assert abs(float(noisy.mean())) < 0.01


def test_laplace_noise_scale():
    noisy = mech.laplace_noise(
        torch.zeros(200_000), sensitivity=2.0, noise_multiplier=0.5, generator=mech.noise_generator(4)
    )
    assert float(noisy.abs().mean()) == pytest.approx(1.0, rel=0.02)  # E|Lap(b)| = b = 1


def test_exponential_mechanism_prefers_high_utility():
    utilities = torch.tensor([0.0, 0.0, 100.0, 0.0])
    picks = [
        mech.exponential_mechanism(utilities, epsilon=1.0, sensitivity=1.0, generator=mech.noise_generator(s))
        for s in range(50)
    ]
    assert picks.count(2) == 50
    flat = [
        mech.exponential_mechanism(
            torch.zeros(4), epsilon=1.0, sensitivity=1.0, generator=mech.noise_generator(s)
        )
        for s in range(400)
    ]
    assert min(np.bincount(flat, minlength=4)) > 60  # uniform when utilities tie
