"""priv_mlp (DP-SGD classifier weights) and discriminator weights: accuracy on a toy, accounting, refusals."""

import logging
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm, spearmanr

from lightning_dp.errors import ConfigError
from lightning_dp.models.dp_gan import DPGAN
from lightning_dp.models.dp_merf import DPMERF
from lightning_dp.nets.discriminators import ConditionalDiscriminator
from lightning_dp.nets.generators import ConditionalGenerator
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.progress import tracker
from lightning_dp.weighting.base import PlanInputs
from lightning_dp.weighting.discriminator import DiscriminatorWeights
from lightning_dp.weighting.dp_mlp import DPSGDWeights

DELTA = 1e-5
pytestmark = pytest.mark.usefixtures("single_thread")  # many tiny DP-SGD steps


def toy(n_real=1987, n_syn=2000, seed=0):
    """Real ~ N((0.7, 0.7), 0.1²) vs synthetic ~ U[0, 1]²; the true log ratio of the synthetic rows."""
    g = torch.Generator().manual_seed(seed)
    real = (0.7 + 0.1 * torch.randn(n_real, 2, generator=g)).clamp(0, 1)
    syn = torch.rand(n_syn, 2, generator=g)
    return real, syn, norm.logpdf(syn.numpy(), 0.7, 0.1).sum(1)  # log p_D - log p_G (p_G = 1)


def inputs(n_syn=2000, **kw):
    return PlanInputs(num_real=2000.0, num_synthetic=n_syn, num_features=2, delta=DELTA, **kw)


def test_priv_mlp_recovers_the_ratio_and_spends_exactly_its_plan(caplog):
    real, syn, true = toy()  # 1987 real rows, but the run's DP count says ñ_D = 2000
    est = DPSGDWeights(epsilon=3.0)
    plan = est.plan(inputs())
    assert len(plan) == 1 and plan[0].name == "dp_sgd/classifier" and plan[0].sensitivity == 1.0
    q = plan[0].sample_rate
    assert q == 64 / 4000  # L/(ñ_D + N_G) from the DP count, never len(real)
    assert plan[0].count == 20 * round(1 / q) == 1240
    ledger = PrivacyLedger(target_epsilon=100.0, delta=DELTA)
    assert ledger.epsilon(plan) == pytest.approx(3.0, abs=1e-3) and ledger.epsilon(plan) <= 3.0
    est.ledger = ledger
    caplog.set_level(logging.INFO, logger="lightning_dp.progress")
    with tracker.session(every=3600, enabled=True):  # off a terminal: the plan's DP-SGD steps (public)
        fit = est.fit(real, syn, releases=plan, generator=torch.Generator().manual_seed(1))
    stages = [r.getMessage() for r in caplog.records if r.name == "lightning_dp.progress"]
    assert stages[0].startswith("progress: weights (priv_mlp): train | 0/1240 DP-SGD steps (0%)")
    assert stages[-1].startswith("progress: weights (priv_mlp): done")

    assert fit.log_w.shape == (2000,) and fit.keep is None and fit.private
    assert spearmanr(fit.log_w, true).correlation > 0.5
    # the ledger holds exactly the planned release, taken step by step by DPSGD
    assert len(ledger.releases) == 1
    assert ledger.releases[0].same_mechanism(plan[0]) and ledger.releases[0].count == plan[0].count
    assert 2.9 <= ledger.spent <= 3.0
    assert fit.releases[0].same_mechanism(plan[0]) and fit.releases[0].count == 1240
    assert fit.info["prior_log_ratio"] == 0.0 and fit.info["steps"] == 1240
    assert est.nominal_guarantee is None and not est.nominal


def test_prior_term_uses_the_dp_count():
    real, syn, _ = toy(n_real=300, n_syn=400)
    est = DPSGDWeights(epsilon=3.0, epochs=1)
    plan = est.plan(PlanInputs(num_real=300.0, num_synthetic=400, num_features=2, delta=DELTA))
    est.ledger = PrivacyLedger(target_epsilon=3.0, delta=DELTA)
    fit = est.fit(real, syn, releases=plan, generator=torch.Generator().manual_seed(0))
    assert fit.info["prior_log_ratio"] == pytest.approx(math.log(400 / 300))
    assert est.ledger.releases[0].count == plan[0].count == round(700 / 64)


def test_per_private_example_mode_is_nominal_and_runs():
    real, syn, true = toy(n_real=500, n_syn=500)
    est = DPSGDWeights(epsilon=3.0, noise="per_private_example", epochs=5)
    assert est.nominal and "no standard (ε, δ) guarantee" in est.nominal_guarantee
    plan = est.plan(PlanInputs(num_real=500.0, num_synthetic=500, num_features=2, delta=DELTA))
    ledger = PrivacyLedger(target_epsilon=3.0, delta=DELTA)
    est.ledger = ledger
    with pytest.raises(RuntimeError, match="waive"):
        est.fit(real, syn, releases=plan, generator=torch.Generator().manual_seed(0))
    ledger.waive("weights/priv_mlp", est.nominal_guarantee)
    fit = est.fit(real, syn, releases=plan, generator=torch.Generator().manual_seed(0))
    assert fit.log_w.shape == (500,) and np.isfinite(fit.log_w).all()
    assert fit.info["nominal_guarantee"] == est.nominal_guarantee
    assert ledger.releases[0].same_mechanism(plan[0]) and ledger.releases[0].count == plan[0].count
    assert not ledger.dp_claim


def test_priv_mlp_refusals():
    with pytest.raises(ConfigError, match="weights.epsilon"):
        DPSGDWeights()
    with pytest.raises(ConfigError, match="noise"):
        DPSGDWeights(epsilon=3.0, noise="per_batch")
    with pytest.raises(ConfigError, match="add_remove"):
        DPSGDWeights(epsilon=3.0).plan(inputs(adjacency="replace_one"))
    real, syn, _ = toy(n_real=50, n_syn=60)
    est = DPSGDWeights(epsilon=3.0)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="plan"):
        est.fit(real, syn, releases=[], generator=gen)
    plan = est.plan(inputs(n_syn=60))
    with pytest.raises(RuntimeError, match="ledger"):
        est.fit(real, syn, releases=plan, generator=gen)
    est.ledger = PrivacyLedger(target_epsilon=3.0, delta=DELTA)
    with pytest.raises(ValueError, match="planned for N_G = 60"):
        est.fit(real, syn[:50], releases=plan, generator=gen)
    other = DPSGDWeights(epsilon=3.0, lot_size=32).plan(inputs(n_syn=60))  # another sample rate
    for releases in ([*plan, *plan], other, []):
        with pytest.raises(ValueError, match="exactly the release"):
            est.fit(real, syn, releases=releases, generator=gen)
    assert not est.ledger.releases  # nothing was recorded by the refused fits


# ---------------------------------------------------------------------------------------------- discriminator
def gan(conditional=True, loss="bce"):
    torch.manual_seed(0)
    blocks, k = [2], 2
    net_blocks, net_k = (blocks, k) if conditional else ([*blocks, k], 1)
    g = ConditionalGenerator(n_continuous=3, block_sizes=net_blocks, num_classes=net_k, latent_dim=4, hidden=[8])
    d = ConditionalDiscriminator(n_continuous=3, block_sizes=net_blocks, num_classes=net_k, hidden=[8],
                                 conditional=conditional)
    return DPGAN(g, d, n_continuous=3, block_sizes=blocks, num_classes=k, conditional=conditional, loss=loss)


@pytest.mark.parametrize("conditional", [True, False])
def test_discriminator_weights_are_its_logit(conditional):
    model = gan(conditional)
    x, y = model.sample(50, seed=0)
    est = DiscriminatorWeights()
    assert est.plan(inputs()) == [] and not est.reads_private and est.needs_model
    fit = est.fit(None, torch.zeros(50, 7), releases=[], generator=torch.Generator(), model=model, rows=(x, y))
    with torch.no_grad():
        if conditional:
            expected = model.discriminator(x, y)
        else:  # the unconditional GAN's D sees the label as the last one-hot block
            expected = model.discriminator(torch.cat([x, torch.nn.functional.one_hot(y, 2).float()], 1),
                                           torch.zeros_like(y))
    np.testing.assert_array_equal(fit.log_w, expected.double().numpy() + 0.0)
    assert fit.releases == [] and fit.info["prior_log_ratio"] == 0.0


def test_discriminator_weights_refuse_critics_and_models_without_one():
    est = DiscriminatorWeights()
    critic = gan(loss="wgan_gp")
    rows = critic.sample(5, seed=0)
    with pytest.raises(ConfigError, match="WGAN critic is not a probability"):
        est.fit(None, None, releases=[], generator=torch.Generator(), model=critic, rows=rows)
    gen = ConditionalGenerator(n_continuous=3, block_sizes=[2], num_classes=2)
    merf = DPMERF(gen, n_continuous=3, block_sizes=[2], num_classes=2, num_features=10, bandwidth=0.5)
    with pytest.raises(ConfigError, match="dp_gan or model=dp_cgan"):
        est.fit(None, None, releases=[], generator=torch.Generator(), model=merf, rows=rows)
    with pytest.raises(ValueError, match="rows"):
        est.fit(None, None, releases=[], generator=torch.Generator(), model=gan())
