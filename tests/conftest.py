"""Shared fixtures: the real config composed and shrunk, and the optional shared data sets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

TINY = ["trainer.max_epochs=1", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1"]
# one-shot embedding models (dp_merf, pearl): few steps on small embeddings
TINY_ONE_SHOT = [
    "model.module.steps_per_epoch=5",
    "model.module.num_features=200",
    "model.module.batch_size=200",
]
ONE_SHOT = ("dp_merf", "pearl")


def make_cfg(tmp_path: Path, *overrides: str) -> DictConfig:
    """The project's real config with tiny training and ``output_dir`` in ``tmp_path``."""
    model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "dp_merf")
    tiny = TINY + (TINY_ONE_SHOT if model in ONE_SHOT else [])
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=[*tiny, f"output_dir={tmp_path}", *overrides])


@pytest.fixture(scope="module", autouse=True)
def budget_registry(tmp_path_factory) -> Iterator[Path]:
    """Each test module its own budget registry (a fresh SQLite file), so modules never share a data set's budget,
    with large default budgets (the tests of budgets set their own); child processes inherit it."""
    path = tmp_path_factory.mktemp("registry") / "budget.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIGHTNING_DP_REGISTRY", str(path))
        mp.setenv("LIGHTNING_DP_DEFAULT_BUDGET", "1000")
        mp.setenv("LIGHTNING_DP_DEFAULT_DELTA", "0.5")
        yield path


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for modules of many tiny tensor ops (OpenMP spinning costs more than it gives on
    2 busy cores)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def shared(*parts: str) -> Path:
    """A path in ../shared/data, or skip the test when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        name = {"mnist-test": "mnist"}.get(parts[0], parts[0]) if parts else "adult cervical mnist"
        pytest.skip(f"shared data set not available at {path}; fetch it with: .venv/bin/python -m lightning_dp.data "
                    f"fetch {name}")
    return path
