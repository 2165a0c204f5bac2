"""``tune=default``: hyperparameter choice that is itself private, with its whole cost on the run's one ledger.

The algorithm (Papernot & Steinke, ICLR 2022, Theorem 2; ``selection.py``):

1. *Plan* (before any data is read). Each candidate Q is given an RDP budget ε_Q(λ) = ρλ (the curve of a
   Gaussian mechanism): a share ``1 − f`` for its training, as ``privacy.epsilon = ε_c`` (the ε at the run's δ of
   the curve (1 − f)ρλ, so every Gaussian release the candidate calibrates to ε_c stays under it), and ``f``
   (``score_budget_fraction``) for a private score. ρ is the largest value (bisection) for which the Theorem 2
   bound of ρλ, added to what the ledger already holds, stays within ``privacy.epsilon``. When no ρ > 0 fits
   (a small ε with a large E[K]) the run is refused here, before anything is released or written.
2. K ~ D_{η,γ} (truncated negative binomial, K ≥ 1) is drawn from privacy-noise randomness (secret: the
   guarantee rests on it); each of the K candidates draws one point of the model's grid uniformly at random and is
   a full, independent :func:`lightning_dp.train.train` run under ``tuning/candidate_k/`` with its own sub-ledger.
   Its RDP curve is that sub-ledger's composition (DP row count, schema, bandwidth, embedding, ...: every data
   release it made) plus the score's Gaussian curve, checked against the planned ρλ.
3. The score: by default PRIVATE, the number of the run's held-out rows (``datamodule.holdout``) that a logistic
   regression fitted on the candidate's synthetic rows classifies correctly, plus Gaussian noise of σ = 1/√(2fρ)
   (sensitivity 1 under add/remove and replace-one: one row changes the count by at most one; the held-out rows are
   chosen per row by a keyed hash, so a neighbour moves no other row). The accuracy shown is that noisy count
   over an estimate of the held-out size from the DP row count (post-processing). With ``tune.validation=PATH``
   the score is the exact accuracy on that PUBLIC file: it costs nothing, the candidates get all of ρ, and the
   run's log and ``tuning.json`` say so.
4. The best noisy score wins. ONE release, ``tuning/selection`` (mechanism ``rdp_curve``), records the Theorem 2
   curve on the run's ledger, whose total therefore never exceeds the target. It is recorded (and ``ledger.json``
   written) after the plan and before the first candidate reads a row: the curve is fixed by the plan, so a kill
   at any moment leaves the whole cost on the run's ledger, and the folder then refuses a second tuning run. The
   winner's checkpoint becomes
   ``checkpoints/last.ckpt`` (its embedded ledger replaced by the run's, so the checkpoint tells the whole story)
   and its samples ``synthetic.csv``.

What is published, and why: the theorem covers the *output*, the chosen candidate (its model, samples, settings)
and its noisy score. It does not cover K, the unchosen candidates' settings, scores or models. So ``tuning.json``
and ``tuning.csv`` hold the public plan (η, γ, E[K], ρ, ε_c, σ of the score, the ε of the selection) and the
chosen row only; the full table of candidates tried is written to ``tuning_private.csv``, whose first line says
it is outside the guarantee and must not be published; the candidates' folders are deleted unless
``tune.keep_candidates=true`` (then they are private too). The candidates' own runs (their logs, Lightning's
lines, warnings: K and each candidate's DP count) go to ``tuning_private.log`` only (``private_log.py``), never
to the console, which a scheduler may write to a shared log; ``train.log`` in the run folder is written after the
selection and holds only what is covered. Each candidate's seeds come from the selection's secret randomness
(like K), so the published config of the chosen one does not reveal its index k, a lower bound on K. Every grid
point and the validation file are checked in full (``check_candidates``) before the selection's release.

Theorem 2 needs one RDP bound for every candidate the search space can produce, before any is drawn. Tuning is
therefore limited to models whose releases are all Gaussian and calibrated to ε_c (``TUNABLE``: dp_merf, pearl),
whose every candidate's curve is at most (1 − f)ρλ by construction; each realised curve is still checked, and a
candidate above it stops the run with nothing published. DP-SGD models (dp_gan) are refused: the
subsampled-Gaussian curve calibrated to an (ε, δ) target is not below ρλ at every order.
"""

from __future__ import annotations

import copy
import csv
import io
import itertools
import json
import logging
import math
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_dp.errors import ConfigError, RunExistsError, UserError
from lightning_dp.io import atomic_write, atomic_write_text
from lightning_dp.privacy import mechanisms as mech
from lightning_dp.privacy.ledger import BudgetExceededError, PrivacyLedger, Release
from lightning_dp.progress import tracker
from lightning_dp.tuning.private_log import private_output
from lightning_dp.tuning.selection import sample_tnb, tnb_mean, tnb_rdp

log = logging.getLogger(__name__)

TUNE_KEYS = ("eta", "gamma", "validation", "score_budget_fraction", "keep_candidates", "space")
OVERRIDE_PREFIXES = ("model.", "trainer.")
SELECTION_NAME = "tuning/selection"
MAX_EXPECTED_K = 100  # a compute guard: each candidate is a full training run
# below this per-candidate ε the selection's release would be recorded (it is, before the first candidate) for
# candidates whose own mechanisms cannot calibrate (e.g. DP-MERF at ε_c = 0.005) or learn nothing: refused at the plan
MIN_CANDIDATE_EPSILON = 0.02
# models whose every release is a Gaussian calibrated to the candidate's ε_c, so each candidate's RDP curve is at
# most the plan's ρλ by construction, for every point of the grid (Theorem 2 needs one bound for all of them); GEM's
# releases are Gaussian measurements and bounded-range selections whose curves sum to at most α·ρ, ρ calibrated to ε_c
TUNABLE = ("dp_merf", "pearl", "gem")
PRIVATE_LOG = "tuning_private.log"
PRIVATE_HEADER = ("# PRIVATE: every candidate tried and its noisy score. Not covered by the run's DP guarantee "
                  "(Papernot & Steinke cover only the chosen candidate and its score): do not publish this file.")


class _CandidateFailed(UserError, RuntimeError):
    """A candidate stopped after the selection's release; the message says what was spent (no candidate named)."""


@dataclass(frozen=True)
class TuneConfig:
    """The ``tune`` config group, checked.

    Attributes:
        eta: η > −1 of the truncated negative binomial.
        gamma: γ ∈ (0, 1).
        validation: path of a PUBLIC validation CSV, or ``None`` for the private score.
        score_budget_fraction: share f ∈ (0, 1) of a candidate's RDP budget for the private score.
        keep_candidates: keep the candidates' folders (private) after the selection.
        grid: override key → values, for the run's model.
    """

    eta: float
    gamma: float
    validation: str | None
    score_budget_fraction: float
    keep_candidates: bool
    grid: dict[str, list[Any]]

    @property
    def points(self) -> list[dict[str, Any]]:
        """Every grid point (one value per key)."""
        keys = list(self.grid)
        return [dict(zip(keys, values, strict=True)) for values in itertools.product(*self.grid.values())]

    @property
    def score_fraction(self) -> float:
        """f actually used: 0 with a public validation set (the score costs nothing)."""
        return 0.0 if self.validation else self.score_budget_fraction

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TuneConfig:
        """Read and check ``cfg.tune`` (a mapping, or the path of a YAML file holding one).

        Raises:
            ConfigError: an unknown key, a value out of range, no grid for the model, or a grid key that is not a
                ``model.``/``trainer.`` setting of the composed config.
        """
        node = cfg.tune
        if isinstance(node, str):
            node = _read_yaml(node, "tune")
        else:
            node = OmegaConf.to_container(node, resolve=True)
        if not isinstance(node, dict):
            raise ConfigError("tune must be a mapping (tune=default) or the path of a YAML file holding one.")
        unknown = sorted(set(node) - set(TUNE_KEYS))
        if unknown:
            raise ConfigError(f"Unknown setting tune.{', tune.'.join(unknown)}; valid keys: {', '.join(TUNE_KEYS)}.")
        eta, gamma = node.get("eta", 1.0), node.get("gamma", 0.25)
        if not (_is_number(eta) and eta > -1):
            raise ConfigError(f"tune.eta must be a number > -1, got {eta!r}; e.g. tune.eta=1 (geometric).")
        if not (_is_number(gamma) and 0 < gamma < 1):
            raise ConfigError(f"tune.gamma must be in (0, 1), got {gamma!r}; e.g. tune.gamma=0.25.")
        if tnb_mean(float(eta), float(gamma)) > MAX_EXPECTED_K:
            raise ConfigError(f"tune.eta={eta:g}, tune.gamma={gamma:g} ask for E[K] = {tnb_mean(eta, gamma):.4g} "
                              f"training runs (at most {MAX_EXPECTED_K} allowed). Raise tune.gamma, e.g. 0.25.")
        frac = node.get("score_budget_fraction", 0.1)
        if not (_is_number(frac) and 0 < frac < 1):
            raise ConfigError(f"tune.score_budget_fraction must be in (0, 1), got {frac!r}; e.g. 0.1.")
        validation = node.get("validation")
        if validation is not None and not Path(str(validation)).is_file():
            raise ConfigError(f"tune.validation={validation!r} is not a file. Name a public validation CSV with the "
                              "data's columns, or set tune.validation=null for the private score.")
        space = node.get("space") or {}
        if isinstance(space, str):
            space = _read_yaml(space, "tune.space")
        model = cfg.model.name
        grid = space.get(model) if isinstance(space, dict) else None
        if not isinstance(grid, dict) or not grid:
            raise ConfigError(f"tune.space has no grid for model={model}. Add one (override key -> list of values), "
                              "e.g. tune.space=PATH to a YAML like configs/tune/default.yaml's space.")
        for key, values in grid.items():
            if not str(key).startswith(OVERRIDE_PREFIXES) or OmegaConf.select(cfg, str(key), default="<absent>") == "<absent>":
                raise ConfigError(f"tune.space.{model}: {key!r} is not a model./trainer. setting of this config. Use "
                                  "keys like model.module.num_features (data and privacy settings cannot be tuned).")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"tune.space.{model}.{key} must be a non-empty list of values, got {values!r}.")
        return cls(eta=float(eta), gamma=float(gamma), validation=None if validation is None else str(validation),
                   score_budget_fraction=float(frac), keep_candidates=bool(node.get("keep_candidates", False)),
                   grid={str(k): list(v) for k, v in grid.items()})

    def public(self) -> dict[str, Any]:
        """The public plan parameters."""
        return {"eta": self.eta, "gamma": self.gamma, "expected_k": tnb_mean(self.eta, self.gamma),
                "score": "public" if self.validation else "private", "validation": self.validation,
                "score_budget_fraction": self.score_fraction, "grid": self.grid}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _read_yaml(path: str, name: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{name}={path!r} could not be read as YAML ({err}). Name a YAML file like "
                          "configs/tune/default.yaml.") from err


@dataclass(frozen=True)
class Plan:
    """How the target is split (all public: a function of the settings, never of the data).

    Attributes:
        orders: the ledger's RDP orders.
        rho: each candidate's RDP budget is ρλ (training plus score).
        train_epsilon: ε_c, the candidates' ``privacy.epsilon`` (the curve (1 − f)ρλ at the run's δ).
        score_sigma: the private score's Gaussian noise (in rows), ``None`` with a public validation set.
    """

    orders: tuple[float, ...]
    rho: float
    train_epsilon: float
    score_sigma: float | None

    def score_rdp(self) -> np.ndarray:
        """The private score's RDP curve (zero with a public score)."""
        if self.score_sigma is None:
            return np.zeros(len(self.orders))
        return np.asarray(self.orders) / (2 * self.score_sigma**2)

    def envelope(self) -> np.ndarray:
        return self.rho * np.asarray(self.orders)


def selection_release(orders: Sequence[float], candidate_rdp: np.ndarray, tc: TuneConfig, note: str = "") -> Release:
    """The one ledger release of the whole selection: the Theorem 2 curve of ``candidate_rdp``."""
    bound = tnb_rdp(orders, candidate_rdp, eta=tc.eta, gamma=tc.gamma)
    return Release(name=SELECTION_NAME, mechanism="rdp_curve", sensitivity=1.0, rdp_values=tuple(bound),
                   rdp_orders=tuple(orders), note=note)


def plan(tc: TuneConfig, ledger: PrivacyLedger, *, rtol: float = 1e-6) -> Plan:
    """The largest per-candidate budget ρλ whose selection bound fits in the ledger's target.

    Raises:
        BudgetExceededError: no ρ > 0 fits (checked before anything is released).
    """
    orders = np.asarray(ledger.orders)

    def fits(rho: float) -> bool:
        return ledger.epsilon_if([selection_release(orders, rho * orders, tc)]) <= ledger.target_epsilon

    lo, hi = math.log(1e-12), math.log(1e3)
    if not fits(math.exp(lo)):
        floor = ledger.epsilon_if([selection_release(orders, 0 * orders, tc)])
        raise BudgetExceededError(
            f"The tuning plan cannot fit: with E[K] = {tnb_mean(tc.eta, tc.gamma):.3g} candidates (tune.eta={tc.eta:g}, "
            f"tune.gamma={tc.gamma:g}) the selection alone costs ε = {floor:.3g} even for candidates that spend "
            f"nothing, above privacy.epsilon={ledger.target_epsilon:g}. Nothing was released. Raise privacy.epsilon, "
            "or ask for fewer candidates (a larger tune.gamma or a smaller tune.eta).")
    while hi - lo > rtol:  # invariant: fits(exp(lo))
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(math.exp(mid)) else (lo, mid)
    rho = math.exp(lo)
    f = tc.score_fraction
    train_eps = mech.rdp_to_epsilon(orders, (1 - f) * rho * orders, ledger.delta)
    sigma = None if f == 0 else 1 / math.sqrt(2 * f * rho)
    if train_eps < MIN_CANDIDATE_EPSILON:
        raise BudgetExceededError(
            f"The tuning plan cannot fit useful candidates: with E[K] = {tnb_mean(tc.eta, tc.gamma):.3g} (tune.eta="
            f"{tc.eta:g}, tune.gamma={tc.gamma:g}) each would train at ε_c = {train_eps:.2g} of privacy.epsilon="
            f"{ledger.target_epsilon:g}, below {MIN_CANDIDATE_EPSILON:g}. Nothing was released. Raise privacy.epsilon, "
            "or ask for fewer candidates (a larger tune.gamma or a smaller tune.eta).")
    return Plan(orders=tuple(ledger.orders), rho=rho, train_epsilon=train_eps, score_sigma=sigma)


# ---------------------------------------------------------------------------------------------------- scoring
def _frame_xy(dm: Any, frame: Any) -> tuple[np.ndarray, np.ndarray]:
    from lightning_dp.data.schema import validate

    frame = validate(frame, dm.encoder.schema, source="the scored rows")
    frame = frame[dm.encoder.keep_mask(frame)].reset_index(drop=True)
    x, y = dm.encoder.transform(frame)
    return x.numpy(), y.numpy()


def correct_count(dm: Any, synthetic_csv: str, rows: Any) -> tuple[int, int]:
    """How many of ``rows`` a logistic regression fitted on the synthetic rows labels correctly, and of how many.

    The exact values are private when ``rows`` are private; only a noisy count may leave (:func:`_score`).
    """
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    x_s, y_s = _frame_xy(dm, pd.read_csv(synthetic_csv))
    x_h, y_h = _frame_xy(dm, rows)
    if len(x_h) == 0:
        return 0, 0
    if len(np.unique(y_s)) < 2:  # a generator that emits one class: a constant classifier
        pred = np.full(len(y_h), y_s[0] if len(y_s) else 0)
    else:
        pred = LogisticRegression(max_iter=1000).fit(x_s, y_s).predict(x_h)
    return int((pred == y_h).sum()), len(y_h)


def _score(tc: TuneConfig, p: Plan, dm: Any, synthetic_csv: str, generator: Any) -> dict[str, float]:
    import pandas as pd
    import torch

    if tc.validation:
        correct, n = correct_count(dm, synthetic_csv, pd.read_csv(tc.validation))
        return {"score": correct / max(n, 1), "noisy_correct": float(correct)}
    correct, _ = correct_count(dm, synthetic_csv, dm.holdout)  # private: only the noisy count below leaves
    noisy = float(mech.gaussian_noise(torch.tensor(float(correct), dtype=torch.float64), sensitivity=1.0,
                                      noise_multiplier=p.score_sigma, generator=generator))
    hf = float(dm.holdout_fraction)
    est = dm.released_num_rows * hf / (1 - hf) if hf > 0 and not dm.test_path else math.nan  # DP, post-processing
    return {"score": noisy, "noisy_correct": noisy, "noisy_accuracy": noisy / est if est > 0 else math.nan}


# ---------------------------------------------------------------------------------------------------- the loop
def _candidate_cfg(cfg: DictConfig, point: dict[str, Any], p: Plan, out: Path, k: int,
                   seeds: tuple[int, int]) -> DictConfig:
    """Candidate ``k``'s config: the run's, at ε_c, with the grid point and the candidate's seeds.

    ``seeds`` (training seed, noise seed) are drawn from the selection's secret randomness, so the chosen
    candidate's published config says nothing about its index k (which lower-bounds K); ``k`` names only its
    private folder.
    """
    cand = copy.deepcopy(cfg)
    with open_dict(cand):
        cand.tune = None
        cand.output_dir = str(out / "tuning" / f"candidate_{k}")
        cand.privacy.epsilon = p.train_epsilon
        # RDP calibration keeps every Gaussian candidate under the plan's curve; PRV would calibrate to a smaller
        # noise whose RDP curve can exceed it
        cand.privacy.accountant = "rdp"
        cand.seed = int(seeds[0])
        if cfg.privacy.get("noise_seed") is not None:
            cand.privacy.noise_seed = int(seeds[1])
        for key, value in point.items():
            OmegaConf.update(cand, key, value, merge=False)
        cand.trainer.enable_progress_bar = False  # a candidate's output goes to the private log only
    return cand


def check_candidates(cfg: DictConfig, tc: TuneConfig, p: Plan, out: Path) -> None:
    """Every grid point as a whole candidate config, and the validation file, checked before the selection's release.

    Each candidate config goes through the checks a plain run makes before its first release (settings, trainer,
    model on the ``meta`` device with the public schema's layout, memory); a PUBLIC validation file is read and
    validated against the public schema.

    Raises:
        ConfigError: naming the grid point or the file, and what to change; nothing was spent.
    """
    import pandas as pd

    from lightning_dp.data.datamodule import PrivateDataModule
    from lightning_dp.data.sources import TabularSource
    from lightning_dp.errors import UserError
    from lightning_dp.models import check_data
    from lightning_dp.preflight import check_before_release, check_config

    source = PrivateDataModule(**cfg.data)._load()  # reads the file; releases nothing
    schema = source.schema if isinstance(source, TabularSource) else None
    for point in tc.points:
        cand = _candidate_cfg(cfg, point, p, out, 0, (0, 0))
        where = f"tune.space.{cfg.model.name} point {json.dumps(point)}"
        try:
            check_config(cand)
            check_data(cand.model, schema, cand.data)
            check_before_release(cand, schema)
        except UserError as err:
            raise ConfigError(f"{where}: {err}") from None
        except Exception as err:  # a value of the wrong type reaching a constructor
            raise ConfigError(f"{where} cannot be built ({type(err).__name__}: {str(err)[:200]}). Fix the grid's "
                              "values; nothing was spent.") from None
    if tc.validation and schema is not None:
        from lightning_dp.data.schema import validate

        try:
            frame = pd.read_csv(tc.validation, dtype=str, keep_default_na=False)
            validate(frame, schema, source=f"tune.validation={tc.validation}")
        except UserError as err:
            raise ConfigError(f"{err} Fix the validation file or set tune.validation=null; nothing was spent.") from None
        except Exception as err:
            raise ConfigError(f"tune.validation={tc.validation!r} could not be read as CSV ({type(err).__name__}: "
                              f"{str(err)[:200]}). Name a CSV with the data's columns; nothing was spent.") from None
        if len(frame) == 0:
            raise ConfigError(f"tune.validation={tc.validation!r} has no rows; nothing was spent.")


def _curve(ledger: PrivacyLedger, orders: tuple[float, ...]) -> np.ndarray:
    """The candidate's RDP curve: the composition of every release on its sub-ledger.

    Raises:
        ConfigError: a release carries an additive δ (not covered by an RDP curve) or other orders.
    """
    if tuple(ledger.orders) != tuple(orders):
        raise ConfigError("A candidate's ledger uses other RDP orders than the run's; tuning needs the default orders.")
    if any(r.delta > 0 for r in ledger.releases if r.count):
        raise ConfigError("A candidate made a release with an additive δ, which Theorem 2's RDP bound does not cover. "
                          "Tune a model whose releases are all RDP (e.g. dp_merf, pearl).")
    rdp = [r.rdp(orders) for r in ledger.releases]
    return np.sum(rdp, axis=0) if rdp else np.zeros(len(orders))


def tune(cfg: DictConfig, *, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """Private hyperparameter selection (module docstring); the chosen candidate is the run's result.

    Args:
        cfg: the composed config with ``tune`` set.
        overrides: the command line's overrides (resume is refused for a tuning run).

    Returns:
        As :func:`lightning_dp.train.train`, plus ``tuning`` (the public summary) and ``tuning_private`` (the path
        of the private table).

    Raises:
        ConfigError: bad ``tune`` settings, image data, resume, or a candidate outside the RDP bound.
        RunExistsError: the output folder already holds a run.
        BudgetExceededError: the plan (checked before any release) or the final bound does not fit.
    """
    from lightning_dp.callbacks.run_record import write_run_files
    from lightning_dp.preflight import check_config
    from lightning_dp.train import make_ledger

    if cfg.get("resume"):
        raise ConfigError("A tuning run cannot be resumed (its candidates are not saved for it). Start a new run with "
                          "another output_dir, or resume a plain run without tune.")
    check_config(cfg)
    if cfg.model.name not in TUNABLE:
        raise ConfigError(f"tune needs a model whose releases are all Gaussian ({', '.join(TUNABLE)}): the selection's "
                          f"bound must hold for every candidate before any is drawn, and model={cfg.model.name}'s "
                          "releases (e.g. DP-SGD's subsampled Gaussian) are not bounded by the plan's curve. Tune "
                          "model=dp_merf or model=pearl.")
    tc = TuneConfig.from_cfg(cfg)
    if cfg.data.name in ("digits", "mnist_test", "npz"):
        raise ConfigError(f"tune scores candidates on table rows; data={cfg.data.name} is image data. Drop tune.")
    out = Path(cfg.output_dir)
    if any((out / name).exists() for name in ("ledger.json", ".prefit.json", "checkpoints", "tuning")):
        raise RunExistsError(f"{str(out)!r} already holds a run. Choose another output_dir=PATH.")
    tracker.stage("tuning: plan and checks of every candidate's settings (no row read yet)")
    ledger = make_ledger(cfg.privacy)
    p = plan(tc, ledger)  # refuses before anything is read or written
    check_candidates(cfg, tc, p, out)
    log.info("Tuning plan: E[K] = %.3g (η=%g, γ=%g); each candidate trains at ε_c = %.4g%s.",
             tnb_mean(tc.eta, tc.gamma), tc.eta, tc.gamma, p.train_epsilon,
             "" if p.score_sigma is None else f" and is scored with Gaussian noise σ = {p.score_sigma:.3g} rows")
    noise_seed = cfg.privacy.get("noise_seed")
    rng = np.random.default_rng(secrets.randbits(63) if noise_seed is None else int(noise_seed))
    score_gen = mech.noise_generator(None if noise_seed is None else int(noise_seed) + 10_000)
    points = tc.points
    num = sample_tnb(tc.eta, tc.gamma, rng)  # secret: the guarantee rests on K's randomness
    envelope = p.envelope()
    note = (f"Papernot & Steinke 2022, Thm 2: best of K ~ TNB(η={tc.eta:g}, γ={tc.gamma:g}), E[K] = "
            f"{tnb_mean(tc.eta, tc.gamma):.4g}; candidates at ε_c = {p.train_epsilon:.4g}, ρ = {p.rho:.4g}; "
            + ("score on a PUBLIC validation set (no charge)" if tc.validation
               else f"private score: Gaussian count, σ = {p.score_sigma:.4g}"))

    def persist(led: PrivacyLedger) -> None:  # config, versions and ledger; train.log opens only at the end
        write_run_files(out, config_yaml=OmegaConf.to_yaml(cfg, resolve=True))
        led.save_json(out / "ledger.json")

    ledger.persist = persist
    from lightning_dp.budget import RunBudget
    from lightning_dp.data.datamodule import PrivateDataModule

    # the budget registry: the tuning run is one run on its data set (fingerprinted now, before any release), charged
    # the selection's ε; its candidates open no registry session of their own (tuning_candidates)
    with RunBudget.open(cfg.privacy, out) as budget:
        budget.attach(ledger)
        budget.identify(*PrivateDataModule(**cfg.data).row_identity())
        return _select(cfg, tc, p, out, ledger, num, points, rng, envelope, score_gen, note)


def _select(cfg: DictConfig, tc: TuneConfig, p: Plan, out: Path, ledger: PrivacyLedger, num: int,
            points: list[dict[str, Any]], rng: np.random.Generator, envelope: np.ndarray, score_gen: Any,
            note: str) -> dict[str, Any]:
    """Record the selection's release, train and score the candidates, publish the chosen one."""
    from lightning_dp.budget import tuning_candidates
    from lightning_dp.checkpoint import AtomicCheckpointIO, load_checkpoint
    from lightning_dp.run_log import RunLog

    # the one release of the whole selection, charged to the registry and on disk before any candidate reads a row:
    # its curve is fixed by the plan (a candidate above it stops the run), so a kill at any moment leaves the whole
    # cost on the run's ledger and the data set's budget
    ledger.record(selection_release(p.orders, envelope, tc, note))
    rows, best = [], None
    tracker.set_epsilon(lambda: f"ε = {ledger.spent:.4g} of {ledger.target_epsilon:g} (the whole selection, spent at its start)")
    try:
        # the candidates' logs, prints and warnings go to the private log only (private_log.py): K and each
        # candidate's run are not covered by the theorem, and the console is what a scheduler writes to a shared log
        with tracker.hidden(f"tuning: selection started (the number of candidates is private: until it ends, "
                            f"progress lines go to {PRIVATE_LOG} only)", done="tuning: selection done"), \
                private_output(out / PRIVATE_LOG) as private_line, tuning_candidates():
            tracker.private_sink(private_line)  # the heartbeats' count grows with K: for the operator only
            try:
                best = _candidates(cfg, tc, p, out, num, points, rng, envelope, score_gen, rows)
            except Exception as err:
                log.exception("The tuning stopped in a candidate: %s", err)  # private: names the candidate
                raise _CandidateFailed(
                    f"A tuning candidate failed ({type(err).__name__}; the details, private, are in {PRIVATE_LOG}). "
                    f"The selection's whole ε is spent and on the ledger ({ledger.summary()}); nothing was "
                    "published. Fix the cause and start a new run with another output_dir (its budget composes "
                    "with this one's).") from None
            finally:
                tracker.private_sink(None)  # before the private file closes
        assert best is not None  # K >= 1
        chosen, result = best
        run_log = RunLog()
        try:
            run_log.open(out / "train.log")  # from here on: only what the selection covers
            published = _publish(cfg, tc, p, ledger, chosen, result, rows, out, load_checkpoint, AtomicCheckpointIO)
        finally:
            run_log.close()
    finally:
        if not tc.keep_candidates:
            shutil.rmtree(out / "tuning", ignore_errors=True)
    return published


def _candidates(cfg: DictConfig, tc: TuneConfig, p: Plan, out: Path, num: int, points: list[dict[str, Any]],
                rng: np.random.Generator, envelope: np.ndarray, score_gen: Any,
                rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Train and score ``num`` candidates (appended to ``rows``); the best ``(row, result)``."""
    from lightning_dp.train import train

    best = None
    for k in range(num):
        point = points[int(rng.integers(len(points)))]
        seeds = (int(rng.integers(2**31)), int(rng.integers(2**31)))  # secret, like K (_candidate_cfg)
        result = train(_candidate_cfg(cfg, point, p, out, k, seeds))
        curve = _curve(result["privacy_ledger"], p.orders) + p.score_rdp()
        if np.any(curve > envelope * (1 + 1e-9)):  # cannot happen for TUNABLE models; never publish if it does
            raise RuntimeError(f"Candidate {k}'s releases exceed the plan's Rényi-DP curve, so the selection's "
                               "bound does not hold; nothing was published. Report this with the run's config.")
        score = _score(tc, p, result["datamodule"], result["synthetic"], score_gen)
        rows.append({"candidate": k, "overrides": json.dumps(point), **score, "seed": seeds[0],
                     "epsilon_candidate": result["privacy_ledger"].epsilon(), "checkpoint": result["checkpoint"],
                     "synthetic": result["synthetic"]})
        if best is None or score["score"] > best[0]["score"]:
            best = (rows[-1], result)
    return best


def _publish(cfg: DictConfig, tc: TuneConfig, p: Plan, ledger: PrivacyLedger, chosen: dict[str, Any],
             result: dict[str, Any], rows: list[dict[str, Any]], out: Path, load_checkpoint: Any,
             checkpoint_io: Any) -> dict[str, Any]:
    """Write the chosen candidate as the run's result, and the public and private tuning records."""
    ckpt = load_checkpoint(chosen["checkpoint"])
    record = ckpt["lightning_dp"]
    record["ledger"] = ledger.state_dict()  # the whole story: the selection, not the candidate's sub-ledger
    config = copy.deepcopy(record["config"])
    config.update(output_dir=str(out), tune=OmegaConf.to_container(cfg.tune, resolve=True))
    config["privacy"] = {**config["privacy"], "epsilon": ledger.target_epsilon}
    record["config"] = config
    checkpoint = out / "checkpoints" / "last.ckpt"
    checkpoint_io().save_checkpoint(ckpt, checkpoint)
    synthetic = out / Path(chosen["synthetic"]).name
    atomic_write(synthetic, lambda tmp: shutil.copyfile(chosen["synthetic"], tmp))
    selection_eps = ledger.epsilon([r for r in ledger.releases if r.name == SELECTION_NAME])
    public_row = {"candidate": "chosen", "overrides": chosen["overrides"], "score": chosen["score"],
                  "score_kind": "public_validation" if tc.validation else "noisy_private",
                  "noisy_accuracy": chosen.get("noisy_accuracy", chosen["score"]),
                  "epsilon_candidate_alone": p.train_epsilon, "epsilon_selection": selection_eps}
    summary = {**tc.public(), "theorem": "Papernot & Steinke, ICLR 2022, Theorem 2 (truncated negative binomial)",
               "rho": p.rho, "epsilon_candidate": p.train_epsilon, "score_sigma": p.score_sigma,
               "epsilon_selection": selection_eps, "epsilon_run": ledger.spent, "target_epsilon": ledger.target_epsilon,
               "delta": ledger.delta, "chosen": {"overrides": json.loads(chosen["overrides"]), "score": chosen["score"]},
               "private_table": "tuning_private.csv (not covered by the guarantee)"}
    atomic_write_text(out / "tuning.json", json.dumps(summary, indent=2, default=float) + "\n")
    atomic_write_text(out / "tuning.csv", _csv([public_row]))
    private_rows = [{k: v for k, v in r.items() if k not in ("checkpoint", "synthetic")} | {
        "chosen": r is chosen, "epsilon_candidate_alone": p.train_epsilon} for r in rows]
    atomic_write_text(out / "tuning_private.csv", PRIVATE_HEADER + "\n" + _csv(private_rows))
    if tc.validation:
        log.info("Scores were computed on the PUBLIC validation set %s: exact, and charged nothing.", tc.validation)
    else:
        log.info("Scores were private: a Gaussian-noised count of held-out rows (σ = %.3g), inside each candidate's "
                 "budget.", p.score_sigma)
    log.info("Tuning chose %s (score %.4g); the selection costs ε = %.4g alone (E[K] = %.3g, ε_c = %.4g each). %s. "
             "tuning_private.csv lists every candidate tried: it is NOT covered by the DP guarantee, do not publish it.",
             chosen["overrides"], chosen["score"], selection_eps, tnb_mean(tc.eta, tc.gamma), p.train_epsilon,
             ledger.summary())
    return {"output_dir": str(out), "checkpoint": str(checkpoint), "ledger": str(out / "ledger.json"),
            "synthetic": str(synthetic), "epsilon": ledger.spent, "delta": ledger.delta, "tuning": summary,
            "tuning_private": str(out / "tuning_private.csv"), "datamodule": result["datamodule"],
            "privacy_ledger": ledger, "config": config}


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
