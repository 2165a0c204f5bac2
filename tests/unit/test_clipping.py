"""Per-sample clipping: norms and clipped sums against autograd micro-batches and Opacus' GradSampleModule."""

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from torch import Tensor, nn

from lightning_dp.privacy.clipping import (
    PerSampleClipper,
    add_noise,
    clip_factors,
    ghost_norms_sq,
    outer_norms_sq,
)

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook", "ignore:In CPU autocast")
RTOL = 1e-5
LossFn = Callable[[nn.Module, Tensor], Tensor]  # (model, inputs) -> (B,) per-sample losses


class Scale(nn.Module):
    """A layer with no Opacus grad sampler: goes through functorch."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight


class SeqNet(nn.Module):
    """3-D inputs (B, T, d): a ghost-norm linear (T=3, 20x20), a materialised one (20->8), a 2-D head."""

    def __init__(self) -> None:
        super().__init__()
        self.ghost, self.wide, self.head = nn.Linear(20, 20), nn.Linear(20, 8), nn.Linear(8, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.wide(torch.tanh(self.ghost(x)))).mean(1))


class EmbNet(nn.Module):
    def __init__(self, padding_idx: int | None) -> None:
        super().__init__()
        self.emb, self.scale, self.out = (
            nn.Embedding(10, 6, padding_idx=padding_idx),
            Scale(6),
            nn.Linear(6, 1),
        )

    def forward(self, idx: Tensor) -> Tensor:
        return self.out(torch.tanh(self.scale(self.emb(idx)))).sum(1)  # (B, 1)


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 16), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)
    )


def mlp_layernorm() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 1))


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2, padding=1),  # (B, 4, 5, 5)
        nn.GroupNorm(2, 4),
        nn.LeakyReLU(0.2),
        nn.Conv2d(4, 6, 3, groups=2),  # (B, 6, 3, 3)
        nn.Flatten(),
        nn.Linear(54, 1),
    )


def bce(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x).squeeze(1), y, reduction="none")


def make_batch(name: str, n: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, 2, (n,), generator=gen).double()
    if name == "convnet":
        return torch.randn(n, 1, 9, 9, generator=gen).double(), y
    if name == "seq":
        return torch.randn(n, 3, 20, generator=gen).double(), y
    if name.startswith("emb"):
        return torch.randint(0, 10, (n, 5), generator=gen), y
    return torch.randn(n, 6, generator=gen).double(), y


MODELS = {
    "mlp": mlp,
    "mlp_layernorm": mlp_layernorm,
    "convnet": convnet,
    "seq": SeqNet,
    "emb": lambda: EmbNet(None),
    "emb_padded": lambda: EmbNet(0),
}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().double()


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def microbatch_grads(model: nn.Module, batch: tuple[Tensor, Tensor]) -> list[Tensor]:
    """Per-sample gradients by plain autograd on batches of one: one (B, *p.shape) tensor per parameter."""
    x, y = batch
    rows = [
        torch.autograd.grad(bce(model, (x[i : i + 1], y[i : i + 1])).sum(), trainable(model))
        for i in range(len(y))
    ]
    return [torch.stack(gs) for gs in zip(*rows)]


def opacus_grads(model: nn.Module, batch: tuple[Tensor, Tensor]) -> list[Tensor]:
    """Per-sample gradients from Opacus' GradSampleModule (hooks) on a copy of the model."""
    model = copy.deepcopy(model)
    for m in model.modules():  # Opacus' full backward hooks cannot handle in-place activations
        if getattr(m, "inplace", False):
            m.inplace = False
    gsm = GradSampleModule(model, loss_reduction="sum")
    bce(gsm, batch).sum().backward()
    return [p.grad_sample for p in gsm.parameters() if p.requires_grad]


def norms_of(per_sample: list[Tensor]) -> Tensor:
    return torch.stack([g.flatten(1).square().sum(1) for g in per_sample]).sum(0).sqrt()


def clipped_sum(per_sample: list[Tensor], c: Tensor) -> list[Tensor]:
    return [torch.einsum("b,b...->...", c, g) for g in per_sample]


def assert_close(actual: Tensor, expected: Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())


@pytest.mark.parametrize("mode", ["auto", "opacus"])
@pytest.mark.parametrize("name", list(MODELS))
def test_norms_and_clipped_sum_match_references(name: str, mode: str) -> None:
    model, batch = build(name), make_batch(name, 8)
    ref = microbatch_grads(model, batch)
    ref_norms = norms_of(ref)
    if name != "emb_padded":  # Opacus' embedding sampler ignores padding_idx
        for ours, theirs in zip(ref, opacus_grads(model, batch)):
            assert_close(theirs, ours)
    max_grad_norm = ref_norms.median().item()  # about half the samples get clipped
    clipper = PerSampleClipper(model, max_grad_norm=max_grad_norm, mode=mode)
    norms = clipper.backward(bce(model, batch))
    assert_close(norms, ref_norms)
    expected = clipped_sum(ref, clip_factors(ref_norms, max_grad_norm))
    for p, e in zip(trainable(model), expected):
        assert_close(p.grad, e)


@pytest.mark.parametrize("name", list(MODELS))
def test_no_clipping_gives_the_plain_gradient(name: str) -> None:
    model, batch = build(name), make_batch(name, 6)
    plain = torch.autograd.grad(bce(model, batch).sum(), trainable(model))
    PerSampleClipper(model, max_grad_norm=1e9).backward(bce(model, batch))
    for p, g in zip(trainable(model), plain):
        assert_close(p.grad, g)


@pytest.mark.parametrize("name", ["mlp", "convnet", "seq"])
def test_each_contribution_is_at_most_c_and_the_sum_is_linear(name: str) -> None:
    model, (x, y) = build(name), make_batch(name, 6)
    clipper = PerSampleClipper(model, max_grad_norm=0.05)
    total = [torch.zeros_like(p) for p in trainable(model)]
    for i in range(len(y)):  # recompute each sample's clipped contribution alone
        clipper.backward(bce(model, (x[i : i + 1], y[i : i + 1])))
        grads = [p.grad.clone() for p in trainable(model)]
        assert torch.sqrt(sum(g.square().sum() for g in grads)) <= 0.05 * (1 + 1e-9)
        total = [t + g for t, g in zip(total, grads)]
    clipper.backward(bce(model, (x, y)))
    for p, t in zip(trainable(model), total):
        assert_close(p.grad, t)


def test_empty_batch_gives_zero_grads() -> None:
    model, (x, y) = build("convnet"), make_batch("convnet", 4)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    norms = clipper.backward(bce(model, (x[:0], y[:0])))
    assert norms.shape == (0,)
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


def test_batchnorm_is_refused() -> None:
    with pytest.raises(ValueError, match="GroupNorm"):
        PerSampleClipper(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), max_grad_norm=1.0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="valid modes"):
        PerSampleClipper(mlp(), max_grad_norm=1.0, mode="ghost")
    with pytest.raises(ValueError, match="C > 0"):
        PerSampleClipper(mlp(), max_grad_norm=0.0)
    with pytest.raises(ValueError, match="mode='fast'"):
        PerSampleClipper(nn.Sequential(nn.Linear(3, 3), Scale(3)), max_grad_norm=1.0, mode="fast")
    with pytest.raises(ValueError, match="shape"):
        model = mlp().double()
        PerSampleClipper(model, max_grad_norm=1.0).backward(model(make_batch("mlp", 3)[0]))  # (B, 1)


def test_tied_and_smuggled_parameters_are_refused() -> None:
    tied = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    tied[2].weight = tied[0].weight
    with pytest.raises(ValueError, match="shared"):
        PerSampleClipper(tied, max_grad_norm=1.0)

    class Smuggler(nn.Module):  # uses a child's weight outside the child's forward
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: Tensor) -> Tensor:
            return F.linear(torch.tanh(self.fc(x)), self.fc.weight).sum(1)

    model = Smuggler()
    with pytest.raises(RuntimeError, match="outside their own module"):
        PerSampleClipper(model, max_grad_norm=1.0).backward(model(torch.randn(3, 4)))


def test_gradient_penalty_is_refused() -> None:
    model, (x, _) = build("mlp"), make_batch("mlp", 4)
    clipper = PerSampleClipper(model, max_grad_norm=1.0)
    x = x.requires_grad_()
    out = model(x).squeeze(1)
    (grad_x,) = torch.autograd.grad(out.sum(), x, create_graph=True)  # WGAN-GP style, per sample
    with pytest.raises(RuntimeError, match="outside their own module"):
        clipper.backward(out + grad_x.square().sum(1))


def test_frozen_parameters_are_ignored() -> None:
    model, batch = build("mlp"), make_batch("mlp", 5)
    model[0].requires_grad_(False)
    ref = microbatch_grads(model, batch)
    clipper = PerSampleClipper(model, max_grad_norm=1e9)
    assert_close(clipper.backward(bce(model, batch)), norms_of(ref))
    assert model[0].weight.grad is None and model[2].weight.grad is not None
    model[0].requires_grad_(True)
    with pytest.raises(RuntimeError, match="became trainable"):
        clipper.backward(bce(model, batch))


def test_gan_step_leaves_the_generator_alone_and_pairs_or_concatenates_calls() -> None:
    torch.manual_seed(0)
    generator, disc = nn.Sequential(nn.Linear(3, 6)).double(), build("mlp")
    real, z = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    generator(z).sum().backward()  # a non-private step through another module...
    disc(generator(z)).sum().backward()  # ...and one through disc whose records must be ignored
    generator.zero_grad(set_to_none=True)
    clipper = PerSampleClipper(disc, max_grad_norm=1e9)

    def loss(d_real: Tensor, d_fake: Tensor) -> tuple[Tensor, Tensor]:
        return F.softplus(-d_real).squeeze(1), F.softplus(d_fake).squeeze(1)  # (B,), (B,)

    fake = generator(z)  # not detached: autograd must stop at disc's first layer
    l_real, l_fake = loss(disc(real), disc(fake))
    paired = clipper.backward(l_real + l_fake)  # sample i = (real_i, fake_i)
    assert all(p.grad is None for p in generator.parameters())
    pair_grads = [
        torch.autograd.grad(
            sum(loss(disc(real[i : i + 1]), disc(fake[i : i + 1].detach()))).sum(), trainable(disc)
        )
        for i in range(4)
    ]
    assert_close(paired, norms_of([torch.stack(gs) for gs in zip(*pair_grads)]))

    l_real, l_fake = loss(disc(real), disc(fake.detach()))
    concatenated = clipper.backward(torch.cat([l_real, l_fake]))  # 8 samples: reals then fakes
    single = [
        torch.autograd.grad(
            loss(disc(real[i : i + 1]), disc(fake[i : i + 1].detach()))[0].sum(), trainable(disc)
        )
        for i in range(4)
    ]
    assert_close(concatenated[:4], norms_of([torch.stack(gs) for gs in zip(*single)]))
    out = disc(real[:2]).squeeze(1)  # 2 rows cannot give 3 per-sample losses
    with pytest.raises(ValueError, match="sizes"):
        clipper.backward(torch.cat([out, out[:1]]))


def test_accumulate_in_place_edits_and_detach() -> None:
    model, batch = build("mlp"), make_batch("mlp", 4)
    clipper = PerSampleClipper(model, max_grad_norm=0.1)
    clipper.backward(bce(model, batch))
    once = [p.grad.clone() for p in trainable(model)]
    clipper.backward(bce(model, batch), accumulate=True)
    for p, g in zip(trainable(model), once):
        assert_close(p.grad, 2 * g)
    x, y = batch
    x = x.clone()
    out = bce(model, (x, y))
    x.mul_(2)  # the first layer's recorded input changes under the clipper
    with pytest.raises(RuntimeError, match="in place"):
        clipper.backward(out)
    twin = copy.deepcopy(model)  # copies the hooks; the twin's calls must not be recorded
    plain = torch.autograd.grad(bce(model, batch).sum(), trainable(model))
    PerSampleClipper(model, max_grad_norm=1e9).backward(bce(model, batch) + bce(twin, batch))
    for p, g in zip(trainable(model), plain):
        assert_close(p.grad, g)
    clipper.detach()
    assert all(len(m._forward_hooks) == 1 for m in model.modules() if isinstance(m, nn.Linear))


def test_autocast_bfloat16_is_close_to_float32() -> None:
    model, (x, y) = build("mlp_layernorm").float(), make_batch("mlp", 8)
    x, y = x.float(), y.float()
    clipper = PerSampleClipper(model, max_grad_norm=0.5)
    exact = clipper.backward(bce(model, (x, y)))
    grads = [p.grad.clone() for p in trainable(model)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x).squeeze(1)
    norms = clipper.backward(F.binary_cross_entropy_with_logits(out.float(), y, reduction="none"))
    torch.testing.assert_close(norms, exact, rtol=0.05, atol=1e-3)
    for p, g in zip(trainable(model), grads):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, g, rtol=0.05, atol=0.02 * g.abs().max().item())


def test_pure_helpers() -> None:
    a, g = torch.randn(5, 3, 4, dtype=torch.float64), torch.randn(5, 3, 2, dtype=torch.float64)
    per_sample = torch.einsum("bto,bti->boi", g, a)  # (B, d_out, d_in)
    assert_close(ghost_norms_sq(a, g), per_sample.square().sum((1, 2)))
    assert_close(
        outer_norms_sq(a[:, 0], g[:, 0]), torch.einsum("bo,bi->boi", g[:, 0], a[:, 0]).square().sum((1, 2))
    )
    assert_close(clip_factors(torch.tensor([0.0, 4.0]), 2.0), torch.tensor([1.0, 0.5]))


def test_add_noise_has_the_gaussian_mechanism_scale() -> None:
    grads = [torch.zeros(200_000)]
    noisy = add_noise(
        grads, noise_multiplier=1.5, max_grad_norm=2.0, generator=torch.Generator().manual_seed(0)
    )
    assert noisy[0].std().item() == pytest.approx(3.0, rel=0.01)
    assert torch.equal(grads[0], torch.zeros(200_000))
    assert torch.equal(add_noise(grads, noise_multiplier=0.0, max_grad_norm=1.0)[0], grads[0])
