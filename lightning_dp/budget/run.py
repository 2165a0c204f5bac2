"""A run's link to the budget registry: the folder lock, the claim on its data set's budget, every ledger state
recorded before a release is used, and a lease kept alive while it runs.

Order in a run (``lightning_dp/train.py``): :meth:`RunBudget.open` (registry reachable, folder locked) before
anything is read; :meth:`RunBudget.attach` gives the ledger its run id and the registry's integrity tag; the data
module calls :meth:`RunBudget.identify` with its rows' canonical digests once the rows are checked and before the
first release: the data set is found (or registered), the run claims its target ε from the data set's budget and
takes the run's lease, and from then on every change of the ledger is recorded in the registry first
(``PrivacyLedger.register``), with the bytes of a durable block's values. :meth:`RunBudget.close` ends the lease,
however the run ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_dp.budget.lock import FolderLock
from lightning_dp.budget.registry import (
    ENV_DEFAULT_BUDGET,
    ENV_DEFAULT_DELTA,
    ENV_URL,
    HEARTBEAT_S,
    Dataset,
    Lease,
    Registry,
    RegistryError,
    resolve_url,
)

if TYPE_CHECKING:  # annotations only: the ledger imports torch and Opacus
    from lightning_dp.privacy.ledger import PrivacyLedger

log = logging.getLogger(__name__)


_CANDIDATES = contextvars.ContextVar("lightning_dp_tuning_candidates", default=False)


@contextlib.contextmanager
def tuning_candidates() -> Iterator[None]:
    """While a tuning run trains its candidates: they open no registry session of their own, because the tuning
    run is registered once and charged the selection's ε (Papernot & Steinke's bound covers every candidate)."""
    token = _CANDIDATES.set(True)
    try:
        yield
    finally:
        _CANDIDATES.reset(token)


def in_tuning() -> bool:
    """True inside :func:`tuning_candidates`: a ``train()`` call is a tuning candidate."""
    return _CANDIDATES.get()


def throwaway_registry(folder: str | Path | None = None) -> Path:
    """Point this process, and every process it starts, at a fresh SQLite budget registry with budgets no run reaches.

    For benchmarks that train many times on public benchmark data (``bench/``): their runs' ledgers still bound each
    run, but they neither spend from nor fill the user's registry (``$LIGHTNING_DP_REGISTRY`` or the default file).

    Args:
        folder: where the registry file goes (default: a new temporary folder).

    Returns:
        The registry file.
    """
    base = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="lightning-dp-registry-"))
    base.mkdir(parents=True, exist_ok=True)
    path = base / "budget.sqlite"
    os.environ.update({ENV_URL: str(path), ENV_DEFAULT_BUDGET: "1e9", ENV_DEFAULT_DELTA: "0.999"})
    return path


def new_run_id() -> str:
    """A fresh run id (random: it says nothing about the data)."""
    return uuid.uuid4().hex


class RunBudget:
    """One run's registry session.

    Args:
        registry: the budget registry.
        output_dir: the run's folder (locked for the run's lifetime).
        dataset_name: ``privacy.dataset_name`` (the owner's name for the data set), or ``None``.
        dataset_budget: ``privacy.dataset_budget`` (the budget of a data set registered now), or ``None``.
    """

    def __init__(self, registry: Registry, *, output_dir: str | Path, dataset_name: str | None = None,
                 dataset_budget: float | None = None, dataset_delta: float | None = None) -> None:
        self.registry = registry
        self.output_dir = Path(output_dir)
        self.dataset_name = dataset_name or None
        self.dataset_budget = None if dataset_budget is None else float(dataset_budget)
        self.dataset_delta = None if dataset_delta is None else float(dataset_delta)
        self.lock = FolderLock(output_dir)
        self.ledger: PrivacyLedger | None = None
        self.run_id: str | None = None
        self.expected_dataset: int | None = None  # a resumed run's data set (its rows must belong to it)
        self.external_of: str | None = None
        self.lease: Lease | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @classmethod
    def open(cls, privacy: Any, output_dir: str | Path) -> RunBudget:
        """The registry of ``privacy.registry`` (checked reachable), with the run folder locked.

        Raises:
            RegistryError: the registry cannot be reached or is misconfigured.
            RunBusyError: another process runs in ``output_dir``.
        """
        registry = Registry(resolve_url(_setting(privacy, "registry")))
        budget = cls(registry, output_dir=output_dir, dataset_name=_setting(privacy, "dataset_name"),
                     dataset_budget=_setting(privacy, "dataset_budget"),
                     dataset_delta=_setting(privacy, "dataset_delta"))
        try:
            budget.lock.acquire()
        except BaseException:
            registry.close()
            raise
        return budget

    def attach(self, ledger: PrivacyLedger, *, run_id: str | None = None, dataset_id: int | None = None,
               external_of: str | None = None) -> None:
        """Give ``ledger`` its run id (a new one for a fresh or external run) and the registry's integrity tag.

        Args:
            ledger: the run's ledger (already holding a resumed run's state).
            run_id: a resumed run's id; ``None`` for a new run.
            dataset_id: a resumed run's data set: :meth:`identify` refuses other rows.
            external_of: the checkpoint an external run starts from (its ledger is charged again in full).
        """
        self.ledger, self.expected_dataset, self.external_of = ledger, dataset_id, external_of
        self.run_id = run_id or new_run_id()
        ledger.run_id = self.run_id
        ledger.seal = self.registry.seal

    def identify(self, digests: np.ndarray, kind: str) -> None:
        """The data module's hook: find the data set, claim the run's budget, take the lease (before any release).

        Raises:
            DatasetBudgetError: the data set's budget has no room for the run's target ε.
            RunBusyError: the run is live in another process.
            RegistryError: a resumed run's rows are not its data set's.
        """
        assert self.ledger is not None and self.run_id is not None, "attach() first"
        registry = self.registry
        fingerprint, sketch = registry.fingerprint(digests, kind=kind), registry.sketch(digests)
        dataset: Dataset | None
        if self.expected_dataset is not None:
            dataset = registry.find_dataset(fingerprint)
            if dataset is None and self.dataset_name:  # a new version of the run's named data set
                dataset = registry.dataset_for(fingerprint, name=self.dataset_name, budget=self.dataset_budget,
                                               sketch=sketch, budget_delta=self.dataset_delta)
            if dataset is None or dataset.id != self.expected_dataset:
                raise RegistryError(f"Run {self.run_id} was trained on other rows than these: resume it with its own "
                                    "data (the data.* settings of its config.yaml).")
        else:
            dataset = registry.dataset_for(fingerprint, name=self.dataset_name, budget=self.dataset_budget,
                                           sketch=sketch, budget_delta=self.dataset_delta)
        self.lease = registry.open_run(run_id=self.run_id, dataset=dataset, ledger=self.ledger,
                                       output_dir=self.output_dir, external_of=self.external_of, name=self.dataset_name)
        lease = self.lease
        self.ledger.register = lambda led, payload=None: registry.record(lease, led, payload)
        self._beat = threading.Thread(target=self._heartbeat, name="ldp-registry-heartbeat", daemon=True)
        self._beat.start()
        # the run's streams name the data set by its public name only, and say nothing the rows decide (whether they
        # are new to the registry, the budget an unnamed data set got): those stay in the registry (public_label)
        log.info("Run %s holds ε = %g of the budget of %s in the budget registry at %s (budgets and every run's "
                 "spend: python -m lightning_dp.budget list).", self.run_id, lease.claim_epsilon, lease.label,
                 registry.display)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self.lease is not None and not self.registry.heartbeat(self.lease):
                    log.error("Run %s: another process took over its lease; this process can release nothing more.",
                              self.run_id)
                    return
            except RegistryError as err:  # the next release will fail and say why; keep trying meanwhile
                log.warning("Run %s: the lease could not be refreshed (%s).", self.run_id, err)

    def __enter__(self) -> RunBudget:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(outcome="ended" if exc_type is None else f"stopped ({exc_type.__name__})")

    def close(self, *, outcome: str = "ended") -> None:
        """End the lease (the data set is then charged the run's spend), stop the heartbeat, unlock the folder."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            if self.lease is not None:
                self.registry.close_run(self.lease, outcome=outcome)
        except RegistryError as err:  # the lease lapses by itself; the claim stays until the run is resumed
            log.warning("Run %s: its lease could not be ended (%s); it lapses in a minute.", self.run_id, err)
        finally:
            if self.ledger is not None:
                self.ledger.register = None
            self.lease = None
            self.lock.release()
            self.registry.close()


def _setting(privacy: Any, key: str) -> Any:
    return privacy.get(key) if hasattr(privacy, "get") else getattr(privacy, key, None)

