"""Only declared metrics leave a run, whatever path they take."""

import pandas as pd
import pytest
import torch

from lightning_dp.models.base import GeneratorModule
from lightning_dp.privacy.metrics import (
    GuardedCSVLogger,
    UndeclaredMetricError,
    declare_metrics,
    declared_metrics,
)
from tests.conftest import make_cfg


class Leaky(GeneratorModule):
    public_metrics = {"train/ok": "a constant"}

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))


def test_an_undeclared_key_is_refused_by_the_module_and_by_the_logger(tmp_path):
    module = Leaky()
    with pytest.raises(UndeclaredMetricError, match="'train/d_loss_real' is not declared"):
        module.log("train/d_loss_real", 1.0)
    declare_metrics(module, {"dp_sgd/noisy_grad_norm": "the release"})
    assert set(declared_metrics(module)) == {"train/ok", "dp_sgd/noisy_grad_norm"}
    assert "dp_sgd/noisy_grad_norm" not in declared_metrics(Leaky())  # declarations are per module
    logger = GuardedCSVLogger(str(tmp_path), name="logs", declared=lambda: declared_metrics(module))
    logger.log_metrics({"train/ok": 1.0, "epoch": 0}, step=0)
    with pytest.raises(UndeclaredMetricError):
        logger.log_metrics({"private/median_norm": 0.3}, step=1)


@pytest.mark.parametrize("model", ["dp_merf", "dp_gan"])
def test_a_real_run_logs_only_declared_keys(tmp_path, model, single_thread):
    from lightning_dp.train import train

    extra = ["model.module.batch_size=64", "data.batch_size=64"] if model == "dp_gan" else []
    train(make_cfg(tmp_path, f"model={model}", *extra))
    metrics = pd.read_csv(next(tmp_path.glob("logs/*/metrics.csv")))
    logged = set(metrics.columns) - {"epoch", "step"}
    expected = {"dp_merf": {"train/mmd2", "privacy/epsilon", "privacy/epsilon_remaining"},
                "dp_gan": {"train/g_loss", "train/d_loss_fake", "privacy/epsilon", "privacy/epsilon_remaining",
                           "dp_sgd/noisy_grad_norm", "dp_sgd/noise_multiplier"}}[model]
    assert logged == expected
