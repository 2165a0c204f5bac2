"""Loading a checkpoint runs no code named by the file: a ``_target_`` planted anywhere in the saved record is
refused by ``load_run``, ``python -m lightning_dp.sample`` (exit 2) and ``python -m audits`` (exit 2, no
report) before anything is imported or called; the shipped configs still build through the registry."""

from __future__ import annotations

import base64
import copy
import importlib
import pathlib
import pickle
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

import lightning_dp.registry as registry
from audits.__main__ import main as audits_main
from lightning_dp.callbacks.dp_sgd import DPSGD
from lightning_dp.callbacks.label_proportions import LabelProportions
from lightning_dp.callbacks.sanitized_embedding import SanitizedEmbedding
from lightning_dp.checkpoint import CheckpointError, UnsafeConfigError, load_run, validate_record
from lightning_dp.models import build_mechanisms, build_model
from lightning_dp.models.dp_gan import DPGAN
from lightning_dp.models.dp_merf import DPMERF
from lightning_dp.models.pearl import PEARL
from lightning_dp.nets.discriminators import ConditionalDiscriminator
from lightning_dp.nets.generators import ConditionalGenerator
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.sample import main as sample_main
from lightning_dp.train import train
from tests.conftest import ROOT, make_cfg

VICTIM_TEXT = "precious results, do not truncate\n"
MODULES = ", ".join(registry.REGISTRY["module"])  # every registered module, in registry order
DPMERF_SETTABLE = "num_features, bandwidth, bandwidth_scale, batch_size, steps_per_epoch, lr, rff_seed"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real tiny DP-MERF run on breast cancer, written by the project's own train()."""
    out = tmp_path_factory.mktemp("run")
    result = train(make_cfg(out, "privacy.noise_seed=0"))
    assert result["checkpoint"] == str(out / "checkpoints" / "last.ckpt")
    return Path(result["checkpoint"])


class _Touch:
    """Unpickling this calls ``Path.touch`` on the sentinel: the payload of the audit's pickle bomb."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def _payloads(victim: Path, sentinel: Path) -> dict[str, dict[str, Any]]:
    """Hydra nodes that truncate ``victim`` or create ``sentinel`` when instantiated."""
    bomb = base64.b64encode(pickle.dumps(_Touch(sentinel))).decode()
    return {
        "open_truncate": {"_target_": "builtins.open", "file": str(victim), "mode": "w"},
        "os_system": {"_target_": "os.system", "_args_": [f"touch {sentinel}"]},
        "path_touch": {
            "_target_": "pathlib.Path.touch",
            "self": {"_target_": "pathlib.Path", "_args_": [str(sentinel)]},
        },
        "read_pickle": {
            "_target_": "pandas.read_pickle",
            "filepath_or_buffer": {
                "_target_": "io.BytesIO",
                "initial_bytes": {"_target_": "base64.b64decode", "s": bomb},
            },
        },
    }


def _plant_module(r: dict, p: dict) -> None:
    r["config"]["model"]["module"] = {**r["config"]["model"]["module"], **p}


def _plant_generator(r: dict, p: dict) -> None:
    r["config"]["model"]["generator"] = {**r["config"]["model"]["generator"], **p}


def _plant_mechanism(r: dict, p: dict) -> None:
    r["config"]["model"]["mechanisms"][0] = {**r["config"]["model"]["mechanisms"][0], **p}


def _plant_hyperparameter(r: dict, p: dict) -> None:
    r["config"]["model"]["module"]["lr"] = p


def _plant_data_root(r: dict, p: dict) -> None:
    r["config"]["data"]["root"] = p


def _plant_trainer(r: dict, p: dict) -> None:
    r["config"]["trainer"] = {**r["config"]["trainer"], **p}


def _plant_record_data(r: dict, p: dict) -> None:
    r["data"] = {**r["data"], **p}


# planting function -> the position the refusal must name (a regex)
POSITIONS: dict[str, tuple[Callable[[dict, dict], None], str]] = {
    "model.module": (_plant_module, r"config\.model\.module\._target_ = "),
    "model.generator": (_plant_generator, r"config\.model\.generator\._target_ = "),
    "model.mechanisms[0]": (_plant_mechanism, r"config\.model\.mechanisms\[0\]\._target_ = "),
    "model.module.lr": (_plant_hyperparameter, r"config\.model\.module\.lr\._target_ = "),
    "config.data.root": (_plant_data_root, r"config\.data\.root\._target_ = "),
    "config.trainer": (_plant_trainer, r"config\.trainer\._target_ = "),
    "record.data": (_plant_record_data, r"(?<![\w.])data\._target_ = "),
}


def _tampered(src: Path, dst: Path, plant: Callable[[dict], None]) -> Path:
    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    plant(ckpt["lightning_dp"])
    torch.save(ckpt, dst)
    return dst


@pytest.fixture
def bait(tmp_path):
    """A victim file holding text and the path of a sentinel that must never appear."""
    victim, sentinel = tmp_path / "victim.txt", tmp_path / "pwned"
    victim.write_text(VICTIM_TEXT)
    return victim, sentinel


def _naive_instantiate(node: Any) -> Any:
    """What any ``_target_`` resolver without a registry does (the old loader handed nodes to Hydra)."""
    if isinstance(node, list):
        return [_naive_instantiate(v) for v in node]
    if not isinstance(node, dict):
        return node
    kwargs = {k: _naive_instantiate(v) for k, v in node.items() if k not in ("_target_", "_args_")}
    if "_target_" not in node:
        return kwargs
    path, _, name = node["_target_"].rpartition(".")
    try:
        obj = importlib.import_module(path)
    except ImportError:  # a method: module.Class.method
        path, _, cls = path.rpartition(".")
        obj = getattr(importlib.import_module(path), cls)
    return getattr(obj, name)(*_naive_instantiate(node.get("_args_", [])), **kwargs)


@pytest.mark.parametrize("payload", ["open_truncate", "os_system", "path_touch", "read_pickle"])
def test_the_payloads_are_live(bait, payload):
    """The payloads do damage when instantiated: the refusals below are not vacuous."""
    victim, sentinel = bait
    obj = _naive_instantiate(_payloads(victim, sentinel)[payload])
    if hasattr(obj, "close"):
        obj.close()
    assert (victim.read_text() == "") if payload == "open_truncate" else sentinel.exists()


def _without_progress(stderr: str) -> str:
    """stderr less the off-terminal progress lines (``progress: STAGE | ...``): what is left is the refusal."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("progress: "))


@pytest.mark.parametrize("payload", ["open_truncate", "os_system", "path_touch", "read_pickle"])
@pytest.mark.parametrize("position", list(POSITIONS))
def test_a_planted_target_is_refused_by_load_run_sample_and_audits(
    checkpoint, tmp_path, bait, capsys, position, payload
):
    victim, sentinel = bait
    plant, named = POSITIONS[position]
    node = _payloads(victim, sentinel)[payload]
    bad = _tampered(checkpoint, tmp_path / "bad.ckpt", lambda r: plant(r, copy.deepcopy(node)))

    with pytest.raises(UnsafeConfigError, match=named) as err:
        load_run(bad)
    assert str(err.value).startswith(f"Checkpoint {str(bad)!r} refused, nothing was built from it: ")
    assert len(str(err.value).splitlines()) <= 2

    assert sample_main([str(bad), "--num-rows", "5", "--out", str(tmp_path / "x.csv")]) == 2
    message = _without_progress(capsys.readouterr().err)
    assert message.startswith("error: Checkpoint ") and re.search(named, message)
    assert not (tmp_path / "x.csv").exists()

    dest = tmp_path / "audit"
    argv = [str(bad), "--real", "breast_cancer", "--holdout", "breast_cancer", "--out", str(dest)]
    assert audits_main(argv) == 2
    message = _without_progress(capsys.readouterr().err)
    assert message.startswith("error: Checkpoint ") and re.search(named, message)
    assert not (dest / "report.json").exists() and not (dest / "report.html").exists()

    assert victim.read_text() == VICTIM_TEXT and not sentinel.exists()


@pytest.mark.parametrize(
    "plant,match",
    [
        (
            lambda r: r["config"]["model"]["module"].update(
                _target_="lightning_dp.nets.generators.ConditionalGenerator"
            ),
            "config.model.module._target_ = 'lightning_dp.nets.generators.ConditionalGenerator' is a network, not a "
            f"module; allowed here: {MODULES}.",
        ),
        (
            lambda r: r["config"]["model"]["generator"].update(_target_="lightning_dp.models.dp_merf.DPMERF"),
            "config.model.generator._target_ = 'lightning_dp.models.dp_merf.DPMERF' is a module, not a network",
        ),
        (
            lambda r: r["config"]["model"]["mechanisms"][0].update(
                _target_="lightning_dp.models.pearl.PEARL"
            ),
            "config.model.mechanisms[0]._target_ = 'lightning_dp.models.pearl.PEARL' is a module, not a mechanism",
        ),
        (
            lambda r: r["config"]["model"]["module"].update(_target_="lightning_dp.models.dp_merf.DPMERF2"),
            "config.model.module._target_ = 'lightning_dp.models.dp_merf.DPMERF2' is not a registered lightning-dp "
            f"module; allowed here: {MODULES}.",
        ),
        (
            lambda r: r["config"]["model"]["module"].update(not_a_param=3),
            "config.model.module.not_a_param is not a parameter of lightning_dp.models.dp_merf.DPMERF; valid: "
            f"{DPMERF_SETTABLE}.",
        ),
        (
            lambda r: r["config"]["model"]["generator"].update(dropout=0.1),
            "config.model.generator.dropout is not a parameter of lightning_dp.nets.generators.ConditionalGenerator; "
            "valid: n_continuous, block_sizes, num_classes, latent_dim, hidden, batch_norm.",
        ),
        (
            lambda r: r["config"]["model"]["module"].update(lr=torch.tensor(0.5)),
            "config.model.module.lr = tensor(0.5000) is a torch.Tensor; config values must be plain data",
        ),
        (
            lambda r: r["config"]["model"]["module"].update(num_classes=7),
            "config.model.module.num_classes is refused: the run supplies it (the data layout and the networks)",
        ),
        (
            lambda r: r["config"]["model"]["mechanisms"][0].update(noise_seed=0),
            "config.model.mechanisms[0].noise_seed is refused: the run supplies it",
        ),
        (
            lambda r: r["config"]["model"]["module"].update(_partial_=True),
            "config.model.module._partial_ is refused: only _target_ may start with '_'",
        ),
        (
            lambda r: r["config"]["privacy"].update(_convert_="all"),
            "config.privacy._convert_ is refused: keys starting with '_'",
        ),
        (
            lambda r: r["ledger"]["releases"][0].update(note={"_target_": "os.getcwd"}),
            "ledger.releases[0].note._target_ = 'os.getcwd' is refused",
        ),
    ],
    ids=[
        "network_as_module",
        "module_as_network",
        "module_as_mechanism",
        "misspelt_module",
        "unknown_hyperparameter",
        "unknown_network_parameter",
        "tensor_value",
        "layout_key",
        "noise_seed_from_file",
        "partial",
        "convert",
        "ledger_target",
    ],
)
def test_refusals_of_non_code_violations_name_the_position_and_what_is_allowed(
    checkpoint, tmp_path, capsys, plant, match
):
    bad = _tampered(checkpoint, tmp_path / "bad.ckpt", plant)
    with pytest.raises(UnsafeConfigError) as err:
        load_run(bad)
    assert match in str(err.value)
    assert sample_main([str(bad), "--num-rows", "5", "--out", str(tmp_path / "x.csv")]) == 2
    assert match in capsys.readouterr().err


def test_the_untampered_checkpoint_loads_strictly_and_samples(checkpoint, tmp_path, capsys):
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    validate_record(ckpt["lightning_dp"], path=checkpoint)  # what a resume calls: no error
    run = load_run(checkpoint)
    assert type(run.model) is DPMERF and type(run.model.generator) is ConditionalGenerator
    assert run.record is run.checkpoint["lightning_dp"] and run.data_state is run.record["data"]
    state = run.model.state_dict()
    assert set(state) == set(ckpt["state_dict"])
    assert all(torch.equal(state[k], ckpt["state_dict"][k]) for k in state)
    assert (
        run.model.hparams.num_features == 200 and run.model.hparams.n_continuous == 30
    )  # tiny run, 30 features
    assert (
        sample_main([str(checkpoint), "--num-rows", "5", "--out", str(tmp_path / "a.csv"), "--seed", "3"])
        == 0
    )
    assert capsys.readouterr().out.strip() == f"wrote 5 rows to {tmp_path / 'a.csv'}"
    a = pd.read_csv(tmp_path / "a.csv")
    names = [c["name"] for c in run.data_state["schema"]["columns"]]
    assert len(a) == 5 and list(a.columns) == names and set(a["diagnosis"]) <= {"malignant", "benign"}
    assert (
        sample_main([str(checkpoint), "--num-rows", "5", "--out", str(tmp_path / "b.csv"), "--seed", "3"])
        == 0
    )
    pd.testing.assert_frame_equal(a, pd.read_csv(tmp_path / "b.csv"))


def test_the_untampered_checkpoint_is_audited(checkpoint, tmp_path, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text("checks:\n  membership:\n    attacks: [dcr]\n    max_auc: 1.0\n")
    dest = tmp_path / "audit"
    argv = [
        str(checkpoint),
        "--real",
        "breast_cancer",
        "--holdout",
        "breast_cancer",
        "--out",
        str(dest),
        "--policy",
        str(policy),
    ]
    assert audits_main(argv) == 0, capsys.readouterr().err
    assert (dest / "report.json").exists() and (dest / "report.html").exists()


def test_a_weight_that_does_not_fit_is_a_checkpoint_error(checkpoint, tmp_path):
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    ckpt["state_dict"]["stray.weight"] = torch.zeros(2)
    torch.save(ckpt, tmp_path / "stray.ckpt")
    with pytest.raises(CheckpointError, match="do not fit the model rebuilt from its config"):
        load_run(tmp_path / "stray.ckpt")


def test_an_unknown_model_name_is_a_checkpoint_error(checkpoint):
    record = torch.load(checkpoint, map_location="cpu", weights_only=True)["lightning_dp"]
    record["config"]["model"]["name"] = "gan9000"
    with pytest.raises(
        CheckpointError, match="unknown model 'gan9000'; valid models: dp_merf, pearl, dp_gan, dp_cgan"
    ):
        validate_record(record)


# ------------------------------------------------------------------------------------------ shipped configs
LAYOUT = {"n_continuous": 4, "block_sizes": [3], "num_classes": 2}
EXPECTED = {  # model -> (module, networks, mechanisms, generator's (block_sizes, num_classes))
    "dp_merf": (DPMERF, {"generator": ConditionalGenerator}, [SanitizedEmbedding], ([3], 2)),
    "pearl": (PEARL, {"generator": ConditionalGenerator}, [SanitizedEmbedding], ([3], 2)),
    "dp_gan": (
        DPGAN,
        {"generator": ConditionalGenerator, "discriminator": ConditionalDiscriminator},
        [DPSGD],
        ([3, 2], 1),
    ),  # unconditional: the label is one more generated block (DPGAN.net_layout)
    "dp_cgan": (
        DPGAN,
        {"generator": ConditionalGenerator, "discriminator": ConditionalDiscriminator},
        [LabelProportions, DPSGD],
        ([3], 2),
    ),
}


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("form", ["hydra", "plain"])
def test_every_shipped_model_config_builds(tmp_path, name, form):
    cfg = make_cfg(tmp_path, f"model={name}").model
    model_cfg = cfg if form == "hydra" else OmegaConf.to_container(cfg, resolve=True)
    module_cls, nets, mechanisms, (blocks, classes) = EXPECTED[name]
    model = build_model(model_cfg, LAYOUT)
    assert type(model) is module_cls
    for key, net_cls in nets.items():
        assert type(getattr(model, key)) is net_cls
    assert model.generator.block_sizes == blocks and model.generator.num_classes == classes
    assert model.hparams.n_continuous == 4 and model.hparams.num_classes == 2
    assert model.hparams.batch_size == cfg.module.batch_size
    ledger, dm = PrivacyLedger(target_epsilon=1.0, delta=1e-5), object()
    built = build_mechanisms(model_cfg, ledger=ledger, datamodule=dm, noise_seed=7)
    assert [type(m) for m in built] == mechanisms
    assert all(m.ledger is ledger and m.datamodule is dm and m.noise_seed == 7 for m in built)
    assert all(m.noise_seed is None for m in build_mechanisms(model_cfg, ledger=ledger, datamodule=dm))
    if name == "dp_cgan":
        assert built[0].epsilon_fraction == 0.05 and built[1].private_modules == ["discriminator"]


def test_a_users_own_config_gets_the_same_clear_error(tmp_path):
    cfg = make_cfg(tmp_path, "+model.module.not_a_param=1")
    with pytest.raises(
        UnsafeConfigError,
        match=rf"^model\.module\.not_a_param is not a parameter of "
        rf"lightning_dp\.models\.dp_merf\.DPMERF; valid: {DPMERF_SETTABLE}\.$",
    ):
        build_model(cfg.model, LAYOUT)
    cfg = make_cfg(tmp_path, "model.generator._target_=builtins.print")
    with pytest.raises(
        UnsafeConfigError, match=r"^model\.generator\._target_ = 'builtins\.print' is not a registered"
    ):
        build_model(cfg.model, LAYOUT)
    cfg = make_cfg(tmp_path, "+model.mechanisms.0._partial_=true")
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(UnsafeConfigError, match=r"^model\.mechanisms\[0\]\._partial_ is refused"):
        build_mechanisms(cfg.model, ledger=ledger, datamodule=object())


class NoSeed:
    """A mechanism whose ``__init__`` takes no noise seed."""

    def __init__(self, *, ledger: Any, datamodule: Any, strength: float = 1.0) -> None:
        self.ledger, self.datamodule, self.strength = ledger, datamodule, strength


def test_noise_seed_is_passed_only_to_mechanisms_that_take_it(monkeypatch):
    monkeypatch.setitem(
        registry.REGISTRY,
        "mechanism",
        (*registry.REGISTRY["mechanism"], "tests.unit.test_safe_loading.NoSeed"),
    )
    model_cfg = {
        "name": "dp_merf",
        "module": {"_target_": "lightning_dp.models.dp_merf.DPMERF"},
        "mechanisms": [
            {"_target_": "tests.unit.test_safe_loading.NoSeed", "strength": 2.5},
            {"_target_": "lightning_dp.callbacks.dp_sgd.DPSGD", "max_grad_norm": 0.5},
        ],
    }
    no_seed, dp_sgd = build_mechanisms(model_cfg, ledger="L", datamodule="D", noise_seed=11)
    assert (no_seed.strength, no_seed.ledger, no_seed.datamodule) == (2.5, "L", "D")
    assert dp_sgd.noise_seed == 11 and dp_sgd.max_grad_norm == 0.5


def test_the_registry_imports_nothing_it_does_not_name():
    code = (
        "import sys\n"
        "import lightning_dp.registry as r\n"
        "assert not any(m.startswith(('lightning_dp.models', 'lightning_dp.nets', 'lightning_dp.callbacks.dp_sgd'))"
        " for m in sys.modules), sorted(m for m in sys.modules if m.startswith('lightning_dp'))\n"
        "try:\n"
        "    r.resolve('xml.dom.minidom.parseString', expected='module')\n"
        "except r.UnsafeConfigError as err:\n"
        "    print(err)\n"
        "assert 'xml.dom.minidom' not in sys.modules\n"
        "assert r.resolve('lightning_dp.nets.generators.ConditionalGenerator', expected='network').__name__ == "
        "'ConditionalGenerator'\n"
        "assert 'lightning_dp.nets.generators' in sys.modules and 'lightning_dp.models.pearl' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"config._target_ = 'xml.dom.minidom.parseString' is not a registered lightning-dp "
        f"module; allowed here: {MODULES}."
    )


def _targets(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["_target_"]] if "_target_" in node else []) + [
            t for v in node.values() for t in _targets(v)
        ]
    if isinstance(node, list):
        return [t for v in node for t in _targets(v)]
    return []


def test_the_registry_holds_every_shipped_target_and_every_network():
    import inspect

    import yaml
    from torch import nn

    import lightning_dp.nets.discriminators as discriminators
    import lightning_dp.nets.generators as generators

    files = sorted((ROOT / "configs").glob("model/*.yaml")) + sorted(
        (ROOT / "configs").glob("experiment/*.yaml")
    )
    targets = {t for f in files for t in _targets(yaml.safe_load(f.read_text()))}
    assert targets == {
        *registry.REGISTRY["module"],
        *registry.REGISTRY["network"],
        *registry.REGISTRY["mechanism"],
    }
    nets = {
        f"{cls.__module__}.{cls.__qualname__}"
        for module in (generators, discriminators)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, nn.Module) and cls.__module__ == module.__name__
    }
    assert nets <= set(registry.REGISTRY["network"])  # every network of these files can be named by a config
    for name in registry.REGISTRY["network"]:  # and every registered network is a plain nn.Module of lightning_dp.nets
        cls = registry.resolve(name, expected="network", where="test")
        assert issubclass(cls, nn.Module) and cls.__module__.startswith("lightning_dp.nets.")
