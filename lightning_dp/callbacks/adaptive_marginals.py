"""Adaptive select–measure rounds of noisy marginals (AIM's loop) for a generator fitted between rounds (GEM).

"AIM: An Adaptive and Iterative Mechanism for Differentially Private Synthetic Data" (McKenna et al. 2022),
Alg. 1, with the generator of "Iterative Methods for Private Synthetic Data" (Liu, Vietri & Wu 2021) as the model.
This callback is the only code of a ``model=gem`` run that reads private rows.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning import Callback, LightningModule, Trainer
from torch import Tensor

from lightning_dp.checkpoint import CheckpointError
from lightning_dp.errors import ConfigError
from lightning_dp.privacy import marginals as mg
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import PrivacyLedger, Release

log = logging.getLogger(__name__)

ONE_WAY = "gem/one_way"
TARGET_PAIRS = "gem/target_pairs"
ROUND = "gem/round_{:04d}/{}"


class AdaptiveMarginals(Callback):
    """AIM's rounds for a :class:`~lightning_dp.models.gem.GEM` module: select a badly fitted marginal, measure it.

    Budget (zCDP, composed on the run's ledger as RDP curves linear in the order α): ρ is the largest zCDP budget
    that the ledger's other releases (the row count, reservations) leave within the run's (ε, δ), found once with
    the ledger's own calibration. With T = ``rounds`` (AIM's 16 per column when null):

    1. ``gem/one_way``: every column's 1-way marginal, each with Gaussian noise σ₀ = √(T / (2·0.9·ρ)) (noise
       multiplier; std σ₀·Δ₁ in counts). One release of C marginals, L2 sensitivity Δ = √C·Δ₁ with Δ₁ = 1
       under add/remove (a row adds one count to one cell of each) and √2 under replace-one (one cell −1,
       another +1): ``privacy.marginals.gaussian_l2_sensitivity``.
       ``gem/target_pairs`` (when ``target_pairs_fraction`` f_L > 0 and the data has a label): in the same first
       block, the 2-way marginal of the label with each of the other C − 1 columns, each with Gaussian noise
       σ_L = √((C − 1) / (2 f_L ρ)) (std σ_L·Δ₁ in counts), one release of C − 1 marginals with L2 sensitivity
       √(C − 1)·Δ₁ (a row is in one cell of each), zCDP cost (C − 1)/(2σ_L²) = f_L·ρ. The workload's structure
       is public, so measuring every label pair needs no selection; the rounds select among all the workload's
       marginals (a label pair may be measured again) with what is left. With ``one_way`` false the label pairs
       replace the 1-way marginals (a column's 1-way marginal is its label pair summed over the label, the label's
       any pair summed over the column): the first block is then the label pairs alone.
    2. each round t (every ``steps_per_round`` training steps): ``select`` one workload marginal r with the
       exponential mechanism on AIM's score ``w_r (||M_r(D) − M_r(Ĝ)||₁ − √(2/π) σ_t Δ₁ n_r)``, sensitivity
       ``max_r w_r · Δ_L1`` (``score_sensitivity``: ||M_r(D)||₁ moves by 1 (add/remove) or 2 (replace-one);
       the model's answers are post-processing), accounted as ``min(α ε_t²/8, ε_t)`` (bounded range,
       ``exponential_rdp``); then ``measure`` it with Gaussian noise of multiplier σ_t (Δ₂ = Δ₁, one marginal).
       A round costs ρ_t = 1/(2σ_t²) + ε_t²/8 = ρ/T at the start. Annealing (``anneal``): ``gap`` (default) —
       when the model before the round was within the noise's expected L1 size of the new measurement, σ halves
       and ε doubles for the next rounds; ``movement`` — AIM's literal test, when the model fitted since the last
       measurement moved by less than that (``privacy.marginals.anneal``: the two agree for AIM's estimator,
       which refits to convergence each round; a generator that takes ``steps_per_round`` warm-started gradient
       steps moves less, so the movement test fires too early and spends the budget in a few rounds). When less
       than two rounds' cost is left, the last round spends all of it.

    The number of rounds is a function of ρ, T and the annealing decisions, which are post-processing of
    releases: no count of private rows is ever used outside a mechanism. After the last round the module
    trains ``final_steps`` more steps, its learning rate decaying from ``lr`` to ``final_lr_fraction · lr`` on a
    cosine, and the trainer stops; a module with ``label_head`` then fits its label head to the measurements
    (post-processing, on every rank from the same seed: rank 0's is saved), before the run's last checkpoint.

    Order and durability: each round's releases are recorded and their values stored in the module inside one
    :meth:`PrivacyLedger.durable` block, so the checkpoint holding them and the ledger are on disk before a
    training step uses them; a resumed run continues from the module's counters and refuses a checkpoint that
    is behind its ledger. Under DDP every rank computes its shard's exact marginals, they are summed once, and
    rank 0's selection and noise are broadcast (and its schedule: σ, ε, the last round), so each release happens once and every rank stops together.

    Args:
        ledger: the run's ledger.
        datamodule: the private data (``private_batches``, ``released_num_rows``).
        rounds: T, AIM's round budget divisor; ``null`` = 16 per column (AIM's default).
        selection_fraction: share of a round's ρ for the selection (AIM: 0.1).
        steps_per_round: training steps between rounds (the fit to all measurements so far).
        final_steps: training steps after the last round.
        final_lr_fraction: the learning rate at the end of the final fit, a fraction of the module's ``lr``.
        anneal: ``gap`` or ``movement`` (AIM's literal test), see above.
        target_pairs_fraction: share f_L of ρ for measuring every (label, column) 2-way marginal in the first
            release (0: none; without a label nothing is spent on it), see above.
        one_way: release the 1-way marginals first (default); false only with the label pairs, which hold them.
        answer_draws: latent draws for the model's answers to every workload marginal before a selection (their
            Monte-Carlo error enters the score: ``GEM.answers``), and the generated rows that the model's label
            head (``label_head``) is fitted on when training ends.
        chunk_size: rows per streamed chunk of the count pass.
        noise_seed: fix the noise (tests only); default OS entropy.
    """

    def __init__(self, *, ledger: PrivacyLedger, datamodule: Any, rounds: int | None = None,
                 selection_fraction: float = 0.1, steps_per_round: int = 50, final_steps: int = 2000,
                 final_lr_fraction: float = 0.05, anneal: str = "gap", answer_draws: int = 65536,
                 chunk_size: int = 65536, target_pairs_fraction: float = 0.0, one_way: bool = True,
                 noise_seed: int | None = None) -> None:
        self.check_settings({"rounds": rounds, "selection_fraction": selection_fraction,
                             "steps_per_round": steps_per_round, "final_steps": final_steps, "chunk_size": chunk_size,
                             "final_lr_fraction": final_lr_fraction, "anneal": anneal, "answer_draws": answer_draws,
                             "target_pairs_fraction": target_pairs_fraction, "one_way": one_way})
        self.ledger, self.datamodule = ledger, datamodule
        self.rounds, self.selection_fraction = rounds, float(selection_fraction)
        self.steps_per_round, self.final_steps, self.chunk_size = steps_per_round, final_steps, chunk_size
        self.final_lr_fraction, self.anneal, self.answer_draws = float(final_lr_fraction), anneal, answer_draws
        self.target_pairs_fraction, self.one_way = float(target_pairs_fraction), bool(one_way)
        self.noise_seed = noise_seed
        self._exact: dict[mg.Clique, Tensor] = {}  # private: never leaves this object
        self._gen: torch.Generator | None = None

    @staticmethod
    def check_settings(node: Mapping[str, Any]) -> None:
        """The mechanism's settings (a config node), checked before any release.

        Raises:
            ConfigError: the first setting out of range.
        """
        for key in ("steps_per_round", "chunk_size", "answer_draws"):
            value = node.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"AdaptiveMarginals (model.mechanisms): {key} must be a whole number >= 1, got "
                                  f"{value!r}.")
        final = node.get("final_steps", 0)
        if isinstance(final, bool) or not isinstance(final, int) or final < 0:
            raise ConfigError(f"AdaptiveMarginals: final_steps must be a whole number >= 0, got {final!r}.")
        rounds = node.get("rounds")
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
            raise ConfigError(f"AdaptiveMarginals: rounds must be null (16 per column, AIM's default) or a whole "
                              f"number >= 1, got {rounds!r}.")
        frac = node.get("selection_fraction", 0.1)
        if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac < 1:
            raise ConfigError(f"AdaptiveMarginals: selection_fraction must be in (0, 1) (AIM: 0.1), got {frac!r}.")
        floor = node.get("final_lr_fraction", 0.05)
        if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 < floor <= 1:
            raise ConfigError(f"AdaptiveMarginals: final_lr_fraction must be in (0, 1] (1 = no decay), got {floor!r}.")
        pairs = node.get("target_pairs_fraction", 0.0)
        if isinstance(pairs, bool) or not isinstance(pairs, int | float) or not 0 <= pairs < 1:
            raise ConfigError(f"AdaptiveMarginals: target_pairs_fraction must be in [0, 1) (0: no label pairs in the "
                              f"first release), got {pairs!r}.")
        one_way = node.get("one_way", True)
        if not isinstance(one_way, bool):
            raise ConfigError(f"AdaptiveMarginals: one_way must be true or false, got {one_way!r}.")
        if not one_way and not pairs:
            raise ConfigError("AdaptiveMarginals: one_way=false needs target_pairs_fraction > 0 (the label pairs hold "
                              "every column's 1-way marginal).")
        if node.get("anneal", "gap") not in ("gap", "movement"):
            raise ConfigError(f"AdaptiveMarginals: anneal must be gap or movement (AIM's literal test), got "
                              f"{node.get('anneal')!r}.")

    @staticmethod
    def check_plan(node: Mapping[str, Any], module_cls: Any, module_cfg: Mapping[str, Any], schema: Any,
                   data: Mapping[str, Any] | None = None) -> None:
        """Refuse, before any release, a first release that would leave no budget for the rounds: with AIM's σ
        (Alg. 1, line 3) the 1-way marginals cost ``C·(1−f)·ρ/T`` of ρ for C discretised columns, and the label
        pairs ``f_L·ρ`` where the data has a label; together they must stay below ρ. Data-free: C comes from the
        public schema and the run's ``data`` settings (``module_cls.possible_levels``), T, f and f_L from the
        settings. Where the releases decide C, the fewest columns they can leave are used, so a plan that can work
        is never refused here (the 1-way release checks the run's own C again). With ``one_way`` false the first
        block is the label pairs alone (f_L < 1 by :meth:`check_settings`), refused on data without a label.

        Raises:
            ConfigError: with the smallest ``rounds`` that fits, or when ``one_way`` is false without a label.
        """
        labelled = getattr(schema, "label", None) is not None
        if not node.get("one_way", True) and not labelled:
            raise ConfigError("model=gem: one_way=false measures the label pairs in place of the 1-way marginals, and "
                              "this data set has no label; set model.mechanisms[0].one_way=true. Nothing was spent.")
        rounds, frac = node.get("rounds"), float(node.get("selection_fraction", 0.1))
        levels = getattr(module_cls, "possible_levels", None)
        if rounds is None or levels is None or not node.get("one_way", True):
            return
        columns = min(len(layout) for layout in levels(module_cfg, schema, data))
        pairs = float(node.get("target_pairs_fraction", 0.0)) if labelled else 0.0
        if columns * (1 - frac) > rounds * (1 - pairs):
            extra = f" and target_pairs_fraction={pairs:g}" if pairs else ""
            raise ConfigError(f"model=gem: the {columns} 1-way marginals alone would spend more than the budget with "
                              f"rounds={rounds}{extra}; set model.mechanisms[0].rounds to at least "
                              f"{math.ceil(columns * (1 - frac) / (1 - pairs))} (null: 16 per column). Nothing was "
                              "spent.")

    # ---------------------------------------------------------------- hooks
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._gen = mech.noise_generator(self._shared_seed(trainer))
        measured = sum(1 for r in self.ledger.releases if r.name.startswith("gem/round_") and r.name.endswith("/measure"))
        if pl_module.is_released():
            first = (not self.one_way or self.ledger.has(ONE_WAY)) and (
                not self._target_pairs(pl_module) or self.ledger.has(TARGET_PAIRS))
            if not first or measured != int(pl_module.rounds):
                raise RuntimeError(f"The checkpoint holds {int(pl_module.rounds)} measured rounds but its ledger lists "
                                   f"{measured}: the checkpoint is inconsistent and cannot be trusted. Start a new run.")
            log.info("Resuming after %d rounds of released marginals; nothing is released again.", measured)
        elif self.ledger.has(ONE_WAY) or self.ledger.has(TARGET_PAIRS):
            raise CheckpointError("The ledger lists released marginals but this checkpoint has none: it is older than "
                                  "the release. Resume from the run's checkpoints/last.ckpt, or start a new run.")
        self._exact = self._exact_marginals(trainer, pl_module)
        if not pl_module.is_released():
            with self.ledger.durable():
                self._release_first(trainer, pl_module)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if bool(pl_module.finished):
            done = step - int(pl_module.finish_step)
            if done >= self.final_steps:
                trainer.should_stop = True
            pl_module.set_lr_fraction(mg.cosine_fraction(done, self.final_steps, floor=self.final_lr_fraction))
            return
        if step - int(pl_module.round_step) >= self.steps_per_round:
            with self.ledger.durable():
                self._round(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not bool(pl_module.finished):
            log.warning("Training ended after %d rounds with zCDP ρ = %.4g of %.4g unspent; raise trainer.max_epochs "
                        "or model.module.steps_per_epoch to use the whole budget.", int(pl_module.rounds),
                        float(pl_module.rho_total - pl_module.rho_used), float(pl_module.rho_total))
        self._exact = {}
        if pl_module.hparams.get("label_head") and pl_module.is_released():  # before the run's last checkpoint
            loss = pl_module.fit_label_head(draws=self.answer_draws)
            log.info("Label head fitted to the measured marginals that hold the label, on %d generated rows "
                     "(mean squared standardised residual and prior %.3g a cell).", self.answer_draws, loss)
            if not len(pl_module.head_cliques):
                log.warning("No measured marginal holds the label with another column, so the label head draws the "
                            "label independently of the row. Measure the label pairs: set "
                            "model.mechanisms.0.one_way=false and model.mechanisms.0.target_pairs_fraction (e.g. 0.3).")

    # ---------------------------------------------------------------- the private pass
    def _exact_marginals(self, trainer: Trainer, module: Any) -> dict[mg.Clique, Tensor]:
        """Exact counts of every 1-way and workload marginal (private; kept in this object only).

        The 1- and 2-way ones come from one Gram matrix of the one-hot rows per chunk (``pair_counts``), larger
        cliques from a ``bincount`` each; the rows are streamed, never held whole."""
        levels = module.levels
        big = [c for c in module.cliques if len(c) > 2]
        size = sum(levels)
        gram = torch.zeros(size, size, dtype=torch.float64, device=module.device)
        totals = [torch.zeros(mg.clique_size(c, levels), dtype=torch.float64, device=module.device) for c in big]
        rank, world = trainer.global_rank, trainer.world_size
        for x, y in self.datamodule.private_batches(chunk_size=self.chunk_size, rank=rank, world_size=world):
            codes = module.discretise(x.to(module.device), y.to(module.device))
            gram += mg.pair_counts(codes, levels)
            for total, counts in zip(totals, mg.marginal_counts(codes, big, levels)):
                total += counts
        if world > 1 and dist.is_available() and dist.is_initialized():
            flat = torch.cat([gram.flatten(), *totals])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            gram = flat[: size * size].view(size, size)
            totals = list(torch.split(flat[size * size :], [len(t) for t in totals]))
        gram = gram.cpu()
        small = [(c,) for c in range(len(levels))] + [c for c in module.cliques if len(c) == 2]
        small += [c for c in self._target_pairs(module) if c not in small]  # a degree-3 workload's label pairs
        return {**{c: mg.clique_from_pairs(gram, c, levels) for c in small},
                **{c: t.cpu() for c, t in zip(big, totals, strict=True)}}

    # ---------------------------------------------------------------- releases
    def _target_pairs(self, module: Any) -> list[mg.Clique]:
        """The (column, label) cliques of the first release: none when ``target_pairs_fraction`` is 0 or the data
        has no label (the label is the last discretised column)."""
        if self.target_pairs_fraction <= 0 or module.num_classes <= 1:
            return []
        label = len(module.levels) - 1
        return [(c, label) for c in range(label)]

    def _release_first(self, trainer: Trainer, module: Any) -> None:
        """The first, deterministic block: the 1-way marginals (unless ``one_way`` is false) and the label pairs."""
        columns = len(module.levels)
        rounds = self.rounds or 16 * columns
        rho = self._rho_budget()
        sigma, epsilon = mg.round_parameters(rho, rounds, selection_fraction=self.selection_fraction)
        pairs = self._target_pairs(module)
        if not self.one_way and not pairs:
            raise ConfigError("model=gem: one_way=false needs the label pairs in its place (target_pairs_fraction > 0 "
                              "and a data set with a label). Nothing was released.")
        rho_pairs = self.target_pairs_fraction * rho if pairs else 0.0
        if (columns / (2 * sigma**2) if self.one_way else 0.0) + rho_pairs > rho:
            raise ConfigError(f"model=gem: the 1-way marginals and the label pairs alone would spend the whole budget "
                              f"with rounds={rounds}; raise model.mechanisms[0].rounds or lower "
                              "target_pairs_fraction. Nothing was released.")
        module.num_rows.fill_(max(float(self.datamodule.released_num_rows), 1.0))
        used, released = 0.0, []
        if self.one_way:
            used += self._release_block(trainer, module, ONE_WAY, [(c,) for c in range(columns)], sigma,
                                       what="1-way marginals", symbol="σ₀")
            released.append(f"the {columns} 1-way marginals")
        if pairs:
            sigma_pairs = math.sqrt(len(pairs) / (2 * rho_pairs))  # the block's cost m/(2σ_L²) is ρ_L
            used += self._release_block(trainer, module, TARGET_PAIRS, pairs, sigma_pairs,
                                        what="(column, label) 2-way marginals", symbol="σ_L")
            released.append(f"the {len(pairs)} label pairs")
        module.start_from_one_way()
        module.rho_total.fill_(rho)
        module.rho_used.fill_(used)
        module.round_sigma.fill_(sigma)
        module.round_epsilon.fill_(epsilon)
        module.round_step.fill_(trainer.global_step)
        log.info("Released %s; the rounds start at σ₀ = %.4g; zCDP budget ρ = %.4g for T = %d rounds; %s",
                 " and ".join(released), sigma, rho, rounds, self.ledger.summary())

    def _release_block(self, trainer: Trainer, module: Any, name: str, cliques: list[mg.Clique], sigma: float, *,
                       what: str, symbol: str) -> float:
        """Release the marginals of ``cliques`` together, noise std σ·Δ₁ on every cell; return the zCDP cost.

        One Gaussian release of m marginals: a row adds one count to one cell of each (Δ₁ = 1 add/remove, √2
        replace-one: one cell −1, another +1), so the L2 sensitivity of the m concatenated marginals is √m·Δ₁
        (``privacy.marginals.gaussian_l2_sensitivity``) and the noise multiplier is σ/√m; its zCDP ρ is m/(2σ²)."""
        m = len(cliques)
        delta_1 = mg.gaussian_l2_sensitivity(1, adjacency=self.ledger.adjacency)
        sens = mg.gaussian_l2_sensitivity(m, adjacency=self.ledger.adjacency)
        self.ledger.record(Release(
            name=name, mechanism="gaussian", sensitivity=sens, noise_multiplier=sigma / math.sqrt(m),
            note=f"the {m} {what}, N(0, ({symbol}Δ₁)²) per cell, {symbol} = {sigma:.4g}; Δ = √{m}·Δ₁ "
                 f"(a row is in one cell of each, {self.ledger.adjacency})"))
        noisy = [mech.gaussian_noise(self._exact[c], sensitivity=delta_1, noise_multiplier=sigma, generator=self._gen)
                 for c in cliques]
        noisy = self._broadcast(trainer, noisy)
        for clique, values in zip(cliques, noisy, strict=True):
            module.add_measurement(clique, values, sigma * delta_1)
        return m / (2 * sigma**2)

    def _rho_budget(self) -> float:
        """The largest zCDP ρ (an RDP curve α·ρ) the ledger can still take, with a margin for rounding."""
        def planned(multiplier: float) -> list[Release]:
            return [Release(name="gem/budget", mechanism="gaussian", sensitivity=1.0, noise_multiplier=multiplier)]

        return (1.0 - 1e-6) / (2.0 * self.ledger.calibrate(planned) ** 2)

    def _round(self, trainer: Trainer, module: Any) -> None:
        t = int(module.rounds) + 1
        delta_1 = mg.gaussian_l2_sensitivity(1, adjacency=self.ledger.adjacency)
        sigma, epsilon = float(module.round_sigma), float(module.round_epsilon)
        if self.anneal == "movement" and int(module.pending_clique) >= 0:  # AIM's test, on the model fitted since
            clique = module.cliques[int(module.pending_clique)]
            after = module.answers([clique], draws=self.answer_draws)[0].cpu()
            if mg.anneal(module.pending_before.cpu(), after, sigma=sigma * delta_1,
                         cells=mg.clique_size(clique, module.levels)):
                sigma, epsilon = sigma / 2, epsilon * 2
        left = float(module.rho_total - module.rho_used)
        final = left < 2 * mg.round_cost(sigma, epsilon)
        if final:  # the last round spends what is left (AIM, Alg. 1, line 15)
            sigma = math.sqrt(1 / (2 * (1 - self.selection_fraction) * left))
            epsilon = math.sqrt(8 * self.selection_fraction * left)
        # every rank follows rank 0's schedule (the model's answers use each rank's own latent draws)
        sigma, epsilon, final = self._broadcast(trainer, (sigma, epsilon, final))
        answers = module.answers(module.cliques, draws=self.answer_draws)
        cells = torch.tensor([float(mg.clique_size(c, module.levels)) for c in module.cliques], dtype=torch.float64)
        errors = torch.stack([(self._exact[c] - a.cpu()).abs().sum() for c, a in zip(module.cliques, answers)])
        weights = torch.tensor(module.weights, dtype=torch.float64)
        scores = mg.selection_scores(errors, sigma=sigma * delta_1, cells=cells, weights=weights)
        sens_select = mg.score_sensitivity(module.weights, adjacency=self.ledger.adjacency)
        orders = self.ledger.orders
        self.ledger.record(Release(
            name=ROUND.format(t, "select"), mechanism="rdp_curve", sensitivity=sens_select,
            rdp_values=tuple(mg.exponential_rdp(orders, epsilon=epsilon)), rdp_orders=orders,
            note=f"exponential mechanism over {len(scores)} marginals, ε = {epsilon:.4g}, Δ = {sens_select:g} "
                 "(AIM's score); bounded range: min(αε²/8, ε)"))
        chosen = mech.exponential_mechanism(scores, epsilon=epsilon, sensitivity=sens_select, generator=self._gen)
        chosen, before = self._broadcast(trainer, (chosen, answers[chosen]))
        clique = module.cliques[chosen]
        self.ledger.record(Release(
            name=ROUND.format(t, "measure"), mechanism="gaussian", sensitivity=delta_1, noise_multiplier=sigma,
            note=f"the marginal of columns {list(clique)} ({mg.clique_size(clique, module.levels)} cells)"))
        noisy = mech.gaussian_noise(self._exact[clique], sensitivity=delta_1, noise_multiplier=sigma,
                                    generator=self._gen)
        noisy = self._broadcast(trainer, noisy)
        module.add_measurement(clique, noisy, sigma * delta_1)
        module.pending_clique.fill_(chosen)
        module.pending_before = before.to(module.pending_before.device)
        module.rho_used += mg.round_cost(sigma, epsilon)
        annealed = self.anneal == "gap" and mg.anneal(before.cpu(), noisy.cpu(), sigma=sigma * delta_1,
                                                      cells=mg.clique_size(clique, module.levels))
        module.round_sigma.fill_(sigma / 2 if annealed else sigma)  # the next round's (a function of releases)
        module.round_epsilon.fill_(epsilon * 2 if annealed else epsilon)
        module.rounds.fill_(t)
        module.round_step.fill_(trainer.global_step)
        if final:
            module.finished.fill_(True)
            module.finish_step.fill_(trainer.global_step)
        log.info("Round %d: measured the marginal of columns %s (σ = %.4g, ε_select = %.4g)%s%s; %s", t, list(clique),
                 sigma, epsilon, ", the last" if final else "", "; annealing" if annealed and not final else "",
                 self.ledger.summary())

    # ---------------------------------------------------------------- DDP
    def _shared_seed(self, trainer: Trainer) -> int:
        seed = self.noise_seed if self.noise_seed is not None else secrets.randbits(62)
        return int(trainer.strategy.broadcast(seed, src=0)) if trainer.world_size > 1 else seed

    @staticmethod
    def _broadcast(trainer: Trainer, value: Any) -> Any:
        """Rank 0's released values on every rank (one release, whatever each rank drew)."""
        return trainer.strategy.broadcast(value, src=0) if trainer.world_size > 1 else value
