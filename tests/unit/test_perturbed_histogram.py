"""The perturbed histogram: its sensitivity, Su et al.'s cell count, the ledger entry, and uniform-in-cell sampling."""

import math

import pytest
import torch
from scipy import stats

from lightning_dp.callbacks.perturbed_histogram import LaplaceHistogram
from lightning_dp.checkpoint import CheckpointError
from lightning_dp.errors import ConfigError
from lightning_dp.models import check_data
from lightning_dp.models.perturbed_histogram import (
    PerturbedHistogram,
    bins_per_dimension,
    sample_cells,
    total_cells,
)
from lightning_dp.privacy.ledger import PrivacyLedger
from lightning_dp.privacy.sensitivity import histogram_sensitivity


class Rows:
    """A data module's private interface: rows in model space, and a released (DP) row count."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor | None = None, *, released: float | None = None
    ) -> None:
        self.x, self.y = x, torch.zeros(len(x), dtype=torch.long) if y is None else y
        self.released_num_rows = float(len(x)) if released is None else released
        self.reads = 0

    def private_batches(self, *, chunk_size: int = 4096, rank: int = 0, world_size: int = 1):
        for start in range(0, len(self.x), chunk_size):
            self.reads += 1
            yield self.x[start : start + chunk_size], self.y[start : start + chunk_size]


def released(
    module: PerturbedHistogram,
    rows: Rows,
    *,
    epsilon: float = 10.0,
    adjacency: str = "add_remove",
    seed: int = 0,
    **kwargs,
) -> PrivacyLedger:
    ledger = PrivacyLedger(target_epsilon=epsilon, delta=1e-5, adjacency=adjacency)
    LaplaceHistogram(ledger=ledger, datamodule=rows, noise_seed=seed, chunk_size=7, **kwargs).on_fit_start(
        None, module
    )
    return ledger


# ------------------------------------------------------------------------------------------ sensitivity
def test_sensitivity_is_one_under_add_remove_and_two_under_replace_one():
    assert histogram_sensitivity(adjacency="add_remove") == 1.0
    assert histogram_sensitivity(adjacency="replace_one") == 2.0
    with pytest.raises(ValueError, match="add_remove, replace_one"):
        histogram_sensitivity(adjacency="swap")


@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_sensitivity_bounds_the_l1_change_of_the_counts_and_is_attained(adjacency):
    gen = torch.Generator().manual_seed(0)
    module = PerturbedHistogram(n_continuous=2, bins_per_dim=3)
    axes, worst = module.grid(num_rows=1, epsilon=1), 0.0
    for _ in range(200):
        x = torch.rand(20, 2, generator=gen)
        y = torch.zeros(20, dtype=torch.long)
        if adjacency == "add_remove":
            x2, y2 = x[:-1], y[:-1]
        else:
            x2 = torch.cat([x[:-1], torch.rand(1, 2, generator=gen)])
            y2 = y
        a = torch.bincount(module.cell_index(x, y, axes), minlength=9)
        b = torch.bincount(module.cell_index(x2, y2, axes), minlength=9)
        worst = max(worst, float((a - b).abs().sum()))
    assert worst == histogram_sensitivity(adjacency=adjacency)


# ------------------------------------------------------------------------------------------ the cell count
@pytest.mark.parametrize(
    ("n", "eps", "d", "total", "per_dim"),
    [
        (404, 100, 14, 2.05e6, 3),  # Boston at α = 100 in the thesis' experiment
        (400, 1e4, 9, 1.47e9, 10),  # California at α = 1e4
        (353, 100, 11, 1.0e6, 4),  # diabetes' 5-fold training sets
        (353, 1000, 11, 4.9e7, 5),
    ],
)
def test_su_et_al_cell_count_and_bins_per_dimension(n, eps, d, total, per_dim):
    assert total_cells(n, eps, d) == pytest.approx(total, rel=0.02)
    assert bins_per_dimension(n, eps, d) == per_dim == round(total_cells(n, eps, d) ** (1 / d))


def test_the_grid_uses_the_released_row_count_not_the_exact_one():
    rows = Rows(torch.rand(10, 3, generator=torch.Generator().manual_seed(0)), released=4040.0)
    module = PerturbedHistogram(n_continuous=3)
    released(module, rows, epsilon=100.0)
    k = bins_per_dimension(4040.0, 100.0, 3)
    assert k == 70 and bins_per_dimension(10, 100.0, 3) == 6  # (40,400)^{6/5} ≈ 3.4e5 cells
    assert module.axes.tolist() == [k] * 3 and module.counts.shape == (k**3,)


def test_categorical_columns_and_the_label_are_axes_of_their_categories():
    module = PerturbedHistogram(n_continuous=2, block_sizes=[3, 2], num_classes=4, bins_per_dim=5)
    assert module.grid(num_rows=100, epsilon=1) == [5, 5, 3, 2, 4]
    x = torch.tensor([[0.0, 1.0, 0, 0, 1, 0, 1], [0.99, 0.2, 1, 0, 0, 1, 0]])  # x = 1 falls in the last bin
    y = torch.tensor([3, 0])
    cells = module.cell_index(x, y, [5, 5, 3, 2, 4])
    strides = [5 * 3 * 2 * 4, 3 * 2 * 4, 2 * 4, 4, 1]
    assert cells.tolist() == [
        sum(d * s for d, s in zip(digits, strides, strict=True))
        for digits in ([0, 4, 2, 1, 3], [4, 1, 0, 0, 0])
    ]


# ------------------------------------------------------------------------------------------ the release
@pytest.mark.parametrize(("adjacency", "sens"), [("add_remove", 1.0), ("replace_one", 2.0)])
def test_release_is_one_laplace_entry_that_spends_the_budget(adjacency, sens):
    rows = Rows(torch.rand(50, 2, generator=torch.Generator().manual_seed(1)))
    module = PerturbedHistogram(n_continuous=2, bins_per_dim=4)
    ledger = released(module, rows, epsilon=2.0, adjacency=adjacency)
    (release,) = ledger.releases
    assert (release.name, release.mechanism, release.sensitivity) == (
        "perturbed_histogram/counts",
        "laplace",
        sens,
    )
    assert ledger.spent <= 2.0 and ledger.spent == pytest.approx(2.0, rel=1e-3)
    assert 1.0 / release.noise_multiplier == pytest.approx(2.0, rel=0.02)  # pure ε of Laplace: Δ/b
    assert module.is_released() and module.counts.shape == (16,) and bool((module.counts >= 0).all())


def test_noise_on_empty_cells_is_laplace_at_the_recorded_scale_then_clipped():
    rows = Rows(torch.zeros(1, 2))  # one row: every other cell is empty
    module = PerturbedHistogram(n_continuous=2, bins_per_dim=300)
    ledger = released(module, rows, epsilon=1.0, cell_chunk=10_000)  # several noise blocks
    scale = ledger.releases[0].noise_multiplier * ledger.releases[0].sensitivity
    empty = module.counts[1:].double()
    assert float((empty == 0).double().mean()) == pytest.approx(
        0.5, abs=0.01
    )  # P(Lap < 0) = 1/2, clipped to 0
    positive = empty[empty > 0]
    assert stats.kstest(positive.numpy(), stats.expon(scale=scale).cdf).pvalue > 1e-3  # Lap | > 0 ~ Exp(b)


def test_a_grid_over_max_cells_is_refused_before_the_histogram_is_released():
    rows = Rows(torch.rand(5, 3, generator=torch.Generator().manual_seed(0)), released=1e6)
    module = PerturbedHistogram(n_continuous=3, max_cells=1000)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(ConfigError, match="max_cells"):
        LaplaceHistogram(ledger=ledger, datamodule=rows).on_fit_start(None, module)
    assert ledger.releases == [] and not module.is_released() and rows.reads == 0


def test_a_resumed_run_reuses_the_release_and_an_inconsistent_one_is_refused():
    rows = Rows(torch.rand(30, 2, generator=torch.Generator().manual_seed(2)))
    module = PerturbedHistogram(n_continuous=2, bins_per_dim=4)
    ledger = released(module, rows)
    state = module.state_dict()
    again = PerturbedHistogram(n_continuous=2, bins_per_dim=4)
    again.load_state_dict(state, strict=True)  # the saved histogram's size is taken before loading
    assert torch.equal(again.counts, module.counts) and again.axes.tolist() == [4, 4] and again.is_released()
    reads = rows.reads
    LaplaceHistogram(ledger=ledger, datamodule=rows).on_fit_start(None, again)
    assert rows.reads == reads and len(ledger.releases) == 1
    with pytest.raises(CheckpointError, match="older than the release"):
        LaplaceHistogram(ledger=ledger, datamodule=rows).on_fit_start(
            None, PerturbedHistogram(n_continuous=2)
        )
    with pytest.raises(RuntimeError, match="inconsistent"):
        LaplaceHistogram(ledger=PrivacyLedger(target_epsilon=1.0, delta=1e-5), datamodule=rows).on_fit_start(
            None, again
        )


def test_settings_and_images_are_refused_before_any_release():
    node = {
        "name": "perturbed_histogram",
        "module": {"_target_": "lightning_dp.models.perturbed_histogram.PerturbedHistogram"},
        "mechanisms": [{"_target_": "lightning_dp.callbacks.perturbed_histogram.LaplaceHistogram"}],
    }
    with pytest.raises(ConfigError, match="tabular"):
        check_data(node, None)
    with pytest.raises(ConfigError, match="bins_per_dim"):
        check_data({**node, "module": {**node["module"], "bins_per_dim": 0}}, object())
    with pytest.raises(ConfigError, match="cell_chunk"):
        check_data({**node, "mechanisms": [{**node["mechanisms"][0], "cell_chunk": 0}]}, object())



def test_a_grid_the_public_schema_already_puts_over_max_cells_is_refused_before_the_row_count():
    # Adult's categorical axes alone make 9·16·7·15·6·5·2·42·2 = 7.6e7 cells > 2^26: refused after the DP row count
    # (ε 0.12 spent) when the mechanism saw the grid; the schema shows it before any release
    from lightning_dp.data.schema import Schema
    from lightning_dp.data.sources import bundled_schema
    from lightning_dp.models.perturbed_histogram import smallest_grid

    node = {"name": "perturbed_histogram",
            "module": {"_target_": "lightning_dp.models.perturbed_histogram.PerturbedHistogram"},
            "mechanisms": [{"_target_": "lightning_dp.callbacks.perturbed_histogram.LaplaceHistogram"}]}
    adult = bundled_schema("adult")
    assert smallest_grid(adult) == [1] * 6 + [9, 16, 7, 15, 6, 5, 2, 42, 2]
    with pytest.raises(ConfigError, match=r"at least .* = 7.62e\+07 cells .*Nothing was released"):
        check_data(node, adult)
    check_data({**node, "module": {**node["module"], "max_cells": 2**27}}, adult)
    with pytest.raises(ConfigError, match="3 bin"):  # 3^6 times more with a public k = 3
        check_data({**node, "module": {**node["module"], "max_cells": 2**27, "bins_per_dim": 3}}, adult)
    small = Schema.from_dict({"label": "y", "columns": [
        {"name": "a", "type": "continuous", "bounds": [0, 1], "missing": True},
        {"name": "b", "type": "categorical", "categories": ["x", "z"], "missing": True},
        {"name": "c", "type": "categorical"},  # its list comes from a DP release: at least 1
        {"name": "y", "type": "categorical", "categories": ["0", "1"]}]})
    assert smallest_grid(small, bins_per_dim=4) == [4, 2, 3, 1, 2]
    check_data(node, small)

# ------------------------------------------------------------------------------------------ sampling
def test_samples_are_uniform_within_their_cell_and_cells_follow_the_counts():
    module = PerturbedHistogram(n_continuous=2, bins_per_dim=4)
    counts = torch.zeros(16)
    counts[1 * 4 + 2], counts[3 * 4 + 0] = 3.0, 1.0  # cells (1, 2) and (3, 0)
    module.set_release(counts, [4, 4])
    x, y = module.sample(20_000, seed=0)
    cells = (x * 4).floor().long()
    in_first = (cells == torch.tensor([1, 2])).all(1)
    assert bool((in_first | (cells == torch.tensor([3, 0])).all(1)).all()) and not y.any()
    assert float(in_first.double().mean()) == pytest.approx(0.75, abs=0.01)
    for column, low in ((0, 0.25), (1, 0.5)):  # within (1, 2): uniform on [1/4, 2/4) × [2/4, 3/4)
        assert stats.kstest((x[in_first, column] - low).numpy() * 4, "uniform").pvalue > 1e-3


def test_negative_counts_are_clipped_and_all_zero_samples_uniformly():
    module = PerturbedHistogram(n_continuous=1, block_sizes=[2], num_classes=3, bins_per_dim=2)
    counts = torch.full((12,), -1.0)
    counts[0 * 6 + 1 * 3 + 2] = 2.0  # bin 0, category 1, label 2
    module.set_release(counts, [2, 2, 3])
    assert float(module.counts.min()) == 0.0
    x, y = module.sample(500, seed=1)
    assert (
        x.shape == (500, 3)
        and bool((x[:, 0] < 0.5).all())
        and bool((x[:, 2] == 1).all())
        and bool((y == 2).all())
    )
    module.set_release(torch.full((12,), -1.0), [2, 2, 3])
    x, y = module.sample(6000, seed=2)
    assert torch.bincount(y, minlength=3).double().div(6000).sub(1 / 3).abs().max() < 0.03
    assert float((x[:, 0] < 0.5).double().mean()) == pytest.approx(0.5, abs=0.03)


def test_two_level_sampler_draws_exactly_proportional_to_the_weights():
    weights = torch.tensor([0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 5.0, 2.0, 0.0])  # blocks of 3: uneven tail
    torch.manual_seed(0)
    cells = sample_cells(weights, 100_000, block=3)
    freq = torch.bincount(cells, minlength=10).double() / 100_000
    assert torch.allclose(freq, weights.double() / 10.0, atol=0.005) and bool((freq[weights == 0] == 0).all())


def test_sampling_before_a_release_is_refused():
    with pytest.raises(CheckpointError, match="no released histogram"):
        PerturbedHistogram(n_continuous=2).sample(3)
    module = PerturbedHistogram(n_continuous=2, bins_per_dim=2)
    module.set_release(torch.ones(4), [2, 2])
    with pytest.raises(ValueError, match="cannot condition"):
        module.sample(3, labels=torch.zeros(3, dtype=torch.long))
    assert math.prod(module.axes.tolist()) == module.counts.numel()
