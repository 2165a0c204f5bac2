"""GEM: a generator network fitted to adaptively selected, noisy marginals of discretised columns.

"Iterative Methods for Private Synthetic Data: Unifying Framework and New Methods" (Liu, Vietri & Wu 2021) keeps
the select–measure–generate loop of AIM ("AIM: An Adaptive and Iterative Mechanism for Differentially Private
Synthetic Data", McKenna et al. 2022) and replaces its graphical model by a generator network. The selection and
measurement are a mechanism (``callbacks/adaptive_marginals.py``); this module holds the released measurements,
fits the network to them by gradient descent (post-processing) and samples rows.

Discretisation (public: a function of the schema's declared bounds and cells, released with DP or declared, and
of this module's settings, never of rows): each categorical block (a categorical column, a continuous column's
observed/missing indicator, or a cells column's cells: its spikes, quantile bins and missing value, the data's
``cells`` representation) is a column of its categories; the label is the last column. A cells column's number
(its position inside the cell) is not modelled: a sampled value is uniform inside its cell. A min-max continuous
column whose integer values number at most ``bins`` has one level per value, any other has ``bins`` equal-width bins
on its public range plus a level for each bound exactly (a "spike": 0 capital gain, a top-coded maximum, an
imputed missing value).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.errors import ConfigError
from lightning_dp.models.base import GeneratorModule
from lightning_dp.models.gem_fit import Products, column_square_sums, products_loss, products_plan
from lightning_dp.privacy.marginals import Clique, clique_size, flat_index, product_marginal, workload

MAX_CLIQUE_CELLS = 2**22  # cells of the largest workload marginal (8 bytes a cell, several copies in memory)
MAX_LEVELS = 8192  # levels of all columns together: the fit and the count pass hold (levels)² Gram matrices
# variable-size buffers: their size is known only after the releases (``_load_from_state_dict``)
GROWING = ("meas_cliques", "meas_sigma", "meas_offsets", "meas_values", "pending_before", "head_cliques", "head_offsets",
           "head_weights")
HEAD = ("head_cliques", "head_offsets", "head_weights", "head_bias", "head_fitted")  # absent from older checkpoints
HEAD_PRIOR_STD = 1.0  # the head's log-odds tables: a N(0, HEAD_PRIOR_STD²) prior on each entry


def minmax_levels(values: int, bins: int) -> int:
    """Levels of a min-max continuous column with ``values`` integer values in its public range (0: real-valued):
    one per value when they are at most ``bins``, else ``bins`` equal-width bins and a level for each bound."""
    return values if 0 < values <= bins else bins + 2


@dataclass(frozen=True)
class Discretisation:
    """How each continuous column maps to levels: ``exact`` (one level per integer value), binned, or not at all
    (``cells``: a position inside the cell that a block holds)."""

    levels: tuple[int, ...]  # levels of every modelled column: min-max continuous, then blocks, then the label
    exact: tuple[bool, ...]  # per continuous column
    bins: int
    cells: tuple[bool, ...] = ()  # per continuous column (empty: none)

    @classmethod
    def of(cls, *, n_continuous: int, block_sizes: Sequence[int], num_classes: int,
           continuous_units: Sequence[float] | None, bins: int,
           continuous_cells: Sequence[bool] | None = None) -> Discretisation:
        units = list(continuous_units) if continuous_units is not None else [0.0] * n_continuous
        cells = [bool(c) for c in continuous_cells] if continuous_cells is not None else [False] * n_continuous
        exact, levels = [], []
        for unit, cell in zip(units, cells, strict=True):
            values = round(1.0 / unit) + 1 if unit > 0 and not cell else 0  # integer values in the public range
            exact.append(0 < values <= bins)
            if not cell:
                levels.append(minmax_levels(values, bins))
        levels += [int(b) for b in block_sizes] + ([int(num_classes)] if num_classes > 1 else [])
        return cls(tuple(levels), tuple(exact), int(bins), tuple(cells) if any(cells) else ())

    @property
    def n_continuous(self) -> int:
        return len(self.exact)

    def is_cells(self, j: int) -> bool:
        return bool(self.cells) and self.cells[j]

    @property
    def n_modelled(self) -> int:
        """Continuous columns with levels of their own (all but the cells columns): the first columns of a code."""
        return sum(not self.is_cells(j) for j in range(self.n_continuous))

    def codes(self, x: Tensor, y: Tensor, block_sizes: Sequence[int], num_classes: int) -> Tensor:
        """The level of every modelled column of each model-space row ``(x, y)``, shape (B, C) int64."""
        cols = []
        for j, exact in enumerate(self.exact):
            if self.is_cells(j):
                continue
            v, k = x[:, j].double(), self.levels[len(cols)]
            if exact:
                cols.append((v * (k - 1)).round().long().clamp(0, k - 1))
            else:
                inner = 1 + (v * self.bins).floor().long().clamp(0, self.bins - 1)
                cols.append(torch.where(v <= 0, 0, torch.where(v >= 1, self.bins + 1, inner)))
        offset = self.n_continuous
        for size in block_sizes:
            cols.append(x[:, offset : offset + size].argmax(1))
            offset += size
        if num_classes > 1:
            cols.append(y.long())
        return torch.stack(cols, 1) if cols else torch.zeros(len(x), 0, dtype=torch.long)

    def values(self, codes: Tensor) -> Tensor:
        """Model-space continuous values (B, n_continuous) of the modelled continuous columns' levels (B,
        n_modelled): the value, the bound, or uniform in a bin; a cells column's position is uniform in [0, 1)."""
        out = torch.empty(codes.shape[0], self.n_continuous, dtype=torch.float32, device=codes.device)
        k = 0
        for j, exact in enumerate(self.exact):
            if self.is_cells(j):
                out[:, j] = torch.rand(codes.shape[0], device=codes.device)
                continue
            c, levels = codes[:, k].float(), self.levels[k]
            k += 1
            if exact:
                out[:, j] = c / max(levels - 1, 1)
            else:
                inner = (c - 1 + torch.rand_like(c)) / self.bins
                out[:, j] = torch.where(c == 0, 0.0, torch.where(c == self.bins + 1, 1.0, inner))
        return out


class FitTargets(NamedTuple):
    """What a training step fits, planned from the pooled measurements (:meth:`GEM._fit_targets`)."""

    one: Tensor  # (K,) every column's 1-way proportions (0 where not measured)
    one_w: Tensor  # (K,) their weights (0 where not measured)
    pairs: Products | None  # the measured pairs' cells (None: none measured)
    triples: Products | None  # the measured (a, b, label) triples' cells
    rest: list[tuple[Clique, Tensor, float]]  # other cliques: (clique, proportions, weight)
    entropy_lambda: float  # λ of the entropy term in the loss's units (:meth:`GEM.entropy_lambda`)


class GEM(GeneratorModule):
    """A product-of-softmaxes generator fitted to released marginals (GEM, Liu, Vietri & Wu 2021, Alg. 1).

    The mechanism stores each release here (:meth:`add_measurement`): a clique of columns, its noisy counts and
    their noise scale. A training step draws ``batch_size`` latent vectors, computes every measured clique's
    marginal under the generator's mixture of products (pairs and label triples by products of their measured
    blocks only, ``models/gem_fit.py``; larger cliques by ``product_marginal``) and minimises the Gaussian
    negative log-likelihood of the measurements, ``Σ_r ||n̂ q_r(G) − y_r||² / (2 s_r²)`` (GEM's loss with the
    weights of Private-PGM's estimator; repeated measurements of a clique are pooled, which leaves it unchanged
    up to a constant). ``n̂`` is the run's released row count. Everything here is post-processing.

    The step's estimate of that loss is unbiased (:func:`unbiased_square_loss`): the square of a B-draw average
    q̂ overestimates q² by Var(q̂), which falls as the mixture's components agree, so the plain square
    (GEM's) pulls the mixture towards one product distribution, i.e. towards independent columns; at B = 1,024
    that pull was several times the whole fit's loss on Adult.

    ``entropy_weight`` λ subtracts λ · E_z[Σ_c H(p_c(z))], the mixture's conditional entropy given the latent
    draw, from the loss. The mixture's entropy is H(X) = H(X | Z) + I(X; Z): among the generators that fit the
    measurements, it prefers those whose components are spread (the measured dependence carried by as little
    latent information as possible), a tractable stand-in for the maximum-entropy estimate that Private-PGM
    fits to the same measurements ("Graphical-model based estimation and inference for differential privacy",
    McKenna, Sheldon & Miklau 2019). Unregularised, the fit ends with nearly deterministic components (on
    Adult's validation carve 5.1 nats of the marginals' 20.7; the label's 0.05 of 0.55), so the higher-order
    structure that no measurement fixes is whatever the network's map from z makes it.

    With ``entropy_units = "proportions"`` λ is given in the loss's units divided by its mean weight, λ · mean_r
    n̂² Σ 1/s_r² (the weight of a squared error in proportions, :meth:`pooled_proportions`): what a nat is worth in
    squared errors of proportions, so the entropy term moves a marginal by about the same proportion on every data
    set whatever its rows and noise (scaled by n̂ · √(mean 1/s²) instead, the setting right for Adult's 26,000 rows
    gave Cervical's 700 λ ≈ 22, which raised its 2-way TV on the validation carve from 0.18–0.21 to 0.24–0.27; in
    these units Cervical's λ is about 0.5 and its TV 0.16–0.20). A function of the releases (n̂ and the noise
    scales): post-processing. The default (``configs/model/gem.yaml``) is 0.001 in these units, ≈ 760 of the
    loss's on Adult's validation carve: there, with the label head, it raised ROC hard / score from 0.739–0.741 /
    0.847–0.861 to 0.753–0.757 / 0.863–0.867 and lowered the 2-way TV from 0.061–0.063 to 0.047–0.050 (seeds 0, 1;
    in the loss's units λ 100–300 gave 0.742–0.754 / 0.853–0.859, 1,000–10,000 0.751–0.762 / 0.863–0.870; the TV
    was least at 300–1,000, 0.044–0.050, and 0.065 at 10,000). Where the fit alone leaves the components nearly
    deterministic, the head, fitted over the generator's rows, learned the label's log-odds on a joint of the
    columns that no measurement fixed.

    Args:
        generator: a :class:`~lightning_dp.nets.marginal_nets.ProductGenerator` over :meth:`levels`.
        n_continuous, block_sizes, num_classes, continuous_units, continuous_cells: the data layout (public).
        bins: bins of a min-max continuous column with more than ``bins`` integer values (or a real-valued one).
        degree: the workload: all 2-way (default) or 3-way marginals.
        target_weight: weight of the workload's marginals that hold the label (AIM's c_r).
        target_triples: with ``degree = 2``, also every triple that holds the label.
        entropy_weight: λ above per nat; 0: none.
        entropy_units: ``"loss"``: λ in the loss's units (Gaussian log-likelihood); ``"proportions"``: in units of
            its mean weight (above).
        label_head: sample the label from a log-linear P(y | x) fitted to the measured label marginals
            (:meth:`fit_label_head`, after the fit) instead of the generator's own label.
        batch_size: latent draws per training step.
        steps_per_epoch: training steps per epoch.
        lr: Adam's learning rate.
    """

    tabular_only = True
    variable_buffers = GROWING  # their shapes follow the releases: resume does not compare them with a fresh module
    # added after GEM's first release (checkpoints and saved configs of earlier runs lack them); their defaults and
    # initial values are what GEM did before: entropy_weight 0.0 adds no entropy term to the loss, entropy_units "loss"
    # reads a saved weight as it was read, label_head false and an unfitted head sample the generator's own label
    # (``_sample``), so an earlier run resumes and samples as it was
    settings_added_later = ("entropy_weight", "label_head", "entropy_units")
    state_added_later = (HEAD,)
    public_metrics = {
        "train/fit_loss": "generated marginals against the released measurements (post-processing)",
        "train/rounds": "rounds of released selections and measurements so far (a function of the releases)",
        "train/component_entropy": "the generator's E_z[sum_c H(p_c(z))] in nats (post-processing)",
    }

    def __init__(self, generator: nn.Module, *, n_continuous: int, block_sizes: Sequence[int] = (),
                 num_classes: int = 1, continuous_units: Sequence[float] | None = None,
                 continuous_cells: Sequence[bool] | None = None, bins: int = 32,
                 degree: int = 2, target_weight: float = 1.0, target_triples: bool = False,
                 entropy_weight: float = 0.0, label_head: bool = False, batch_size: int = 1024,
                 steps_per_epoch: int = 1000, lr: float = 1e-3, entropy_units: str = "loss") -> None:
        super().__init__()
        check_settings(bins=bins, degree=degree, target_weight=target_weight, batch_size=batch_size,
                       steps_per_epoch=steps_per_epoch, lr=lr, entropy_weight=entropy_weight, label_head=label_head,
                       entropy_units=entropy_units)
        self.save_hyperparameters(ignore=["generator"])
        self.generator = generator
        self.block_sizes = [int(b) for b in block_sizes]
        self.init_label_buffer(num_classes)
        self.discretisation = Discretisation.of(n_continuous=n_continuous, block_sizes=self.block_sizes,
                                                num_classes=num_classes, continuous_units=continuous_units, bins=bins,
                                                continuous_cells=continuous_cells)
        self.check_levels(self.levels, {"degree": degree, "target_triples": target_triples})  # DP categories: no bound before
        if list(generator.level_sizes) != list(self.levels):
            raise ValueError(f"The generator's levels {generator.level_sizes} are not the module's {self.levels}.")
        target = len(self.levels) - 1 if num_classes > 1 else None
        self.cliques, self.weights = workload(len(self.levels), degree=degree, target=target,
                                              target_weight=target_weight, target_triples=target_triples)
        # the released measurements: clique (padded with -1), noise scale in counts, flat noisy counts
        self.register_buffer("meas_cliques", torch.zeros(0, 3, dtype=torch.long))
        self.register_buffer("meas_sigma", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("meas_offsets", torch.zeros(1, dtype=torch.long))
        self.register_buffer("meas_values", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("num_rows", torch.tensor(1.0, dtype=torch.float64))  # the released row count
        # the mechanism's schedule (AIM Alg. 1), in the checkpoint with the measurements it led to
        self.register_buffer("rho_total", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("rho_used", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("round_sigma", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("round_epsilon", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("rounds", torch.tensor(0, dtype=torch.long))
        self.register_buffer("round_step", torch.tensor(0, dtype=torch.long))
        self.register_buffer("finished", torch.tensor(False))
        self.register_buffer("finish_step", torch.tensor(0, dtype=torch.long))
        self.register_buffer("pending_clique", torch.tensor(-1, dtype=torch.long))  # index into self.cliques
        self.register_buffer("pending_before", torch.zeros(0, dtype=torch.float64))
        # the label head (:meth:`fit_label_head`): per measured label clique, a (levels of its other columns, k)
        # table of log-odds, flat; fitted once the measurements are final
        self.register_buffer("head_cliques", torch.zeros(0, 3, dtype=torch.long))
        self.register_buffer("head_offsets", torch.zeros(1, dtype=torch.long))
        self.register_buffer("head_weights", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("head_bias", torch.zeros(max(num_classes, 1), dtype=torch.float64))
        self.register_buffer("head_fitted", torch.tensor(False))

    # ---------------------------------------------------------------- layout (public)
    @staticmethod
    def net_layout(layout: dict[str, Any], module_cfg: Any) -> dict[str, Any]:
        """The generator sees the levels of the discretised columns."""
        disc = Discretisation.of(n_continuous=layout["n_continuous"], block_sizes=layout["block_sizes"],
                                 num_classes=layout["num_classes"], continuous_units=layout.get("continuous_units"),
                                 bins=module_cfg.get("bins", 32), continuous_cells=layout.get("continuous_cells"))
        return {"level_sizes": list(disc.levels)}

    @staticmethod
    def possible_levels(module_cfg: Mapping[str, Any], schema: Any,
                        data: Mapping[str, Any] | None = None) -> list[list[int]]:
        """The discretised columns' level counts before any release: one list for each way the releases can end.

        A function of the public schema, this module's ``bins`` and the run's ``data`` settings
        (``representation``, ``bins``; None: the data module's defaults, cells and ``dp_cells.DEFAULT_BINS``).
        Exact where the schema declares everything, else an upper bound over every outcome of the DP releases
        (``dp_cells.most_cells``), except a category list left to a DP release, which counts 2 (the fewest it can
        keep; the run's own layout is checked again, :meth:`check_levels`). A cells column is one column of its
        cells (its missing value one of them); a min-max column has ``bins + 2`` levels (one per integer value
        when they are at most ``bins``) and a 2-level missing indicator beside it. The cells release has two
        outcomes with different columns: every cells column released, or, when its rows are too few, nothing
        (``dp_cells.cells_without_release``: a column declaring neither spikes nor bins stays min-max).
        """
        from lightning_dp.data.dp_cells import DEFAULT_BINS, cells_without_release, most_cells, needs_cells

        bins, data = module_cfg.get("bins", 32), data or {}
        cells = data.get("representation", "cells") == "cells"
        data_bins = int(data.get("bins", DEFAULT_BINS))
        todo = {c.name for c in needs_cells(schema)} if cells else set()

        def minmax(c: Any) -> list[int]:
            values = int(c.bounds[1] - c.bounds[0]) + 1 if c.integer and c.bounds is not None else 0
            return [minmax_levels(values, bins)] + ([2] if c.missing else [])

        def layout(released: bool) -> list[int]:
            levels: list[int] = []
            for c in schema.columns:
                if c.type == "continuous":
                    count = (None if not cells else most_cells(c, bins=data_bins) if released or c.name not in todo
                             else cells_without_release(c, bins=data_bins))
                    levels += minmax(c) if count is None else [count]
                elif c.name == schema.label:  # the classes, no missing level (``TabularEncoder.classes``)
                    k = len(c.categories) if c.categories is not None else 2
                    levels += [k] if k > 1 else []
                else:
                    levels.append(len(c.categories) + int(c.missing) if c.categories is not None else 2)
            return levels

        return [layout(True)] + ([layout(False)] if todo else [])

    @staticmethod
    def check_levels(levels: Sequence[int], module_cfg: Mapping[str, Any]) -> None:
        """Refuse discretised columns whose Gram matrices or largest workload marginal would not fit in memory.

        Raises:
            ConfigError: with the settings to change.
        """
        fix = ("Set data.bins lower (a cells column's quantile bins) or model.module.bins (a min-max column's), or "
               "declare fewer categories")
        if sum(levels) > MAX_LEVELS:
            raise ConfigError(f"model=gem: the discretised columns have up to {sum(levels):,} levels together, above "
                              f"{MAX_LEVELS:,} (the fit holds a square matrix of them). {fix}.")
        degree = min(module_cfg.get("degree", 2), len(levels))
        top = sorted(levels)[-3:] if module_cfg.get("target_triples") else sorted(levels)[-degree:]
        if math.prod(top) > MAX_CLIQUE_CELLS:
            raise ConfigError(f"model=gem: the largest workload marginal has up to {math.prod(top):,} cells, above "
                              f"{MAX_CLIQUE_CELLS:,}. {fix}, or set model.module.degree=2.")

    @staticmethod
    def check_schema(module_cfg: Mapping[str, Any], schema: Any, data: Mapping[str, Any] | None = None) -> None:
        """Refuse settings out of range and a workload that may not fit in memory, before any release: every way
        the releases can end (:meth:`possible_levels`, upper bounds) must fit.

        Raises:
            ConfigError: the first problem, with the setting to change.
        """
        keys = ("bins", "degree", "target_weight", "batch_size", "steps_per_epoch", "lr", "entropy_weight", "label_head",
                "entropy_units")
        check_settings(**{k: module_cfg[k] for k in keys if k in module_cfg})
        if schema is None:
            return
        if module_cfg.get("label_head") and schema.label is None:
            raise ConfigError("model.module.label_head models the label given the other columns; this data set has no "
                              "label column. Set model.module.label_head=false or declare the label in the schema.")
        layouts = GEM.possible_levels(module_cfg, schema, data)
        if min(len(levels) for levels in layouts) < 2:
            raise ConfigError("model=gem models the dependence between columns; the data set needs at least two "
                              "columns (the label counts).")
        for levels in layouts:
            GEM.check_levels(levels, module_cfg)

    @property
    def levels(self) -> tuple[int, ...]:
        return self.discretisation.levels

    def discretise(self, x: Tensor, y: Tensor) -> Tensor:
        """Levels of every column of model-space rows, (B, C) int64 (public map; the mechanism applies it)."""
        return self.discretisation.codes(x, y, self.block_sizes, self.num_classes)

    # ---------------------------------------------------------------- measurements (set by the mechanism)
    def is_released(self) -> bool:
        return len(self.meas_sigma) > 0

    def measured(self) -> list[tuple[Clique, float, Tensor]]:
        """Every release so far: ``(clique, noise std in counts, noisy counts)``."""
        out = []
        for i, row in enumerate(self.meas_cliques.tolist()):
            clique = tuple(c for c in row if c >= 0)
            lo, hi = int(self.meas_offsets[i]), int(self.meas_offsets[i + 1])
            out.append((clique, float(self.meas_sigma[i]), self.meas_values[lo:hi]))
        return out

    def add_measurement(self, clique: Clique, noisy: Tensor, sigma: float) -> None:
        """Store one released marginal ``noisy`` (cells,) of ``clique``, measured with noise std ``sigma``."""
        if noisy.numel() != clique_size(clique, self.levels):
            raise ValueError(f"{noisy.numel()} values for the clique {clique} of {clique_size(clique, self.levels)} "
                             "cells.")
        dev = self.meas_values.device
        row = torch.tensor([list(clique) + [-1] * (3 - len(clique))], dtype=torch.long, device=dev)
        self.meas_cliques = torch.cat([self.meas_cliques, row])
        self.meas_sigma = torch.cat([self.meas_sigma, torch.tensor([sigma], dtype=torch.float64, device=dev)])
        self.meas_values = torch.cat([self.meas_values, noisy.detach().to(dev, torch.float64)])
        end = self.meas_offsets[-1:] + noisy.numel()
        self.meas_offsets = torch.cat([self.meas_offsets, end])

    @torch.no_grad()
    def start_from_one_way(self) -> None:
        """Start every column at its released 1-way proportions (clipped at 1e-3): the output layer's bias is their
        log, its weights stay 0, so the fit begins at the independent model of the 1-way measurements. A column
        without a 1-way measurement takes the first released pair that holds it, summed over the other column."""
        out = getattr(self.generator, "out", None)
        if not isinstance(out, nn.Linear):
            return
        o, levels = self.offsets, self.levels
        one_way: dict[int, Tensor] = {}
        for clique, y, _ in self.pooled():
            if len(clique) == 1:
                one_way[clique[0]] = y
        for clique, y, _ in self.pooled():
            if len(clique) == 2:
                table = y.view(levels[clique[0]], levels[clique[1]])  # (k_a, k_b)
                one_way.setdefault(clique[0], table.sum(1))
                one_way.setdefault(clique[1], table.sum(0))
        for c, y in one_way.items():
            p = (y / float(self.num_rows)).clamp_min(1e-3)
            out.bias[o[c] : o[c + 1]] = (p / p.sum()).log().to(out.bias)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        """The measurements' sizes are known only after the releases: take the saved ones before loading them. A
        checkpoint written before the label head existed has none of its buffers (``state_added_later``, tolerated
        by ``GeneratorModule._load_from_state_dict``): it samples as it did (the generator's own label). A file is
        untrusted: variable-size buffers that do not describe each other are an error of the load
        (:meth:`_layout_errors`), not an index error when sampling."""
        for name in GROWING:
            saved = state_dict.get(prefix + name)
            if isinstance(saved, Tensor):
                setattr(self, name, torch.empty_like(saved, device=self.num_rows.device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        error_msgs.extend(self._layout_errors())

    def _layout_errors(self) -> list[str]:
        """What is inconsistent in the measurements' and the label head's variable-size buffers: cliques of known
        columns (the head's ending with the label), offsets from 0 that step by each clique's cells (times the
        label's classes for the head) and end at the values' length."""
        columns, k = len(self.levels), self.num_classes
        errors = []
        for what, cliques, offsets, values, per_cell, head in (
                ("measurements", self.meas_cliques, self.meas_offsets, self.meas_values, 1, False),
                ("label head", self.head_cliques, self.head_offsets, self.head_weights, k, True)):
            rows = [tuple(c for c in row if c >= 0) for row in cliques.tolist()] if cliques.dim() == 2 else None
            if rows is None or any(not r or max(r) >= columns or list(r) != sorted(set(r)) or
                                   (head and (len(r) < 2 or r[-1] != columns - 1)) for r in rows):
                errors.append(f"the {what}' cliques are not cliques of the model's {columns} columns")
                continue
            sizes = [clique_size(r[:-1] if head else r, self.levels) * per_cell for r in rows]
            if offsets.tolist() != [0, *itertools.accumulate(sizes)] or int(offsets[-1]) != len(values):
                errors.append(f"the {what}' offsets do not match their cliques and values")
        if len(self.meas_sigma) != len(self.meas_cliques):
            errors.append("the measurements' noise scales do not match their cliques")
        return errors

    def pooled(self) -> list[tuple[Clique, Tensor, float]]:
        """Measurements pooled per clique: the precision-weighted mean and its precision Σ 1/s² (same least
        squares up to a constant)."""
        acc: dict[Clique, tuple[Tensor, float]] = {}
        for clique, sigma, values in self.measured():
            w = 1.0 / sigma**2
            total, prec = acc.get(clique, (torch.zeros_like(values), 0.0))
            acc[clique] = (total + w * values, prec + w)
        return [(c, total / prec, prec) for c, (total, prec) in acc.items()]

    def pooled_proportions(self) -> list[tuple[Clique, Tensor, float]]:
        """:meth:`pooled` in proportions of the released row count n̂, each with its weight n̂²·Σ 1/s² (the
        Gaussian log-likelihood's weight of a squared error in proportions: the fit's and the label head's)."""
        n = float(self.num_rows)
        return [(clique, y / n, precision * n**2) for clique, y, precision in self.pooled()]

    # ---------------------------------------------------------------- answers of the generator
    def level_probs(self, n: int) -> list[Tensor]:
        """Level probabilities of each column for ``n`` latent draws, a list of (n, k_c)."""
        z = torch.randn(n, self.generator.latent_dim, device=self.device)
        return self.generator(z)

    @property
    def offsets(self) -> list[int]:
        """Where each column's levels start in the concatenated level vector (length C + 1)."""
        return [0, *itertools.accumulate(self.levels)]

    def _block(self, gram: Tensor, clique: Clique) -> Tensor:
        """A 2-way clique's marginal, flat, from the Gram matrix ``PᵀP / B`` of the concatenated levels."""
        o = self.offsets
        (a, b) = clique
        return gram[o[a] : o[a + 1], o[b] : o[b + 1]].flatten()

    @torch.no_grad()
    def answers(self, cliques: Sequence[Clique], *, draws: int = 8192, chunk: int = 8192) -> list[Tensor]:
        """The generator's marginals of ``cliques`` in counts (``n̂ ·`` proportions), float64, averaged over
        ``draws`` latent draws taken ``chunk`` at a time (memory flat in ``draws``).

        An answer's Monte-Carlo error enters the selection's score: at 4,096 draws it averaged ~900 counts of L1
        on Adult's pairs (n ≈ 26,000), more than a noise penalty for the smaller ones; it falls as 1/√draws."""
        n, done = float(self.num_rows), 0
        gram: Tensor | None = None
        triples: Tensor | None = None  # (k_label, K, K): the label-weighted Gram matrices, for every (a, b, label)
        big: dict[Clique, Tensor] = {}
        labelled = any(self._label_triple(c) for c in cliques)
        while done < draws:
            b = min(chunk, draws - done)
            probs = self.level_probs(b)
            flat = torch.cat(probs, 1)  # (b, K)
            part = (flat.T @ flat).double()  # (K, K): every 2-way marginal at once, summed over the draws
            gram = part if gram is None else gram + part
            if labelled:
                part = label_grams(flat, probs[-1]).double()
                triples = part if triples is None else triples + part
            for c in cliques:
                if len(c) != 2 and not self._label_triple(c):
                    big[c] = big.get(c, 0) + product_marginal(probs, c).double() * b
            done += b
        o, out = self.offsets, []
        for c in cliques:
            if len(c) == 2:
                out.append(self._block(gram, c))
            elif self._label_triple(c):
                a, b, _ = c
                out.append(triples[:, o[a] : o[a + 1], o[b] : o[b + 1]].permute(1, 2, 0).flatten())
            else:
                out.append(big[c])
        return [a * n / draws for a in out]

    # ---------------------------------------------------------------- training (post-processing)
    def train_dataloader(self) -> DataLoader:
        """Step indices only: the module fits released marginals, never rows."""
        return DataLoader(range(self.hparams.steps_per_epoch), batch_size=None)

    def _label_triple(self, clique: Clique) -> bool:
        """A triple (a, b, label): the label is the last column, so it is the clique's last."""
        return len(clique) == 3 and self.num_classes > 1 and clique[2] == len(self.levels) - 1

    def _fit_targets(self, dense: bool | None = None) -> FitTargets:
        """The pooled measurements as proportions, planned for the step: 1-way targets and weights, the measured
        pairs' and triples' (a, b, label) cells (:func:`products_plan`; ``dense`` as there), the other larger cliques
        apart, and the entropy term's λ."""
        size, dev = self.offsets[-1], self.device
        one, one_w = torch.zeros(size, dtype=torch.float64), torch.zeros(size, dtype=torch.float64)
        o, pairs, triples, rest = self.offsets, [], [], []
        pooled = self.pooled_proportions()
        for clique, y, w in pooled:
            y = y.cpu()
            if len(clique) == 1:
                (c,) = clique
                one[o[c] : o[c + 1]], one_w[o[c] : o[c + 1]] = y, w
            elif len(clique) == 2:
                pairs.append((clique, y, w))
            elif self._label_triple(clique):
                triples.append((clique, y, w))
            else:
                rest.append((clique, y.to(dev, torch.float32), w))
        pair_plan, triple_plan = (products_plan(m, self.levels, label=label, dense=dense, device=dev) if m else None
                                  for m, label in ((pairs, False), (triples, True)))
        return FitTargets(one.to(dev, torch.float32), one_w.to(dev, torch.float32), pair_plan, triple_plan, rest,
                          self.entropy_lambda([w for _, _, w in pooled]))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Minus the measurements' Gaussian log-likelihood (class docstring): 1-way cells from the draws' mean,
        the measured pairs and label triples by products of their blocks only (``models/gem_fit.py``: O(B · Σ k_a
        k_b) over the measured pairs), larger cliques by :func:`product_marginal`."""
        if not self.is_released():
            raise RuntimeError("GEM has no released marginals: add the AdaptiveMarginals mechanism.")
        key = (len(self.meas_sigma), self.device)  # planned again after each new measurement
        if getattr(self, "_targets", None) is None or self._targets[0] != key:
            self._targets = (key, self._fit_targets())
        one, one_w, pairs, triples, rest, entropy_lambda = self._targets[1]
        probs = self.level_probs(self.hparams.batch_size)
        flat = torch.cat(probs, 1)  # (B, K)
        squares = flat.square()  # (B, K): the draws' own products, for the unbiased square
        b = flat.shape[0]
        loss = 0.5 * (one_w * unbiased_square_loss(flat.mean(0), squares.mean(0), one, b)).sum()
        if pairs is not None or triples is not None:
            sums = column_square_sums(squares, self.levels)  # (B, C)
            for plan in (p for p in (pairs, triples) if p is not None):
                loss = loss + products_loss(plan, probs, flat, sums)
        for clique, target, weight in rest:
            mean, mean_sq = product_marginal(probs, clique), product_marginal([p.square() for p in probs], clique)
            loss = loss + 0.5 * weight * unbiased_square_loss(mean, mean_sq, target, b).sum()
        self.log("train/fit_loss", loss.detach(), prog_bar=True)
        self.log("train/rounds", float(self.rounds))
        if self.hparams.entropy_weight > 0:
            entropy = component_entropy([flat])  # one block of every column's levels: the same sum, one op
            self.log("train/component_entropy", entropy.detach())
            loss = loss - entropy_lambda * entropy
        return loss

    def entropy_lambda(self, weights: Sequence[float] | None = None) -> float:
        """λ of the entropy term in the loss's units: ``entropy_weight``, times the mean weight of the pooled
        measurements (``weights``; None: those of :meth:`pooled_proportions`) under ``entropy_units = "proportions"``
        (class docstring)."""
        weight = float(self.hparams.entropy_weight)
        if self.hparams.entropy_units == "loss" or weight == 0:
            return weight
        weights = [w for _, _, w in self.pooled_proportions()] if weights is None else weights
        return weight * sum(weights) / len(weights)

    def set_lr_fraction(self, fraction: float) -> None:
        """Set the optimiser's learning rate to ``fraction · lr`` (the mechanism's final-fit schedule; a function
        of the step counters, so a resumed run continues the same schedule)."""
        if self._trainer is None:
            return
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                group["lr"] = self.hparams.lr * fraction

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr)

    def on_fit_start(self) -> None:
        """Flush subnormal floats to zero on the CPU while fitting (``torch.set_flush_denormal``; this process's
        threads, restored in :meth:`teardown`). A fitted mixture is nearly deterministic, so a few percent of its
        probabilities and of their products fall below 2⁻¹²⁶, where CPUs compute many times slower: on Adult a
        step took 13.2 ms with them and 8.9–10.8 ms flushed, a round's answers (65,536 draws) 0.93 s and 0.27 s.
        Values that small are zeros to every marginal. The mechanism's releases meet none: their counts are
        integers, the Gaussian noise a float64 draw of σ ≥ 1, the exponential mechanism's Gumbel noise from
        uniforms clamped at 1e-300, a normal float64."""
        torch.set_flush_denormal(True)

    def teardown(self, stage: str) -> None:
        torch.set_flush_denormal(False)  # the default: other work in the process computes as before

    # ---------------------------------------------------------------- the label head (post-processing)
    def _draw_codes(self, n: int) -> Tensor:
        """``n`` rows of levels drawn from the generator's mixture, (n, C) int64."""
        return torch.stack([torch.multinomial(p, 1).squeeze(1) for p in self.level_probs(n)], 1)

    def head_logits(self, codes: Tensor) -> Tensor:
        """The label head's log-odds for each row of levels ``codes`` (n, C), (n, k) float64."""
        sizes = [int(e - s) for s, e in zip(self.head_offsets[:-1], self.head_offsets[1:], strict=True)]
        tables = [t.view(-1, self.num_classes) for t in torch.split(self.head_weights, sizes)]
        cells = [flat_index(codes, self._head_features(row), self.levels) for row in self.head_cliques.tolist()]
        return additive_logits(self.head_bias, tables, cells, len(codes))

    @staticmethod
    def _head_features(clique: Sequence[int]) -> Clique:
        """A head table's columns: its clique (padded with -1) without the label, its last column."""
        return tuple(c for c in clique if c >= 0)[:-1]

    def fit_label_head(self, *, draws: int = 65536, seed: int = 0, max_iter: int = 200,
                       prior_std: float = HEAD_PRIOR_STD) -> float:
        """Fit the label head, ``P(y | x) ∝ exp(b_y + Σ_r θ_r[x_{C_r}, y])`` over the generator's rows x: one table
        θ_r for each measured clique C_r ∪ {label} (C_r a column, or a pair of columns under label triples).

        It is the form of the label's conditional in a graphical model fitted to the same measurements
        (Private-PGM, "Graphical-model based estimation and inference for differential privacy", McKenna, Sheldon
        & Miklau 2019, which AIM samples from): the label's log-odds add up over the measured cliques that hold it.
        The generator's mixture fits those measurements too, but leaves P(y | x) to its map from the latent draw,
        which ends nearly deterministic. The tables are fitted as Private-PGM fits its potentials, to the Gaussian
        likelihood of the measurements (:func:`fit_log_linear`) with x drawn from the generator (``draws`` rows,
        seeded: every DDP rank fits the same head). Post-processing: the releases and the generator, never rows.

        Returns:
            the fit's loss a measured cell (~0.5 where the head is within the measurements' noise); NaN where no
            marginal holds the label (nothing fitted).
        """
        label, k = len(self.levels) - 1, self.num_classes
        measured = [(c, y.to(self.device, torch.float64), w) for c, y, w in self.pooled_proportions()
                    if k > 1 and c[-1] == label]
        if not measured:
            return float("nan")
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]), torch.no_grad():
            torch.manual_seed(seed)
            codes = self._draw_codes(draws)
        cliques = [c for c, _, _ in measured if len(c) > 1]
        cells = [flat_index(codes, self._head_features(c), self.levels) for c in cliques]
        sizes = [clique_size(self._head_features(c), self.levels) for c in cliques]
        share = next((y for c, y, _ in measured if len(c) == 1), measured[0][1].view(-1, k).sum(0))
        targets = [(cliques.index(c) if len(c) > 1 else None, y, w) for c, y, w in measured]
        bias, tables, loss = fit_log_linear(cells, sizes, targets, share, prior_std=prior_std, max_iter=max_iter)
        dev = self.head_weights.device
        self.head_cliques = torch.tensor([list(c) + [-1] * (3 - len(c)) for c in cliques], dtype=torch.long,
                                         device=dev).view(-1, 3)
        self.head_offsets = torch.tensor([0, *itertools.accumulate(s * k for s in sizes)], dtype=torch.long, device=dev)
        self.head_weights = (torch.cat([t.flatten() for t in tables]) if tables else torch.zeros(0, dtype=torch.float64)
                             ).to(dev)  # no tables: only the label's own share was measured
        self.head_bias = bias.to(dev)
        self.head_fitted.fill_(True)
        return loss

    # ---------------------------------------------------------------- sampling (post-processing)
    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        if labels is not None:
            raise ValueError("model=gem generates the label with the row; it cannot condition on one.")
        if not self.is_released():
            raise CheckpointError("This model holds no released marginals: there is nothing to sample; train a "
                                  "new run.")
        codes = self._draw_codes(n)  # (n, C)
        if bool(self.head_fitted):
            codes[:, -1] = torch.multinomial(torch.softmax(self.head_logits(codes).float(), 1), 1).squeeze(1)
        d = self.discretisation.n_modelled
        parts = [self.discretisation.values(codes[:, :d])]
        for i, size in enumerate(self.block_sizes):
            parts.append(F.one_hot(codes[:, d + i], size).float())
        x = torch.cat(parts, 1)  # (n, D)
        y = codes[:, -1] if self.num_classes > 1 else torch.zeros(n, dtype=torch.long, device=x.device)
        return x, y


def unbiased_square_loss(mean: Tensor, mean_sq: Tensor, target: Tensor, draws: int) -> Tensor:
    """An unbiased estimate of ``(q − y)²`` per cell from ``draws`` i.i.d. draws ``X_i`` with mean ``q``.

    ``mean`` = (1/B) Σ X_i, ``mean_sq`` = (1/B) Σ X_i²; ``(B·mean² − mean_sq) / (B − 1)`` = (1/(B(B−1))) Σ_{i≠j}
    X_i X_j is the U-statistic of q² ("A Class of Statistics with Asymptotically Normal Distribution", Hoeffding
    1948), so the estimate's expectation, and its gradient's, is that of the loss at the mixture's exact marginal.
    A product cell's draw is X_i = Π_c p_c(z_i)[l_c], whose square is the product of the squared probabilities:
    ``mean_sq`` is the same marginal of the squared probabilities.
    """
    return (draws * mean.square() - mean_sq) / (draws - 1) - 2 * target * mean + target.square()


def label_grams(flat: Tensor, label: Tensor) -> Tensor:
    """``Σ_z label[z, l] · flat[z] ⊗ flat[z]`` for every label level l, (k, K, K): every (a, b, label) triple's
    marginal of the draws' products at once, one (K, K) product per level (memory flat in the levels).

    Args:
        flat: (B, K) every column's level probabilities of each draw, side by side.
        label: (B, k) the label's level probabilities of each draw.
    """
    return torch.stack([(flat * label[:, [level]]).T @ flat for level in range(label.shape[1])])


def additive_logits(bias: Tensor, tables: Sequence[Tensor], cells: Sequence[Tensor], rows: int) -> Tensor:
    """``bias + Σ_r tables[r][cells[r]]``: each of ``rows`` rows' log-odds (rows, classes), its cell (rows,) of
    every table added up."""
    logits = bias.expand(rows, -1)
    for index, table in zip(cells, tables, strict=True):
        logits = logits + table[index]
    return logits


def fit_log_linear(cells: Sequence[Tensor], sizes: Sequence[int], targets: Sequence[tuple[int | None, Tensor, float]],
                   share: Tensor, *, prior_std: float = HEAD_PRIOR_STD, max_iter: int = 200
                   ) -> tuple[Tensor, list[Tensor], float]:
    """A log-linear conditional ``P(y | x) = softmax(b + Σ_r θ_r[cells_r(x)])`` fitted to measured marginals.

    Minimises ``½ [Σ_m w_m ||q_m(θ) − t_m||² + Σ_r ||θ_r||² / prior_std²]`` (per measured cell) with L-BFGS, where
    ``q_m`` is the marginal of the rows' cells and the label under the model, averaged over the rows, and ``w_m``
    the measurement's precision in counts: the Gaussian likelihood of the measurements (Private-PGM's estimator)
    and a N(0, prior_std²) prior on every table entry. Class 0 is the reference (its log-odds are 0). The prior
    makes the optimum unique: without it a level seen in few rows, or two nearly collinear columns, leave
    directions the measurements hardly fix, along which L-BFGS drifts (on Adult the head's probabilities moved by
    up to 0.5 between 100 and 200 iterations; with it, less than 0.02 after 200).

    Args:
        cells: for each table r, every row's cell (draws,) int64.
        sizes: each table's number of cells.
        targets: ``(r, t, w)``: a measured marginal of table r's cells and the label, flat (size_r · k,) in
            proportions (r None: the label's own marginal, (k,)), and its weight.
        share: the label's proportions, (k,): the bias starts at their log-odds.

    Returns:
        the bias (k,), the tables [(size_r, k)] (class 0's entries 0) and the loss a measured cell.
    """
    k, draws = len(share), len(cells[0]) if cells else 1
    dtype, dev = torch.float64, share.device
    log_share = share.to(dtype).clamp_min(1e-3).log()
    bias = (log_share[1:] - log_share[0]).clone().requires_grad_(True)
    tables = [torch.zeros(size, k - 1, dtype=dtype, device=dev, requires_grad=True) for size in sizes]
    zero = torch.zeros(draws, 1, dtype=dtype, device=dev)
    n_cells = sum(t.numel() for _, t, _ in targets)

    def loss_fn() -> Tensor:
        p = torch.softmax(torch.cat([zero, additive_logits(bias, tables, cells, draws)], 1), 1)  # (draws, k)
        loss = sum(t.square().sum() for t in tables) / prior_std**2
        for r, target, weight in targets:
            q = p.mean(0) if r is None else torch.zeros(sizes[r], k, dtype=dtype, device=dev).index_add_(
                0, cells[r], p) / draws
            loss = loss + weight * (q.flatten() - target).square().sum()
        return 0.5 * loss / n_cells

    opt = torch.optim.LBFGS([bias, *tables], max_iter=max_iter, line_search_fn="strong_wolfe", tolerance_grad=1e-10,
                            tolerance_change=1e-14, history_size=20)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        loss = float(loss_fn())
    return F.pad(bias.detach(), (1, 0)), [F.pad(t.detach(), (1, 0)) for t in tables], loss


def component_entropy(probs: Sequence[Tensor]) -> Tensor:
    """``E_z[Σ_c H(p_c(z))]`` in nats, estimated on the draws: ``probs[c]`` (B, k_c) are column c's level
    probabilities for each of B latent draws (the mixture's components, products over the columns). The sum over
    columns is one over their levels, so the columns side by side as one block, (B, Σ_c k_c), give the same value."""
    return sum(-(p * p.clamp_min(1e-12).log()).sum(1).mean() for p in probs)


def check_settings(*, bins: Any = 32, degree: Any = 2, target_weight: Any = 1.0, batch_size: Any = 1024,
                   steps_per_epoch: Any = 1000, lr: Any = 1e-3, entropy_weight: Any = 0.0,
                   label_head: Any = False, entropy_units: Any = "loss") -> None:
    """The module's settings, checked before any release.

    Raises:
        ConfigError: the first setting out of range, with a valid value.
    """
    def whole(value: Any, low: int) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value >= low

    def positive(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value > 0

    if not whole(bins, 1):
        raise ConfigError(f"model.module.bins must be a whole number >= 1 (e.g. 32), got {bins!r}.")
    if degree not in (2, 3) or isinstance(degree, bool):
        raise ConfigError(f"model.module.degree must be 2 (all 2-way marginals) or 3, got {degree!r}.")
    if not positive(target_weight):
        raise ConfigError(f"model.module.target_weight must be a number > 0 (1 = no extra weight), got "
                          f"{target_weight!r}.")
    for key, value, low in (("batch_size", batch_size, 2), ("steps_per_epoch", steps_per_epoch, 1)):
        if not whole(value, low):
            raise ConfigError(f"model.module.{key} must be a whole number >= {low}, got {value!r}.")
    if not positive(lr):
        raise ConfigError(f"model.module.lr must be a number > 0 (e.g. 0.001), got {lr!r}.")
    if entropy_weight != 0 and not positive(entropy_weight):
        raise ConfigError(f"model.module.entropy_weight must be a number >= 0 (0: no entropy term), got "
                          f"{entropy_weight!r}.")
    if entropy_units not in ("loss", "proportions"):
        raise ConfigError(f"model.module.entropy_units must be loss (λ in the loss's units) or proportions (in units of "
                          f"the loss's mean weight), got {entropy_units!r}.")
    if not isinstance(label_head, bool):
        raise ConfigError(f"model.module.label_head must be true or false, got {label_head!r}.")
