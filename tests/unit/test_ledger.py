import json
import math
import resource

import numpy as np
import pytest
from opacus.accountants.analysis.prv import Domain

from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PRV_MAX_POINTS, BudgetExceededError, PrivacyLedger, Release


def sgd(count: int = 2250, sigma: float = 1.5, q: float = 0.04) -> Release:
    return Release(
        name="dp_sgd",
        mechanism="subsampled_gaussian",
        sensitivity=1.0,
        noise_multiplier=sigma,
        sample_rate=q,
        count=count,
    )


def test_reproduces_opacus_golden_value():
    ledger = PrivacyLedger(target_epsilon=10, delta=1e-5)
    ledger.record(sgd())
    assert ledger.spent == pytest.approx(7.32911117143, abs=1e-6)


def test_step_by_step_equals_one_composed_release():
    one, many = PrivacyLedger(target_epsilon=10, delta=1e-5), PrivacyLedger(target_epsilon=10, delta=1e-5)
    one.record(sgd(count=300))
    for _ in range(300):
        many.record(sgd(count=1))
    assert len(many.releases) == 1 and many.releases[0].count == 300
    assert many.spent == pytest.approx(one.spent, rel=1e-12)


@pytest.mark.parametrize("eps,k", [(1.0, 1), (1.0, 3), (0.3, 2), (8.0, 2)])
def test_calibration_hits_target_within_one_percent(eps, k):
    ledger = PrivacyLedger(target_epsilon=eps, delta=1e-5)

    def planned(s):
        return [Release(name="emb", mechanism="gaussian", sensitivity=1.0, noise_multiplier=s, count=k)]

    sigma = ledger.calibrate(planned)
    reached = ledger.epsilon_if(planned(sigma))
    assert reached <= eps * (1 + 1e-9)
    assert reached == pytest.approx(eps, rel=0.01)


def test_calibration_beats_the_papers_standard_conversion():
    # DP-MERF spec §3: the standard RDP conversion gives σ = 8.488 for k = 3 at (1, 1e-5); Balle et al.'s
    # conversion (ours and Opacus') is tighter, so σ must be smaller but of the same order.
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    sigma = ledger.calibrate(
        lambda s: [Release(name="e", mechanism="gaussian", sensitivity=1, noise_multiplier=s, count=3)]
    )
    assert 6.46 < sigma < 8.488


def test_over_budget_release_raises_and_changes_nothing():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    ledger.record(Release(name="a", mechanism="gaussian", sensitivity=1, noise_multiplier=6.0))
    before = ledger.state_dict()
    with pytest.raises(BudgetExceededError, match="above the run's target"):
        ledger.record(Release(name="b", mechanism="gaussian", sensitivity=1, noise_multiplier=1.0))
    assert ledger.state_dict() == before


def test_calibrate_refuses_when_budget_is_spent():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    sigma = ledger.calibrate(
        lambda s: [Release(name="a", mechanism="gaussian", sensitivity=1, noise_multiplier=s)]
    )
    ledger.record(Release(name="a", mechanism="gaussian", sensitivity=1, noise_multiplier=sigma))
    with pytest.raises(BudgetExceededError, match="already spent"):
        ledger.calibrate(
            lambda s: [Release(name="b", mechanism="gaussian", sensitivity=1, noise_multiplier=s)]
        )


def test_state_survives_a_round_trip(tmp_path):
    ledger = PrivacyLedger(target_epsilon=3.0, delta=1e-6, accountant="prv")
    ledger.record(sgd(count=100))
    ledger.record(Release(name="bounds", mechanism="exponential", sensitivity=1, epsilon=0.05, count=4))
    copy = PrivacyLedger.from_state_dict(ledger.state_dict())
    assert copy.spent == ledger.spent and copy.releases == ledger.releases
    ledger.save_json(tmp_path / "ledger.json")
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert {"target_epsilon", "delta", "epsilon", "releases"} <= set(data)
    assert data["releases"][0]["noise_multiplier"] == 1.5 and data["releases"][1]["count"] == 4
    assert data["epsilon"] == pytest.approx(ledger.spent)


def test_resume_with_other_privacy_settings_is_refused():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="target_epsilon"):
        PrivacyLedger(target_epsilon=2.0, delta=1e-5).load_state_dict(ledger.state_dict())


@pytest.mark.parametrize("eps,delta", [(0, 1e-5), (-1, 1e-5), (math.inf, 1e-5), (1, 1.0), (1, 0.0), (1, 2)])
def test_bad_privacy_parameters(eps, delta):
    with pytest.raises(ValueError, match="privacy"):
        PrivacyLedger(target_epsilon=eps, delta=delta)


def test_prv_is_never_looser_than_rdp():
    rdp, prv = (
        PrivacyLedger(target_epsilon=10, delta=1e-5),
        PrivacyLedger(target_epsilon=10, delta=1e-5, accountant="prv"),
    )
    rdp.record(sgd())
    prv.record(sgd())
    assert prv.spent < rdp.spent


def test_prv_calibration_of_dp_sgd_stays_in_bounded_memory():
    # Opacus' default PRV grid at σ = 1e-3 (the old first probe) has ~1e13 points.
    def planned(s):
        return [sgd(count=1000, sigma=s, q=0.01)]

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    prv = PrivacyLedger(target_epsilon=1.0, delta=1e-5, accountant="prv")
    sigma_prv = prv.calibrate(planned)
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    sigma_rdp = PrivacyLedger(target_epsilon=1.0, delta=1e-5).calibrate(planned)
    assert growth_mib < 1024
    assert sigma_rdp == pytest.approx(1.5132, rel=1e-3) and sigma_prv == pytest.approx(1.4243, rel=1e-3)
    assert sigma_prv <= sigma_rdp
    assert prv.epsilon_if(planned(sigma_prv)) <= 1.0


def test_prv_is_skipped_where_rdp_epsilon_is_huge():
    prv, rdp = (
        PrivacyLedger(target_epsilon=1, delta=1e-5, accountant="prv"),
        PrivacyLedger(target_epsilon=1, delta=1e-5),
    )
    tiny = [sgd(count=1000, sigma=1e-3, q=0.01)]
    assert prv.epsilon(tiny) == rdp.epsilon(tiny) > 1e8


def test_prv_grid_is_capped(monkeypatch):
    # σ = 0.3, q = 0.01, 1000 steps: RDP ε = 79, so PRV is tried at target 10, and Opacus' default grid
    # (eps_error = 0.01) would have 2.2e6 points.
    sizes = []
    create = Domain.create_aligned.__func__

    def spy(cls, t_min, t_max, dt):
        domain = create(cls, t_min, t_max, dt)
        sizes.append(domain.size)
        return domain

    monkeypatch.setattr(Domain, "create_aligned", classmethod(spy))
    ledger = PrivacyLedger(target_epsilon=10, delta=1e-5, accountant="prv")
    releases = [sgd(count=1000, sigma=0.3, q=0.01)]
    eps = ledger.epsilon(releases)
    assert sizes and max(sizes) <= PRV_MAX_POINTS + 2
    rdp = PrivacyLedger(target_epsilon=10, delta=1e-5).epsilon(releases)
    assert math.isfinite(eps) and eps < rdp == pytest.approx(79.05, abs=0.01)


def test_additive_delta_is_charged():
    ledger = PrivacyLedger(target_epsilon=5, delta=1e-5)
    base = Release(name="g", mechanism="gaussian", sensitivity=1, noise_multiplier=2.0)
    with_delta = Release(name="g", mechanism="gaussian", sensitivity=1, noise_multiplier=2.0, delta=5e-6)
    assert ledger.epsilon([with_delta]) > ledger.epsilon([base])
    assert (
        ledger.epsilon(
            [Release(name="g", mechanism="gaussian", sensitivity=1, noise_multiplier=2.0, delta=1e-5)]
        )
        == math.inf
    )


def test_laplace_and_pure_dp_curves_are_bounded_by_epsilon():
    orders = mech.DEFAULT_ORDERS
    assert np.all(mech.laplace_rdp(orders, noise_multiplier=2.0) <= 0.5 + 1e-12)  # Laplace(b = 2Δ) is 0.5-DP
    assert np.all(mech.pure_dp_rdp(orders, epsilon=0.3) <= 0.3)
    # RDP order-1 limit of Laplace is the KL divergence 1/λ + e^{-1/λ} - 1 (Mironov 2017, Prop. 6)
    lam = 2.0
    assert mech.laplace_rdp([1.0001], noise_multiplier=lam)[0] == pytest.approx(
        1 / lam + math.exp(-1 / lam) - 1, rel=1e-3
    )


# ---------------------------------------------------------------- reservations (budget held for later releases)
def _weights_release(count: int = 1) -> Release:
    return Release(name="weights/output_lapl", mechanism="laplace", sensitivity=0.02, noise_multiplier=10.0, count=count)


def _sgd(sigma: float, count: int = 500) -> Release:
    return Release(name="dp_sgd/d", mechanism="subsampled_gaussian", sensitivity=1.0, noise_multiplier=sigma,
                   sample_rate=0.05, count=count)


def test_a_reservation_leaves_room_that_calibration_does_not_take():
    ledger = PrivacyLedger(target_epsilon=4.0, delta=1e-5)
    ledger.reserve([_weights_release(20)])
    sigma = ledger.calibrate(lambda s: [_sgd(s)])
    ledger.record(_sgd(sigma))
    assert ledger.spent < 4.0 - 0.5  # the weights' share is still free
    assert ledger.epsilon_if([]) == pytest.approx(4.0, rel=1e-3)
    with pytest.raises(BudgetExceededError):
        ledger.record(_sgd(sigma, count=1))  # one more step would eat the reservation
    for _ in range(20):  # the reserved releases, one by one, use it up
        ledger.record(_weights_release())
    assert ledger.reserved == []
    assert ledger.spent == pytest.approx(4.0, rel=1e-3)


def test_reservations_travel_in_the_state_and_json_and_can_be_dropped():
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    ledger.reserve([_weights_release(5)])
    again = PrivacyLedger.from_state_dict(ledger.state_dict())
    assert again.reserved == ledger.reserved
    view = ledger.to_dict()
    assert view["reserved"][0]["name"] == "weights/output_lapl" and view["epsilon"] == 0.0
    assert PrivacyLedger.state_from_json(view)["reserved"][0]["count"] == 5
    assert "reserved" in ledger.summary()
    again.unreserve()
    assert again.reserved == [] and again.epsilon_if([]) == 0.0


def test_a_reservation_beyond_the_target_is_refused():
    ledger = PrivacyLedger(target_epsilon=0.5, delta=1e-5)
    with pytest.raises(BudgetExceededError, match="Reserving"):
        ledger.reserve([_weights_release(500)])
    assert ledger.reserved == []
