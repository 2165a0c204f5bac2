"""PEARL: CF features, (weighted) CF distance, critic weights, the two-release accounting, a tiny run."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dp.kernels.characteristic import (
    cf_distance,
    cf_features,
    cf_sum_sensitivity,
    empirical_cf,
    importance_weights,
    sample_frequencies,
)
from lightning_dp.models import build_model
from lightning_dp.privacy.ledger import PrivacyLedger, Release
from lightning_dp.sample import sample_checkpoint
from lightning_dp.train import train
from tests.conftest import make_cfg


def test_cf_features_have_unit_norm_and_sensitivity_one_or_two():
    x = torch.rand(64, 7) * 10 - 5
    for scale in (0.1, 1.0, 30.0):
        z = cf_features(x, scale * sample_frequencies(50, 7, seed=1))  # (64, 100)
        assert z.shape == (64, 100)
        torch.testing.assert_close(z.norm(dim=1), torch.ones(64))
    assert cf_sum_sensitivity(adjacency="add_remove") == 1.0
    assert cf_sum_sensitivity(adjacency="replace_one") == 2.0


def test_weighted_cf_distance_at_uniform_weights_is_eq7():
    freqs = sample_frequencies(40, 5, seed=0)
    p, q = torch.rand(300, 5), torch.rand(200, 5) ** 2
    phi_p, phi_q = empirical_cf(p, freqs), empirical_cf(q, freqs)  # (80,) each
    uniform = torch.full((40,), 1 / 40)
    unweighted = cf_distance(phi_p, phi_q)
    torch.testing.assert_close(cf_distance(phi_p, phi_q, uniform), unweighted)
    # Eq. 7 with the 1/K: (1/K) Σ|ΔΦ|² = ||mean z_P − mean z_Q||² for the unit-norm features
    mean_gap = (cf_features(p, freqs).mean(0) - cf_features(q, freqs).mean(0)).square().sum()
    torch.testing.assert_close(unweighted, mean_gap)
    assert cf_distance(phi_p, phi_p) == 0


def test_critic_weights_are_a_probability_vector_and_uniform_at_the_base_distribution():
    omega0 = sample_frequencies(100, 12, seed=3)
    torch.testing.assert_close(importance_weights(omega0, torch.zeros(12)), torch.full((100,), 0.01))
    for r in (torch.randn(12), torch.full((12,), 1.0), torch.full((12,), -1.0)):
        w = importance_weights(omega0, r)
        assert w.shape == (100,) and (w >= 0).all()
        assert float(w.sum()) == pytest.approx(1.0, abs=1e-6)
    # a sharper ω (larger precision) favours the low frequencies: ω(t)/ω0(t) falls with ||t||
    w = importance_weights(omega0, torch.full((12,), 0.5))
    norms = omega0.norm(dim=1)
    assert w[norms.argmin()] > w[norms.argmax()]


def test_two_equal_releases_at_eps_1_match_the_spec_table():
    """Spec §2.4: two equal-σ Gaussian releases at ε = 1, δ = 1e-5 need σ = 5.721 (RDP, tight conversion)."""
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)

    def planned(s):
        return [
            Release(name=n, mechanism="gaussian", sensitivity=1.0, noise_multiplier=s) for n in ("aux", "cf")
        ]

    assert ledger.calibrate(planned) == pytest.approx(5.721, rel=0.01)
    # at ε = 0.2 and 10 the table says 25.33 and 0.749
    for eps, sigma in ((0.2, 25.33), (10.0, 0.749)):
        assert PrivacyLedger(target_epsilon=eps, delta=1e-5).calibrate(planned) == pytest.approx(
            sigma, rel=0.01
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pearl")
    cfg = make_cfg(out, "model=pearl", "privacy.noise_seed=0", "model.module.n_gen=2")
    return cfg, train(cfg)


def test_tiny_run_releases_twice_within_the_target_and_samples(run, tmp_path):
    cfg, result = run
    ledger = json.loads(Path(result["ledger"]).read_text())
    assert ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=0.01)
    rel = {r["name"]: r for r in ledger["releases"]}
    assert list(rel) == [
        "data/num_rows",
        "pearl/embedding/bandwidth_moments",
        "pearl/embedding",
        "pearl/embedding/class_counts",
    ]
    # equal shares: the auxiliary release and the embedding (sums + counts, one Gaussian of Δ = √2) both
    # at the two-equal-releases noise multiplier of the spec's table
    # (the DP row count took 2% of the Rényi budget first: both noise multipliers grow by 1/√0.98)
    equal = 5.721 / math.sqrt(0.98)
    assert rel["pearl/embedding/bandwidth_moments"]["noise_multiplier"] == pytest.approx(equal, rel=0.01)
    assert rel["pearl/embedding"]["noise_multiplier"] / math.sqrt(2) == pytest.approx(equal, rel=0.01)
    assert rel["pearl/embedding"]["sensitivity"] == 1.0
    synth = pd.read_csv(result["synthetic"])
    ckpt = torch.load(result["checkpoint"], weights_only=True)
    released = ckpt["lightning_dp"]["data"]["num_rows"]["value"]
    assert len(synth) == round(released) and set(synth["diagnosis"]) <= {"malignant", "benign"}
    state = ckpt["state_dict"]
    assert state["released"] and math.isfinite(float(state["bandwidth"]))
    assert state["precision_offset"].abs().max() > 0  # the critic moved
    out = sample_checkpoint(result["checkpoint"], 50, tmp_path / "s.csv", seed=1)
    assert len(pd.read_csv(out)) == 50


def test_without_critic_weights_stay_uniform(tmp_path):
    layout = {"n_continuous": 4, "block_sizes": [3], "num_classes": 2}
    cfg = make_cfg(tmp_path, "model=pearl", "model.module.critic=false", "model.module.bandwidth=1.0")
    model = build_model(cfg.model, layout)
    assert model.configure_optimizers().__len__() == 1 and not model.needs_bandwidth()
    torch.testing.assert_close(model.critic_weights(), torch.full((100,), 0.01))
    model.set_release(torch.randn(2, 200) * 10, torch.tensor([30.0, 10.0]))
    assert model.class_probs.tolist() == pytest.approx([0.75, 0.25])
    x, y = model.sample(64, seed=0)
    assert x.shape == (64, 7) and ((x[:, :4] >= 0) & (x[:, :4] <= 1)).all()
    assert np.allclose(x[:, 4:].sum(1).numpy(), 1.0) and set(y.tolist()) <= {0, 1}


def test_critic_projection_keeps_the_effective_number_of_frequencies(tmp_path):
    layout = {"n_continuous": 50, "block_sizes": [], "num_classes": 1}
    cfg = make_cfg(tmp_path, "model=pearl", "model.module.bandwidth=2.0", "model.module.critic_min_ess=0.5")
    model = build_model(cfg.model, layout)
    with torch.no_grad():
        model.precision_offset.copy_(torch.linspace(-3.0, 3.0, 50))  # |log(p/p0)| up to ~1.3: collapses α
    assert float(1 / model.critic_weights().square().sum()) < 50
    model.project_to_min_ess()
    ess = float(1 / model.critic_weights().square().sum())
    assert 50 <= ess < 60  # the floor (0.5·K), reached from above by bisection on the offset's scale
