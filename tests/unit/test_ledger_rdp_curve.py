"""The ledger's ``rdp_curve`` mechanism: a release given by its RDP values (e.g. a private selection's bound)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger, Release


def _ledger(eps: float = 1.0) -> PrivacyLedger:
    return PrivacyLedger(target_epsilon=eps, delta=1e-5)


def _curve(ledger: PrivacyLedger, sigma: float, name: str = "tuning/selection") -> Release:
    rdp = mech.gaussian_rdp(ledger.orders, noise_multiplier=sigma, sample_rate=1.0)
    return Release(name=name, mechanism="rdp_curve", sensitivity=1.0, rdp_values=tuple(rdp), rdp_orders=ledger.orders)


def test_curve_composes_like_the_mechanism_it_copies():
    ledger = _ledger()
    as_curve = ledger.epsilon([_curve(ledger, 5.0)])
    as_gaussian = ledger.epsilon([Release(name="g", mechanism="gaussian", sensitivity=1.0, noise_multiplier=5.0)])
    assert as_curve == pytest.approx(as_gaussian, rel=1e-12)
    two = ledger.epsilon([_curve(ledger, 5.0), Release(name="g", mechanism="gaussian", sensitivity=1.0,
                                                        noise_multiplier=5.0)])
    assert two == pytest.approx(ledger.epsilon([_curve(ledger, 5.0 / np.sqrt(2))]), rel=1e-12)


def test_record_refuses_a_curve_that_does_not_fit():
    ledger = _ledger(1.0)
    with pytest.raises(BudgetExceededError):
        ledger.record(_curve(ledger, 0.5))
    assert ledger.releases == []
    eps = ledger.record(_curve(ledger, 20.0))
    assert 0 < eps < 1 and ledger.has("tuning/selection")


def test_curve_at_other_orders_is_refused():
    ledger = _ledger()
    r = Release(name="x", mechanism="rdp_curve", sensitivity=1.0, rdp_values=(0.1, 0.2), rdp_orders=(2.0, 3.0))
    with pytest.raises(ValueError, match="other orders"):
        ledger.epsilon([r])


@pytest.mark.parametrize("kwargs", [
    {"mechanism": "rdp_curve"},
    {"mechanism": "rdp_curve", "rdp_values": (0.1,), "rdp_orders": (2.0, 3.0)},
    {"mechanism": "rdp_curve", "rdp_values": (-0.1,), "rdp_orders": (2.0,)},
    {"mechanism": "gaussian", "noise_multiplier": 1.0, "rdp_values": (0.1,), "rdp_orders": (2.0,)},
])
def test_bad_curves_are_rejected(kwargs):
    with pytest.raises(ValueError):
        Release(name="x", sensitivity=1.0, **kwargs)


def test_same_mechanism_compares_curves():
    ledger = _ledger()
    a, b = _curve(ledger, 5.0), _curve(ledger, 6.0)
    assert a.same_mechanism(_curve(ledger, 5.0)) and not a.same_mechanism(b)


def test_state_and_json_round_trip_and_old_states_load():
    ledger = _ledger()
    ledger.record(Release(name="g", mechanism="gaussian", sensitivity=1.0, noise_multiplier=30.0))
    ledger.record(_curve(ledger, 20.0))
    spent = ledger.spent
    again = PrivacyLedger.from_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert again.releases == ledger.releases and again.spent == pytest.approx(spent, rel=1e-12)
    from_json = PrivacyLedger.from_state_dict(
        PrivacyLedger.state_from_json(json.loads(json.dumps(ledger.to_dict(), default=float))))
    assert from_json.releases == ledger.releases
    old = ledger.state_dict()  # a state saved before the field existed
    old["releases"] = [{k: v for k, v in r.items() if k not in ("rdp_values", "rdp_orders")} for r in old["releases"][:1]]
    assert PrivacyLedger.from_state_dict(old).releases[0].rdp_values is None
