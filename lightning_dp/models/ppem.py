"""PPEM: privacy-preserving energy-based generative models for marginal distribution protection.

"Privacy-Preserving Energy-Based Generative Models for Marginal Distribution Protection" (Tillman, Balch &
Veloso, TMLR 2023). A row is split into sensitive columns x′ (continuous, named in config) and the rest x*.
Two energy/generator pairs are trained adversarially (EBGAN margin losses, eqs. 6–7, m = 10, with the
WGAN-GP penalty of eq. 2 on both energies, §3.7):

* marginal pair (E_ξ, G_ω) models p(x′); the α-LMDP penalty (eq. 18) acts on E_ξ only, and is not here:
  it is the ``KSDPenalty`` mechanism (``callbacks/ksd_penalty.py``), which reads :meth:`sensitive_energy`;
* conditional pair (E_γ, G_υ) models p(x* | x′); E_γ is trained on real (x*, x′) pairs.

**The marginal energy as a density** (``marginal_objective``). The α-LMDP guarantee is a goodness-of-fit test of
real x′ against p_ξ ∝ exp(−E_ξ), so it means something only if, without the penalty, p_ξ fits x′ and the test
does not reject. An EBGAN energy is not such a density: at equilibrium it is constant almost everywhere (the
paper's Thm 3.2), so the test rejects with or without the penalty (its App. D.3 reports p = 0.00 for every
model; here: Adult batch Ŝ_{l,n} 10–32 from the first step, full-data p = 0 both ways) and the "guarantee" is
vacuous. ``likelihood`` (the config default; the class default ``ebgan`` is the paper's) fits E_ξ by maximum
likelihood, ℓ_i = E_ξ(x′_i) + log Z_ξ, with Z_ξ = ∫_Ω exp(−E_ξ) over the public box Ω = [−pad, 1 + pad]^d′ of
model space, estimated on a jittered grid (stratified, unbiased for Z; d′ ≤ 3); E_ξ gets random Fourier
features (``fourier``). Then p_ξ fits x′ and the penalty is what makes the test reject. G_ω is then trained to
sample p_ξ: MMD² (RBF mixture) between G_ω(z) and exact draws from the grid's p_ξ (no private input).

**Dequantisation** (``dequantise``). Integer-valued columns (public: the schema's ``integer``) have no density,
and a smooth p_ξ tested against atoms is rejected whatever it is (the KSD's Stein identity fails at an atom).
x′ of integer columns gets Gaussian noise of ``dequantise`` units (model-space σ = dequantise / (hi − lo)) each
time a private batch is read, and the α-LMDP audit adds the same noise to REAL's x′ (``sensitive_jitter``):
the protected marginal is that of the dequantised column. Gaussian, not the usual uniform dequantisation,
because a uniform one has a piecewise-constant density whose score is zero except at jumps, where the Stein
identity fails again.

Per private batch (one training step): the per-sample loss of both energies,
``ℓ_i = E_ξ(x′_i) + [m − E_ξ(G_ω(z_i))]₊ + λ_L(‖∇E_ξ(x̂′_i)‖ − 1)² + E_γ(x*_i | x′_i)
+ [m − E_γ(G_υ(z′_i | x′_i) | x′_i)]₊ + λ_L(‖∇_{x̂*}E_γ(x̂*_i | x′_i)‖ − 1)²``, with x̂ = u_i·real + (1 − u_i)·fake
(u_i ~ U(0, 1) per row, the same u_i for both, the conditional one interpolating x* only). Every term of ℓ_i
reads row i alone (no normalisation layer in the energies; fake rows drawn fresh for each row), so under
DP-SGD its clipped gradient has sensitivity C. Under ``likelihood`` the marginal part of ℓ_i is E_ξ(x′_i) alone.
Every ``energy_steps``-th batch (5, Algorithm 1's T_E) the generators step on fresh fakes: L_ω = E_ξ(G_ω(z))
(``ebgan``; the MMD² above under ``likelihood``), L_υ = E_γ(G_υ(z′ | c) | c).

**Differential privacy** (the paper's Algorithm 1 leaves two gaps, 2 and 3, both closed here):

1. The likelihood's log Z_ξ reads no private row (released parameters, public grid, public noise). It is a
   separate scalar backward after the private one, so under DP-SGD its gradient is added after the noise
   (post-processing) and only E_ξ(x′_i) is clipped per row.
2. The KSD penalty couples the batch (its pitfall "DP and a batch-level penalty"): one row moves every pair
   term's normalisation. Under DP-SGD it is a batch-coupled term: its gradient is clipped whole to C_P and
   added before the noise, so each step is the sampled Gaussian mechanism with sensitivity C + 2C_P
   (proof: ``privacy/batch_terms.py``). The ledger records that Δ and the noise uses it.
3. G_υ takes x′ as input. The paper conditions it on *real* x′ (``generator_condition: real``), so its
   gradient reads private rows outside the energies' mechanism and the "post-processing" argument covers only
   G_ω. With ``generator_condition: generated`` (the default) G_υ is conditioned on x′ = G_ω(z), a function
   of released parameters. Then: E_ξ and E_γ are trained by DP-SGD on one joint per-sample loss (one release
   per step, clipped jointly); G_ω and G_υ read only the energies' released parameters and public noise, so
   the whole model is post-processing of the DP-SGD releases, composed on the one ledger with the row count
   and schema releases. Under ``real``, G_υ is an ``unprotected_networks`` entry, so a DP run refuses that
   setting (``privacy/coverage.py``) instead of claiming what does not hold. Conditioning G_υ on generated x′ also trains it on the
   distribution it is sampled from (Algorithm 2), the paper's limitation of a shift at sampling time.

Without DP-SGD (``privacy=none``) the run makes no DP claim, only α-LMDP, and says so (ledger, log, report).

Sampling (Algorithm 2, typos fixed): x′ = G_ω(z), x* = G_υ(z′ | x′), z, z′ ~ N(0, I₁₂₈), BatchNorm in eval mode.

Choices where the paper is silent: Adam with β = (0.5, 0.999); the generators' Gumbel one-hots at τ = 0.2 in
training; sensitive columns must be continuous and without missing values (the Stein operator needs a
density on R^{d′}; a missing-value indicator would sit in x* and leak the protected marginal's support).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_dp.errors import ConfigError
from lightning_dp.kernels.mmd import mmd2, rbf_kernel
from lightning_dp.models.base import GeneratorModule
from lightning_dp.nets.energies import (
    ConditionalEnergy,
    ConditionalResidualGenerator,
    EnergyMLP,
    ResidualGenerator,
)
from lightning_dp.privacy.microbatch import with_rows

CONDITIONS = ("generated", "real")
OBJECTIVES = ("ebgan", "likelihood")
GRID_POINTS = {1: 4096, 2: 128, 3: 32}  # likelihood grid points per axis by d′ (4096, 16384, 32768 points in all)
MAX_LIKELIHOOD_DIM = 3
G_SIGMAS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)  # RBF stds of G_ω's MMD under the likelihood objective (model space)


def check_objective(objective: str, n_sensitive: int) -> None:
    """Refuse an unknown marginal objective, or a likelihood grid over more than 3 sensitive columns.

    Raises:
        ConfigError: naming the valid choices.
    """
    if objective not in OBJECTIVES:
        raise ConfigError(f"model.module.marginal_objective={objective!r}; valid: {', '.join(OBJECTIVES)}.")
    if objective == "likelihood" and n_sensitive > MAX_LIKELIHOOD_DIM:
        raise ConfigError(f"marginal_objective=likelihood normalises p_ξ on a grid, for at most {MAX_LIKELIHOOD_DIM} "
                          f"sensitive columns (got {n_sensitive}); name fewer, or set "
                          "model.module.marginal_objective=ebgan (the paper's energy, see the PPEM docstring).")


def check_sensitive(sensitive: Sequence[str], schema: Any) -> None:
    """Refuse sensitive columns that PPEM cannot protect, naming the valid ones (before any release).

    Raises:
        ConfigError: none given, unknown, categorical, the label, allowing missing values, or all columns.
    """
    continuous = [c.name for c in schema.features if c.type == "continuous" and not c.missing]
    hint = f"continuous columns without missing values: {continuous}"
    if not sensitive:
        raise ConfigError(f"PPEM needs the sensitive columns x′ whose marginal it protects: set model.sensitive=[...] "
                          f"({hint}).")
    if len(set(sensitive)) != len(sensitive):
        raise ConfigError(f"model.sensitive={list(sensitive)} names a column twice.")
    for name in sensitive:
        if name not in schema.names:
            raise ConfigError(f"model.sensitive names {name!r}, which is not a column of the data; {hint}.")
        column = schema[name]
        if name == schema.label or column.type != "continuous":
            raise ConfigError(f"model.sensitive names {name!r}, a categorical column: the KSD test and penalty need "
                              f"a density with a score on R^d′ (no discrete Stein operator is implemented); {hint}.")
        if column.missing:
            raise ConfigError(f"model.sensitive names {name!r}, which allows missing values: its missing-value "
                              f"indicator would be generated outside the protected marginal; {hint}.")
    if len(sensitive) == len(schema.features) and schema.label is None:
        raise ConfigError("model.sensitive names every column: PPEM needs at least one non-sensitive column x*.")


class PPEM(GeneratorModule):
    """The four networks, the margin losses and Algorithm 1's schedule; KSD penalty and DP-SGD are mechanisms.

    Args:
        n_continuous, block_sizes, num_classes, continuous_names: the data layout (supplied by the run).
        sensitive: names of the sensitive (continuous) columns x′.
        latent_dim: l = l′ (128).
        hidden: widths of every network's hidden layers (256).
        margin: m of the margin losses (10).
        gp_weight: λ_L of the gradient penalty (1, App. D.1's λ_D).
        energy_steps: energy steps (private batches) per generator step (T_E = 5).
        batch_size: generated rows per generator step.
        lr_energy, lr_generator: Adam learning rates (1e-3, 5e-4).
        generator_condition: ``generated`` (G_υ trained on G_ω's x′; DP-compatible) or ``real`` (the paper).
        gumbel_tau: temperature of the generators' straight-through one-hots in training.
        continuous_units: model-space width of one unit per continuous column, 0 if not integer (the layout).
        marginal_objective: ``ebgan`` (the paper's margin loss) or ``likelihood`` (E_ξ a density; see above).
        dequantise: σ of the Gaussian dequantisation of integer sensitive columns, in units (0: none).
        fourier, fourier_scale: random Fourier features of E_ξ's input (0: none).
        grid_points: likelihood grid points per axis (default by d′: 4096, 128, 32).
    """

    uses_private_batches = True
    needs_double_backward = True  # the gradient penalty: DP-SGD's mode=microbatch
    tabular_only = True
    public_metrics = {
        "train/g_energy": "mean marginal energy of generated x′ (the released energy on generated rows)",
        "train/g_conditional_energy": "mean conditional energy of generated rows (post-processing)",
        "train/fake_energy": "mean marginal energy of the generated x′ of the energy step (post-processing)",
        "train/log_partition": "log Z_ξ of the marginal density over the public grid (post-processing)",
        "train/g_mmd": "MMD² of G_ω's x′ to draws from p_ξ (post-processing)",
    }

    def __init__(self, *, n_continuous: int, block_sizes: Sequence[int] = (), num_classes: int = 1,
                 continuous_names: Sequence[str] = (), sensitive: Sequence[str] = (), latent_dim: int = 128,
                 hidden: Sequence[int] = (256, 256), margin: float = 10.0, gp_weight: float = 1.0,
                 energy_steps: int = 5, batch_size: int = 128, lr_energy: float = 1e-3, lr_generator: float = 5e-4,
                 betas: Sequence[float] = (0.5, 0.999), generator_condition: str = "generated",
                 gumbel_tau: float = 0.2, continuous_units: Sequence[float] = (), marginal_objective: str = "ebgan",
                 dequantise: float = 0.0, fourier: int = 0, fourier_scale: float = 20.0,
                 grid_points: int | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        if generator_condition not in CONDITIONS:
            raise ConfigError(f"model.module.generator_condition={generator_condition!r}; valid: {', '.join(CONDITIONS)}.")
        missing = [s for s in sensitive if s not in continuous_names]
        if not sensitive or missing:
            raise ConfigError(f"model.sensitive must name continuous columns of the data ({list(continuous_names)}); "
                              f"got {list(sensitive)}.")
        check_objective(marginal_objective, len(sensitive))
        if dequantise < 0:
            raise ConfigError(f"model.module.dequantise must be >= 0 (units of an integer column), got {dequantise}.")
        self.sensitive_columns = list(sensitive)
        self.sensitive_index = [list(continuous_names).index(s) for s in sensitive]
        units = list(continuous_units) or [0.0] * n_continuous
        self.sensitive_jitter = [float(dequantise) * float(units[i]) for i in self.sensitive_index]  # model-space σ
        self.rest_index = [i for i in range(n_continuous) if i not in self.sensitive_index]
        self.n_continuous, self.block_sizes = n_continuous, list(block_sizes)
        self.init_label_buffer(num_classes)
        d_s = len(self.sensitive_index)
        rest_blocks = self.block_sizes + ([num_classes] if num_classes > 1 else [])
        d_rest = len(self.rest_index) + sum(rest_blocks)
        width = list(hidden)
        # 3 hidden layers at the paper's sizes (Fig. 1)
        self.energy = EnergyMLP(d_s, [*width, width[-1]], fourier=fourier, fourier_scale=fourier_scale)
        self.conditional_energy = ConditionalEnergy(d_rest, d_s, [*width, width[-1]])
        self.generator = ResidualGenerator(latent_dim, d_s, (), width)
        self.conditional_generator = ConditionalResidualGenerator(latent_dim, d_s, len(self.rest_index), rest_blocks,
                                                                  width)
        self.register_buffer("energy_steps_done", torch.zeros((), dtype=torch.long))  # across epochs and resumes

    @staticmethod
    def check_schema(module_cfg: dict[str, Any], schema: Any, data: Mapping[str, Any] | None = None) -> None:
        """Refuse sensitive columns PPEM cannot protect, before any release (:func:`check_sensitive`; images:
        ``tabular_only``)."""
        sensitive = list(module_cfg.get("sensitive") or [])
        check_sensitive(sensitive, schema)
        check_objective(str(module_cfg.get("marginal_objective", "ebgan")), len(sensitive))

    @staticmethod
    def minmax_columns(module_cfg: Mapping[str, Any], schema: Any) -> list[str]:
        """The sensitive columns x′ stay one min-max number each (E_ξ is a density on them); the rest are cells."""
        return list(module_cfg.get("sensitive") or [])

    # ------------------------------------------------------------------ the protocol of the KSD penalty and audits
    def sensitive_part(self, x: Tensor) -> Tensor:
        """x′: the sensitive columns of model-space rows, shape (B, d′); in training, integer columns dequantised
        (Gaussian, σ = ``sensitive_jitter``), the sample E_ξ is fitted to and the KSD penalty tests."""
        x_s = x[:, self.sensitive_index]
        if self.training and any(self.sensitive_jitter):
            x_s = x_s + torch.randn_like(x_s) * x_s.new_tensor(self.sensitive_jitter)
        return x_s

    @property
    def sensitive_is_density(self) -> bool:
        """Whether E_ξ was fitted as a density of x′ (the α-LMDP tests are vacuous otherwise; see above)."""
        return self.hparams.marginal_objective == "likelihood"

    def sensitive_energy(self, x_sensitive: Tensor) -> Tensor:
        """E_ξ(x′), shape (B,): the marginal energy the KSD penalty and the α-LMDP audit test."""
        return self.energy(x_sensitive)

    def sensitive_score(self, x_sensitive: Tensor) -> Tensor:
        """s_ξ(x′) = −∇_{x′} E_ξ(x′) (detached), the score of the marginal model p_ξ ∝ exp(−E_ξ)."""
        with torch.enable_grad():
            x = x_sensitive.detach().to(self.device, torch.float32).requires_grad_(True)
            return -torch.autograd.grad(self.energy(x).sum(), x)[0].detach()

    @staticmethod
    def exposed_networks(module_cfg: Mapping[str, Any]) -> list[str]:
        """E_ξ and E_γ read private rows, through the per-sample loss DP-SGD clips."""
        return ["energy", "conditional_energy"]

    @staticmethod
    def unprotected_networks(module_cfg: Mapping[str, Any]) -> list[str]:
        """G_υ conditioned on real x′ (the paper's choice) reads private rows in a batch-mean loss that DP-SGD
        cannot clip per sample: such a run can make no DP claim."""
        return ["conditional_generator"] if module_cfg.get("generator_condition", "generated") == "real" else []

    # ------------------------------------------------------------------ rows ⇄ (x′, x*)
    def _rest(self, x: Tensor, y: Tensor) -> Tensor:
        """x*: the non-sensitive continuous columns, the one-hot blocks and the label as a last block."""
        parts = [x[:, self.rest_index], x[:, self.n_continuous :]]
        if self.num_classes > 1:
            parts.append(F.one_hot(y, self.num_classes).to(x.dtype))
        return torch.cat(parts, 1)

    def _join(self, x_sensitive: Tensor, x_rest: Tensor) -> tuple[Tensor, Tensor]:
        """(x′, x*) → model-space rows ``x`` and labels ``y``."""
        n_rest = len(self.rest_index)
        cont = x_sensitive.new_empty(len(x_sensitive), self.n_continuous)
        cont[:, self.sensitive_index] = x_sensitive
        cont[:, self.rest_index] = x_rest[:, :n_rest]
        tail = x_rest[:, n_rest:]
        if self.num_classes > 1:
            tail, label = tail[:, : -self.num_classes], tail[:, -self.num_classes :]
            return torch.cat([cont, tail], 1), label.argmax(1)
        return torch.cat([cont, tail], 1), torch.zeros(len(x_rest), dtype=torch.long, device=x_rest.device)

    def _grid(self) -> tuple[Tensor, float]:
        """A jittered grid over Ω = [−pad, 1 + pad]^d′ (one uniform point per cell) and the cells' volume."""
        d = len(self.sensitive_index)
        k = self.hparams.grid_points or GRID_POINTS[d]
        pad = 4 * max(self.sensitive_jitter, default=0.0) + 0.02
        width = (1 + 2 * pad) / k
        axis = torch.arange(k, device=self.device, dtype=torch.float32) * width - pad  # cells' lower corners
        corners = torch.cartesian_prod(*[axis] * d).reshape(-1, d)  # (k^d′, d′)
        return corners + torch.rand_like(corners) * width, width**d

    def log_partition(self) -> Tensor:
        """log Ẑ_ξ = log(v·Σ_g exp(−E_ξ(g))) over the jittered grid (differentiable; reads no private row)."""
        grid, volume = self._grid()
        return torch.logsumexp(-self.energy(grid), 0) + math.log(volume)

    @torch.no_grad()
    def sample_marginal(self, n: int) -> Tensor:
        """n exact draws of x′ from the grid's p_ξ: a cell by its mass, then its jittered point. (n, d′)."""
        grid, _ = self._grid()
        idx = torch.multinomial(torch.softmax(-self.energy(grid), 0), n, replacement=True)
        return grid[idx]

    def _noise(self, n: int) -> Tensor:
        return torch.randn(n, self.hparams.latent_dim, device=self.device)

    def _sample(self, n: int, labels: Tensor | None) -> tuple[Tensor, Tensor]:
        """Algorithm 2: x′ = G_ω(z), x* = G_υ(z′ | x′) (conditioned on the *generated* x′)."""
        if labels is not None:
            raise ValueError("PPEM generates the label with the other non-sensitive columns; it cannot condition on one.")
        x_s = self.generator(self._noise(n))
        return self._join(x_s, self.conditional_generator(self._noise(n), x_s, hard=True))

    # ------------------------------------------------------------------ losses
    def _gradient_penalty(self, energy: Any, real: Tensor, fake: Tensor, u: Tensor, *condition: Tensor) -> Tensor:
        """λ_L(‖∇_x̂ E(x̂)‖ − 1)² per row, x̂ = u·real + (1 − u)·fake (eq. 2), double-backprop graph kept."""
        x_hat = (u * real + (1 - u) * fake).requires_grad_(True)
        grad = torch.autograd.grad(energy(x_hat, *condition).sum(), x_hat, create_graph=True)[0]
        return self.hparams.gp_weight * (grad.norm(dim=1) - 1).square()

    def energy_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """ℓ_i of both energies for each private row, shape (B,) (eqs. 6–7 plus eq. 2; see the module docstring)."""
        x_s, x_r = self.sensitive_part(x), self._rest(x, y)
        n = len(x)
        with torch.no_grad():
            fake_s = self.generator(self._noise(n))  # (B, d′): one fresh fake per row
            fake_r = self.conditional_generator(self._noise(n), x_s, gumbel_tau=self.hparams.gumbel_tau)
        u = torch.rand(n, 1, device=self.device)
        loss = self._row_losses(x_s, x_r, fake_s, fake_r, u)
        with torch.no_grad():  # for the metric only (the public fakes under the released energy)
            self._fake_energy = self.energy(fake_s).mean() if n else None
        return with_rows(loss, self._row_losses, x_s, x_r, fake_s, fake_r, u)  # DP-SGD recomputes row by row

    def _row_losses(self, x_s: Tensor, x_r: Tensor, fake_s: Tensor, fake_r: Tensor, u: Tensor) -> Tensor:
        """ℓ_i from each row's data and its own draws (fakes, u_i); shape (B,)."""
        m = self.hparams.margin
        if self.hparams.marginal_objective == "likelihood":
            marginal = self.energy(x_s)  # + log Z_ξ, a public scalar (training_step)
        else:
            marginal = (self.energy(x_s) + F.relu(m - self.energy(fake_s))
                        + self._gradient_penalty(self.energy, x_s, fake_s, u))
        conditional = (self.conditional_energy(x_r, x_s) + F.relu(m - self.conditional_energy(fake_r, x_s))
                       + self._gradient_penalty(self.conditional_energy, x_r, fake_r, u, x_s))
        return marginal + conditional

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch  # a (Poisson-sampled, under DP-SGD) batch of private rows
        e_opt, g_opt = self.optimizers()
        e_opt.zero_grad()
        self.manual_backward(self.energy_loss(x, y))  # (B,): private; DP-SGD (if any) clips and noises it
        if self.hparams.marginal_objective == "likelihood":
            log_z = self.log_partition()
            self.manual_backward(log_z)  # scalar, no private row: added after the noise (post-processing)
            self.log("train/log_partition", log_z.detach())
        e_opt.step()
        self.energy_steps_done += 1
        if self._fake_energy is not None:
            self.log("train/fake_energy", self._fake_energy)
        if int(self.energy_steps_done) % self.hparams.energy_steps:
            return
        g_opt.zero_grad()
        n, tau = self.hparams.batch_size, self.hparams.gumbel_tau
        fake_s = self.generator(self._noise(n))
        g_energy = self.energy(fake_s).mean()
        if self.hparams.marginal_objective == "likelihood":  # G_ω samples p_ξ: MMD² to exact draws from it
            g_mmd = mmd2(fake_s, self.sample_marginal(n), rbf_kernel(G_SIGMAS))
            self.log("train/g_mmd", g_mmd.detach())
            g_loss = g_mmd
        else:
            g_loss = g_energy
        if self.hparams.generator_condition == "real":
            condition = self.sensitive_part(x)
            if len(condition) == 0:
                condition = fake_s.detach()
        else:
            condition = fake_s.detach()
        fake_r = self.conditional_generator(self._noise(len(condition)), condition, gumbel_tau=tau)
        g_conditional = self.conditional_energy(fake_r, condition).mean()
        self.manual_backward(g_loss + g_conditional)  # scalar: reads the energies' released parameters
        g_opt.step()
        self.log("train/g_energy", g_energy.detach(), prog_bar=True)
        self.log("train/g_conditional_energy", g_conditional.detach())

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        betas = tuple(self.hparams.betas)
        energies = [*self.energy.parameters(), *self.conditional_energy.parameters()]
        generators = [*self.generator.parameters(), *self.conditional_generator.parameters()]
        return [torch.optim.Adam(energies, lr=self.hparams.lr_energy, betas=betas),
                torch.optim.Adam(generators, lr=self.hparams.lr_generator, betas=betas)]
