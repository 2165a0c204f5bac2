"""GEM's label head (``GEM.fit_label_head``): the log-linear P(y | x) fitted to the measured label marginals over
the generator's rows, how sampling uses it, and checkpoints with and without it."""

import math

import pytest
import torch

from lightning_dp.errors import ConfigError
from lightning_dp.models.gem import GEM
from lightning_dp.nets.marginal_nets import ProductGenerator

LEVELS = (3, 4, 2)  # two categorical columns and a binary label
P1, P2 = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.2, 0.3, 0.4])
B1, B2, BIAS = torch.tensor([-1.0, 0.0, 1.5]), torch.tensor([0.5, -0.5, 0.0, 1.0]), -0.5
N = 10_000.0


def true_joint() -> torch.Tensor:
    """P(x1, x2, y) with independent columns and a label whose log-odds add up over them, (3, 4, 2)."""
    p_pos = torch.sigmoid(BIAS + B1[:, None] + B2[None, :])  # (3, 4)
    px = P1[:, None] * P2[None, :]
    return torch.stack([px * (1 - p_pos), px * p_pos], -1).double()


def model(measure: bool = True) -> GEM:
    """A GEM whose generator draws the two columns independently at their true proportions (output weights 0, biases
    the logs) and the label independently of them; its measurements are the true marginals in counts."""
    torch.manual_seed(0)
    gem = GEM(ProductGenerator(level_sizes=LEVELS, latent_dim=4, hidden=[8]), n_continuous=0, block_sizes=[3, 4],
              num_classes=2, label_head=True)
    gem.num_rows.fill_(N)
    joint = true_joint()
    with torch.no_grad():
        gem.generator.out.bias.copy_(torch.cat([P1.log(), P2.log(), joint.sum((0, 1)).log().float()]))
    if measure:
        for clique, table in (((0,), joint.sum((1, 2))), ((1,), joint.sum((0, 2))), ((2,), joint.sum((0, 1))),
                              ((0, 2), joint.sum(1)), ((1, 2), joint.sum(0))):
            gem.add_measurement(clique, N * table.flatten(), sigma=20.0)  # ~ the draws' Monte-Carlo error
    return gem


def head_positive(gem: GEM) -> torch.Tensor:
    """The head's P(y = 1 | x1, x2) on every cell, (3, 4)."""
    codes = torch.tensor([[a, b, 0] for a in range(3) for b in range(4)])
    logits = gem.head_logits(codes)
    return torch.softmax(logits, 1)[:, 1].view(3, 4)


def test_the_head_recovers_a_label_additive_in_the_columns():
    truth = true_joint()
    truth = truth[..., 1] / truth.sum(-1)
    assert float(truth.max() - truth.min()) > 0.5  # the generator's own label ignores x: the head must supply it
    gem = model()
    loss = gem.fit_label_head()
    assert bool(gem.head_fitted) and loss < 1.0  # within the noise: ~0.5 a cell
    assert gem.head_cliques.tolist() == [[0, 2, -1], [1, 2, -1]]
    assert (head_positive(gem) - truth).abs().max() < 0.03


def test_sampling_draws_the_label_from_the_head():
    gem = model()
    x, y = gem.sample(40_000, seed=1)
    x1 = x[:, :3].argmax(1)
    before = [float(y[x1 == a].float().mean()) for a in range(3)]
    assert max(before) - min(before) < 0.03  # the generator alone: the label is independent of x1
    gem.fit_label_head()
    x, y = gem.sample(40_000, seed=1)
    x1, truth = x[:, :3].argmax(1), true_joint().sum(1)
    for a in range(3):
        assert float(y[x1 == a].float().mean()) == pytest.approx(float(truth[a, 1] / truth[a].sum()), abs=0.02)


def test_noisy_measurements_leave_the_head_finite_and_close():
    gem = model(measure=False)
    gen = torch.Generator().manual_seed(3)
    joint = true_joint()
    for clique, table in (((2,), joint.sum((0, 1))), ((0, 2), joint.sum(1)), ((1, 2), joint.sum(0))):
        counts = N * table.flatten()
        gem.add_measurement(clique, counts + 30.0 * torch.randn(counts.shape, generator=gen, dtype=torch.float64),
                            sigma=30.0)
    gem.fit_label_head()
    truth = joint[..., 1] / joint.sum(-1)
    assert torch.isfinite(gem.head_weights).all() and (head_positive(gem) - truth).abs().max() < 0.1


def test_a_checkpoint_keeps_the_head_and_one_without_it_samples_as_before():
    gem = model()
    gem.fit_label_head()
    fresh = model(measure=False)
    fresh.load_state_dict(gem.state_dict(), strict=True)  # the head's sizes follow the saved ones
    assert torch.equal(fresh.sample(500, seed=2)[1], gem.sample(500, seed=2)[1])
    old = {k: v for k, v in gem.state_dict().items() if not k.startswith("head_")}  # written before the head
    older = model(measure=False)
    older.load_state_dict(old, strict=True)
    assert not bool(older.head_fitted)
    unfitted = model()
    assert torch.equal(older.sample(500, seed=2)[1], unfitted.sample(500, seed=2)[1])


def test_label_head_settings_are_checked_before_any_release():
    from lightning_dp.data.schema import Column, Schema

    with pytest.raises(ConfigError, match="label_head must be true or false"):
        GEM.check_schema({"label_head": "yes"}, None)
    unlabelled = Schema(columns=[Column("a", "categorical", categories=["x", "y"]),
                                 Column("b", "categorical", categories=["x", "y"])])
    with pytest.raises(ConfigError, match="no label column"):
        GEM.check_schema({"label_head": True}, unlabelled)
    GEM.check_schema({"label_head": False}, unlabelled)
    assert math.isnan(model(measure=False).fit_label_head())  # nothing measured: nothing to fit


def test_training_end_fits_the_head_and_warns_when_no_pair_holds_the_label(caplog):
    from lightning_dp.callbacks.adaptive_marginals import AdaptiveMarginals
    from lightning_dp.privacy.ledger import PrivacyLedger

    mechanism = AdaptiveMarginals(ledger=PrivacyLedger(target_epsilon=1.0, delta=1e-5), datamodule=None,
                                  answer_draws=4096)
    gem = model(measure=False)
    gem.finished.fill_(True)
    gem.add_measurement((2,), N * true_joint().sum((0, 1)).flatten(), sigma=20.0)  # the label's share alone
    with caplog.at_level("WARNING", logger="lightning_dp"):
        mechanism.on_train_end(None, gem)
    assert bool(gem.head_fitted) and "independently of the row" in caplog.text
    share = float(true_joint().sum((0, 1))[1])
    assert float(gem.sample(20_000, seed=4)[1].float().mean()) == pytest.approx(share, abs=0.02)  # a label a row
    caplog.clear()
    fitted = model()
    fitted.finished.fill_(True)
    with caplog.at_level("WARNING", logger="lightning_dp"):
        mechanism.on_train_end(None, fitted)
    assert bool(fitted.head_fitted) and len(fitted.head_cliques) == 2 and "independently" not in caplog.text


def test_a_three_class_label_is_recovered_with_class_0_as_the_reference():
    torch.manual_seed(0)
    b1 = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, -1.0], [0.0, -1.0, 2.0]])
    b2 = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0], [0.0, 1.0, 1.0]])
    truth = torch.softmax(b1[:, None, :] + b2[None, :, :], -1).double()  # (3, 4, 3)
    joint = P1[:, None, None].double() * P2[None, :, None].double() * truth
    gem = GEM(ProductGenerator(level_sizes=(3, 4, 3), latent_dim=4, hidden=[8]), n_continuous=0, block_sizes=[3, 4],
              num_classes=3, label_head=True)
    gem.num_rows.fill_(N)
    with torch.no_grad():
        gem.generator.out.bias.copy_(torch.cat([P1.log(), P2.log(), joint.sum((0, 1)).log().float()]))
    for clique, table in (((2,), joint.sum((0, 1))), ((0, 2), joint.sum(1)), ((1, 2), joint.sum(0))):
        gem.add_measurement(clique, N * table.flatten(), sigma=20.0)
    gem.fit_label_head()
    codes = torch.tensor([[a, b, 0] for a in range(3) for b in range(4)])
    head = torch.softmax(gem.head_logits(codes), 1).view(3, 4, 3)
    first = gem.head_weights[: int(gem.head_offsets[1])].view(-1, 3)  # the first table, (levels, classes)
    assert (head - truth).abs().max() < 0.03 and (gem.head_bias[0] == 0 and (first[:, 0] == 0).all())


def test_a_checkpoint_whose_head_or_measurements_do_not_fit_together_is_refused_at_load():
    gem = model()
    gem.fit_label_head()
    for key, bad, message in (
            ("head_cliques", torch.tensor([[0, 99, -1], [1, 2, -1]]), "label head' cliques"),
            ("head_cliques", torch.tensor([[0, 1, -1], [1, 2, -1]]), "label head' cliques"),  # no label in a table
            ("head_offsets", torch.tensor([0, 6, 20]), "label head' offsets"),
            ("meas_offsets", torch.tensor([0, 3, 7, 9, 21, 30]), "measurements' offsets")):
        state = {**gem.state_dict(), key: bad}
        with pytest.raises(RuntimeError, match=message):
            model(measure=False).load_state_dict(state, strict=True)
    model(measure=False).load_state_dict(gem.state_dict(), strict=True)  # the untouched file loads
