"""The KSD penalty as a mechanism: on a second, trivial energy module; with and without DP-SGD."""

from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from scipy.stats import chi2
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dp.callbacks.dp_sgd import DPSGD
from lightning_dp.callbacks.ksd_penalty import KSDPenalty
from lightning_dp.kernels.stein import ksd_linear_normalized, median_bandwidth
from lightning_dp.models.base import GeneratorModule
from lightning_dp.privacy.batch_terms import batch_terms
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.privacy.metrics import declared_metrics

CRITICAL = float(chi2.ppf(0.95, df=1))


class GaussianEnergy(GeneratorModule):
    """E(x) = ½‖x − μ‖² on the first two columns: a unit Gaussian with a learnt mean. Its per-sample loss is
    the negative log-likelihood, so without a penalty μ goes to the data's mean and the model is right."""

    public_metrics = {"train/mu_norm": "a parameter (no DP claim in these tests)"}

    def __init__(self) -> None:
        super().__init__()
        self.mu = nn.Parameter(torch.zeros(2))
        self.generator = nn.Identity()

    def sensitive_part(self, x):
        return x[:, :2]

    def sensitive_energy(self, x_sensitive):
        return 0.5 * (x_sensitive - self.mu).square().sum(1)

    def training_step(self, batch, batch_idx):
        return self.sensitive_energy(self.sensitive_part(batch[0]))  # (B,): the per-sample loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def gaussian_rows(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g) + torch.tensor([2.0, -1.0, 0.0])


def batch_statistic(module, x, seed=0):
    torch.manual_seed(seed)
    xs = module.sensitive_part(x).detach().requires_grad_(True)
    score = -torch.autograd.grad(module.sensitive_energy(xs).sum(), xs)[0]
    return float(ksd_linear_normalized(xs.detach(), score, bandwidth=median_bandwidth(xs, pairs="linear")))


def fit(module, callbacks, x, epochs=3):
    loader = DataLoader(TensorDataset(x, torch.zeros(len(x), dtype=torch.long)), batch_size=128, shuffle=True)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    return module


def no_claim_ledger():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    ledger.waive("test/mu", "trained without DP")
    return ledger


def rejection_rate(module, x):
    batches = len(x) // 128
    stats = [batch_statistic(module, x[i * 128:(i + 1) * 128], seed=i) for i in range(batches)]
    return sum(s > CRITICAL for s in stats) / batches


def test_the_penalty_makes_a_second_energy_module_fail_the_ksd_test():
    x = gaussian_rows()
    plain = fit(GaussianEnergy(), [], x)
    assert torch.allclose(plain.mu, torch.tensor([2.0, -1.0]), atol=0.15)  # the MLE: the model is right
    assert rejection_rate(plain, x) <= 0.15  # a correct model: batches reject at about α
    penalised = fit(GaussianEnergy(), [KSDPenalty(ledger=no_claim_ledger(), weight=10.0, scale="per_batch")], x)
    assert rejection_rate(penalised, x) >= 0.8  # pushed to a marginal the batch test rejects (α-LMDP)
    assert float((penalised.mu.detach() - torch.tensor([2.0, -1.0])).norm()) > 0.3


def test_scales_and_metrics_follow_the_claim():
    x = gaussian_rows(512)
    module = GaussianEnergy()
    ksd = KSDPenalty(ledger=no_claim_ledger(), weight=10.0, scale="per_sample")
    ksd.setup(None, module, "fit")
    assert batch_terms(module) == [ksd] and "ksd/statistic" in declared_metrics(module)
    ksd._x = module.sensitive_part(x[:128])
    module.log = lambda *a, **k: None
    per_sample = float(ksd(torch.zeros(128)))
    ksd.scale = "per_batch"
    assert float(ksd(torch.zeros(128))) == pytest.approx(per_sample * 128, rel=1e-4)  # P/n vs P (the paper's P5)
    dp_module = GaussianEnergy()
    KSDPenalty(ledger=PrivacyLedger(target_epsilon=1.0, delta=1e-5)).setup(None, dp_module, "fit")
    assert not any(k.startswith("ksd/") for k in declared_metrics(dp_module))  # under DP: private, not logged


def test_refusals():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    for kwargs in ({"alpha": 1.5}, {"weight": -1}, {"scale": "sum"}, {"max_grad_norm": 0}):
        with pytest.raises(ValueError):
            KSDPenalty(ledger=ledger, **kwargs)
    with pytest.raises(ValueError, match="sensitive_part"):
        KSDPenalty(ledger=ledger).setup(None, pl.LightningModule(), "fit")


class Data:
    batch_size = 128
    released_num_rows = 4096.0

    def use_poisson_sampling(self, **kwargs):
        pass




class Wrapped(GaussianEnergy):
    """The trivial module with its parameter in a submodule, as DP-SGD's ``private_modules`` name modules."""

    def __init__(self):
        super().__init__()
        del self.mu
        self.mean = nn.Linear(1, 2, bias=False)

    @property
    def mu(self):
        return self.mean.weight.squeeze(1)

    def sensitive_energy(self, x_sensitive):
        return 0.5 * (x_sensitive - self.mean.weight.squeeze(1)).square().sum(1)


def test_under_dp_sgd_the_term_is_clipped_whole_and_widens_the_sensitivity():
    x = gaussian_rows(128)
    module = Wrapped()
    ledger = PrivacyLedger(target_epsilon=1e30, delta=1e-5)
    ksd = KSDPenalty(ledger=ledger, weight=1e6, scale="per_batch", max_grad_norm=0.25)
    dp = DPSGD(ledger=ledger, datamodule=Data(), max_grad_norm=1.0, noise_multiplier=1e-9, private_modules=["mean"],
               noise_seed=0)
    ksd.setup(None, module, "fit")
    trainer = SimpleNamespace(max_steps=10, max_epochs=1, world_size=1, global_rank=0, accumulate_grad_batches=1,
                              strategy=SimpleNamespace(broadcast=lambda v, src=0: v),
                              _accelerator_connector=SimpleNamespace(use_distributed_sampler=False))
    dp.on_fit_start(trainer, module)
    assert dp.mode == "microbatch" and dp.sensitivity == pytest.approx(1.5)  # C + 2·C_P
    rows = module.sensitive_part(x)
    ksd._x = rows
    dp.private_backward(module.sensitive_energy(rows))
    with_term = module.mean.weight.grad.clone() * dp._expected_batch
    module.mean.weight.grad = None
    ksd.weight = 0.0  # the same step without the penalty's gradient
    dp._released_this_batch = False
    dp.private_backward(module.sensitive_energy(rows))
    without = module.mean.weight.grad * dp._expected_batch
    assert float((with_term - without).norm()) <= 0.25 + 1e-4  # the whole term contributes at most C_P
    release = ledger.releases[-1]
    assert release.sensitivity == pytest.approx(1.5) and "batch-coupled" in release.note
