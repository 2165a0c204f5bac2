"""The pure math of adaptive marginals (privacy/marginals.py) and GEM's public discretisation."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_dp.errors import ConfigError
from lightning_dp.models.gem import GEM, Discretisation
from lightning_dp.nets.marginal_nets import ProductGenerator
from lightning_dp.privacy import marginals as mg
from lightning_dp.privacy.ledger import PrivacyLedger, Release


def test_workload_weights_the_target_and_adds_its_triples():
    cliques, weights = mg.workload(4, degree=2, target=3, target_weight=2.5)
    assert cliques == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert weights == [1.0, 1.0, 2.5, 1.0, 2.5, 2.5]
    cliques, _ = mg.workload(4, degree=2, target=3, target_triples=True)
    assert cliques[6:] == [(0, 1, 3), (0, 2, 3), (1, 2, 3)]
    assert len(mg.workload(5, degree=3)[0]) == 10
    with pytest.raises(ValueError, match="degree"):
        mg.workload(4, degree=4)


def test_marginal_counts_match_a_crosstab():
    rng = np.random.default_rng(0)
    codes = torch.from_numpy(np.stack([rng.integers(0, 3, 500), rng.integers(0, 4, 500), rng.integers(0, 2, 500)], 1))
    pair, triple = mg.marginal_counts(codes, [(0, 1), (0, 1, 2)], [3, 4, 2])
    table = np.zeros((3, 4))
    np.add.at(table, (codes[:, 0].numpy(), codes[:, 1].numpy()), 1)
    assert np.array_equal(pair.numpy(), table.ravel())
    assert triple.sum() == 500 and triple.view(3, 4, 2).sum(2).equal(pair.view(3, 4))


def test_product_marginal_of_one_hot_draws_is_their_empirical_marginal():
    codes = torch.tensor([[0, 1, 1], [2, 0, 1], [2, 0, 0], [1, 3, 1]])
    probs = [F.one_hot(codes[:, c], k).double() for c, k in enumerate([3, 4, 2])]
    for clique in [(0,), (0, 1), (1, 2), (0, 1, 2)]:
        expected = mg.marginal_counts(codes, [clique], [3, 4, 2])[0] / 4
        assert torch.allclose(mg.product_marginal(probs, clique), expected)
    soft = [torch.softmax(torch.randn(7, k, dtype=torch.float64), 1) for k in (3, 4, 2)]
    assert float(mg.product_marginal(soft, (0, 1, 2)).sum()) == pytest.approx(1.0)


def test_one_row_moves_each_marginal_by_one_count():
    """The sensitivities the mechanism states: add/remove adds 1 to one cell of each marginal."""
    rng = np.random.default_rng(1)
    codes = torch.from_numpy(rng.integers(0, 3, (50, 4)))
    cliques = [(0,), (1,), (0, 1), (2, 3)]
    before = torch.cat(mg.marginal_counts(codes, cliques, [3] * 4))
    after = torch.cat(mg.marginal_counts(torch.cat([codes, codes[:1]]), cliques, [3] * 4))
    assert float((after - before).norm()) == pytest.approx(mg.gaussian_l2_sensitivity(4, adjacency="add_remove"))
    replaced = torch.cat(mg.marginal_counts(torch.cat([codes[1:], torch.tensor([[2, 2, 0, 1]])]), cliques, [3] * 4))
    assert float((replaced - before).norm()) <= mg.gaussian_l2_sensitivity(4, adjacency="replace_one") + 1e-12
    assert mg.gaussian_l2_sensitivity(3, adjacency="add_remove") == pytest.approx(math.sqrt(3))
    assert mg.gaussian_l2_sensitivity(1, adjacency="replace_one") == pytest.approx(math.sqrt(2))
    assert mg.score_sensitivity([1.0, 3.0], adjacency="add_remove") == 3.0
    assert mg.score_sensitivity([1.0, 3.0], adjacency="replace_one") == 6.0


def test_exponential_rdp_is_bounded_range_and_pure_dp():
    rdp = mg.exponential_rdp([2.0, 10.0, 1000.0], epsilon=0.1)
    assert rdp.tolist() == pytest.approx([2 * 0.01 / 8, 10 * 0.01 / 8, 0.1])


def test_a_round_at_the_starting_parameters_costs_rho_over_t():
    sigma, eps = mg.round_parameters(0.05, 40)
    assert mg.round_cost(sigma, eps) == pytest.approx(0.05 / 40)
    assert eps**2 / 8 == pytest.approx(0.1 * 0.05 / 40)
    # the ledger composes a round's two releases to the same curve α·ρ/T
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    releases = [Release(name="m", mechanism="gaussian", sensitivity=1.0, noise_multiplier=sigma),
                Release(name="s", mechanism="rdp_curve", sensitivity=1.0, rdp_orders=ledger.orders,
                        rdp_values=tuple(mg.exponential_rdp(ledger.orders, epsilon=eps)))]
    curve = sum(r.rdp(ledger.orders) for r in releases)
    small = np.asarray(ledger.orders) < 50
    assert np.allclose(curve[small], np.asarray(ledger.orders)[small] * 0.05 / 40)


def test_selection_scores_and_annealing():
    scores = mg.selection_scores(torch.tensor([10.0, 10.0]), sigma=2.0, cells=torch.tensor([1.0, 4.0]),
                                 weights=torch.tensor([1.0, 2.0]))
    b = math.sqrt(2 / math.pi) * 2.0
    assert scores.tolist() == pytest.approx([10 - b, 2 * (10 - 4 * b)])
    before = torch.zeros(4)
    assert mg.anneal(before, torch.full((4,), 0.5), sigma=1.0, cells=4)  # moved 2.0 <= 3.19
    assert not mg.anneal(before, torch.full((4,), 1.0), sigma=1.0, cells=4)


def test_pair_counts_hold_every_one_and_two_way_marginal():
    levels = [3, 1, 4, 2]
    gen = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randint(k, (1000,), generator=gen) for k in levels], 1)
    gram = mg.pair_counts(codes, levels, block=64)  # several blocks
    cliques = [(c,) for c in range(4)] + mg.workload(4)[0]
    for clique, exact in zip(cliques, mg.marginal_counts(codes, cliques, levels)):
        assert torch.equal(mg.clique_from_pairs(gram, clique, levels), exact)


def test_cosine_schedule_runs_from_one_to_the_floor():
    assert mg.cosine_fraction(0, 100, floor=0.1) == pytest.approx(1.0)
    assert mg.cosine_fraction(50, 100, floor=0.1) == pytest.approx(0.55)
    assert mg.cosine_fraction(100, 100, floor=0.1) == pytest.approx(0.1)
    assert mg.cosine_fraction(500, 100, floor=0.1) == pytest.approx(0.1)  # held after the end
    assert mg.cosine_fraction(0, 0, floor=0.2) == 0.2


def test_discretisation_levels_codes_and_values():
    # age-like integer column with 16 values (exact levels), a wide one (bins + 2 spikes), a real-valued one
    disc = Discretisation.of(n_continuous=3, block_sizes=[3], num_classes=2, continuous_units=[1 / 15, 1e-5, 0.0],
                             bins=16)
    assert disc.levels == (16, 18, 18, 3, 2) and disc.exact == (True, False, False)
    x = torch.tensor([[0.0, 0.0, 0.5, 0, 1, 0], [1.0, 1.0, 0.999, 1, 0, 0], [7 / 15, 0.03, 0.0625, 0, 0, 1]])
    codes = disc.codes(x, torch.tensor([1, 0, 1]), [3], 2)
    assert codes.tolist() == [[0, 0, 9, 1, 1], [15, 17, 16, 0, 0], [7, 1, 2, 2, 1]]
    values = disc.values(codes[:, :3])
    assert values[:, 0].tolist() == pytest.approx([0.0, 1.0, 7 / 15])
    assert values[0, 1] == 0.0 and values[1, 1] == 1.0  # the spikes at the bounds
    assert 0 < values[2, 1] < 1 / 16 and 0.5 <= values[0, 2] < 0.5 + 1 / 16  # uniform within the bin
    assert disc.codes(values, torch.tensor([1, 0, 1]), [], 1)[:, :3].equal(codes[:, :3])


def test_a_cells_column_is_modelled_by_its_cell_block_not_its_position():
    # column 0: cells (its position is not a level; its 4 cells are the first block), column 1: exact integers
    disc = Discretisation.of(n_continuous=2, block_sizes=[4, 3], num_classes=2, continuous_units=[0.0, 0.25],
                             bins=8, continuous_cells=[True, False])
    assert disc.levels == (5, 4, 3, 2) and disc.n_modelled == 1 and disc.cells == (True, False)
    x = torch.tensor([[0.9, 0.5, 0, 0, 1, 0, 0, 1, 0], [0.1, 1.0, 1, 0, 0, 0, 1, 0, 0]])
    codes = disc.codes(x, torch.tensor([1, 0]), [4, 3], 2)
    assert codes.tolist() == [[2, 2, 1, 1], [4, 0, 0, 0]]  # the position (0.9, 0.1) is no part of a code
    torch.manual_seed(0)
    values = disc.values(codes[:, :1].repeat(500, 1))
    assert values.shape == (1000, 2) and values[:, 1].tolist() == [0.5, 1.0] * 500
    assert values[:, 0].min() >= 0 and values[:, 0].max() < 1 and abs(values[:, 0].mean() - 0.5) < 0.05  # uniform
    assert Discretisation.of(n_continuous=1, block_sizes=[], num_classes=2, continuous_units=[0.25],
                             bins=8).cells == ()  # no cells: as before
    gem = GEM(ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8]), n_continuous=2,
              block_sizes=[4, 3], num_classes=2, continuous_units=[0.0, 0.25], continuous_cells=[True, False], bins=8)
    gem.num_rows.fill_(10.0)
    gem.add_measurement((1,), torch.tensor([0.0, 0, 10, 0]), 1.0)  # every row in cell 2
    gem.start_from_one_way()
    x, _ = gem.sample(50, seed=0)
    assert x.shape == (50, 9) and (x[:, 2:6].argmax(1) == 2).float().mean() > 0.9  # the cell block is sampled


def test_gem_starts_uniform_and_samples_rows_in_model_space():
    disc = Discretisation.of(n_continuous=1, block_sizes=[3], num_classes=2, continuous_units=[0.25], bins=8)
    module = GEM(ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8]), n_continuous=1,
                 block_sizes=[3], num_classes=2, continuous_units=[0.25], bins=8)
    assert module.levels == (5, 3, 2) and module.cliques == [(0, 1), (0, 2), (1, 2)]
    probs = module.level_probs(6)
    assert all(torch.allclose(p, torch.full_like(p, 1 / p.shape[1])) for p in probs)  # zero output layer
    with pytest.raises(Exception, match="no released marginals"):
        module.sample(4)
    module.add_measurement((0,), torch.tensor([1.0, 2, 3, 4, 5]), 2.0)
    module.add_measurement((0,), torch.tensor([3.0, 2, 1, 0, 5]), 2.0)
    (clique, pooled, precision), = module.pooled()
    assert clique == (0,) and pooled.tolist() == [2.0, 2, 2, 2, 5] and precision == pytest.approx(0.5)
    x, y = module.sample(10, seed=0)
    assert x.shape == (10, 4) and set(x[:, 0].tolist()) <= {0, 0.25, 0.5, 0.75, 1.0}
    assert x[:, 1:].sum(1).eq(1).all() and set(y.tolist()) <= {0, 1}
    with pytest.raises(ValueError, match="cells"):
        module.add_measurement((0, 1), torch.zeros(3), 1.0)


def test_settings_are_refused_before_any_release():
    from lightning_dp.callbacks.adaptive_marginals import AdaptiveMarginals

    for bad in ({"bins": 0}, {"degree": 4}, {"target_weight": -1}, {"lr": 0}, {"batch_size": 1.5}):
        with pytest.raises(ConfigError):
            GEM.check_schema(bad, None)
    for bad in ({"rounds": 0}, {"selection_fraction": 1.0}, {"steps_per_round": 0}, {"final_steps": -1},
                {"final_lr_fraction": 0}, {"final_lr_fraction": 1.5}, {"anneal": "always"}):
        with pytest.raises(ConfigError):
            AdaptiveMarginals.check_settings(bad)


def test_the_gram_loss_is_the_sum_over_measured_cliques():
    disc = Discretisation.of(n_continuous=1, block_sizes=[3, 2], num_classes=2, continuous_units=[0.25], bins=8)
    gen = ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8])
    torch.nn.init.normal_(gen.out.weight)  # away from the uniform start
    module = GEM(gen, n_continuous=1, block_sizes=[3, 2], num_classes=2, continuous_units=[0.25], bins=8,
                 batch_size=16, degree=2, target_triples=True)
    module.log = lambda *args, **kwargs: None
    module.num_rows.fill_(50.0)
    rng = torch.Generator().manual_seed(0)
    for clique, sigma in [((0,), 2.0), ((1, 3), 1.0), ((1, 3), 3.0), ((0, 2), 2.0), ((0, 2, 3), 1.5)]:
        module.add_measurement(clique, torch.rand(mg.clique_size(clique, module.levels), generator=rng) * 20, sigma)
    torch.manual_seed(3)
    loss = module.training_step(None, 0)
    torch.manual_seed(3)
    probs = module.level_probs(16)
    squared = [p.square() for p in probs]
    expected = sum(0.5 * precision * 50.0**2 * ((16 * mg.product_marginal(probs, c).square()
                                                 - mg.product_marginal(squared, c)) / 15
                                                - 2 * y / 50.0 * mg.product_marginal(probs, c) + (y / 50.0).square()).sum()
                   for c, y, precision in module.pooled())
    assert float(loss) == pytest.approx(float(expected), rel=1e-4)
    answers = module.answers([(1, 3), (0, 2, 3)], draws=64)
    assert [a.numel() for a in answers] == [6, 20] and float(answers[0].sum()) == pytest.approx(50.0)
    pair, triple = module.answers([(0, 2), (0, 2, 3)], draws=50, chunk=7)  # the same 50 draws, 7 at a time
    assert float(pair.sum()) == pytest.approx(50.0) and float(triple.sum()) == pytest.approx(50.0)
    assert torch.allclose(triple.view(5, 2, 2).sum(2).flatten(), pair)


def test_the_fit_starts_from_the_released_one_way_proportions():
    disc = Discretisation.of(n_continuous=0, block_sizes=[3], num_classes=2, continuous_units=[], bins=8)
    module = GEM(ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8]), n_continuous=0,
                 block_sizes=[3], num_classes=2, continuous_units=[], bins=8)
    module.num_rows.fill_(100.0)
    module.add_measurement((0,), torch.tensor([50.0, 30.0, -5.0]), 1.0)  # a negative noisy count: clipped
    module.add_measurement((1,), torch.tensor([75.0, 25.0]), 1.0)
    module.start_from_one_way()
    first, label = module.level_probs(3)
    assert torch.allclose(label, torch.tensor([0.75, 0.25]).expand(3, 2), atol=1e-6)
    assert torch.allclose(first[0], torch.tensor([0.5, 0.3, 0.001]) / 0.801, atol=1e-6)


def test_the_step_loss_is_unbiased_for_the_mixtures_loss():
    # the square of a B-draw average overestimates the square of the mixture's marginal by its variance, a pull
    # towards identical components (independent columns); the U-statistic has no such bias
    from lightning_dp.models.gem import unbiased_square_loss

    torch.manual_seed(0)
    gen = ProductGenerator(level_sizes=[3, 2], latent_dim=4, hidden=[8])
    torch.nn.init.normal_(gen.out.weight, std=3.0)  # components far apart: a large variance
    with torch.no_grad():
        first, second = gen(torch.randn(400_000, 4))
        truth = (first.T @ second / len(first)).double()  # the mixture's 2-way marginal (its exact loss: 0)
        a, b = gen(torch.randn(20_000 * 4, 4))
        draws = (a[:, :, None] * b[:, None, :]).double().view(20_000, 4, 3, 2)  # 20,000 steps of B = 4 draws
        mean, mean_sq = draws.mean(1), draws.square().mean(1)
        unbiased = unbiased_square_loss(mean, mean_sq, truth, 4).sum((1, 2))
        plain = (mean - truth).square().sum((1, 2))
    assert abs(float(unbiased.mean())) < 4 * float(unbiased.std()) / 20_000**0.5 + 1e-4
    assert float(plain.mean()) > 10 * abs(float(unbiased.mean())) and float(plain.mean()) > 1e-3
    with pytest.raises(ConfigError, match="batch_size"):
        GEM.check_schema({"batch_size": 1}, None)


def test_the_entropy_term_is_the_components_entropy_and_lowers_the_loss():
    from lightning_dp.models.gem import component_entropy

    uniform, point = torch.full((5, 4), 0.25), F.one_hot(torch.tensor([0, 1, 2, 0, 1]), 3).float()
    assert float(component_entropy([uniform, point])) == pytest.approx(math.log(4))  # Σ_c of the mean over draws
    assert float(component_entropy([torch.cat([uniform, point], 1)])) == pytest.approx(math.log(4))  # one block
    disc = Discretisation.of(n_continuous=0, block_sizes=[3], num_classes=2, continuous_units=[], bins=8)
    modules = [GEM(ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8]), n_continuous=0,
                   block_sizes=[3], num_classes=2, continuous_units=[], bins=8, batch_size=8, entropy_weight=w)
               for w in (0.0, 2.0)]
    for module in modules:
        module.log = lambda *args, **kwargs: None
        module.num_rows.fill_(100.0)
        module.add_measurement((0, 1), torch.tensor([20.0, 10, 30, 5, 25, 10]), 1.0)
    modules[1].load_state_dict(modules[0].state_dict())
    torch.manual_seed(0)
    plain = modules[0].training_step(None, 0)
    torch.manual_seed(0)
    spread = modules[1].training_step(None, 0)
    # the uniform start: every component at log 3 + log 2 nats
    assert float(plain - spread) == pytest.approx(2.0 * (math.log(3) + math.log(2)), rel=1e-5)
    with pytest.raises(ConfigError, match="entropy_weight"):
        GEM.check_schema({"entropy_weight": -1.0}, None)


def test_in_proportions_the_entropy_weight_scales_with_the_losss_mean_weight():
    disc = Discretisation.of(n_continuous=0, block_sizes=[3], num_classes=2, continuous_units=[], bins=8)

    def module(units: str) -> GEM:
        gem = GEM(ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8]), n_continuous=0,
                  block_sizes=[3], num_classes=2, continuous_units=[], bins=8, entropy_weight=2.0, entropy_units=units)
        gem.num_rows.fill_(500.0)
        gem.add_measurement((0,), torch.tensor([100.0, 150, 250]), 4.0)
        gem.add_measurement((0, 1), torch.tensor([20.0, 10, 30, 5, 25, 10]), 10.0)
        gem.add_measurement((0, 1), torch.tensor([22.0, 9, 31, 4, 26, 9]), 10.0)  # pooled: precision 2 / 10²
        return gem

    assert module("loss").entropy_lambda() == 2.0
    # n̂² · (mean over the pooled cliques of Σ 1/s²): (1/4² + 2/10²) / 2
    assert module("proportions").entropy_lambda() == pytest.approx(2.0 * 500**2 * (1 / 16 + 2 / 100) / 2)
    with pytest.raises(ConfigError, match="entropy_units must be loss"):
        GEM.check_schema({"entropy_units": "nats"}, None)


def test_the_label_triples_come_from_label_weighted_gram_matrices():
    disc = Discretisation.of(n_continuous=0, block_sizes=[3, 4], num_classes=3, continuous_units=[], bins=8)
    gen = ProductGenerator(level_sizes=disc.levels, latent_dim=4, hidden=[8])
    torch.nn.init.normal_(gen.out.weight)
    module = GEM(gen, n_continuous=0, block_sizes=[3, 4], num_classes=3, continuous_units=[], bins=8,
                 target_triples=True)
    module.num_rows.fill_(10.0)
    assert module.cliques[-1] == (0, 1, 2) and module._label_triple((0, 1, 2))
    torch.manual_seed(5)
    pair, triple = module.answers([(0, 2), (0, 1, 2)], draws=40, chunk=40)
    torch.manual_seed(5)
    expected = mg.product_marginal(module.level_probs(40), (0, 1, 2)).double() * 10.0
    assert torch.allclose(triple, expected, atol=1e-5) and torch.allclose(triple.view(3, 4, 3).sum(1).flatten(), pair)
