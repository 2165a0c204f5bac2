"""White-box attacks of the one-run audit (audits/white_box.py; Steinke, Nasr and Jagielski 2023): the embedding
least-squares score and DP-SGD's Dirac gradient canaries through the real ``DPSGD`` callback's hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_lightning import LightningModule
from torch import nn

from audits.canary import full_batch_dp_sgd
from audits.one_run import audit_scores
from audits.white_box import DiracCanaries, embedding_scores, spike_scores
from lightning_dp.privacy.ledger import PrivacyLedger


def _embedding_release(noise: float, seed: int = 0):
    """A DP-MERF-like release: 2 classes, D' = 400 unit features, 2,000 base rows, 200 canaries (half in)."""
    rng = np.random.default_rng(seed)
    d, m = 400, 200
    base = rng.normal(size=(2000, d)) / np.sqrt(d) + 0.3 / np.sqrt(d)  # correlated rows, like real data
    base_y = rng.integers(0, 2, 2000)
    canary = rng.normal(size=(m, d)) / np.sqrt(d)
    canary_y = rng.integers(0, 2, m)
    included = rng.random(m) < 0.5
    base_sums = np.stack([base[base_y == c].sum(0) for c in range(2)])
    sums = base_sums + np.stack([canary[included & (canary_y == c)].sum(0) for c in range(2)])
    counts = np.bincount(base_y, minlength=2) + np.bincount(canary_y[included], minlength=2)
    noisy_sums = sums + noise * rng.normal(size=sums.shape)
    noisy_counts = counts + noise * rng.normal(size=2)
    return noisy_sums / noisy_counts[:, None], base_sums, canary, canary_y, included


def test_embedding_scores_recover_the_bits_without_noise():
    target, base_sums, canary, canary_y, included = _embedding_release(noise=0.0)
    scores = embedding_scores(target, base_sums, canary, canary_y)
    assert np.allclose(scores, included.astype(float), atol=1e-6)  # the linear system is exact
    res = audit_scores(scores, included, delta=1e-5)
    assert res["best"]["v"] == res["best"]["r"] and res["epsilon_lower_bound"] > 2


def test_embedding_scores_under_heavy_noise_bound_nothing():
    target, base_sums, canary, canary_y, included = _embedding_release(noise=20.0)
    res = audit_scores(embedding_scores(target, base_sums, canary, canary_y), included, delta=1e-5)
    assert res["epsilon_lower_bound"] < 1


def test_embedding_scores_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes do not match"):
        embedding_scores(np.zeros((2, 5)), np.zeros((2, 5)), np.zeros((3, 4)), np.zeros(3))


def test_dirac_canaries_validate():
    with pytest.raises(ValueError, match="distinct"):
        DiracCanaries(np.array([1, 1]), np.array([True, False]), size=10, sample_rate=0.5, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="lie in"):
        DiracCanaries(np.array([1, 10]), np.array([True, False]), size=10, sample_rate=0.5, max_grad_norm=1.0)


def _dp_sgd_run(epsilon: float, *, steps: int = 200, m: int = 100, rows: int = 64, rate: float = 0.05):
    """``steps`` private steps of the real DPSGD callback (full batch: every row in every step) on a small network
    and fixed rows, with m Dirac canaries attached, each sampled into a step at ``rate`` (sparser than the rows:
    that only weakens them); the model is held still (no optimizer), so the rows' gradients are the same in
    every step and swamp the canaries' sums."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    module = LightningModule()
    module.discriminator = net
    x = torch.randn(rows, 8)
    mech, stub = full_batch_dp_sgd(PrivacyLedger(target_epsilon=epsilon, delta=1e-5), rows=rows, steps=steps,
                                   max_grad_norm=1.0, noise_seed=1)
    mech.on_fit_start(stub, module)
    size = sum(p.numel() for p in net.parameters())
    rng = np.random.default_rng(0)
    canaries = DiracCanaries(rng.choice(size, m, replace=False), rng.random(m) < 0.5, size=size,
                             sample_rate=rate, max_grad_norm=1.0, seed=2)
    mech.attach_canaries(canaries)
    for _ in range(steps):
        mech._released_this_batch = False
        for p in net.parameters():
            p.grad = None
        module.backward(net(x).squeeze(1).square())
    mech.on_fit_end(stub, module)
    return canaries, mech


def test_dirac_canaries_pass_through_dp_sgd_before_the_noise():
    canaries, mech = _dp_sgd_run(1e4)
    assert canaries.steps == 200 and 0 < canaries.sampled < 200 * int(canaries.included.sum())
    summed = audit_scores(canaries.scores, canaries.included, delta=1e-5)
    spikes = audit_scores(canaries.attack_scores(), canaries.included, delta=1e-5)
    assert summed["epsilon_lower_bound"] < 1  # the rows' gradients swamp the plain sum ...
    assert spikes["epsilon_lower_bound"] > 2 and spikes["best"]["v"] == spikes["best"]["r"]  # ... not the spikes


def test_dirac_canaries_at_epsilon_one_stay_below_one():
    canaries, mech = _dp_sgd_run(1.0)
    assert mech.noise_multiplier > 1
    assert audit_scores(canaries.attack_scores(), canaries.included, delta=1e-5)["epsilon_lower_bound"] < 1


def test_spike_scores_ignore_a_drift_and_find_the_spikes():
    rng = np.random.default_rng(0)
    t, m, q = 400, 60, 0.05
    drift = np.cumsum(rng.normal(0, 0.01, (t, m)), 0) + rng.normal(0, 100, m)  # slow, and large per coordinate
    included = np.arange(m) < m // 2
    spikes = (rng.random((t, m)) < q) & included
    scores = spike_scores(drift + spikes + rng.normal(0, 0.05, (t, m)), sample_rate=q)
    assert scores[included].min() > scores[~included].max()
    with pytest.raises(ValueError, match="0 < q < 1"):
        spike_scores(drift, sample_rate=1.0)


def test_canary_gradients_are_clipped_to_c():
    class Huge(DiracCanaries):
        def draw(self):
            out = super().draw()
            return None if out is None else out * 1000  # a canary larger than C is clipped like a row

    torch.manual_seed(0)
    net = nn.Linear(4, 1, bias=False)
    module = LightningModule()
    module.discriminator = net
    mech, stub = full_batch_dp_sgd(PrivacyLedger(target_epsilon=1e6, delta=1e-5), rows=8, steps=10,
                                   max_grad_norm=1.0, noise_seed=0)
    mech.on_fit_start(stub, module)
    canaries = Huge(np.array([0]), np.array([True]), size=4, sample_rate=1.0, max_grad_norm=1.0)
    mech.attach_canaries(canaries)
    x = torch.zeros(8, 4)  # rows with zero gradient: the release is the canary plus the (tiny) noise
    module.backward(net(x).squeeze(1))
    assert canaries.scores[0] == pytest.approx(1.0, abs=0.05)
