"""The one-run privacy audit (audits/one_run.py; Steinke, Nasr and Jagielski 2023): the bound's arithmetic, and the
whole pipeline once on a tiny data set, where the perturbed histogram with its noise switched off must be caught
(bound well above ε = 1) and the same at ε = 1 must not be (bound below 1)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import binom

from audits.__main__ import main
from audits.one_run import audit_scores, epsilon_lower_bound, guess_grid, p_value

LEVELS = [f"v{i}" for i in range(30)]


def test_p_value_is_the_binomial_tail_without_delta():
    q = 1 / (1 + math.exp(-1.0))
    assert p_value(100, 50, 40, 1.0, 0.0) == pytest.approx(binom.sf(39, 50, q))
    # δ adds 2 m δ times the largest average mass just below v; with δ = 0.5 / (2m) it is half of that
    below = [binom.pmf(40 - i, 50, q) for i in range(1, 41)]
    alpha = max(sum(below[:i]) / i for i in range(1, 41))
    assert p_value(100, 50, 40, 1.0, 0.5 / 200) == pytest.approx(binom.sf(39, 50, q) + 0.5 * alpha)


def test_all_correct_guesses_give_the_closed_form_bound():
    # r of r correct: P[Binomial(r, q) >= r] = q^r < p  <=>  ε < log(q / (1 - q)) with q = p^(1/r)
    q = 0.05 ** (1 / 40)
    assert epsilon_lower_bound(100, 40, 40, delta=0.0, p=0.05) == pytest.approx(
        math.log(q / (1 - q)), abs=2e-4
    )
    assert epsilon_lower_bound(100, 40, 20, delta=0.0, p=0.05) == 0.0  # chance: nothing rejected


def test_guesses_from_scores_and_bonferroni():
    included = np.array([True] * 50 + [False] * 50)
    perfect = audit_scores(np.where(included, 1.0, 0.0), included, delta=1e-5)
    assert perfect["per_test_level"] == pytest.approx(0.05 / len(guess_grid(100)))
    assert perfect["best"]["v"] == perfect["best"]["r"] and perfect["epsilon_lower_bound"] > 2
    blind = audit_scores(np.zeros(100), included, delta=1e-5)  # no signal: ties broken at random
    assert blind["epsilon_lower_bound"] < 0.5


def _tiny_data(folder):
    """300 rows on 27 of 9,000 category triples, a number on [0, 1], a label: canaries land in empty cells."""
    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame(
        {
            "a": rng.choice(LEVELS[:3], n),
            "b": rng.choice(LEVELS[:3], n),
            "c": rng.choice(LEVELS[:3], n),
            "x": rng.uniform(0, 1, n).round(3),
            "y": rng.choice(["no", "yes"], n),
        }
    )
    frame.loc[rng.random(n) < 0.05, "c"] = "?"  # missing cells: the run's files must keep the schema's token
    schema = {
        "label": "y",
        "missing_values": ["?"],
        "columns": [
            {"name": "a", "type": "categorical", "categories": LEVELS},
            {"name": "b", "type": "categorical", "categories": LEVELS},
            {"name": "c", "type": "categorical", "categories": LEVELS[:10], "missing": True},
            {"name": "x", "type": "continuous", "bounds": [0, 1]},
            {"name": "y", "type": "categorical", "categories": ["no", "yes"]},
        ],
    }
    frame.iloc[:300].to_csv(folder / "train.csv", index=False)
    frame.iloc[300:].to_csv(folder / "test.csv", index=False)
    (folder / "schema.yaml").write_text(yaml.safe_dump(schema))
    return [
        "data=csv",
        f"data.path={folder / 'train.csv'}",
        f"data.schema={folder / 'schema.yaml'}",
        f"data.test_path={folder / 'test.csv'}",
        "data.public_num_rows=300",
        "model=perturbed_histogram",
        "model.module.bins_per_dim=2",
        "trainer.enable_progress_bar=false",
        "privacy.noise_seed=0",
    ]


@pytest.mark.parametrize("epsilon,caught", [(1000.0, True), (1.0, False)])
def test_one_run_catches_the_pipeline_without_noise(tmp_path, capsys, monkeypatch, epsilon, caught):
    # the same canaries and bits make the same training file: each case its own budget registry (ε = 1000 spends
    # the module registry's whole default budget for that data set)
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY", str(tmp_path / "budget.sqlite"))
    overrides = _tiny_data(tmp_path)
    out = tmp_path / "audit"
    code = main(
        ["one-run", "--canaries", "1000", "--out", str(out), *overrides, f"privacy.epsilon={epsilon}"]
    )
    res = json.loads((out / "one_run.json").read_text())
    assert res["m"] == 1000 and res["claimed_epsilon"] == pytest.approx(epsilon, rel=1e-3)
    assert res["training_rows"] == 300 + res["included"]
    if caught:  # exact counts: an inserted canary's cell is sampled, an absent one's never
        assert res["epsilon_lower_bound"] > 1.5 and code == 0  # well above 1, below the (huge) claim
    else:
        assert res["epsilon_lower_bound"] < 1 and code == 0
    assert "one-run audit: ε ≥" in capsys.readouterr().out


def test_one_run_refuses_an_existing_folder(tmp_path, capsys):
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "one_run.json").write_text("{}")
    assert main(["one-run", "--out", str(tmp_path / "audit"), "data=breast_cancer"]) == 2
    assert "already holds a one-run audit" in capsys.readouterr().err


@pytest.mark.parametrize("epsilon,caught", [(1000.0, True), (1.0, False)])
def test_white_box_embedding_attack_on_dp_merf(tmp_path, capsys, monkeypatch, epsilon, caught):
    # DP-MERF's released embedding read from the checkpoint: with the noise off the linear system gives the bits
    # (bound well above 1); at ε = 1 the bound stays below 1. The black-box score is reported beside it.
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY", str(tmp_path / "budget.sqlite"))
    overrides = [o for o in _tiny_data(tmp_path) if not o.startswith("model")] + [
        "model=dp_merf", "model.module.num_features=500", "model.module.steps_per_epoch=5",
        "model.module.batch_size=100", "trainer.max_epochs=1",
    ]
    out = tmp_path / "audit"
    code = main(["one-run", "--canaries", "200", "--out", str(out), *overrides, f"privacy.epsilon={epsilon}"])
    res = json.loads((out / "one_run.json").read_text())
    assert set(res["attacks"]) == {"black_box", "embedding"} and code == 0
    white = res["attacks"]["embedding"]
    assert white["m"] == 200 and white["confidence"] == pytest.approx(0.975)  # Bonferroni over the two attacks
    if caught:
        assert white["epsilon_lower_bound"] > 1.5 and res["attack"] == "embedding"
    else:
        assert res["epsilon_lower_bound"] < 1
    assert "embedding: ε ≥" in capsys.readouterr().out


@pytest.mark.parametrize("epsilon,caught", [(1000.0, True), (1.0, False)])
def test_white_box_gradient_canaries_on_dp_gan(tmp_path, capsys, monkeypatch, epsilon, caught):
    # Dirac gradient canaries through the run's DP-SGD (q = 16/300, 5 epochs): with the noise off their spikes give
    # the bits away (bound well above 1); at ε = 1 the bound stays below 1. Row canaries are inserted as well.
    monkeypatch.setenv("LIGHTNING_DP_REGISTRY", str(tmp_path / "budget.sqlite"))
    overrides = [o for o in _tiny_data(tmp_path) if not o.startswith("model")] + [
        "model=dp_gan", "data.batch_size=16", "trainer.max_epochs=5", "model.module.batch_size=16",
        "model.generator.hidden=[32]", "model.discriminator.hidden=[32]",
    ]
    out = tmp_path / "audit"
    code = main(["one-run", "--canaries", "200", "--out", str(out), *overrides, f"privacy.epsilon={epsilon}"])
    res = json.loads((out / "one_run.json").read_text())
    assert set(res["attacks"]) == {"black_box", "gradient"} and code == 0
    grad = res["attacks"]["gradient"]
    assert grad["m"] == 200 and "spike likelihood ratio" in grad["attack"]
    if caught:
        assert grad["epsilon_lower_bound"] > 1.5 and res["attack"] == "gradient"
    else:
        assert res["epsilon_lower_bound"] < 1
    assert "gradient: ε ≥" in capsys.readouterr().out
