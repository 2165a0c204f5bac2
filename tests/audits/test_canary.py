"""Canary audits of DP-MERF's one-shot release: the score's calibration, a bound below the claimed ε, power
with the noise off, and the trial protocol that other mechanisms (DP-SGD) plug into."""

import math

import numpy as np
import pytest
import torch

from audits.canary import EmbeddingCanary, audit_trials
from tests.conftest import make_cfg

DELTA = 1e-5
TRIALS = 64  # per side: 32 evaluate the threshold; no error in 32 + 32 gives the largest bound, 2.1022
LAYOUT = {"n_continuous": 4, "block_sizes": [3], "num_classes": 2}


def _rows(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n model-space rows: 4 continuous columns in [0, 1], one 3-category block, 2 classes."""
    g = torch.Generator().manual_seed(seed)
    hot = torch.nn.functional.one_hot(torch.randint(0, 3, (n,), generator=g), 3).float()
    return torch.cat([torch.rand(n, 4, generator=g), hot], 1), torch.randint(0, 2, (n,), generator=g)


@pytest.fixture(scope="module")
def model_cfg(tmp_path_factory):
    return make_cfg(tmp_path_factory.mktemp("canary"), "model.module.num_features=64").model


def _trial(model_cfg, epsilon: float) -> EmbeddingCanary:
    x, y = _rows()
    canary = (torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]), 0)  # a corner of the box, rare category
    return EmbeddingCanary(
        model_cfg=model_cfg, layout=LAYOUT, x=x, y=y, canary=canary, epsilon=epsilon, delta=DELTA
    )


def test_score_is_the_gaussian_likelihood_ratio_statistic(model_cfg):
    # noise off: the score is exactly 0 without the canary and 2 with it (sum shift / Δ² + count shift / Δ²)
    off = _trial(model_cfg, 1e4)
    assert off(True, 0) == pytest.approx(2.0, abs=0.1) and off(False, 1) == pytest.approx(0.0, abs=0.1)
    assert off.noise_multiplier < 0.02
    # at ε = 1 the ledger calibrates σ = 5.732 for sums and counts (5% of ε to the bandwidth), and the score
    # is N(0, 2σ²): its spread over releases checks that the callback adds the noise the ledger claims
    on = _trial(model_cfg, 1.0)
    scores = np.array([on(False, s) for s in range(60)])
    assert on.noise_multiplier == pytest.approx(5.732, rel=1e-3)
    sd = math.sqrt(2) * on.noise_multiplier
    # 60 draws: the sample sd is within ±30% of the true one with probability > 0.99
    assert scores.std(ddof=1) == pytest.approx(sd, rel=0.3)
    assert abs(scores.mean()) < 4 * sd / math.sqrt(60)


def test_dp_merf_bound_stays_below_its_epsilon_and_exceeds_it_with_the_noise_off(model_cfg):
    claimed = audit_trials(_trial(model_cfg, 1.0), trials=TRIALS, delta=DELTA)
    assert claimed.epsilon_lower_bound < 1.0
    off = audit_trials(_trial(model_cfg, 1e4), trials=TRIALS, delta=DELTA)
    assert (off.false_positives, off.false_negatives) == (0, 0)
    ub = 1 - 0.025 ** (1 / (TRIALS // 2))  # Clopper–Pearson upper bound of 0 errors in 32 runs
    assert off.epsilon_lower_bound == pytest.approx(math.log((1 - DELTA - ub) / ub), rel=1e-9)
    assert off.epsilon_lower_bound == pytest.approx(2.1022, abs=1e-4) and off.epsilon_lower_bound > 1.0


def test_any_mechanism_plugs_in_as_a_trial():
    # a DP-SGD audit will pass its own trial(with_canary, seed) -> score; here a Gaussian sum with Δ = 1
    def gaussian(with_canary: bool, seed: int) -> float:
        return float(with_canary) + 0.05 * np.random.default_rng(seed).normal()

    res = audit_trials(gaussian, trials=TRIALS, delta=DELTA)
    assert res.epsilon_lower_bound == pytest.approx(2.1022, abs=1e-4) and res.sign == 1


def test_bad_shapes_are_refused(model_cfg):
    x, y = _rows()
    with pytest.raises(ValueError, match=r"x must be \(n, 7\)"):
        EmbeddingCanary(
            model_cfg=model_cfg, layout=LAYOUT, x=x[:, :5], y=y, canary=(x[0], 0), epsilon=1.0, delta=DELTA
        )
    with pytest.raises(ValueError, match="canary label 5"):
        EmbeddingCanary(
            model_cfg=model_cfg, layout=LAYOUT, x=x, y=y, canary=(x[0], 5), epsilon=1.0, delta=DELTA
        )


@pytest.mark.slow
def test_many_trials_on_real_rows_stay_below_the_tight_epsilon(model_cfg):
    """500 releases per side on breast-cancer rows: the bound stays below the tight ε of the attacked
    Gaussian (0.913 at σ = 5.732), itself below the ledger's ε = 1."""
    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.privacy.ledger import PrivacyLedger
    from lightning_dp.privacy.mechanisms import noise_generator

    dm = PrivateDataModule(name="breast_cancer", max_rows=100)
    dm.prepare(PrivacyLedger(target_epsilon=1.0, delta=DELTA), generator=noise_generator(0))
    cx, cy = dm.encoder.transform(dm.holdout.iloc[:1])
    trial = EmbeddingCanary(
        model_cfg=model_cfg,
        layout=dm.layout,
        x=dm.x,
        y=dm.y,
        canary=(cx[0], int(cy[0])),
        epsilon=1.0,
        delta=DELTA,
    )
    assert audit_trials(trial, trials=500, delta=DELTA).epsilon_lower_bound < 0.913


def test_dp_sgd_bound_stays_below_its_epsilon_and_exceeds_it_with_the_noise_off():
    from audits.canary import SGDCanary

    gen = torch.Generator().manual_seed(0)
    rows = torch.rand(30, 6, generator=gen)
    canary = torch.full((6,), 5.0)  # far from D: its gradient is clipped to exactly C
    private = audit_trials(SGDCanary(rows, canary, epsilon=1.0, delta=1e-5, steps=3), trials=60, delta=1e-5)
    assert private.epsilon_lower_bound < 1.0
    noiseless = SGDCanary(rows, canary, epsilon=1e4, delta=1e-5, steps=3)
    bound = audit_trials(noiseless, trials=60, delta=1e-5).epsilon_lower_bound
    assert noiseless.noise_multiplier < 0.05 and bound > 1.0


@pytest.mark.parametrize("objective", [
    {"marginal_objective": "ebgan"},
    {"marginal_objective": "likelihood", "dequantise": 1.0, "fourier": 8, "continuous_units": [0.1, 0.0, 0.0]},
])
def test_ppem_with_its_batch_coupled_penalty_stays_below_its_epsilon_and_exceeds_it_with_the_noise_off(objective):
    """The real PPEM energies + KSDPenalty + DPSGD: the penalty's batch coupling is covered by Δ = C + 2·C_P, with
    the paper's energy and with the density (its log Z, public, is not part of the private release)."""
    from audits.canary import PPEMCanary

    gen = torch.Generator().manual_seed(0)
    n = 20
    onehot = torch.nn.functional.one_hot(torch.randint(0, 2, (n,), generator=gen), 2).float()
    rows = torch.cat([torch.rand(n, 3, generator=gen), onehot], 1)
    labels = torch.randint(0, 2, (n,), generator=gen)
    layout = {"n_continuous": 3, "block_sizes": [2], "num_classes": 2, "continuous_names": ["a", "b", "c"],
              "sensitive": ["a", "b"], **objective}
    canary = (torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]), 1)  # an extreme x′: moves every pair of the penalty
    private = PPEMCanary(rows, labels, canary, layout=layout, epsilon=1.0, delta=1e-5, steps=2)
    assert audit_trials(private, trials=40, delta=1e-5).epsilon_lower_bound < 1.0
    noiseless = PPEMCanary(rows, labels, canary, layout=layout, epsilon=1e4, delta=1e-5, steps=2)
    assert audit_trials(noiseless, trials=40, delta=1e-5).epsilon_lower_bound > 1.0
    assert noiseless.noise_multiplier < 0.05


def test_dp_iw_gmmn_bound_stays_below_its_epsilon_and_exceeds_it_with_the_noise_off():
    """The real IWMMDGenerator step + DPSGD: a canary weighted 50× moves the release by exactly C, no more."""
    from audits.canary import IWGMMNCanary

    gen = torch.Generator().manual_seed(0)
    rows = torch.rand(12, 4, generator=gen)
    canary = torch.full((4,), 0.5)  # amid the generated rows at initialisation: its kernel gradient is not ~0

    def weights(x: torch.Tensor) -> torch.Tensor:  # known weights: 1 for D, 50 for the canary
        return 1.0 + 49.0 * ((x - 0.5).abs().sum(1) < 1e-6).float()

    private = IWGMMNCanary(rows, canary, weights=weights, epsilon=1.0, delta=DELTA, steps=2)
    shifts = [float((b - a).norm()) for a, b in zip(*private.clean)]
    assert shifts == pytest.approx([1.0, 1.0], abs=1e-3)  # the weighted canary's gradient is clipped to C = 1
    assert audit_trials(private, trials=40, delta=DELTA).epsilon_lower_bound < 1.0
    noiseless = IWGMMNCanary(rows, canary, weights=weights, epsilon=1e4, delta=DELTA, steps=2)
    assert audit_trials(noiseless, trials=40, delta=DELTA).epsilon_lower_bound > 1.0
    assert noiseless.noise_multiplier < 0.05
    with pytest.raises(ValueError, match="allows iw, standard only"):
        IWGMMNCanary(rows, canary, estimator="sniw", epsilon=1.0, delta=DELTA)
