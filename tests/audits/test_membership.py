"""Membership attacks: AUC ≈ 0.5 against a generator that never saw the targets, > 0.9 against memorisation."""

import json

import numpy as np
import pytest
from scipy.stats import gaussian_kde
from sklearn.metrics import roc_auc_score

from audits.membership import (
    ATTACKS,
    evaluate_scores,
    gaussian_kde_logpdf,
    roc_auc,
    run_attack,
    tpr_at_fpr,
    tpr_estimable,
)
from audits.verdicts import delong_auc

pytestmark = pytest.mark.usefixtures("single_thread")


D = 10
N = 400


def _population(rng: np.random.Generator, n: int) -> np.ndarray:
    # correlated, non-isotropic Gaussian so that density-ratio attacks have something to calibrate
    mix = np.linalg.cholesky(0.5 * np.eye(D) + 0.5)
    return rng.normal(size=(n, D)) @ mix.T * np.linspace(0.5, 3.0, D)


@pytest.fixture(scope="module")
def sets() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    members, non_members = _population(rng, N), _population(rng, N)
    return {
        "members": members,
        "non_members": non_members,
        "reference": _population(rng, 2 * N),
        "fresh": _population(rng, 2 * N),  # a perfect generator that never saw the members
        "memorised": members + 1e-3 * rng.normal(size=members.shape),  # returns its training rows
    }


def _fresh_generator(dataset: np.ndarray, seed: int):
    rng = np.random.default_rng(10_000 + seed)
    return lambda n: _population(rng, n)


def _memorising_generator(dataset: np.ndarray, seed: int):
    rng = np.random.default_rng(10_000 + seed)
    return lambda n: (
        dataset[rng.permutation(len(dataset))[:n]] + 1e-3 * rng.normal(size=(min(n, len(dataset)), D))
    )


def _kwargs(name: str, memorised: bool) -> dict:
    if name != "shadow":
        return {}
    return {"train_generator": _memorising_generator if memorised else _fresh_generator, "n_shadow": 8}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_blind_to_a_generator_that_never_saw_the_targets(sets, name):
    res = run_attack(
        name,
        synthetic=sets["fresh"],
        members=sets["members"],
        non_members=sets["non_members"],
        reference=sets["reference"],
        n_bootstrap=50,
        **_kwargs(name, memorised=False),
    )
    assert abs(res.auc - 0.5) < 0.08, res.to_dict()
    assert res.auc_ci[0] <= res.auc <= res.auc_ci[1]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_detects_memorisation(sets, name):
    res = run_attack(
        name,
        synthetic=sets["memorised"],
        members=sets["members"],
        non_members=sets["non_members"],
        reference=sets["reference"],
        n_bootstrap=50,
        **_kwargs(name, memorised=True),
    )
    assert res.auc > 0.9, res.to_dict()
    assert res.tpr_at_fpr[0.01] > 0.3


def test_result_and_registry(sets):
    res = run_attack("dcr", synthetic=sets["fresh"], members=sets["members"], non_members=sets["non_members"])
    assert res.scores.shape == res.labels.shape == (2 * N,)
    assert res.labels[:N].all() and not res.labels[N:].any()
    summary = json.loads(json.dumps(res.to_dict()))
    assert set(summary) >= {"name", "auc", "auc_ci", "tpr_at_fpr", "tpr_at_fpr_ci", "params"}
    assert set(summary["tpr_at_fpr"]) == {"0.001", "0.01"}
    with pytest.raises(ValueError, match=r"valid names: \['dcr', 'dcr_ratio', 'domias', 'shadow'\]"):
        run_attack("loss", synthetic=sets["fresh"], members=sets["members"], non_members=sets["non_members"])
    with pytest.raises(ValueError, match="reference"):
        run_attack(
            "domias", synthetic=sets["fresh"], members=sets["members"], non_members=sets["non_members"]
        )
    with pytest.raises(ValueError, match="train_generator"):
        run_attack(
            "shadow",
            synthetic=sets["fresh"],
            members=sets["members"],
            non_members=sets["non_members"],
            reference=sets["reference"],
        )
    with pytest.raises(ValueError, match="same number of features"):
        run_attack(
            "dcr", synthetic=sets["fresh"][:, :3], members=sets["members"], non_members=sets["non_members"]
        )


def test_metrics_by_hand():
    scores = np.array([0.9, 0.8, 0.3, 0.7, 0.2, 0.1, 0.05, 0.4])
    labels = np.array([1, 1, 1, 0, 0, 0, 0, 0])
    # pairs (pos > neg): 0.9 beats 5, 0.8 beats 5, 0.3 beats 3 (0.2, 0.1, 0.05) -> 13 / 15
    assert roc_auc(scores, labels) == pytest.approx(13 / 15)
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    # FPR 0 allowed: positives above the largest negative 0.7 -> 2 / 3
    assert tpr_at_fpr(scores, labels, 0.001) == pytest.approx(2 / 3)
    # FPR <= 0.2 allows 1 of 5 negatives: above the 2nd largest negative 0.4 -> still 2 / 3
    assert tpr_at_fpr(scores, labels, 0.2) == pytest.approx(2 / 3)
    # FPR <= 0.4: above 0.2 -> 3 / 3
    assert tpr_at_fpr(scores, labels, 0.4) == 1.0


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(3)
    scores, labels = rng.normal(size=200), np.r_[np.ones(100, int), np.zeros(100, int)]
    a = evaluate_scores("x", scores, labels, seed=1, n_bootstrap=100)
    b = evaluate_scores("x", scores, labels, seed=1, n_bootstrap=100)
    c = evaluate_scores("x", scores, labels, seed=2, n_bootstrap=100)
    assert a.auc_ci == b.auc_ci != c.auc_ci


def test_kde_matches_scipy_gaussian_kde():
    rng = np.random.default_rng(5)
    data, points = _population(rng, 300)[:, :3], _population(rng, 50)[:, :3]
    for rule in ("scott", "silverman"):
        got, h = gaussian_kde_logpdf(points, data, bandwidth=rule, ridge=0.0)
        want = gaussian_kde(data.T, bw_method=rule)
        np.testing.assert_allclose(got, want.logpdf(points.T), rtol=1e-10)
        assert h == pytest.approx(want.factor)


def test_tpr_at_low_fpr_is_refused_with_too_few_non_members():
    # 57 non-members: the FPR can only be 0 or >= 1/57, so neither 0.1% nor 1% FPR can be read (needs 1,000
    # and 100 non-members); with 150 the 1% point can (one false positive allowed), 0.1% still not
    rng = np.random.default_rng(0)
    for n_neg, estimable in ((57, {0.001: False, 0.01: False}), (150, {0.001: False, 0.01: True})):
        labels = np.r_[np.ones(60, dtype=int), np.zeros(n_neg, dtype=int)]
        res = evaluate_scores("x", rng.normal(size=60 + n_neg) + labels, labels, n_bootstrap=50)
        assert {f: res.tpr_at_fpr[f] is not None for f in (0.001, 0.01)} == estimable
        assert {f: res.tpr_at_fpr_ci[f] is not None for f in (0.001, 0.01)} == estimable
        note = res.to_dict()["tpr_at_fpr_note"]
        assert (
            note.startswith("not estimable at FPR 0.001") and f"{n_neg} non-members cannot resolve it" in note
        )
    assert tpr_estimable(0.01, 100) and not tpr_estimable(0.01, 99)


def test_auc_carries_delong_interval():
    rng = np.random.default_rng(1)
    labels = np.r_[np.ones(100, dtype=int), np.zeros(100, dtype=int)]
    res = evaluate_scores("x", rng.normal(size=200) + labels, labels, n_bootstrap=50)
    d = delong_auc(np.asarray(res.scores), labels)
    assert res.auc == pytest.approx(d["auc"]) and res.auc_se == pytest.approx(d["se"])
    assert res.auc_delong_ci == pytest.approx((d["lo"], d["hi"])) and d["lo"] < res.auc < d["hi"]
