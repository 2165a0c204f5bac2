"""Every check that needs no private data runs before the first release (issue list 5): each of these settings is
refused through the real ``python train.py`` entry point with exit 2, a message naming the fix, no traceback, and
no ledger (nothing was spent). A refusal that can only come after a release says what was spent and how to go on.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_data import toy_frame, toy_schema

spec = importlib.util.spec_from_file_location("train_entry_refusals", ROOT / "train.py")
entry = sys.modules["train_entry_refusals"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)

TINY = ["trainer.max_epochs=1", "trainer.enable_progress_bar=false"]
ONE_SHOT = ["model.module.steps_per_epoch=2", "model.module.num_features=200", "model.module.batch_size=200"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    many = toy_schema().to_dict()
    many["columns"][2]["categories"] = [f"c{i}" for i in range(100_000)]
    frame = toy_frame(n=300)
    frame["city"] = frame["city"].map({"a": "c1", "b": "c2", "c": "c3", "?": "?"})
    frame.to_csv(d / "many.csv", index=False)
    (d / "many.yaml").write_text(yaml.safe_dump(many))
    toy_frame(n=300).to_csv(d / "rows.csv", index=False)
    (d / "schema.yaml").write_text(yaml.safe_dump(toy_schema().to_dict()))
    (d / "space_negative.yaml").write_text("dp_merf:\n  model.module.num_features: [200, -5]\n")
    (d / "space_word.yaml").write_text("dp_merf:\n  model.module.num_features: [200, many]\n")
    (d / "space_bad_key.yaml").write_text("dp_merf:\n  model.module.num_featurez: [200]\n")
    (d / "validation_wrong.csv").write_text("foo,bar\n1,2\n")
    return d


def _run(argv, tmp_path, capsys, monkeypatch=None):
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    code = entry.cli([f"output_dir={tmp_path / 'run'}", *TINY, *argv])
    err = capsys.readouterr().err
    return code, err


def _refused_before_release(code, err, tmp_path, match):
    assert code == 2, err
    assert "Traceback" not in err
    assert match in err, err
    assert not (tmp_path / "run" / "ledger.json").exists()
    assert not (tmp_path / "run" / ".prefit.json").exists()


CASES = {
    "weights.epsilon above privacy.epsilon": (
        lambda d: ["weights=beta_noised", "weights.epsilon=2", *ONE_SHOT], "above privacy.epsilon=1"),
    "weights.calibration_epsilon negative": (
        lambda d: ["weights=beta_noised", "weights.epsilon=0.3", "weights.calibration_epsilon=-1", *ONE_SHOT],
        "weights.calibration_epsilon must be a number > 0"),
    "weights on image data": (
        lambda d: ["data=digits", "weights=beta_noised", "weights.epsilon=0.3", *ONE_SHOT], "image data"),
    "trainer.devices=0": (lambda d: ["trainer.devices=0", *ONE_SHOT], "devices=0"),
    "gradient accumulation under DP-SGD": (
        lambda d: ["model=dp_gan", "+trainer.accumulate_grad_batches=2"], "accumulate_grad_batches=2 with DP-SGD"),
    "gradient accumulation of a hand-stepped model": (
        lambda d: ["model=support_points", "data=diabetes", "+trainer.accumulate_grad_batches=2"],
        "takes its optimiser steps itself"),
    "checkpoint interval negative": (
        lambda d: ["callbacks.checkpoint.every_n_steps=-1", *ONE_SHOT], "callbacks.checkpoint.every_n_steps must be"),
    "unknown trainer setting": (lambda d: ["+trainer.max_epoch=3", *ONE_SHOT], "Unknown trainer setting"),
    "tune.space value out of range": (
        lambda d: ["tune=default", f"tune.space={d / 'space_negative.yaml'}", *ONE_SHOT], '"model.module.num_features": -5'),
    "tune.space value of the wrong type": (
        lambda d: ["tune=default", f"tune.space={d / 'space_word.yaml'}", *ONE_SHOT], "many"),
    "tune.space key unknown": (
        lambda d: ["tune=default", f"tune.space={d / 'space_bad_key.yaml'}", *ONE_SHOT], "num_featurez"),
    "tune.validation with other columns": (
        lambda d: ["tune=default", f"tune.validation={d / 'validation_wrong.csv'}", "data=csv",
                   f"data.path={d / 'rows.csv'}", f"data.schema={d / 'schema.yaml'}", *ONE_SHOT],
        "does not match the schema"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_any_release(case, files, tmp_path, capsys):
    make, match = CASES[case]
    code, err = _run(make(files), tmp_path, capsys)
    _refused_before_release(code, err, tmp_path, match)


def test_a_schema_too_wide_for_the_machine_is_refused_before_any_release(files, tmp_path, capsys, monkeypatch):
    """100,000 categories: the model's training memory, from the public schema on the meta device, is compared with
    the machine's before the count is released (here a machine of 256 MiB; DP-MERF's features need more)."""
    import lightning_dp.resources as resources

    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 256 * 2**20)
    code, err = _run(["data=csv", f"data.path={files / 'many.csv'}", f"data.schema={files / 'many.yaml'}",
                      *ONE_SHOT], tmp_path, capsys)
    _refused_before_release(code, err, tmp_path, "100,005 model-space columns")
    assert "nothing was spent" in err


def test_a_model_too_big_for_the_machine_on_images_is_refused_before_any_release(tmp_path, capsys, monkeypatch):
    """Images: the layout (pixels per image, declared classes) is public, so the model's memory is checked before the
    count too (here DP-MERF's 20,000 features on 8×8 digits and a machine of 1 MiB)."""
    import lightning_dp.resources as resources

    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 2**20)
    code, err = _run(["data=digits", "model.module.steps_per_epoch=2", "model.module.num_features=20000",
                      "model.module.batch_size=200"], tmp_path, capsys)
    _refused_before_release(code, err, tmp_path, "64 model-space columns (one per pixel)")
    assert "nothing was spent" in err


def test_a_refusal_after_the_count_says_what_was_spent_and_how_to_go_on(files, tmp_path, capsys):
    """δ ≥ 1/n needs the DP count: the refusal comes after it, and says so."""
    code, err = _run(["privacy.delta=0.01", *ONE_SHOT], tmp_path, capsys)
    assert code == 2 and "Traceback" not in err
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert [r["name"] for r in ledger["releases"]] == ["data/num_rows"]
    assert "already spent ε = " in err and "resume=last" in err and "nothing was spent" not in err


def test_rows_too_many_for_the_machine_are_refused_on_the_dp_count_saying_what_was_spent(files, tmp_path, capsys,
                                                                                         monkeypatch):
    """The encoded rows' size needs the row count: checked on the DP count, before the rows are encoded."""
    import lightning_dp.resources as resources

    budget = {"calls": 0}

    def memory():  # plenty for the model (checked first, before any release), little for the rows
        budget["calls"] += 1
        return 2**40 if budget["calls"] == 1 else 2**20

    monkeypatch.setattr(resources, "available_memory_bytes", memory)
    code, err = _run(["data=csv", f"data.path={files / 'many.csv'}", f"data.schema={files / 'many.yaml'}",
                      *ONE_SHOT], tmp_path, capsys)
    assert code == 2 and "Traceback" not in err
    assert "Encoding about" in err and "already spent ε = " in err, err
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert [r["name"] for r in ledger["releases"]] == ["data/num_rows"]
