"""A run saved by an earlier release resumes under this one: GEM's checkpoints and configs from before its label head
(``label_head``, the ``head_*`` buffers) and ``entropy_weight`` continue training and sampling, while other weights,
edited settings and settings this release no longer has are refused as before.

An "earlier release's" run is made with today's code and then stripped of what the later releases added, rewritten
the way a run writes its files (``AtomicCheckpointIO``, ``atomic_write_text``); nothing runs from a loaded file.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from lightning_dp.checkpoint import AtomicCheckpointIO, load_run
from lightning_dp.io import atomic_write_text
from lightning_dp.models.gem import HEAD
from lightning_dp.resume import ResumeError
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

spec = importlib.util.spec_from_file_location("train_entry_upgrade", ROOT / "train.py")
entry = sys.modules["train_entry_upgrade"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)

# two rounds an epoch, far from the end of the budget: a resumed epoch measures and fits more
GEM = ("model=gem", "data=diabetes", "privacy.noise_seed=0", "model.module.bins=4", "model.module.batch_size=64",
       "model.module.steps_per_epoch=4", "model.generator.hidden=[16]", "model.mechanisms.0.rounds=40",
       "model.mechanisms.0.steps_per_round=2", "model.mechanisms.0.final_steps=3",
       "model.mechanisms.0.answer_draws=2048", "model.module.entropy_weight=0.0", "model.module.entropy_units=loss")
# GEM's settings added after its first release; the runs here set the entropy term as that release ran (none), so the
# composed config of a resume from Python states what the earlier run did (gem.yaml's defaults now add the term)
LATER = ("label_head", "entropy_weight", "entropy_units")


def _ckpt(out: Path) -> Path:
    return out / "checkpoints" / "last.ckpt"


def _edit_ckpt(path: Path, change: Callable[[dict], None]) -> None:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    change(ckpt)
    AtomicCheckpointIO().save_checkpoint(ckpt, path)


def _edit_config(out: Path, change: Callable[[dict], None]) -> None:
    config = yaml.safe_load((out / "config.yaml").read_text())
    change(config)
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(config)))


def _drop_settings(config: dict) -> None:
    for key in LATER:
        del config["model"]["module"][key]


def _as_earlier_release(out: Path) -> None:
    """The run as GEM wrote it before ``entropy_weight`` and the label head: no head buffers, neither setting."""

    def strip(ckpt: dict) -> None:
        for name in HEAD:
            del ckpt["state_dict"][name]
        _drop_settings(ckpt["lightning_dp"]["config"])
        for key in LATER:
            ckpt["hyper_parameters"].pop(key, None)

    _edit_ckpt(_ckpt(out), strip)
    _edit_config(out, _drop_settings)


def _releases(out: Path) -> list[dict]:
    return json.loads((out / "ledger.json").read_text())["releases"]


@pytest.fixture(scope="module")
def earlier(tmp_path_factory, single_thread) -> Path:
    """An earlier release's run, stopped after one epoch; the refusal tests copy it (a refusal releases nothing)."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    train(make_cfg(out, *GEM))
    _as_earlier_release(out)
    return out


@pytest.mark.parametrize("how", ["train.py", "python"])
def test_an_earlier_releases_gem_run_resumes_trains_on_and_samples(how, tmp_path, single_thread):
    out = tmp_path / "run"
    first = train(make_cfg(out, *GEM))
    _as_earlier_release(out)
    saved = torch.load(_ckpt(out), weights_only=True)
    assert saved["epoch"] == 1 and not set(HEAD) & set(saved["state_dict"]) and not bool(saved["state_dict"]["finished"])
    before = _releases(out)
    overrides = ["resume=last", "trainer.max_epochs=3"]
    if how == "train.py":  # the command line names only what changes
        result = train(make_cfg(out, *overrides), overrides=overrides)
    else:  # from Python the whole composed config is compared: the new settings at what the earlier run did are no edit
        result = train(make_cfg(out, *GEM, *overrides))
    after = _releases(out)
    assert after[: len(before)] == before and len(after) > len(before)  # the ledger goes on, never back
    assert result["epsilon"] > first["epsilon"]
    resumed = torch.load(result["checkpoint"], weights_only=True)
    assert resumed["epoch"] == 3 and int(resumed["state_dict"]["rounds"]) > int(saved["state_dict"]["rounds"])
    assert torch.equal(resumed["state_dict"]["meas_values"][: len(saved["state_dict"]["meas_values"])],
                       saved["state_dict"]["meas_values"])  # nothing measured again
    # the settings it ran with are now on record: the defaults, which are what the earlier release did
    for config in (resumed["lightning_dp"]["config"], yaml.safe_load((out / "config.yaml").read_text())):
        module = config["model"]["module"]
        assert module["label_head"] is False and module["entropy_weight"] == 0.0 and module["entropy_units"] == "loss"
    model = load_run(result["checkpoint"]).model
    assert not bool(model.head_fitted)  # the generator's own label, as before
    rows = pd.read_csv(result["synthetic"])
    assert len(rows) > 100 and "target" in rows and not rows.isna().any().any()


def _refused(out: Path, extra: list[str], capsys) -> str:
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    code = entry.cli([f"output_dir={out}", "resume=last", "trainer.max_epochs=3", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    return err


def _first_net_weight(ckpt: dict) -> None:
    key = next(k for k in ckpt["state_dict"] if k.startswith("generator."))
    ckpt["state_dict"][key] = torch.zeros(*ckpt["state_dict"][key].shape, 2)


def _part_of_the_head(ckpt: dict) -> None:
    ckpt["state_dict"]["head_fitted"] = torch.tensor(False)  # a head buffer without the rest of its group


def _removed_setting(out: Path) -> None:
    _edit_config(out, lambda c: c["model"]["module"].update(old_setting=3))


REFUSALS = {
    "another network's weights": (lambda o: _edit_ckpt(_ckpt(o), _first_net_weight), [],
                                  r"not model=gem's as configured \(other shapes: generator\.layers\.0\.weight"),
    "a weight missing besides the head": (lambda o: _edit_ckpt(_ckpt(o), lambda c: c["state_dict"].pop("num_rows")), [],
                                          r"not model=gem's as configured \(missing: num_rows\)"),
    "part of the label head": (lambda o: _edit_ckpt(_ckpt(o), _part_of_the_head), [],
                               r"\(missing: head_bias, head_cliques, head_offsets \.\.\.\)"),
    "config.yaml edited to a label head": (lambda o: _edit_config(o, lambda c: c["model"]["module"].update(
        label_head=True)), [], "disagree on model.module.label_head"),
    "config.yaml edited to an entropy term": (lambda o: _edit_config(o, lambda c: c["model"]["module"].update(
        entropy_weight=5.0)), [], "disagree on model.module.entropy_weight"),
    "a setting this release does not have": (_removed_setting, [],
                                             "sets model.module.old_setting, which this lightning-dp no longer has"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_an_earlier_releases_run_is_still_refused_what_any_run_is(case, earlier, tmp_path, capsys):
    tamper, extra, match = REFUSALS[case]
    out = tmp_path / "run"
    shutil.copytree(earlier, out)
    tamper(out)
    err = _refused(out, extra, capsys)
    assert re.search(match, err), err
    assert _releases(out) == _releases(earlier)


def test_from_python_a_label_head_the_earlier_run_did_not_have_is_an_edit(earlier, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(earlier, out)  # experiment=gem_adult now sets label_head: true; the run was trained without it
    with pytest.raises(ResumeError, match=r"would change: model\.module\.label_head\."):
        train(make_cfg(out, *GEM, "resume=last", "model.module.label_head=true"))
