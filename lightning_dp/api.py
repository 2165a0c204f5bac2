"""A Python API over the same code path as ``train.py``: ``Synthesizer(...).fit(frame).sample(n)``.

``fit`` composes the project's Hydra config (``configs/train.yaml`` and its groups) exactly as ``train.py``
does and calls :func:`lightning_dp.train.train` on it; ``sample`` draws from the checkpoint the run wrote,
through :func:`lightning_dp.checkpoint.load_run` (the loader of ``python -m lightning_dp.sample``). There is
no second implementation: a DataFrame given to ``fit`` is written to a private temporary Parquet file with
its schema and read by ``data=csv``, and every run leaves the same folder (``config.yaml``, ``ledger.json``,
``checkpoints/last.ckpt``, ``synthetic.csv``, ``train.log``) as ``train.py``.

    >>> synth = Synthesizer("dp_merf", epsilon=1.0, delta=1e-5, schema=schema)  # doctest: +SKIP
    >>> synth.fit(frame)                                                        # doctest: +SKIP
    >>> rows = synth.sample(1000)                                               # doctest: +SKIP
    >>> synth.ledger.spent                                                      # doctest: +SKIP
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from omegaconf import DictConfig

    from lightning_dp.checkpoint import LoadedRun
    from lightning_dp.data.schema import Schema
    from lightning_dp.privacy.ledger import PrivacyLedger

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The run config ``train.py`` would use for these command-line overrides (``key=value``, ``group=option``).

    Raises:
        ConfigError: an override Hydra cannot apply (unknown group option, bad syntax).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lightning_dp.errors import ConfigError

    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose("train", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"{str(err).splitlines()[0]} Check the overrides {list(overrides)}.") from err


class Synthesizer:
    """A DP generator for a table (or images), trained and sampled in-process.

    Args:
        model: a generator name (``dp_merf``, ``pearl``, ``dp_gan``, ... as ``model=`` in ``train.py``).
        epsilon, delta: the run's (ε, δ) target (``privacy.epsilon``, ``privacy.delta``).
        schema: the public schema of a table given to :meth:`fit` as a DataFrame or a file: a YAML path, a dict
            in the YAML's form (``{"label": ..., "columns": [...]}``) or a :class:`~lightning_dp.data.schema.Schema`.
            Unused for a named data set, which has its own.
        output_dir: the run's folder (default ``outputs/<date>_<time>`` under the working directory, as ``train.py``).
        overrides: further ``train.py`` overrides, e.g. ``["trainer.max_epochs=5", "tune=default"]``.
        seed: ``seed`` of the run (model initialisation, latent noise; privacy noise stays OS-seeded).
        verbose: print the run's log lines (INFO) to stderr while fitting; they go to ``train.log`` anyway.
    """

    def __init__(self, model: str = "dp_merf", *, epsilon: float = 1.0, delta: float = 1e-5,
                 schema: str | Path | Mapping[str, Any] | Schema | None = None, output_dir: str | Path | None = None,
                 overrides: Sequence[str] = (), seed: int = 0, verbose: bool = True) -> None:
        self.model_name, self.epsilon, self.delta = model, epsilon, delta
        self.schema, self.output_dir, self.overrides = schema, output_dir, list(overrides)
        self.seed, self.verbose = seed, verbose
        self.checkpoint: Path | None = None
        self.result: dict[str, Any] = {}
        self._run: LoadedRun | None = None
        self._data_dir: tempfile.TemporaryDirectory[str] | None = None

    def __repr__(self) -> str:
        state = f"fitted, {self.ledger.summary()}" if self.checkpoint else "not fitted"
        return f"Synthesizer({self.model_name!r}, epsilon={self.epsilon:g}, delta={self.delta:g}; {state})"

    # ------------------------------------------------------------------ training
    def config(self, data: pd.DataFrame | str | Path, *, test: pd.DataFrame | str | Path | None = None) -> DictConfig:
        """The composed config :meth:`fit` trains with (a DataFrame is written to a private temporary file)."""
        import pandas as pd
        from omegaconf import open_dict

        from lightning_dp.data.sources import LOADERS

        named = isinstance(data, str) and data in LOADERS and data not in ("csv", "npz") and not Path(data).exists()
        out = self.output_dir or Path("outputs") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
        cfg = compose_config([f"model={self.model_name}", f"data={data if named else 'csv'}", f"seed={self.seed}",
                              *self.overrides])
        with open_dict(cfg):
            cfg.privacy.epsilon, cfg.privacy.delta, cfg.output_dir = self.epsilon, self.delta, str(out)
            if not named:
                cfg.data.path = self._table(data, "rows") if isinstance(data, pd.DataFrame) else str(data)
                cfg.data.schema = self._schema_file()
                if test is not None:
                    cfg.data.test_path = self._table(test, "test") if isinstance(test, pd.DataFrame) else str(test)
                elif not any(o.startswith("data.holdout_fraction=") for o in self.overrides):
                    cfg.data.holdout_fraction = 0.0  # train on every row given: the caller keeps its own holdout
        return cfg

    def fit(self, data: pd.DataFrame | str | Path, *, test: pd.DataFrame | str | Path | None = None) -> Synthesizer:
        """Train on ``data``: a DataFrame, a CSV/Parquet file (both with ``schema``), or a data set name (``adult``).

        A DataFrame or file is trained on whole (``data.holdout_fraction=0``) unless ``test`` (held-out rows, for
        the run's own audit) or a ``data.holdout_fraction=`` override is given. Runs :func:`lightning_dp.train.train`.

        Returns:
            ``self``, fitted: :attr:`checkpoint`, :attr:`ledger`, :attr:`result` (``train()``'s paths and ε).

        Raises:
            UserError: bad settings, data or schema (nothing is spent); BudgetExceededError.
        """
        from lightning_dp.train import train

        cfg = self.config(data, test=test)
        handler = _console(self.verbose)
        try:
            result = train(cfg)
        except SystemExit as stop:  # Lightning turns Ctrl-C during fit into sys.exit(1), after saving the run
            raise KeyboardInterrupt(
                f"fit interrupted; the run as it stands is saved in {cfg.output_dir}/checkpoints/last.ckpt with its "
                "ledger of what was spent (Synthesizer.load samples from it); a tuning run's ledger.json holds the "
                "whole selection's ε.") from stop
        finally:
            if handler is not None:
                logging.getLogger("lightning_dp").removeHandler(handler)
        self.result = {k: v for k, v in result.items() if k not in ("datamodule",)}
        self.checkpoint, self._run = Path(result["checkpoint"]), None
        self.output_dir = result["output_dir"]
        return self

    def _private_dir(self) -> Path:
        if self._data_dir is None:  # private rows on disk: owner-only, removed with this object
            self._data_dir = tempfile.TemporaryDirectory(prefix="lightning-dp-")
            Path(self._data_dir.name).chmod(0o700)
        return Path(self._data_dir.name)

    def _table(self, frame: pd.DataFrame, stem: str) -> str:
        path = self._private_dir() / f"{stem}.parquet"
        frame.to_parquet(path, index=False)
        return str(path)

    def _schema_file(self) -> str | None:
        import yaml

        from lightning_dp.data.schema import Schema

        if self.schema is None or isinstance(self.schema, str | Path):
            return None if self.schema is None else str(self.schema)
        body = self.schema.to_dict() if isinstance(self.schema, Schema) else dict(self.schema)
        path = self._private_dir() / "schema.yaml"
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        return str(path)

    # ------------------------------------------------------------------ using a fitted run
    def _loaded(self) -> LoadedRun:
        from lightning_dp.checkpoint import load_run
        from lightning_dp.errors import ConfigError

        if self.checkpoint is None:
            raise ConfigError("This Synthesizer is not fitted: call fit(data) or Synthesizer.load(PATH) first.")
        if self._run is None:
            self._run = load_run(self.checkpoint)
        return self._run

    @property
    def ledger(self) -> PrivacyLedger:
        """The run's privacy ledger (ε spent, every release), as saved in its checkpoint."""
        from lightning_dp.checkpoint import load_checkpoint
        from lightning_dp.privacy.ledger import PrivacyLedger

        self._loaded()
        return PrivacyLedger.from_state_dict(load_checkpoint(self.checkpoint)["lightning_dp"]["ledger"])

    def sample(self, n: int, *, seed: int | None = None, weights: str | None = None,
               weights_epsilon: float | None = None, **weight_options: Any) -> pd.DataFrame | dict[str, Any]:
        """``n`` synthetic rows in the user's columns (post-processing: no budget), or images and labels.

        Args:
            n: rows (or images) to draw.
            seed: seed of the latent noise (the same seed gives the same rows).
            weights: an importance-weight estimator (``beta_noised``, ``output_lapl``, ``output_norm``,
                ``priv_mlp``, ``discriminator``): adds a ``weight`` column, as ``sample --weights``. A private one
                spends ``weights_epsilon`` from the run's ledger and reloads the run's data (``fit`` on a
                DataFrame keeps its private copy while this object lives).
            weight_options: ``temper``, ``psis``, ``allow_non_private`` (as ``WeightsConfig``).

        Returns:
            A DataFrame (tables), or ``{"images": (n, H, W), "labels": (n,)}`` arrays (images).
        """
        import pandas as pd

        from lightning_dp.data.datamodule import decode_samples
        from lightning_dp.errors import ConfigError
        from lightning_dp.synthetic import sample_in_chunks

        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ConfigError(f"n must be a positive whole number of rows, got {n!r}.")
        run = self._loaded()
        if weights is None:
            x, y = sample_in_chunks(run.model, n, seed=seed)
            return decode_samples(run.data_state, x, y)
        from lightning_dp.sample import sample_weighted

        with tempfile.TemporaryDirectory(prefix="lightning-dp-") as tmp:
            path, _ = sample_weighted(self.checkpoint, n, Path(tmp) / "weighted.parquet", seed=seed,
                                      weights={"estimator": weights, "epsilon": weights_epsilon, **weight_options})
            frame = pd.read_parquet(path)
        self._run = None  # the checkpoint's ledger now holds the weights' release
        return frame

    def save(self, path: str | Path) -> Path:
        """Copy the run's checkpoint (model, ledger, public data facts) to ``path``, atomically."""
        from lightning_dp.io import atomic_write

        self._loaded()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: shutil.copyfile(self.checkpoint, tmp))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Synthesizer:
        """A fitted Synthesizer from a checkpoint (``checkpoints/last.ckpt`` or a :meth:`save` copy); loading runs
        no code from the file (:func:`~lightning_dp.checkpoint.load_run`).

        Raises:
            CheckpointError, UnsafeConfigError: unreadable, foreign or tampered file.
        """
        from lightning_dp.checkpoint import load_run

        run = load_run(path)
        privacy = run.record["config"]["privacy"]
        synth = cls(run.record["config"]["model"]["name"], epsilon=privacy["epsilon"], delta=privacy["delta"],
                    output_dir=run.record["config"].get("output_dir"), seed=run.record["config"].get("seed", 0))
        synth.checkpoint, synth._run = Path(path), run
        return synth


def _console(verbose: bool) -> logging.Handler | None:
    """INFO lines of ``lightning_dp`` to stderr for the duration of a fit (a notebook has no handler of its own);
    the level is INFO either way, so the run's ``train.log`` is complete."""
    logger = logging.getLogger("lightning_dp")
    logger.setLevel(logging.INFO)
    if not verbose or any(isinstance(h, logging.StreamHandler) for h in logging.getLogger().handlers):
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    return handler
