"""GEM's training step by measured blocks (``models/gem_fit.py``) against the loss's definition: the same value
and the same gradients, both layouts (groups of blocks, one dense product), and a plan rebuilt after a release."""

import string

import pytest
import torch

from lightning_dp.models import gem_fit
from lightning_dp.models.gem import GEM
from lightning_dp.nets.marginal_nets import ProductGenerator
from lightning_dp.privacy.marginals import clique_size

LEVELS = (3, 4, 2, 5, 3)  # four categorical columns and a 3-class label (column 4)
B, N = 64, 500.0
MEASURED = [((0,), 4.0), ((3,), 2.0), ((4,), 3.0), ((0, 1), 2.0), ((1, 3), 1.5), ((1, 3), 3.0), ((0, 4), 2.0),
            ((2, 4), 1.0), ((1, 2), 2.5), ((2, 3), 2.0), ((0, 1, 4), 1.5), ((1, 3, 4), 2.0), ((0, 2, 4), 3.0),
            ((0, 2, 3), 2.0)]  # 1-way, pairs (one measured twice), label triples, and a 3-way clique apart


def module(measured=MEASURED, seed: int = 0) -> GEM:
    torch.manual_seed(seed)
    gen = ProductGenerator(level_sizes=LEVELS, latent_dim=4, hidden=[16])
    torch.nn.init.normal_(gen.out.weight, std=2.0)  # components far from the uniform start and from each other
    gem = GEM(gen, n_continuous=0, block_sizes=LEVELS[:-1], num_classes=LEVELS[-1], batch_size=B,
              target_triples=True)
    gem.log = lambda *args, **kwargs: None
    gem.num_rows.fill_(N)
    rng = torch.Generator().manual_seed(seed)
    for clique, sigma in measured:
        gem.add_measurement(clique, torch.rand(clique_size(clique, LEVELS), generator=rng) * 2 * N
                            / clique_size(clique, LEVELS), sigma)
    return gem


def reference_loss(gem: GEM, probs: list[torch.Tensor]) -> torch.Tensor:
    """The definition, in float64: per pooled clique, its cells' mean over the draws of the product of the columns'
    probabilities (and of their squares), ``½ w [(B q̂² − q̂₂) / (B − 1) − 2 y q̂ + y²]`` summed."""
    probs = [p.double() for p in probs]
    loss = torch.zeros((), dtype=torch.float64, device=probs[0].device)
    for clique, y, w in gem.pooled_proportions():
        letters = string.ascii_lowercase[: len(clique)]
        spec = ",".join(f"z{x}" for x in letters) + "->" + letters
        mean = torch.einsum(spec, *(probs[c] for c in clique)).flatten() / B
        mean_sq = torch.einsum(spec, *(probs[c].square() for c in clique)).flatten() / B
        loss = loss + 0.5 * w * ((B * mean.square() - mean_sq) / (B - 1) - 2 * y * mean + y.square()).sum()
    return loss


def step_and_reference(gem: GEM, seed: int) -> tuple[float, float, list[torch.Tensor], list[torch.Tensor]]:
    params = list(gem.generator.parameters())
    torch.manual_seed(seed)
    loss = gem.training_step(None, 0)
    grads = torch.autograd.grad(loss, params)
    torch.manual_seed(seed)
    ref = reference_loss(gem, gem.level_probs(B))
    ref_grads = torch.autograd.grad(ref, params)
    return float(loss.detach()), float(ref.detach()), list(grads), list(ref_grads)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("layout", ["blocks", "dense"])
def test_the_step_is_the_loss_of_the_measured_cliques_with_its_gradients(layout, device, monkeypatch):
    monkeypatch.setattr(gem_fit, "DENSE_COST" if layout == "blocks" else "CALL_COST", 10**12)  # the estimate's choice
    gem = module().to(device)
    targets = gem._fit_targets()
    pairs, triples, rest = targets.pairs, targets.triples, targets.rest
    assert (pairs.cells is None) == (triples.cells is None) == (layout == "blocks")
    assert [c for c, _, _ in rest] == [(0, 2, 3)] and triples.label and not pairs.label
    assert sorted(tuple(sorted((c, p))) for c, ps in pairs.groups for p in ps) == [(0, 1), (0, 4), (1, 2), (1, 3),
                                                                                  (2, 3), (2, 4)]
    for seed in (1, 2):
        loss, ref, grads, ref_grads = step_and_reference(gem, seed)
        assert loss == pytest.approx(ref, rel=1e-5) and abs(ref) > 1.0
        for g, r in zip(grads, ref_grads, strict=True):
            assert float(r.abs().max()) > 0
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5 * float(r.abs().max()))


def test_both_layouts_give_the_same_step():
    gem = module()
    torch.manual_seed(5)
    probs = gem.level_probs(B)
    flat = torch.cat(probs, 1)
    sums = gem_fit.column_square_sums(flat.square(), LEVELS)
    for label, cliques in ((False, [c for c, _, _ in gem.pooled_proportions() if len(c) == 2]),
                           (True, [(0, 1, 4), (1, 3, 4), (0, 2, 4)])):
        measured = [m for m in gem.pooled_proportions() if m[0] in cliques]
        losses = [gem_fit.products_loss(gem_fit.products_plan(measured, LEVELS, label=label, dense=dense), probs,
                                        flat, sums) for dense in (False, True)]
        assert float(losses[0].detach()) == pytest.approx(float(losses[1].detach()), rel=1e-6)


def test_the_plan_is_rebuilt_after_a_measurement():
    gem = module(MEASURED[:-4])  # no triples, no clique apart yet
    loss, ref, _, _ = step_and_reference(gem, 3)
    assert loss == pytest.approx(ref, rel=1e-5)
    plan = gem._targets
    assert plan[1][3] is None and plan[1][4] == []
    gem.add_measurement((2, 3), torch.full((10,), 1000.0), 0.5)  # a pair measured again, far from the first
    gem.add_measurement((1, 3, 4), torch.full((60,), N / 60), 1.0)  # a label triple
    after, ref_after, _, _ = step_and_reference(gem, 3)
    assert gem._targets is not plan and gem._targets[1].triples is not None
    assert after == pytest.approx(ref_after, rel=1e-5) and after > 2 * loss


def test_the_estimate_prefers_blocks_when_few_pairs_are_measured():
    wide = [20] * 15
    few = [((a, a + 1), torch.rand(400), 1.0) for a in range(0, 14, 2)]
    assert gem_fit.products_plan(few, wide).cells is None  # 7 of 105 pairs: 2,800 of 90,000 multiply-adds a draw
    every = [((a, b), torch.rand(400), 1.0) for a in range(15) for b in range(a + 1, 15)]
    assert gem_fit.products_plan(every, wide).cells is not None  # every pair: one product, not 14 groups


def test_fitting_flushes_subnormal_floats_and_restores_them_after():
    tiny = torch.tensor([2.0**-130])  # subnormal in float32
    gem = GEM(ProductGenerator(level_sizes=(2, 2), latent_dim=2, hidden=[4]), n_continuous=0, block_sizes=[2, 2])
    assert float(tiny * 1.0) > 0
    gem.on_fit_start()
    try:
        assert float(tiny * 1.0) == 0.0
    finally:
        gem.teardown("fit")
    assert float(tiny * 1.0) > 0
