"""PPEM's marginal energy as a density: the grid's log Z and draws, dequantisation of integer columns, refusals."""

import math

import pytest
import torch
from torch import nn

from lightning_dp.data.encoders import TabularEncoder
from lightning_dp.data.schema import Schema
from lightning_dp.errors import ConfigError
from lightning_dp.models.ppem import PPEM, check_objective
from lightning_dp.nets.energies import EnergyMLP

CENTRE, SCALE = 0.4, 0.08


class Quadratic(nn.Module):
    """E(x) = ‖x − c‖² / (2s²): p ∝ exp(−E) is N(c, s²I), with Z = (2πs²)^{d/2} (its mass outside Ω is < 1e-6)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - CENTRE).square().sum(1) / (2 * SCALE**2)


def ppem(**kwargs) -> PPEM:
    layout = {"n_continuous": 3, "block_sizes": [2], "num_classes": 2, "continuous_names": ["a", "b", "c"],
              "continuous_units": [1 / 73, 0.0, 1 / 98]}
    return PPEM(**layout, **{"sensitive": ["a", "c"], "hidden": [16, 16], "latent_dim": 8,
                             "marginal_objective": "likelihood", **kwargs})


@pytest.mark.parametrize("d", [1, 2, 3])
def test_the_grid_normalises_a_known_density(d):
    torch.manual_seed(0)
    names = ["a", "b", "c", "d"]
    model = PPEM(n_continuous=4, continuous_names=names, continuous_units=[0.0] * 4, sensitive=names[:d],
                 hidden=[8], latent_dim=4, marginal_objective="likelihood")
    model.energy = Quadratic()
    expected = d / 2 * math.log(2 * math.pi * SCALE**2)
    assert float(model.log_partition()) == pytest.approx(expected, abs=0.02)
    draws = model.sample_marginal(20_000)  # exact draws from the grid's p_ξ
    assert draws.shape == (20_000, d)
    assert draws.mean(0).sub(CENTRE).abs().max() < 0.005
    assert draws.std(0).sub(SCALE).abs().max() < 0.005


def test_log_z_is_differentiable_and_reads_only_the_energy():
    torch.manual_seed(0)
    model = ppem()
    log_z = model.log_partition()
    grads = torch.autograd.grad(log_z, list(model.energy.parameters()))
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_integer_columns_are_dequantised_in_training_only():
    torch.manual_seed(0)
    model = ppem(dequantise=1.0)
    assert model.sensitive_jitter == pytest.approx([1 / 73, 1 / 98])
    x = torch.full((20_000, 7), 0.5)
    model.train()
    noisy = model.sensitive_part(x)
    assert noisy.std(0).tolist() == pytest.approx([1 / 73, 1 / 98], rel=0.03)
    model.eval()
    assert torch.equal(model.sensitive_part(x), x[:, [0, 2]])
    assert ppem(dequantise=0.0).sensitive_jitter == [0.0, 0.0]
    assert ppem(sensitive=["b"]).sensitive_jitter == [0.0]  # not an integer column: never jittered


def test_the_encoder_gives_integer_columns_their_unit():
    schema = Schema.from_dict({"columns": [
        {"name": "age", "type": "continuous", "bounds": [17, 90], "integer": True},
        {"name": "x", "type": "continuous", "bounds": [0, 2]},
        {"name": "y", "type": "categorical", "categories": ["a", "b"]}], "label": "y"})
    assert TabularEncoder(schema).continuous_units == pytest.approx([1 / 73, 0.0])


def test_density_flags_and_refusals():
    assert ppem().sensitive_is_density
    assert not ppem(marginal_objective="ebgan").sensitive_is_density
    with pytest.raises(ConfigError, match="marginal_objective"):
        check_objective("mle", 2)
    with pytest.raises(ConfigError, match="at most 3"):
        check_objective("likelihood", 4)
    check_objective("ebgan", 4)
    with pytest.raises(ConfigError, match="dequantise"):
        ppem(dequantise=-1.0)


def test_fourier_features_are_a_saved_buffer():
    torch.manual_seed(0)
    energy = EnergyMLP(2, (8,), fourier=4, fourier_scale=3.0)
    assert energy.fourier_matrix.shape == (2, 4) and "fourier_matrix" in energy.state_dict()
    assert "fourier_matrix" not in EnergyMLP(2, (8,)).state_dict()  # old checkpoints load strictly
    clone = EnergyMLP(2, (8,), fourier=4)
    clone.load_state_dict(energy.state_dict())
    x = torch.rand(5, 2)
    assert torch.equal(clone(x), energy(x)) and (energy(x) >= 0).all()
    with pytest.raises(ValueError, match="fourier"):
        EnergyMLP(2, (8,), fourier=-1)
