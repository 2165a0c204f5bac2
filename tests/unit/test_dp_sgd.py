"""The DP-SGD mechanism: its step, its accounting, and its refusals."""

from types import SimpleNamespace

import pytest
import torch
from opacus.accountants import RDPAccountant
from pytorch_lightning import LightningModule
from torch import nn

from lightning_dp.callbacks.dp_sgd import DPSGD
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger


class Tiny(LightningModule):
    def __init__(self, norm: str = "layer") -> None:
        super().__init__()
        torch.manual_seed(0)
        norm_layer = nn.LayerNorm(16) if norm == "layer" else nn.BatchNorm1d(16)
        self.discriminator = nn.Sequential(nn.Linear(5, 16), norm_layer, nn.Tanh(), nn.Linear(16, 1))

    def per_sample_loss(self, x):
        return (self.discriminator(x).squeeze(1) - x[:, 0]).square()  # (B,)


def trainer_stub(max_steps=10):
    return SimpleNamespace(
        max_steps=max_steps,
        max_epochs=1,
        world_size=1,
        global_rank=0,
        accumulate_grad_batches=1,
        strategy=None,
        _accelerator_connector=SimpleNamespace(use_distributed_sampler=False),
    )


class Data:
    def __init__(self, n=1000, batch_size=32):
        self.batch_size = batch_size
        self.released_num_rows = float(n)  # DP-SGD sees only the released count

    def use_poisson_sampling(self, **kwargs):
        self.poisson = kwargs


def attach(module, *, sigma, clip, eps=1e30, n=1000, batch=32, steps=10):
    ledger = PrivacyLedger(target_epsilon=eps, delta=1e-5)
    mech = DPSGD(
        ledger=ledger, datamodule=Data(n, batch), max_grad_norm=clip, noise_multiplier=sigma, noise_seed=0
    )
    mech.on_fit_start(trainer_stub(steps), module)
    return mech, ledger


def test_no_noise_and_no_clipping_equals_the_plain_step():
    x = torch.randn(32, 5)
    plain = Tiny()
    (plain.per_sample_loss(x).sum() / 32).backward()  # L = q·N = 32
    private = Tiny()
    mech, _ = attach(private, sigma=1e-12, clip=1e4)
    private.backward(private.per_sample_loss(x))
    for p, q in zip(private.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_clipping_bounds_each_samples_contribution():
    x = torch.randn(32, 5) * 10
    module = Tiny()
    attach(module, sigma=1e-12, clip=0.01)
    module.backward(module.per_sample_loss(x))
    total = torch.cat([p.grad.reshape(-1) for p in module.parameters()]).norm() * 32
    assert total <= 32 * 0.01 * (1 + 1e-4)


def test_noise_has_std_sigma_c_over_l():
    module = Tiny()
    attach(module, sigma=2.0, clip=0.5, eps=1e6)
    module.backward(
        torch.zeros(0, requires_grad=True) + module.discriminator(torch.zeros(0, 5)).sum(1)
    )  # empty batch
    grads = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    assert float(grads.std()) == pytest.approx(2.0 * 0.5 / 32, rel=0.15)


def test_public_scalar_losses_pass_through_and_add():
    module = Tiny()
    attach(module, sigma=1e-12, clip=1e4)
    x = torch.randn(8, 5)
    (module.discriminator(x).mean()).backward()
    public = [p.grad.clone() for p in module.parameters()]
    module.backward(module.discriminator(x).mean())  # scalar → the plain backward hook
    for p, g in zip(module.parameters(), public):
        torch.testing.assert_close(p.grad, 2 * g)


def test_epsilon_after_n_steps_is_the_accountants():
    module = Tiny()
    mech, ledger = attach(module, sigma=1.1, clip=1.0, eps=50, n=10_000, batch=100)
    x = torch.randn(100, 5)
    for _ in range(120):
        mech._released_this_batch = False
        module.zero_grad()
        module.backward(module.per_sample_loss(x))
    acc = RDPAccountant()
    acc.history = [(1.1, 0.01, 120)]
    assert ledger.releases[0].count == 120
    assert ledger.spent == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_calibrated_noise_spends_the_budget_over_the_planned_steps():
    module = Tiny()
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    mech = DPSGD(ledger=ledger, datamodule=Data(5000, 50), max_grad_norm=1.0)
    mech.on_fit_start(trainer_stub(max_steps=500), module)
    assert ledger.epsilon_if([mech._release(500)]) == pytest.approx(2.0, rel=0.01)
    assert ledger.epsilon_if([mech._release(520)]) > 2.0


def test_over_budget_step_is_refused_before_noise():
    module = Tiny()
    mech, ledger = attach(module, sigma=4.0, clip=1.0, eps=1.0, n=100, batch=50)  # 2 steps fit, not 3
    x = torch.randn(50, 5)
    with pytest.raises(BudgetExceededError):
        for _ in range(100):
            mech._released_this_batch = False
            module.backward(module.per_sample_loss(x))
    assert ledger.spent <= 1.0 and ledger.releases[0].count == 2


def test_two_private_backwards_on_one_batch_are_refused():
    module = Tiny()
    attach(module, sigma=1.0, clip=1.0)
    x = torch.randn(4, 5)
    module.backward(module.per_sample_loss(x))
    with pytest.raises(RuntimeError, match="one private backward per batch"):
        module.backward(module.per_sample_loss(x))


def test_refusals():
    with pytest.raises(ValueError, match="add/remove"):
        ledger = PrivacyLedger(target_epsilon=1, delta=1e-5, adjacency="replace_one")
        DPSGD(ledger=ledger, datamodule=Data(), noise_multiplier=1.0).on_fit_start(trainer_stub(), Tiny())
    with pytest.raises(ValueError, match="accumulation"):
        stub = trainer_stub()
        stub.accumulate_grad_batches = 4
        DPSGD(
            ledger=PrivacyLedger(target_epsilon=1, delta=1e-5), datamodule=Data(), noise_multiplier=1.0
        ).on_fit_start(stub, Tiny())
    with pytest.raises(Exception, match="BatchNorm"):
        attach(Tiny(norm="batch"), sigma=1.0, clip=1.0)


def test_microbatch_mode_matches_the_fast_engine():
    x = torch.randn(16, 5)
    fast, loop = Tiny(), Tiny()
    attach(fast, sigma=1e-12, clip=0.05)
    ledger = PrivacyLedger(target_epsilon=1e30, delta=1e-5)
    mech = DPSGD(
        ledger=ledger,
        datamodule=Data(),
        max_grad_norm=0.05,
        noise_multiplier=1e-12,
        mode="microbatch",
        noise_seed=0,
    )
    mech.on_fit_start(trainer_stub(), loop)
    fast.backward(fast.per_sample_loss(x))
    loop.backward(loop.per_sample_loss(x))
    for p, q in zip(fast.parameters(), loop.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-8)


def test_a_per_sample_gradient_penalty_is_clipped_per_sample():
    # WGAN-GP under DP: ℓ_i = −D(x_i) + λ(||∇D(x̂_i)|| − 1)²; microbatch mode clips each ℓ_i's gradient to C.
    module = Tiny()
    attach_kw = dict(
        ledger=PrivacyLedger(target_epsilon=1e30, delta=1e-5),
        datamodule=Data(),
        max_grad_norm=0.1,
        noise_multiplier=1e-12,
        mode="microbatch",
        noise_seed=0,
    )
    DPSGD(**attach_kw).on_fit_start(trainer_stub(), module)
    x = torch.randn(8, 5)
    x_hat = (0.5 * x).requires_grad_(True)
    grad_x = torch.autograd.grad(module.discriminator(x_hat).sum(), x_hat, create_graph=True)[0]
    loss = -module.discriminator(x).squeeze(1) + 10 * (grad_x.norm(dim=1) - 1).square()
    module.backward(loss)
    total = torch.cat([p.grad.reshape(-1) for p in module.parameters()]).norm() * 32
    assert 0 < total <= 8 * 0.1 * (1 + 1e-4)
    with pytest.raises(RuntimeError):  # the one-backward engine refuses the double backward
        fast = Tiny()
        attach(fast, sigma=1.0, clip=0.1)
        x_hat = (0.5 * x).requires_grad_(True)
        g = torch.autograd.grad(fast.discriminator(x_hat).sum(), x_hat, create_graph=True)[0]
        fast.backward(-fast.discriminator(x).squeeze(1) + 10 * (g.norm(dim=1) - 1).square())
