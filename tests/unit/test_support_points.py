"""Private support points: the energy sensitivity, the MH sampler against exact targets, R̂, and the release."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from lightning_dp.callbacks.private_support_points import PrivateSupportPoints
from lightning_dp.errors import ConfigError
from lightning_dp.kernels.energy import energy_distance, support_point_loss
from lightning_dp.models import check_data
from lightning_dp.models.support_points import SupportPoints
from lightning_dp.privacy.energy_mh import (
    ChainSettings,
    Diagnostics,
    accept,
    delta_energy,
    diagnose,
    rhat,
    run_chains,
)
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger, Release
from lightning_dp.privacy.sensitivity import energy_range_sensitivity, energy_sensitivity


# ------------------------------------------------------------------------------------------ sensitivity
def test_energy_sensitivity_worked_example_is_seven_eighths():
    x_prime = torch.zeros(4, 1, dtype=torch.float64)
    x = torch.tensor([[0.0], [0.0], [0.0], [1.0]], dtype=torch.float64)
    y = torch.ones(3, 1, dtype=torch.float64)
    assert float(energy_distance(x_prime, y, 1)) == pytest.approx(2.0, abs=1e-12)
    assert float(energy_distance(x, y, 1)) == pytest.approx(1.125, abs=1e-12)
    assert energy_sensitivity(n_ref=4, d=1, p=1) == 0.875
    assert float(energy_distance(x_prime, y, 1) - energy_distance(x, y, 1)) == pytest.approx(7 / 8, abs=1e-12)


@pytest.mark.parametrize(("n_ref", "d", "p", "expected"), [
    (200, 2, 2, 0.02821356), (10, 2, 2, 0.53740115), (20, 14, 1, 2.73), (40, 9, 1, 0.88875)])
def test_energy_sensitivity_reference_values(n_ref, d, p, expected):
    assert energy_sensitivity(n_ref=n_ref, d=d, p=p) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_energy_sensitivity_bounds_random_neighbours(p):
    gen = torch.Generator().manual_seed(0)
    n_ref, n, d, trials = 6, 4, 3, 2000
    x = torch.rand(trials, n_ref, d, generator=gen, dtype=torch.float64)
    x_prime = x.clone()
    x_prime[:, -1] = torch.randint(0, 2, (trials, d), generator=gen).double()  # a corner: large moves
    y = torch.rand(trials, n, d, generator=gen, dtype=torch.float64).round()
    gap = (energy_distance(x_prime, y, p) - energy_distance(x, y, p)).abs()
    assert float(gap.max()) <= energy_sensitivity(n_ref=n_ref, d=d, p=p) + 1e-12


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_energy_score_range_bounds_any_reference(p):
    gen = torch.Generator().manual_seed(1)
    d = 3
    y = torch.rand(500, 4, d, generator=gen, dtype=torch.float64)
    r = torch.rand(500, 5, d, generator=gen, dtype=torch.float64).round()  # corners
    e = energy_distance(y, r, p)
    assert float(e.min()) >= -1e-12 and float(e.max()) <= energy_range_sensitivity(d=d, p=p)
    corner = energy_distance(torch.zeros(2, d, dtype=torch.float64), torch.ones(3, d, dtype=torch.float64), p)
    assert float(corner) == pytest.approx(energy_range_sensitivity(d=d, p=p))  # the range is attained


# ------------------------------------------------------------------------------------------ the MH step
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_incremental_delta_energy_matches_recomputation(p):
    gen = torch.Generator().manual_seed(2)
    points = torch.rand(3, 5, 4, generator=gen, dtype=torch.float64)
    ref = torch.rand(7, 4, generator=gen, dtype=torch.float64)
    proposal = torch.rand(3, 4, generator=gen, dtype=torch.float64)
    cross = torch.cdist(points, ref.expand(3, 7, 4), p=p).sum(-1)
    delta, cross_new = delta_energy(points, 2, proposal, cross, ref, p)
    moved = points.clone()
    moved[:, 2] = proposal
    assert torch.allclose(delta, energy_distance(moved, ref, p) - energy_distance(points, ref, p), atol=1e-12)
    assert torch.allclose(cross_new, torch.cdist(proposal.unsqueeze(1), ref.expand(3, 7, 4), p=p).sum((-2, -1)))


def test_acceptance_is_log_space_metropolis_and_rejects_outside():
    delta = torch.tensor([-1.0, 0.5, 0.5, 0.5], dtype=torch.float64)
    log_u = torch.tensor([0.0, math.log(0.2), math.log(0.3), math.log(0.2)], dtype=torch.float64)
    inside = torch.tensor([True, True, True, False])
    # β = 2: accept iff u < exp(−1) ≈ 0.368; a move down in energy always; outside the domain never
    assert accept(delta, log_u, inside, 2.0).tolist() == [True, True, True, False]
    assert not bool(accept(torch.tensor([0.5]), torch.tensor([math.log(0.4)]), torch.tensor([True]), 2.0))


def test_mh_kernel_leaves_the_exponential_mechanism_invariant_by_exact_enumeration():
    """Two points on the grid {0, 1/2, 1}, ±1/2 proposals (rejected outside [0, 1]), the sampler's Δe and
    acceptance: the kernel's stationary law is exp(−β e(Y, R))/Z, for random-scan and for cyclic scan."""
    grid, n, beta = (0.0, 0.5, 1.0), 2, 3.0
    ref = torch.tensor([[0.2], [0.9], [0.6]], dtype=torch.float64)
    states = list(itertools.product(grid, repeat=n))
    index = {s: k for k, s in enumerate(states)}

    def kernel(i: int) -> np.ndarray:  # move point i only
        mat = np.zeros((len(states), len(states)))
        for s in states:
            pts = torch.tensor(s, dtype=torch.float64).view(1, n, 1)
            cross = torch.cdist(pts, ref.unsqueeze(0), p=1).sum(-1)
            for step in (-0.5, 0.5):
                target = s[i] + step
                if not 0 <= target <= 1:
                    mat[index[s], index[s]] += 0.5  # out of the domain: rejected
                    continue
                delta, _ = delta_energy(pts, i, torch.tensor([[target]], dtype=torch.float64), cross, ref, 1)
                prob = min(1.0, math.exp(-beta * float(delta)))  # P(log u < −β Δe)
                moved = tuple(target if j == i else v for j, v in enumerate(s))
                mat[index[s], index[moved]] += 0.5 * prob
                mat[index[s], index[s]] += 0.5 * (1 - prob)
        return mat

    energies = np.array([float(energy_distance(torch.tensor(s, dtype=torch.float64).view(n, 1), ref, 1))
                         for s in states])
    target = np.exp(-beta * (energies - energies.min()))
    target /= target.sum()
    k0, k1 = kernel(0), kernel(1)
    for mat in (0.5 * (k0 + k1), k0 @ k1):  # random scan, cyclic scan
        assert np.allclose(mat.sum(1), 1.0)
        values, vectors = np.linalg.eig(mat.T)
        stationary = np.real(vectors[:, np.argmin(np.abs(values - 1))])
        stationary /= stationary.sum()
        assert np.allclose(stationary, target, atol=1e-12)
    assert target.max() / target.min() > 5  # the target is far from uniform: the test has teeth


def test_chains_sample_the_exponential_mechanism_on_one_point():
    """n = 1, D = 1: π(y) ∝ exp(−2β|y − r|) on [0, 1], so |y − r| has a known law; the whole loop (adaptation,
    freezing, boundary rejection, trace) is checked against it."""
    r, beta = 0.3, 3.0
    settings = ChainSettings(burn_in=1000, thin=1000, draws=17, num_chains=4, trace_every=20)
    result = run_chains(torch.tensor([[r]]), n=1, beta=beta, p=1, settings=settings,
                        generator=torch.Generator().manual_seed(0))
    dist = (result.trace.flatten().numpy() / 2.0)  # e = 2|y − r|

    def cdf(u: np.ndarray) -> np.ndarray:  # |y − r| with density ∝ 2e^{−2βu} on [0, r], e^{−2βu} on (r, 1 − r]
        k = 2 * beta
        near = 2 * (1 - np.exp(-k * np.minimum(u, r))) / k
        far = (np.exp(-k * r) - np.exp(-k * np.clip(u, r, 1 - r))) / k
        return (near + far) / (2 * (1 - np.exp(-k * r)) / k + (np.exp(-k * r) - np.exp(-k * (1 - r))) / k)

    assert stats.kstest(dist, cdf).pvalue > 0.01
    assert ((result.acceptance > 0.2) & (result.acceptance < 0.45)).all()  # tuned towards 30%


# ------------------------------------------------------------------------------------------ R̂
def test_rhat_is_near_one_for_iid_chains_and_flags_shifted_ones():
    rng = np.random.default_rng(0)
    iid = rng.normal(size=(4, 500))
    assert rhat(iid) < 1.01
    shifted = iid + np.array([[0.0], [0.0], [0.0], [2.0]])  # one chain two standard deviations away
    assert rhat(shifted) > 1.1
    trending = iid + np.linspace(0, 3, 500)  # every chain drifts: split-R̂ sees the halves disagree
    assert rhat(trending) > 1.1
    assert math.isnan(rhat(np.ones((4, 10))))
    constant = Diagnostics(rhat=math.nan, between_variance=0, within_variance=0, acceptance=[0], step_size=[0],
                           trace_length=10)
    assert not constant.mixed(1.1)


def test_rhat_flags_chains_that_have_not_mixed():
    """Chains that cannot move (tiny frozen steps, no burn-in) stay near their different uniform starts."""
    ref = torch.full((3, 2), 0.5, dtype=torch.float64)
    stuck = ChainSettings(burn_in=0, thin=50, draws=5, num_chains=4, trace_every=10, init_step=1e-5)
    result = run_chains(ref, n=3, beta=1.0, p=2, settings=stuck, generator=torch.Generator().manual_seed(0))
    assert not diagnose(result).mixed(1.1)
    moving = ChainSettings(burn_in=2000, thin=500, draws=10, num_chains=4, trace_every=25)
    result = run_chains(ref, n=3, beta=1.0, p=2, settings=moving, generator=torch.Generator().manual_seed(0))
    assert diagnose(result).mixed(1.1)


# ------------------------------------------------------------------------------------------ the release
class Rows:
    """A private data module of 40 rows in [0, 1]^2 around (0.3, 0.7)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = (torch.tensor([0.3, 0.7]) + 0.05 * torch.randn(40, 2, generator=gen)).clamp(0, 1)

    def private_batches(self, *, chunk_size: int = 4096, rank: int = 0, world_size: int = 1):
        for start in range(0, len(self.x), chunk_size):
            yield self.x[start : start + chunk_size], torch.zeros(len(self.x[start : start + chunk_size]),
                                                                   dtype=torch.long)


SHORT = dict(burn_in=500, thin=250, draws=9, num_chains=3, trace_every=25)


def optimised_module(rows: Rows) -> SupportPoints:
    module = SupportPoints(n_continuous=2, num_points=4, p=2.0)
    opt = torch.optim.Adam([module.points], lr=0.02)
    for _ in range(100):  # what training does (Eq. 5.6)
        opt.zero_grad()
        support_point_loss(rows.x, module.points, 2.0).backward()
        opt.step()
    return module


def test_release_is_recorded_and_replaces_the_optimised_points():
    rows = Rows()
    module = optimised_module(rows)
    optimised = module.points.detach().clone()
    saved = {"state_dict": module.state_dict(), "optimizer_states": [{"state": {0: {"exp_avg": 1}}, "param_groups": []}]}
    module.on_save_checkpoint(saved)
    assert torch.isnan(saved["state_dict"]["points"]).all() and saved["optimizer_states"][0]["state"] == {}
    ledger = PrivacyLedger(target_epsilon=50.0, delta=1e-5)
    cb = PrivateSupportPoints(ledger=ledger, datamodule=rows, max_rhat=1.5, noise_seed=0, sensitivity="support_set", **SHORT)
    assert cb._release(module)
    assert [r.name for r in ledger.releases] == ["support_points/points", "support_points/bandwidth"]
    em = ledger.releases[0]
    assert em.mechanism == "exponential" and em.sensitivity == energy_sensitivity(n_ref=4, d=2, p=2.0)
    assert ledger.spent <= 50.0 and ledger.spent == pytest.approx(50.0, rel=1e-3)
    assert module.is_released() and not torch.allclose(module.points, optimised)
    assert 0.001 <= float(module.bandwidth) <= 0.125
    saved = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(saved)
    assert torch.equal(saved["state_dict"]["points"], module.points.detach())  # the released draw, not Y*
    x, y = module.sample(100, seed=0)
    assert x.shape == (100, 2) and bool(((x >= 0) & (x <= 1)).all()) and not y.any()
    assert cb.diagnostics["mixed"] and cb.diagnostics["rhat"] <= 1.5


def test_release_is_refused_over_budget_before_any_chain_runs():
    rows = Rows()
    module = optimised_module(rows)
    before = module.points.detach().clone()
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    ledger.record(Release(name="earlier", mechanism="exponential", sensitivity=1.0, epsilon=0.99))
    cb = PrivateSupportPoints(ledger=ledger, datamodule=rows, noise_seed=0, **SHORT)
    with pytest.raises(BudgetExceededError):
        cb._release(module)
    assert [r.name for r in ledger.releases] == ["earlier"]
    assert not module.is_released() and torch.equal(module.points.detach(), before) and cb.diagnostics is None


def test_non_mixed_chains_release_the_draw_and_label_only_the_private_diagnostics():
    rows = Rows()
    module = optimised_module(rows)
    ledger = PrivacyLedger(target_epsilon=5.0, delta=1e-5)
    cb = PrivateSupportPoints(ledger=ledger, datamodule=rows, noise_seed=0, burn_in=0, thin=50, draws=5,
                              num_chains=4, trace_every=10, init_step=1e-5)
    assert not cb._release(module)  # not mixed: said in the (private) diagnostics only
    assert [r.name for r in ledger.releases] == ["support_points/points", "support_points/bandwidth"]
    assert module.is_released() and not cb.diagnostics["mixed"]
    saved = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(saved)
    assert not torch.isnan(saved["state_dict"]["points"]).any()
    assert module.sample(5)[0].shape[0] == 5


# ------------------------------------------------------------------------------------------ module and settings
def test_categorical_blocks_and_the_label_are_sampled_hard_from_the_centres():
    module = SupportPoints(n_continuous=1, block_sizes=[3], num_classes=2, num_points=2, bandwidth=0.01)
    assert module.dim == 1 + 3 + 2
    module.set_release(torch.tensor([[0.2, 1.0, 0.0, 0.0, 0.0, 1.0], [0.8, 0.0, 0.5, 0.5, 0.3, 0.0]]))
    x, y = module.sample(2000, seed=0)
    assert x.shape == (2000, 4) and torch.equal(x[:, 1:].sum(1), torch.ones(2000))
    first = x[:, 0] < 0.5  # rows drawn around the first centre
    assert bool((x[first, 1] == 1).all()) and bool((y[first] == 1).all())
    assert bool((x[~first, 1] == 0).all()) and bool((y[~first] == 0).all())
    assert 0.4 < float(x[~first, 2].mean()) < 0.6  # 0.5/0.5 between categories 1 and 2


def test_settings_are_checked_before_any_release():
    cfg = {"module": {"_target_": "lightning_dp.models.support_points.SupportPoints", "num_points": 35},
           "mechanisms": [{"_target_": "lightning_dp.callbacks.private_support_points.PrivateSupportPoints",
                           "draws": 1, "thin": 10, "trace_every": 100}]}
    with pytest.raises(ConfigError, match="split-R̂ needs at least 4"):
        check_data(cfg, schema=object())
    cfg["mechanisms"][0] = {"_target_": cfg["mechanisms"][0]["_target_"], "sensitivity": "data"}
    with pytest.raises(ConfigError, match="support_set, score_range"):
        check_data(cfg, schema=object())
    cfg["mechanisms"] = []
    with pytest.raises(ConfigError, match="tabular"):
        check_data(cfg, schema=None)
    cfg["module"]["p"] = 3
    with pytest.raises(ConfigError, match=r"p must be in \[1, 2\]"):
        check_data(cfg, schema=object())


def test_score_range_sensitivity_is_what_the_ledger_records():
    rows = Rows()
    ledger = PrivacyLedger(target_epsilon=50.0, delta=1e-5)
    cb = PrivateSupportPoints(ledger=ledger, datamodule=rows, max_rhat=1.5, noise_seed=0, sensitivity="score_range",
                              **SHORT)
    assert cb._release(optimised_module(rows))
    assert ledger.releases[0].sensitivity == energy_range_sensitivity(d=2, p=2.0) == 2 * math.sqrt(2)
    assert "holds for any reference" in ledger.releases[0].note
