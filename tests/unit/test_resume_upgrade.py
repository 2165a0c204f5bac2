"""What a later release added to a class (``settings_added_later``, ``state_added_later``) is all that an earlier
run's saved config or checkpoint may lack: its defaults stand in, and every other difference is refused."""

from __future__ import annotations

import copy
import inspect

import pytest
from omegaconf import OmegaConf

from lightning_dp.io import atomic_write_text
from lightning_dp.models import fill_settings_added_later, settings_removed
from lightning_dp.models.gem import GEM, HEAD
from lightning_dp.registry import REGISTRY, resolve
from lightning_dp.resume import ResumeError, ResumeState, check_same_run, resume_config
from tests.conftest import make_cfg

# the entropy term as GEM's first release ran (none; gem.yaml's defaults now add it)
GEM_CFG = ("model=gem", "data=diabetes", "model.module.entropy_weight=0.0", "model.module.entropy_units=loss")
LATER = ("entropy_weight", "label_head", "entropy_units")


def _earlier(config: dict) -> dict:
    """``config`` as GEM's first release saved it: none of the settings added later."""
    config = copy.deepcopy(config)
    for key in LATER:
        del config["model"]["module"][key]
    return config


@pytest.mark.parametrize("target", [t for names in REGISTRY.values() for t in names])
def test_a_setting_added_later_is_a_parameter_with_a_default(target):
    kind = next(k for k, names in REGISTRY.items() if target in names)
    cls = resolve(target, expected=kind)
    params = inspect.signature(cls).parameters
    for name in getattr(cls, "settings_added_later", ()):
        assert name in params and params[name].default is not inspect.Parameter.empty, (target, name)


def test_gems_later_settings_default_to_what_it_did_before_them():
    params = inspect.signature(GEM).parameters
    assert set(GEM.settings_added_later) == set(LATER)
    assert params["entropy_weight"].default == 0.0 and params["label_head"].default is False
    assert params["entropy_units"].default == "loss"  # a weight saved before the setting is read as it was
    assert GEM.state_added_later == (HEAD,)


def test_an_earlier_config_gets_the_defaults_and_a_config_that_has_them_keeps_its_values(tmp_path):
    config = OmegaConf.to_container(make_cfg(tmp_path, *GEM_CFG, "model.module.label_head=true"), resolve=True)
    assert fill_settings_added_later(config["model"]) == {}
    assert config["model"]["module"]["label_head"] is True
    earlier = _earlier(config)
    assert fill_settings_added_later(earlier["model"]) == {"model.module.entropy_weight": 0.0,
                                                          "model.module.label_head": False,
                                                          "model.module.entropy_units": "loss"}
    assert earlier["model"]["module"] == {**config["model"]["module"], "label_head": False}


def test_a_setting_this_release_does_not_take_is_named():
    model = {"module": {"_target_": "lightning_dp.models.gem.GEM", "bins": 4, "old_setting": 1},
             "mechanisms": [{"_target_": "lightning_dp.callbacks.adaptive_marginals.AdaptiveMarginals", "gone": 2}]}
    assert settings_removed(model) == ["model.module.old_setting", "model.mechanisms[0].gone"]


def test_a_checkpoint_may_lack_a_whole_group_of_later_state_never_part_of_one():
    keys = {"generator.out.weight", "meas_values", "num_rows"}
    assert GEM.absent_later_state(keys) == set(HEAD)
    assert GEM.absent_later_state(keys | {"head_fitted"}) == set()
    assert GEM.absent_later_state(keys, prefix="model.") == {f"model.{k}" for k in HEAD}


def _state(config: dict) -> ResumeState:
    return ResumeState(ledger={}, data=None, checkpoint=None, where="test", config=config)


def test_the_checkpoints_record_of_an_earlier_run_agrees_with_todays_defaults_only(tmp_path):
    cfg = make_cfg(tmp_path, *GEM_CFG)
    earlier = _earlier(OmegaConf.to_container(cfg, resolve=True))
    check_same_run(cfg, _state(earlier))  # config.yaml rewritten by the resumed run, checkpoint not yet
    for key, value in (("label_head", True), ("entropy_weight", 5.0)):
        edited = make_cfg(tmp_path, *GEM_CFG, f"model.module.{key}={value}")
        with pytest.raises(ResumeError, match=rf"disagree on model\.module\.{key}: one of them was edited"):
            check_same_run(edited, _state(earlier))
    other = copy.deepcopy(earlier)
    other["model"]["module"]["bins"] = 8
    with pytest.raises(ResumeError, match=r"disagree on model\.module\.bins"):
        check_same_run(cfg, _state(other))


def test_from_python_an_earlier_config_resumes_and_an_edit_of_any_setting_is_refused(tmp_path):
    cfg = make_cfg(tmp_path, *GEM_CFG, "resume=last")
    earlier = _earlier(OmegaConf.to_container(cfg, resolve=True))
    atomic_write_text(tmp_path / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(earlier)))
    resumed = resume_config(cfg)
    assert resumed.model.module.label_head is False and resumed.model.module.entropy_weight == 0.0
    for edit in ("model.module.label_head=true", "model.module.entropy_weight=5", "model.module.bins=8"):
        with pytest.raises(ResumeError, match=rf"would change: {edit.split('=')[0]}\."):
            resume_config(make_cfg(tmp_path, *GEM_CFG, "resume=last", edit))
    removed = {**earlier, "model": copy.deepcopy(earlier["model"])}
    removed["model"]["module"]["old_setting"] = 3
    atomic_write_text(tmp_path / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(removed)))
    with pytest.raises(ResumeError, match=r"sets model\.module\.old_setting, which this lightning-dp no longer has"):
        resume_config(cfg, overrides=["resume=last"])
