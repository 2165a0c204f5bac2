"""model=gem through the real train(): rounds on the run's ledger, the stop, resume after a kill, refusals."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from lightning_dp.checkpoint import load_run
from lightning_dp.errors import ConfigError
from lightning_dp.models.gem import GEM
from lightning_dp.train import train
from tests.conftest import make_cfg, shared

TINY = ("model=gem", "data=diabetes", "privacy.noise_seed=0", "model.module.bins=4", "model.module.batch_size=64",
        "model.module.steps_per_epoch=40", "model.generator.hidden=[16]", "model.mechanisms.0.rounds=40",
        "model.mechanisms.0.steps_per_round=2", "model.mechanisms.0.final_steps=3",
        "model.mechanisms.0.answer_draws=2048")


def names(result: dict) -> list[str]:
    return [r["name"] for r in json.loads(Path(result["ledger"]).read_text())["releases"]]


@pytest.fixture(scope="module")
def run(tmp_path_factory, single_thread):
    return train(make_cfg(tmp_path_factory.mktemp("gem"), *TINY))


def test_rounds_are_releases_on_the_runs_ledger_until_the_budget_is_spent(run):
    ledger = json.loads(Path(run["ledger"]).read_text())
    released = names(run)
    assert released[:2] == ["data/num_rows", "gem/one_way"]
    rounds = (len(released) - 2) // 2
    assert rounds >= 3 and released[2:] == [f"gem/round_{t:04d}/{k}" for t in range(1, rounds + 1)
                                            for k in ("select", "measure")]
    one_way = ledger["releases"][1]
    assert one_way["mechanism"] == "gaussian" and one_way["sensitivity"] == pytest.approx(11**0.5)  # 11 columns
    select, measure = ledger["releases"][2], ledger["releases"][3]
    assert select["mechanism"] == "rdp_curve" and select["sensitivity"] == 1.0
    assert measure["mechanism"] == "gaussian" and measure["sensitivity"] == 1.0
    assert ledger["dp_claim"] and ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=1e-3)
    model = load_run(run["checkpoint"]).model
    assert isinstance(model, GEM) and bool(model.finished) and int(model.rounds) == rounds
    assert len(model.measured()) == 11 + rounds  # the 1-way marginals, then one per round
    # stopped final_steps after the last round, before the epoch's 40 steps
    assert int(model.finish_step) <= 2 * rounds + 2


def test_synthetic_rows_are_in_the_public_ranges(run):
    loaded = load_run(run["checkpoint"])
    synthetic = pd.read_csv(run["synthetic"])
    assert len(synthetic) == round(loaded.record["data"]["num_rows"]["value"])
    assert synthetic["target"].between(25, 346).all() and synthetic["bmi"].between(-0.2, 0.2).all()


def test_replace_one_doubles_the_squared_sensitivities(tmp_path, single_thread):
    result = train(make_cfg(tmp_path, *TINY, "privacy.adjacency=replace_one", "model.mechanisms.0.rounds=20"))
    releases = {r["name"]: r for r in json.loads(Path(result["ledger"]).read_text())["releases"]}
    assert releases["gem/one_way"]["sensitivity"] == pytest.approx(22**0.5)
    assert releases["gem/round_0001/select"]["sensitivity"] == 2.0
    assert releases["gem/round_0001/measure"]["sensitivity"] == pytest.approx(2**0.5)


def test_the_label_pairs_are_measured_in_the_first_release_at_their_budget_share(tmp_path, single_thread):
    """target_pairs_fraction f_L: every (column, label) 2-way marginal, one Gaussian release in the first block,
    zCDP f_L·ρ against the 1-way marginals' C(1−f)ρ/T; then the rounds."""
    result = train(make_cfg(tmp_path, "model=gem", "data=breast_cancer", "privacy.noise_seed=0", "model.module.bins=3",
                            "model.module.batch_size=64", "model.module.steps_per_epoch=40",
                            "model.generator.hidden=[16]", "model.mechanisms.0.rounds=64",
                            "model.mechanisms.0.steps_per_round=2", "model.mechanisms.0.final_steps=3",
                            "model.mechanisms.0.target_pairs_fraction=0.25", "model.mechanisms.0.answer_draws=1024"))
    ledger = json.loads(Path(result["ledger"]).read_text())
    assert names(result)[:4] == ["data/num_rows", "gem/one_way", "gem/target_pairs", "gem/round_0001/select"]
    one_way, pairs = ledger["releases"][1], ledger["releases"][2]
    columns = round(one_way["sensitivity"] ** 2)  # √C
    assert pairs["mechanism"] == "gaussian" and pairs["sensitivity"] == pytest.approx((columns - 1) ** 0.5)
    # zCDP 1/(2·multiplier²) each: the pairs' share f_L·ρ against the 1-way marginals' C(1−f)ρ/T
    ratio = (one_way["noise_multiplier"] / pairs["noise_multiplier"]) ** 2
    assert ratio == pytest.approx(0.25 * 64 / (columns * 0.9), rel=1e-9)
    assert ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=1e-3)
    model = load_run(result["checkpoint"]).model
    label = len(model.levels) - 1
    measured = [c for c, _, _ in model.measured()]
    assert measured[:columns] == [(c,) for c in range(columns)]
    assert measured[columns : 2 * columns - 1] == [(c, label) for c in range(label)]
    assert len(measured) == 2 * columns - 1 + int(model.rounds) and bool(model.finished)
    # a first release that would leave the rounds no budget is refused before anything is spent
    with pytest.raises(ConfigError, match="rounds=30 and target_pairs_fraction=0.2; .* at least 35"):
        train(make_cfg(tmp_path / "refused", "model=gem", "data=breast_cancer", "model.module.bins=3",
                       "model.mechanisms.0.rounds=30", "model.mechanisms.0.target_pairs_fraction=0.2"))
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())


def test_the_label_pairs_can_replace_the_one_way_marginals(tmp_path, single_thread):
    """one_way=false: the first block is the label pairs alone (they hold every 1-way marginal); refused, before
    anything is spent, on a data set without a label."""
    result = train(make_cfg(tmp_path, "model=gem", "data=breast_cancer", "privacy.noise_seed=0", "model.module.bins=3",
                            "model.module.batch_size=64", "model.module.steps_per_epoch=40",
                            "model.generator.hidden=[16]", "model.mechanisms.0.rounds=64",
                            "model.mechanisms.0.steps_per_round=2", "model.mechanisms.0.final_steps=3",
                            "model.mechanisms.0.target_pairs_fraction=0.3", "model.mechanisms.0.one_way=false",
                            "model.mechanisms.0.answer_draws=1024", "model.module.label_head=true"))
    ledger = json.loads(Path(result["ledger"]).read_text())
    assert names(result)[:3] == ["data/num_rows", "gem/target_pairs", "gem/round_0001/select"]
    assert ledger["epsilon"] <= 1.0 and ledger["epsilon"] == pytest.approx(1.0, rel=1e-3)
    model = load_run(result["checkpoint"]).model
    label = len(model.levels) - 1
    assert [c for c, _, _ in model.measured()][:label] == [(c, label) for c in range(label)]
    # the label head, post-processing of these releases (none of its own), is in the run's last checkpoint
    heads = {tuple(c for c in row if c >= 0) for row in model.head_cliques.tolist()}
    assert bool(model.head_fitted) and heads == {c for c, _, _ in model.measured() if len(c) > 1 and c[-1] == label}
    with pytest.raises(ConfigError, match="no label; set model.mechanisms.0..one_way=true"):
        train(make_cfg(tmp_path / "refused", *TINY, "model.mechanisms.0.target_pairs_fraction=0.3",
                       "model.mechanisms.0.one_way=false"))
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())


def test_a_run_killed_between_rounds_resumes_without_releasing_again(tmp_path, single_thread):
    real_step = GEM.training_step

    def killed(self, batch, batch_idx):
        if int(self.rounds) >= 3:
            raise RuntimeError("simulated kill after round 3")
        return real_step(self, batch, batch_idx)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GEM, "training_step", killed)
        with pytest.raises(RuntimeError, match="simulated kill"):
            train(make_cfg(tmp_path, *TINY))
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert int(saved["state_dict"]["rounds"]) == 3  # the round's checkpoint was written before its first use
    on_disk = [r["name"] for r in json.loads((tmp_path / "ledger.json").read_text())["releases"]]
    assert on_disk[-1] == "gem/round_0003/measure"
    result = train(make_cfg(tmp_path, *TINY, "resume=last"))
    released = names(result)
    assert released[: len(on_disk)] == on_disk and len(set(released)) == len(released)
    model = load_run(result["checkpoint"]).model
    assert bool(model.finished) and len(model.measured()) == 11 + int(model.rounds)
    assert torch.equal(model.meas_values[: len(saved["state_dict"]["meas_values"])], saved["state_dict"]["meas_values"])


def test_bad_settings_are_refused_before_anything_is_released(tmp_path):
    with pytest.raises(ConfigError, match="bins"):
        train(make_cfg(tmp_path, *TINY, "model.module.bins=0"))
    with pytest.raises(ConfigError, match="steps_per_round"):
        train(make_cfg(tmp_path, *TINY, "model.mechanisms.0.steps_per_round=0"))
    # 11 discretised columns: the 1-way marginals cost 11·0.9/T of ρ, more than ρ below T = 10
    with pytest.raises(ConfigError, match="rounds=9; set model.mechanisms.0..rounds to at least 10"):
        train(make_cfg(tmp_path, *TINY, "model.mechanisms.0.rounds=9"))
    assert not any(tmp_path.iterdir())


def test_a_plan_the_release_can_afford_is_not_refused_before_it(tmp_path, single_thread):
    """Cervical: 26 continuous columns with missing values. Under cells a column and its missing value are one
    discretised column (36 in all, if its rows allow the cells release); its ~700 rows are too few for that release
    and 12 columns stay min-max beside their missing indicators (41). The old pre-release count (46: an indicator
    beside every column with missing values) refused rounds=37, which the run's own count affords (41·0.9 ≤ 37)."""
    shared("cervical")
    result = train(make_cfg(tmp_path, *TINY, "data=cervical", "model.mechanisms.0.rounds=37",
                            "model.mechanisms.0.answer_draws=1024"))
    releases = {r["name"]: r for r in json.loads(Path(result["ledger"]).read_text())["releases"]}
    assert releases["gem/one_way"]["sensitivity"] == pytest.approx(41**0.5)  # 41 discretised columns
    with pytest.raises(ConfigError, match="rounds=32; set model.mechanisms.0..rounds to at least 33"):
        train(make_cfg(tmp_path / "refused", *TINY, "data=cervical", "model.mechanisms.0.rounds=32"))
    assert not (tmp_path / "refused").exists()


def test_the_rounds_plan_matches_the_release_it_guards():
    import math

    from lightning_dp.privacy import marginals as mg

    for columns, rounds, frac in [(11, 10, 0.1), (15, 14, 0.1), (40, 30, 0.25), (7, 7, 0.05)]:
        sigma, _ = mg.round_parameters(1.0, rounds, selection_fraction=frac)
        planned_ok = columns * (1 - frac) <= rounds
        assert planned_ok == (columns / (2 * sigma**2) <= 1.0 * (1 + 1e-12)), (columns, rounds, frac)
        assert math.isclose(columns / (2 * sigma**2), columns * (1 - frac) / rounds)


@pytest.mark.ddp
def test_two_process_ddp_releases_each_round_once(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path / "ddp"
    proc = subprocess.run([sys.executable, "train.py", *TINY, "data=breast_cancer", "model.module.bins=3",
                           "model.mechanisms.0.rounds=64", "model.module.label_head=true", "trainer=ddp",
                           "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1",
                           "trainer.enable_progress_bar=false", f"output_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = json.loads((out / "ledger.json").read_text())
    released = [r["name"] for r in ledger["releases"]]
    assert released[:2] == ["data/num_rows", "gem/one_way"] and len(set(released)) == len(released)
    assert ledger["epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert json.loads((out / "replicas.json").read_text())["identical"]  # rank 0's releases on every rank
    model = load_run(out / "checkpoints" / "last.ckpt").model
    assert bool(model.finished) and 2 * int(model.rounds) == len(released) - 2
    assert bool(model.head_fitted) and "Label head fitted" in (out / "train.log").read_text()


def test_private_tuning_selects_among_gem_candidates(tmp_path, single_thread):
    """GEM's releases compose to at most α·ρ (ρ calibrated to the candidate's ε_c): Theorem 2's bound holds."""
    cfg = make_cfg(tmp_path, "model=gem", "data=breast_cancer", "tune=default", "model.module.batch_size=64",
                   "model.module.steps_per_epoch=40", "model.generator.hidden=[16]", "model.mechanisms.0.rounds=64",
                   "model.mechanisms.0.steps_per_round=2", "model.mechanisms.0.final_steps=3",
                   "model.mechanisms.0.answer_draws=2048", "tune.space.gem={model.module.bins:[3,4]}")
    result = train(cfg)
    assert names(result) == ["tuning/selection"] and result["epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert load_run(result["checkpoint"]).model.hparams.bins in (3, 4)
