"""The budget registry: one (ε, δ) budget per data set, across every run, folder and machine, kept in a database.

A data set is known by a keyed fingerprint of its canonical rows (``fingerprint``) and, optionally, a name its
owner gives it (then every version of the rows under that name shares one budget). Rows first seen that are for the
most part a registered data set's rows (a keyed bottom-k sketch per version, ``sketch.py``; D plus or minus some rows)
are charged to that data set rather than given a fresh budget; the owner may also let runs use registered data sets
only (``policy``).

Runs compose by basic composition (Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", Thm 3.16): a
data set that k runs read with (ε_i, δ_i)-DP mechanisms is (Σ ε_i, Σ δ_i)-DP, whatever the runs were and however
they were chosen (each run's mechanism may depend on earlier runs' outputs: the theorem holds for adaptive
composition). It needs nothing from the runs beyond each one's own (ε_i, δ_i) guarantee, which its ledger proves, so
it is sound across accountants, models and machines; it is loose next to composing the runs' Rényi curves, which the
registry does not do (runs' curves at different orders and PRV bounds do not combine). So the registry enforces
Σ ε_i ≤ the data set's ε budget and Σ δ_i ≤ its δ budget, and keeps:

* a **claim** per active run: its target ε and its δ, taken from the data set's budgets when the run starts or
  resumes (``open_run``), so a run that could not finish is refused before it releases anything;
* the run's **spend** (its ledger's ε, with what it reserved), recorded with its whole ledger state in the same
  transaction that checks it (``record``); the ledger calls it before a release's value is saved or used;
* the **values** of the run's latest durable block (``record`` with a payload: the bytes of the file that holds
  them), stored in the transaction that charges them, so a run killed before it wrote the file resumes from them
  (``payload``) rather than drawing them again; dropped when the run ends normally;
* after the run ends (``close_run``), its charge is what it spent (and its δ, if it released anything).

Every decision locks the data set's row first (``SELECT ... FOR UPDATE`` on PostgreSQL, the database write lock
on SQLite), so runs on many machines cannot both spend the last of a budget. Records carry HMAC tags under the
registry's key, so a row or a run file edited outside lightning-dp is detected.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    delete,
    event,
    exc,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url

from lightning_dp.budget import sketch as sk
from lightning_dp.budget import tables as t
from lightning_dp.errors import BudgetExceededError, UserError

if TYPE_CHECKING:  # the ledger imports torch and Opacus: `python -m lightning_dp.budget list` needs neither
    from lightning_dp.privacy.durable import Payload
    from lightning_dp.privacy.ledger import PrivacyLedger

log = logging.getLogger(__name__)

ENV_URL = "LIGHTNING_DP_REGISTRY"          # where the registry is when privacy.registry is null
ENV_KEY = "LIGHTNING_DP_REGISTRY_KEY"      # the HMAC key (else one is generated and kept in the registry)
ENV_DEFAULT_BUDGET = "LIGHTNING_DP_DEFAULT_BUDGET"  # the registry-wide default below, for an administrator
DEFAULT_DATASET_BUDGET = 10.0              # ε of a data set first seen without privacy.dataset_budget
ENV_DEFAULT_DELTA = "LIGHTNING_DP_DEFAULT_DELTA"  # the registry-wide default δ budget, for an administrator
DEFAULT_DATASET_DELTA = 1e-3               # Σ δ of a data set's runs, when first seen without privacy.dataset_delta
OVERLAP_THRESHOLD = 0.5                    # rows mostly (> this share, either way) a registered data set's are charged to it
LEASE_TTL_S = 60.0                         # a run's lease lapses this long after its last heartbeat
HEARTBEAT_S = 10.0
TOLERANCE = 1e-9
SCHEMES = ("sqlite", "postgresql")


class RegistryError(UserError, RuntimeError):
    """The registry cannot be reached, is misconfigured, or refuses the request; nothing was released."""


class RunBusyError(RegistryError):
    """Another process is running this run or writing to this output folder."""


class TamperedError(RegistryError):
    """A record (a registry row or a run file) does not carry a valid integrity tag: it was edited."""


class DatasetBudgetError(BudgetExceededError):
    """The data set's budget (all its runs together) has no room for the request."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def actor() -> str:
    """``user@host`` of this process, for the event log."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name (containers without /etc/passwd entries)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def default_budget() -> float:
    """ε a data set gets when first registered without ``privacy.dataset_budget``: ``$LIGHTNING_DP_DEFAULT_BUDGET``,
    else 10.

    Raises:
        RegistryError: the variable is not a finite number > 0.
    """
    text = os.environ.get(ENV_DEFAULT_BUDGET)
    if not text:
        return DEFAULT_DATASET_BUDGET
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise RegistryError(f"${ENV_DEFAULT_BUDGET}={text!r} must be an ε > 0.")
    return value


def default_delta() -> float:
    """δ budget a data set gets when first registered without ``privacy.dataset_delta``: ``$LIGHTNING_DP_DEFAULT_DELTA``,
    else 1e-3.

    Raises:
        RegistryError: the variable is not a number in (0, 1).
    """
    text = os.environ.get(ENV_DEFAULT_DELTA)
    if not text:
        return DEFAULT_DATASET_DELTA
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise RegistryError(f"${ENV_DEFAULT_DELTA}={text!r} must be a δ in (0, 1).")
    return value


def default_location() -> Path:
    """The embedded default: ``$XDG_DATA_HOME/lightning-dp/budget.sqlite`` (``~/.local/share/...``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "lightning-dp" / "budget.sqlite"


def resolve_url(setting: str | None, *, saved: bool = True) -> str:
    """The SQLAlchemy URL of ``privacy.registry`` (else ``$LIGHTNING_DP_REGISTRY``, else the default SQLite file).

    Accepts a file path (SQLite), ``sqlite:///PATH`` and ``postgresql://USER@HOST[:PORT]/DB``. A password may not
    stand in ``privacy.registry``, because the run's config is saved beside its checkpoint: put it in
    ``PGPASSWORD`` or ``~/.pgpass``, or give the whole URL in ``$LIGHTNING_DP_REGISTRY``.

    Args:
        setting: ``privacy.registry`` (or a URL given to a command).
        saved: the setting is saved with the run (a password is refused).

    Raises:
        RegistryError: an unknown scheme or a password in the config.
    """
    from_config = setting not in (None, "")
    value = str(setting) if from_config else os.environ.get(ENV_URL) or str(default_location())
    if "://" not in value:
        return f"sqlite:///{Path(value).expanduser().resolve()}"
    try:
        url = make_url(value)
    except exc.ArgumentError as err:
        raise RegistryError(f"privacy.registry={value!r} is not a database URL ({err}). Use a file path, "
                            "sqlite:///PATH or postgresql://USER@HOST:PORT/DB.") from err
    scheme = url.drivername.split("+")[0]
    if scheme not in SCHEMES:
        raise RegistryError(f"privacy.registry={url.render_as_string()!r}: unknown database {scheme!r}; valid: "
                            f"{', '.join(SCHEMES)} (a file path means SQLite).")
    if from_config and saved and url.password:
        raise RegistryError("privacy.registry holds a password, and the run's config is saved beside its checkpoint: "
                            f"drop it from the URL and put it in PGPASSWORD or ~/.pgpass (or the whole URL in ${ENV_URL}).")
    if scheme == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def public_label(name: str | None) -> str:
    """How a run's streams and files name its data set: the owner's ``privacy.dataset_name`` (public config), never
    what the registry knows from the rows (an unnamed data set's ``fp-...`` name is a keyed function of the rows: two
    runs' logs naming it would tell D from D plus one row)."""
    return (f"data set {name!r}" if name else
            "the unnamed data set (its name, for the registry's owner: python -m lightning_dp.budget list)")


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=float).encode()


@dataclass(frozen=True)
class Dataset:
    """A data set's row: its id, the name runs and commands use, and its ε budget."""

    id: int
    name: str
    budget_epsilon: float
    budget_delta: float = DEFAULT_DATASET_DELTA
    separate: bool = False


@dataclass(frozen=True)
class RunRow:
    """A run as the registry holds it (tags verified)."""

    run_id: str
    dataset_id: int
    output_dir: str
    target_epsilon: float
    delta: float
    claim_epsilon: float
    epsilon_spent: float
    epsilon_committed: float
    seq: int
    state: dict[str, Any]
    external_of: str | None
    active: bool
    live: bool
    host: str | None
    pid: int | None
    created_at: str
    closed_at: str | None

    @property
    def charge(self) -> float:
        """What the run holds of its data set's budget: its claim while active, its spend after it ended."""
        return max(self.claim_epsilon, self.epsilon_committed) if self.active else self.epsilon_committed

    @property
    def delta_charge(self) -> float:
        """The δ the run holds: its δ while active or once it released anything; 0 for an ended run that released
        nothing."""
        return _delta_charge(self.active, self.delta, self.epsilon_committed)


def _delta_charge(active: bool, delta: float, committed: float) -> float:
    return float(delta) if active or committed > 0 else 0.0


@dataclass(frozen=True)
class StoredPayload:
    """The values of a run's latest durable block as the registry holds them (tag verified): the file's path in the
    run folder, its bytes, and the run's ``seq`` of the charge that stored them."""

    run_id: str
    seq: int
    path: str
    data: bytes


@dataclass(frozen=True)
class Lease:
    """This process's right to record releases for ``run_id`` (one process at a time); ``label`` names its data set in
    messages (:func:`public_label`)."""

    run_id: str
    token: str
    dataset: Dataset
    claim_epsilon: float
    label: str = "the unnamed data set"


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live(row: Any, now: float) -> bool:
    """True while a run's lease is held by a process that is still there (heartbeat fresh; on this host, alive)."""
    if not row.active or row.lease is None or row.heartbeat_at is None or now - row.heartbeat_at > LEASE_TTL_S:
        return False
    return row.host != socket.gethostname() or _pid_alive(row.pid)


def _total(state: dict[str, Any]) -> int:
    return sum(int(r["count"]) for r in state.get("releases", []))


class Registry:
    """The budget registry at a database URL (see :func:`resolve_url`); tables are created on first use.

    Args:
        url: a SQLAlchemy URL (``sqlite:///...``, ``postgresql+psycopg://...``) or a setting for :func:`resolve_url`.
        connect_timeout_s: give up reaching a PostgreSQL server after this long.
        lock_timeout_s: give up waiting for another process's transaction after this long.

    Raises:
        RegistryError: the database cannot be reached or created, or the key does not fit it.
    """

    def __init__(self, url: str | None = None, *, connect_timeout_s: float = 10.0, lock_timeout_s: float = 60.0) -> None:
        self.url = resolve_url(url, saved=False)
        parsed = make_url(self.url)
        self.dialect = parsed.drivername.split("+")[0]
        self.display = parsed.render_as_string(hide_password=True)
        self.engine = self._engine(parsed, connect_timeout_s, lock_timeout_s)
        self.host = socket.gethostname()
        with self._errors("open"):
            self._key = self._setup()

    # ------------------------------------------------------------------ connection
    def _engine(self, url: Any, connect_timeout_s: float, lock_timeout_s: float) -> Engine:
        if self.dialect == "sqlite":
            path = Path(url.database or "")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise RegistryError(f"The budget registry's folder {str(path.parent)!r} cannot be created ({err}). Set "
                                    "privacy.registry=PATH to a writable place.") from err
            engine = create_engine(url, connect_args={"timeout": lock_timeout_s})

            @event.listens_for(engine, "connect")
            def _connect(dbapi_connection: Any, record: Any) -> None:
                dbapi_connection.isolation_level = None  # transactions begin below, not in the driver
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=FULL")  # a committed release survives a power cut
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.close()

            @event.listens_for(engine, "begin")
            def _begin(conn: Connection) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock at once: no two deciders at a time

            return engine
        options = f"-c lock_timeout={int(lock_timeout_s * 1000)} -c statement_timeout={int(2 * lock_timeout_s * 1000)}"
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2,
                             connect_args={"connect_timeout": max(1, int(connect_timeout_s)), "options": options,
                                           "application_name": "lightning-dp"})

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except exc.SQLAlchemyError as err:
            detail = str(getattr(err, "orig", None) or err).strip().splitlines()[0][:300]
            raise RegistryError(f"The budget registry at {self.display} failed to {what} ({type(err).__name__}: "
                                f"{detail}). Nothing was released; check that the database is reachable "
                                "(privacy.registry, or $LIGHTNING_DP_REGISTRY) and retry.") from err

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[Connection]:
        with self._errors(what), self.engine.begin() as conn:
            yield conn

    def _lock_dataset(self, conn: Connection, dataset_id: int) -> Dataset:
        row = conn.execute(select(t.datasets).where(t.datasets.c.id == dataset_id).with_for_update()).one_or_none()
        if row is None:
            raise RegistryError(f"The budget registry at {self.display} has no data set {dataset_id}.")
        return self._dataset(row)

    def _setup(self) -> bytes:
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":  # one creator at a time (concurrent CREATE TABLE races on the catalog)
                conn.execute(text("SELECT pg_advisory_xact_lock(24240024)"))
            t.metadata.create_all(conn)
            stored = {r.name: r.value for r in conn.execute(select(t.meta))}
            env = os.environ.get(ENV_KEY)
            if not stored:
                key = env.encode() if env else secrets.token_bytes(32)
                rows = [{"name": "schema_version", "value": t.SCHEMA_VERSION},
                        {"name": "key_check", "value": self._check_value(key)}]
                if not env:
                    rows.append({"name": "key", "value": key.hex()})
                conn.execute(insert(t.meta), rows)
                return key
            if stored.get("schema_version") == "1":  # a δ budget and the separate mark per data set (sketches: new table)
                conn.execute(text("ALTER TABLE ldp_datasets ADD COLUMN budget_delta FLOAT"))
                conn.execute(text("ALTER TABLE ldp_datasets ADD COLUMN separate BOOLEAN NOT NULL DEFAULT FALSE"))
                conn.execute(update(t.meta).where(t.meta.c.name == "schema_version").values(value=t.SCHEMA_VERSION))
                stored["schema_version"] = t.SCHEMA_VERSION
        if stored.get("schema_version") != t.SCHEMA_VERSION:
            raise RegistryError(f"The budget registry at {self.display} has schema version "
                                f"{stored.get('schema_version')!r}; this lightning-dp reads {t.SCHEMA_VERSION!r}.")
        if "key" in stored:
            key = bytes.fromhex(stored["key"])
            if env and env.encode() != key:
                raise RegistryError(f"${ENV_KEY} is set, but the registry at {self.display} keeps its own key: unset it.")
        elif env:
            key = env.encode()
        else:
            raise RegistryError(f"The registry at {self.display} seals its records with a key from ${ENV_KEY}; set it.")
        if not hmac.compare_digest(stored.get("key_check", ""), self._check_value(key)):
            raise RegistryError(f"${ENV_KEY} is not the key of the registry at {self.display}: its records cannot be "
                                "checked. Set the key the registry was created with.")
        return key

    @staticmethod
    def _check_value(key: bytes) -> str:
        return hmac.new(key, b"lightning-dp/registry-key-check", hashlib.sha256).hexdigest()

    # ------------------------------------------------------------------ tags
    def _mac(self, *parts: Any) -> str:
        return hmac.new(self._key, _canonical(parts), hashlib.sha256).hexdigest()

    def seal(self, state: dict[str, Any]) -> str:
        """The integrity tag of a ledger state (all keys but ``integrity``); travels with the run's files."""
        return self._mac("ledger", {k: v for k, v in state.items() if k != "integrity"})

    def check_seal(self, state: dict[str, Any], where: str) -> None:
        """Refuse a ledger state whose tag is missing or wrong (the file was edited, or sealed by another registry).

        Raises:
            TamperedError: with ``where`` named.
        """
        tag = state.get("integrity")
        if not isinstance(tag, str) or not hmac.compare_digest(tag, self.seal(state)):
            what = "carries no integrity tag" if tag is None else "does not match its integrity tag"
            raise TamperedError(f"The ledger in {where} {what}: it was edited, or written under another budget "
                                f"registry than {self.display}. The run cannot be resumed from it; resume_external=true "
                                "starts a new run from the checkpoint and charges its ledger to the data set again.")

    def fingerprint(self, digests: np.ndarray, *, kind: str) -> str:
        """The data set's keyed fingerprint: HMAC of its sorted canonical row digests (order of rows ignored).

        Args:
            digests: one unkeyed 64-bit digest per row (``lightning_dp.data.canonical.row_digests``), shape (n,).
            kind: ``"tabular"`` or ``"image"``.
        """
        rows = np.sort(np.asarray(digests, dtype=np.uint64)).astype("<u8")  # (n,)
        mac = hmac.new(self._key, f"lightning-dp/dataset/v1/{kind}/".encode(), hashlib.sha256)
        mac.update(rows.tobytes())
        return mac.hexdigest()

    def _dataset_tag(self, dataset_id: int, name: str, budget: float, delta: float | None = None,
                     separate: bool = False) -> str:
        if delta is None and not separate:  # as schema 1 tagged it
            return self._mac("dataset", dataset_id, name, float(budget))
        return self._mac("dataset", dataset_id, name, float(budget), delta, bool(separate))

    def _dataset(self, row: Any) -> Dataset:
        if not hmac.compare_digest(row.tag, self._dataset_tag(row.id, row.name, row.budget_epsilon, row.budget_delta,
                                                              row.separate)):
            raise TamperedError(f"The budget registry's row for data set {row.name!r} was changed outside lightning-dp "
                                f"(its tag does not match). Budgets change only with python -m lightning_dp.budget "
                                "set/raise; restore the row from a backup.")
        return Dataset(id=row.id, name=row.name, budget_epsilon=row.budget_epsilon, separate=bool(row.separate),
                       budget_delta=default_delta() if row.budget_delta is None else float(row.budget_delta))

    def _run_tag(self, run_id: str, dataset_id: int, seq: int, state_text: str, claim: float, spent: float,
                 committed: float) -> str:
        return self._mac("run", run_id, dataset_id, seq, state_text, float(claim), float(spent), float(committed))

    def _payload_tag(self, run_id: str, seq: int, path: str, data: bytes) -> str:
        return self._mac("payload", run_id, int(seq), path, hashlib.sha256(data).hexdigest())

    def _run(self, row: Any, now: float | None = None) -> RunRow:
        if not hmac.compare_digest(row.tag, self._run_tag(row.run_id, row.dataset_id, row.seq, row.state,
                                                          row.claim_epsilon, row.epsilon_spent, row.epsilon_committed)):
            raise TamperedError(f"The budget registry's row for run {row.run_id} was changed outside lightning-dp (its "
                                "tag does not match); its spend cannot be trusted. Restore it from a backup.")
        return RunRow(run_id=row.run_id, dataset_id=row.dataset_id, output_dir=row.output_dir,
                      target_epsilon=row.target_epsilon, delta=row.delta, claim_epsilon=row.claim_epsilon,
                      epsilon_spent=row.epsilon_spent, epsilon_committed=row.epsilon_committed, seq=row.seq,
                      state=json.loads(row.state), external_of=row.external_of, active=bool(row.active),
                      live=_live(row, time.time() if now is None else now), host=row.host, pid=row.pid,
                      created_at=row.created_at, closed_at=row.closed_at)

    def _event(self, conn: Connection, action: str, *, dataset_id: int | None = None, run_id: str | None = None,
               **detail: Any) -> None:
        conn.execute(insert(t.events).values(at=_now(), actor=actor(), action=action, dataset_id=dataset_id,
                                             run_id=run_id, detail=json.dumps(detail, default=str)))

    # ------------------------------------------------------------------ data sets
    def dataset_for(self, fingerprint: str, *, name: str | None = None, budget: float | None = None,
                    sketch: np.ndarray | None = None, budget_delta: float | None = None) -> Dataset:
        """The data set these rows belong to, registering them (or this version of a known data set) on first sight.

        Rows not seen before join the data set they mostly are (:meth:`overlaps`: more than the registry's overlap
        threshold of one set's rows in the other, either way), so a changed file is charged to the data set it
        changes; without such a data set they form a new one, unless the registry accepts registered data sets only.

        Args:
            fingerprint: :meth:`fingerprint` of the rows.
            name: ``privacy.dataset_name``: the owner's name; rows first seen under it join its budget.
            budget: ``privacy.dataset_budget``: the ε budget of a data set registered now; for a known one it must
                equal the registered budget (a change is an explicit act: ``python -m lightning_dp.budget``).
            sketch: :meth:`sketch` of the rows (``None``: no overlap check, nothing kept for later ones).
            budget_delta: ``privacy.dataset_delta``: the δ budget of a data set registered now.

        Raises:
            RegistryError: the rows are registered under another name, overlap a data set other than the one they
                would join, are new to a registry that accepts registered data sets only, or ``budget`` disagrees.
        """
        if budget is not None and not (math.isfinite(budget) and budget > 0):
            raise RegistryError(f"privacy.dataset_budget must be a finite ε > 0, got {budget!r}.")
        if budget_delta is not None and not 0 < budget_delta < 1:
            raise RegistryError(f"privacy.dataset_delta must be a δ in (0, 1), got {budget_delta!r}.")
        for attempt in range(3):  # two first sightings at once on PostgreSQL: the loser retries and finds the row
            try:
                with self._transaction("register the data set") as conn:
                    return self._dataset_for(conn, fingerprint, name, budget, sketch, budget_delta)
            except RegistryError as err:
                if attempt == 2 or not isinstance(err.__cause__, exc.IntegrityError):
                    raise
        raise AssertionError("unreachable")

    def find_dataset(self, fingerprint: str) -> Dataset | None:
        """The data set these rows were registered under, or ``None`` (nothing is registered)."""
        with self._errors("read the data set"), self.engine.connect() as conn:
            row = conn.execute(select(t.datasets).join(t.fingerprints, t.fingerprints.c.dataset_id == t.datasets.c.id)
                               .where(t.fingerprints.c.fingerprint == fingerprint)).one_or_none()
        return None if row is None else self._dataset(row)

    def sketch(self, digests: np.ndarray) -> np.ndarray:
        """The rows' keyed bottom-k sketch (``lightning_dp/budget/sketch.py``), from their canonical row digests."""
        return sk.bottom_k(sk.keyed_hashes(digests, self._key))

    def overlaps(self, conn: Connection, sketch: np.ndarray) -> dict[int, float]:
        """Data sets whose registered versions share more than the overlap threshold of their rows with ``sketch``'s
        (the larger of the two containments), with that share."""
        threshold = float(self.policy(conn)["overlap_threshold"])
        found: dict[int, float] = {}
        for row in conn.execute(select(t.sketches.c.dataset_id, t.sketches.c.sketch)):
            share = max(sk.containment(sketch, sk.decode(row.sketch)))
            if share > threshold:
                found[row.dataset_id] = max(share, found.get(row.dataset_id, 0.0))
        return found

    def _dataset_for(self, conn: Connection, fingerprint: str, name: str | None, budget: float | None,
                     sketch: np.ndarray | None, budget_delta: float | None) -> Dataset:
        known = conn.execute(select(t.fingerprints.c.dataset_id).where(t.fingerprints.c.fingerprint == fingerprint)
                             ).scalar_one_or_none()
        if known is not None:
            dataset = self._lock_dataset(conn, known)
            if sketch is not None and conn.execute(select(t.sketches.c.fingerprint).where(
                    t.sketches.c.fingerprint == fingerprint)).first() is None:  # registered before sketches (schema 1)
                conn.execute(insert(t.sketches).values(fingerprint=fingerprint, dataset_id=dataset.id,
                                                       sketch=sk.encode(sketch)))
            if name and name != dataset.name:  # the other name stays in the registry (the rows chose it)
                raise RegistryError(f"These rows are registered in the budget registry under another data set name than "
                                    f"{name!r}: leave privacy.dataset_name out, or set the registered name (python -m "
                                    "lightning_dp.budget list shows it to the registry's owner). Nothing was released.")
        else:
            dataset = self._new_version(conn, fingerprint, name, budget, sketch, budget_delta)
        if budget is not None and abs(budget - dataset.budget_epsilon) > TOLERANCE * max(1.0, budget):
            raise RegistryError(f"privacy.dataset_budget={budget:g} differs from the budget the registry holds for "
                                f"{public_label(name)}. Leave privacy.dataset_budget out, or change the budget explicitly: "
                                f"python -m lightning_dp.budget set {name or 'NAME'} {budget:g} --reason TEXT.")
        return dataset

    def _new_version(self, conn: Connection, fingerprint: str, name: str | None, budget: float | None,
                     sketch: np.ndarray | None, budget_delta: float | None) -> Dataset:
        """Rows seen for the first time: the data set they join (by name, or by overlap) or a new one."""
        overlap = self.overlaps(conn, sketch) if sketch is not None else {}
        row = conn.execute(select(t.datasets).where(t.datasets.c.name == name).with_for_update()
                           ).one_or_none() if name else None
        named = self._dataset(row) if row is not None else None
        if named is None and not name and len(overlap) == 1:  # a changed file of a known data set: charged to it
            named = self._lock_dataset(conn, next(iter(overlap)))
        others = [d for d in overlap if named is None or d != named.id]
        if others and not (named is not None and named.separate):
            raise RegistryError(
                "These rows are for the most part the rows of " + ("another registered data set" if len(others) == 1
                                                                   else f"{len(others)} registered data sets")
                + (f" than {name!r}" if name else "") + ", so they share its budget. Run them under that data set's "
                "privacy.dataset_name (python -m lightning_dp.budget list shows the registry's owner which), or the "
                "owner declares a separate data set: python -m lightning_dp.budget set NAME EPSILON --create --separate "
                "--reason TEXT, then privacy.dataset_name=NAME. Nothing was released.")
        if named is not None:
            dataset = named
            self._event(conn, "new_version", dataset_id=dataset.id, fingerprint=fingerprint[:16],
                        overlap=round(overlap[dataset.id], 3) if dataset.id in overlap else None)
        elif self.policy(conn)["registered_only"]:
            raise RegistryError(
                "The budget registry accepts registered data sets only, and these rows belong to none"
                + (f" (no data set {name!r})" if name else "") + ". The data's owner registers it: python -m "
                "lightning_dp.budget set NAME EPSILON --create --reason TEXT; then run with privacy.dataset_name=NAME. "
                "Nothing was released.")
        else:
            dataset = self._create(conn, name or f"fp-{fingerprint[:12]}", budget, budget_delta=budget_delta,
                                   source="privacy.dataset_budget" if budget is not None else "default")
        conn.execute(insert(t.fingerprints).values(fingerprint=fingerprint, dataset_id=dataset.id, first_seen=_now()))
        if sketch is not None:
            conn.execute(insert(t.sketches).values(fingerprint=fingerprint, dataset_id=dataset.id,
                                                   sketch=sk.encode(sketch)))
        return dataset

    def _create(self, conn: Connection, name: str, budget: float | None, *, source: str,
                budget_delta: float | None = None, separate: bool = False) -> Dataset:
        value = default_budget() if budget is None else float(budget)
        delta = default_delta() if budget_delta is None else float(budget_delta)
        stamp = _now()
        dataset_id = conn.execute(insert(t.datasets).values(name=name, budget_epsilon=value, budget_delta=delta,
                                                            separate=separate, created_at=stamp, updated_at=stamp,
                                                            tag="")).inserted_primary_key[0]
        conn.execute(update(t.datasets).where(t.datasets.c.id == dataset_id)
                     .values(tag=self._dataset_tag(dataset_id, name, value, delta, separate)))
        # kept in the registry's event log (``python -m lightning_dp.budget list/show``), not in the run's streams:
        # whether rows are new to the registry is a function of the rows
        self._event(conn, "create_dataset", dataset_id=dataset_id, name=name, budget_epsilon=value, budget_delta=delta,
                    separate=separate, source=source)
        return Dataset(id=dataset_id, name=name, budget_epsilon=value, budget_delta=delta, separate=separate)

    def set_budget(self, name: str, epsilon: float, *, reason: str, only_raise: bool = False, create: bool = False,
                   delta: float | None = None, separate: bool | None = None) -> tuple[float | None, Dataset]:
        """Set a data set's budget (an explicit act, logged with who, when and why).

        Args:
            name: the data set's name (``fp-...`` for an unnamed one).
            epsilon: the new ε budget.
            reason: why; kept in the event log.
            only_raise: refuse a value below the current budget (``raise``), ε or δ.
            create: register a named data set that does not exist yet (its runs then attach by
                ``privacy.dataset_name``).
            delta: the new δ budget (``None``: unchanged; the default for a new data set).
            separate: mark the data set separate (rows that overlap other data sets may join it) or not; ``None``:
                unchanged.

        Returns:
            The previous ε budget (``None`` when created) and the data set.

        Raises:
            RegistryError: unknown name, ε not > 0, δ not in (0, 1), or a lower value under ``only_raise``.
        """
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise RegistryError(f"A budget must be a finite ε > 0, got {epsilon!r}.")
        if delta is not None and not 0 < delta < 1:
            raise RegistryError(f"A δ budget must be in (0, 1), got {delta!r}.")
        if not reason.strip():
            raise RegistryError("Say why with --reason TEXT: a budget change is logged with who, when and why.")
        with self._transaction("change the budget") as conn:
            row = conn.execute(select(t.datasets).where(t.datasets.c.name == name).with_for_update()).one_or_none()
            if row is None:
                if not create:
                    raise RegistryError(f"No data set {name!r} in the registry at {self.display}; list them with "
                                        "python -m lightning_dp.budget list (or pass --create to register a name).")
                return None, self._create(conn, name, epsilon, source=f"set: {reason}", budget_delta=delta,
                                          separate=bool(separate))
            dataset = self._dataset(row)
            new_delta = dataset.budget_delta if delta is None else float(delta)
            new_separate = dataset.separate if separate is None else bool(separate)
            if only_raise and (epsilon < dataset.budget_epsilon or new_delta < dataset.budget_delta):
                raise RegistryError(f"raise only increases a budget: {name!r} has ε = {dataset.budget_epsilon:g}, δ = "
                                    f"{dataset.budget_delta:g}; use set to lower it.")
            conn.execute(update(t.datasets).where(t.datasets.c.id == dataset.id).values(
                budget_epsilon=float(epsilon), budget_delta=new_delta, separate=new_separate, updated_at=_now(),
                tag=self._dataset_tag(dataset.id, dataset.name, float(epsilon), new_delta, new_separate)))
            self._event(conn, "raise_budget" if only_raise else "set_budget", dataset_id=dataset.id,
                        before=dataset.budget_epsilon, after=float(epsilon), delta_before=dataset.budget_delta,
                        delta_after=new_delta, separate=new_separate, reason=reason)
        log.warning("Budget of data set %r changed from ε = %g, δ = %g to ε = %g, δ = %g by %s (%s).", name,
                    dataset.budget_epsilon, dataset.budget_delta, epsilon, new_delta, actor(), reason)
        return dataset.budget_epsilon, Dataset(id=dataset.id, name=dataset.name, budget_epsilon=float(epsilon),
                                               budget_delta=new_delta, separate=new_separate)

    # ------------------------------------------------------------------ policy
    def policy(self, conn: Connection | None = None) -> dict[str, Any]:
        """The owner's registry-wide settings: ``registered_only`` (runs may not register new data sets) and
        ``overlap_threshold`` (the share of rows above which new rows are charged to a registered data set)."""
        if conn is None:
            with self._errors("read the policy"), self.engine.connect() as c:
                return self.policy(c)
        stored = {r.name: r.value for r in conn.execute(select(t.meta).where(
            t.meta.c.name.in_(("registered_only", "overlap_threshold"))))}
        return {"registered_only": stored.get("registered_only") == "true",
                "overlap_threshold": float(stored.get("overlap_threshold", OVERLAP_THRESHOLD))}

    def set_policy(self, *, reason: str, registered_only: bool | None = None,
                   overlap_threshold: float | None = None) -> dict[str, Any]:
        """Change the policy (an explicit act, logged).

        Raises:
            RegistryError: no reason, or a threshold outside (0, 1).
        """
        if not reason.strip():
            raise RegistryError("Say why with --reason TEXT: a policy change is logged with who, when and why.")
        if overlap_threshold is not None and not 0 < overlap_threshold < 1:
            raise RegistryError(f"--overlap-threshold must be in (0, 1), got {overlap_threshold!r}.")
        changes = {k: v for k, v in (("registered_only", None if registered_only is None else
                                      ("true" if registered_only else "false")),
                                     ("overlap_threshold", None if overlap_threshold is None else
                                      repr(float(overlap_threshold)))) if v is not None}
        with self._transaction("change the policy") as conn:
            before = self.policy(conn)
            for key, value in changes.items():
                done = conn.execute(update(t.meta).where(t.meta.c.name == key).values(value=value)).rowcount
                if not done:
                    conn.execute(insert(t.meta).values(name=key, value=value))
            after = self.policy(conn)
            self._event(conn, "set_policy", before=before, after=after, reason=reason)
        return after

    # ------------------------------------------------------------------ runs
    def _charges(self, conn: Connection, dataset_id: int, *, besides: str) -> tuple[float, float]:
        """What the data set's other runs hold, (ε, δ): claims of active runs, spends of ended ones (δ: each run's δ,
        once it is active or released anything; basic composition, see the module docstring)."""
        c = t.runs.c
        rows = conn.execute(select(c.active, c.claim_epsilon, c.epsilon_committed, c.delta)
                            .where(c.dataset_id == dataset_id, c.run_id != besides)).all()
        eps = sum(max(r.claim_epsilon, r.epsilon_committed) if r.active else r.epsilon_committed for r in rows)
        return float(eps), float(sum(_delta_charge(r.active, r.delta, r.epsilon_committed) for r in rows))

    @staticmethod
    def _check_delta(dataset: Dataset, others: float, delta: float, label: str, command: str) -> None:
        if others + delta > dataset.budget_delta * (1 + TOLERANCE):
            raise DatasetBudgetError(
                f"The δ budget of {label} is {dataset.budget_delta:g} across all its runs (their δ add up); its "
                f"other runs hold δ = {others:.3g}, so this run's privacy.delta={delta:g} does not fit. Nothing was "
                f"released. Lower privacy.delta, or raise the δ budget: python -m lightning_dp.budget raise {command} "
                "EPSILON --delta DELTA --reason TEXT.")

    def open_run(self, *, run_id: str, dataset: Dataset, ledger: PrivacyLedger, output_dir: str | Path,
                 external_of: str | None = None, name: str | None = None) -> Lease:
        """Start or resume a run on a data set: take its lease and claim its target ε from the data set's budget.

        A new run is recorded with ``ledger``'s state (empty for a fresh run; a checkpoint's for
        ``external_of``, charged in full). A known run must be idle (no live lease) and on the same data set.
        ``name`` is the run's ``privacy.dataset_name``: messages name the data set by it only (:func:`public_label`).

        Raises:
            RunBusyError: the run, or another run writing to ``output_dir``, is live in another process.
            DatasetBudgetError: the other runs' charges plus this run's target exceed the data set's budget.
            RegistryError: the run belongs to another data set, or its row was edited.
        """
        out, now = str(Path(output_dir).resolve()), time.time()
        state = {k: v for k, v in ledger.state_dict().items() if k != "integrity"}
        target, spent, committed = ledger.target_epsilon, ledger.spent, ledger.epsilon([*ledger.releases,
                                                                                          *ledger.reserved])
        token, label, command = secrets.token_hex(16), public_label(name), name or "NAME"
        with self._transaction("start the run") as conn:
            locked = self._lock_dataset(conn, dataset.id)
            c = t.runs.c
            for other in conn.execute(select(t.runs).where(c.output_dir == out, c.run_id != run_id, c.active)).all():
                if _live(other, now):
                    raise RunBusyError(f"Run {other.run_id} ({other.host}, pid {other.pid}) is writing to {out} now. "
                                       "Wait for it to end, or choose another output_dir.")
                # a run whose process died in this folder (e.g. killed before its first file was written): from now on
                # it is charged what it spent, not its claim; resuming it claims again
                conn.execute(update(t.runs).where(c.run_id == other.run_id).values(
                    active=False, lease=None, heartbeat_at=None, closed_at=_now(), updated_at=_now()))
                self._event(conn, "end_run", dataset_id=other.dataset_id, run_id=other.run_id,
                            outcome=f"ended: its process is gone and run {run_id} took its folder")
            row = conn.execute(select(t.runs).where(c.run_id == run_id).with_for_update()).one_or_none()
            if row is not None:
                known = self._run(row, now)
                if known.dataset_id != dataset.id:
                    raise RegistryError(f"Run {run_id} was trained on another data set than these rows: resume it with "
                                        "its own data (data.*).")
                if known.live:
                    raise RunBusyError(f"Run {run_id} is running now ({known.host}, pid {known.pid}); a run is resumed "
                                       "by one process at a time. Wait for it to end.")
            others, others_delta = self._charges(conn, dataset.id, besides=run_id)
            if others + target > locked.budget_epsilon * (1 + TOLERANCE):
                raise DatasetBudgetError(
                    f"The budget of {label} is ε = {locked.budget_epsilon:g} across all its runs; its "
                    f"other runs hold ε = {others:.4g}, so this run's privacy.epsilon={target:g} does not fit (ε = "
                    f"{max(locked.budget_epsilon - others, 0):.4g} left). Nothing was released. Lower privacy.epsilon, "
                    f"or raise the budget: python -m lightning_dp.budget raise {command} EPSILON --reason TEXT.")
            self._check_delta(locked, others_delta, ledger.delta, label, command)
            lease = dict(active=True, lease=token, host=self.host, pid=os.getpid(), heartbeat_at=now, output_dir=out,
                         claim_epsilon=target, updated_at=_now(), closed_at=None)
            if row is None:
                if committed > target * (1 + TOLERANCE):
                    raise DatasetBudgetError(f"The checkpoint's ledger holds ε = {committed:.4g}, above its target "
                                             f"{target:g}: it cannot be continued.")
                text_state = json.dumps(state, default=float)
                conn.execute(insert(t.runs).values(
                    run_id=run_id, dataset_id=dataset.id, target_epsilon=target, delta=ledger.delta, epsilon_spent=spent,
                    epsilon_committed=committed, seq=1, state=text_state, external_of=external_of, created_at=_now(),
                    tag=self._run_tag(run_id, dataset.id, 1, text_state, target, spent, committed), **lease))
                self._insert_releases(conn, run_id, state["releases"], start=0)
                self._event(conn, "external_run" if external_of else "start_run", dataset_id=dataset.id, run_id=run_id,
                            target_epsilon=target, charged_epsilon=committed, output_dir=out, checkpoint=external_of)
            else:
                seq, text_state, spent_, committed_ = row.seq, row.state, row.epsilon_spent, row.epsilon_committed
                if _total(state) > _total(known.state):  # a checkpoint one block ahead of the record: catch up
                    self._check_extends(known.state, state, run_id)
                    if committed > target * (1 + TOLERANCE):
                        raise DatasetBudgetError(f"Run {run_id}'s checkpoint holds ε = {committed:.4g}, above its "
                                                 f"target {target:g}: it cannot be continued.")
                    seq, text_state, spent_, committed_ = row.seq + 1, json.dumps(state, default=float), spent, committed
                    self._update_releases(conn, run_id, known.state["releases"], state["releases"])
                conn.execute(update(t.runs).where(c.run_id == run_id).values(
                    seq=seq, state=text_state, epsilon_spent=spent_, epsilon_committed=committed_,
                    tag=self._run_tag(run_id, dataset.id, seq, text_state, target, spent_, committed_), **lease))
                self._event(conn, "resume_run", dataset_id=dataset.id, run_id=run_id, output_dir=out,
                            taken_over_from=f"{row.host} pid {row.pid}" if row.active else None)
        return Lease(run_id=run_id, token=token, dataset=locked, claim_epsilon=target, label=label)

    def run(self, run_id: str) -> RunRow | None:
        """The run's row (tag checked), or ``None`` when the registry does not know it."""
        with self._errors("read the run"), self.engine.connect() as conn:
            row = conn.execute(select(t.runs).where(t.runs.c.run_id == run_id)).one_or_none()
        return None if row is None else self._run(row)

    def record(self, lease: Lease, ledger: PrivacyLedger, payload: Payload | None = None) -> None:
        """Check the ledger's new state against the data set's budget and make it the run's record, in one transaction.

        Called by the ledger before a release's value is used or saved (``PrivacyLedger.register``). The new state
        must extend the recorded one (the registry never goes back). With ``payload`` (a durable block's values as the
        bytes of their file, not yet written), the run's stored payload is replaced by it in the same transaction: the
        charge and the values become durable together (``PrivacyLedger._persist``); without, the stored one stays.

        Raises:
            RunBusyError: another process took the run over (its lease is no longer ours).
            DatasetBudgetError: the data set's budget (e.g. lowered since the run started) has no room.
            RegistryError: the new state does not extend the recorded one.
        """
        state = {k: v for k, v in ledger.state_dict().items() if k != "integrity"}
        spent, committed = ledger.spent, ledger.epsilon([*ledger.releases, *ledger.reserved])
        text_state = json.dumps(state, default=float)
        c = t.runs.c
        with self._transaction("record the release") as conn:
            dataset = self._lock_dataset(conn, lease.dataset.id)
            row = conn.execute(select(t.runs).where(c.run_id == lease.run_id).with_for_update()).one()
            if row.lease != lease.token or not row.active:
                raise RunBusyError(f"Run {lease.run_id} was taken over by another process ({row.host}, pid {row.pid}); "
                                   "this one stops without releasing anything more.")
            known = self._run(row)
            self._check_extends(known.state, state, lease.run_id)
            others, others_delta = self._charges(conn, dataset.id, besides=lease.run_id)
            self._check_delta(dataset, others_delta, ledger.delta, lease.label, "NAME")
            if committed > row.claim_epsilon * (1 + TOLERANCE) or others + committed > dataset.budget_epsilon * (
                    1 + TOLERANCE):
                raise DatasetBudgetError(
                    f"This release would bring the runs of {lease.label} to ε = {others + committed:.4g}, above "
                    f"its budget ε = {dataset.budget_epsilon:g}. Nothing was released. Raise the budget (python -m "
                    "lightning_dp.budget raise NAME EPSILON --reason TEXT), then resume with resume=last.")
            seq = row.seq + 1
            conn.execute(update(t.runs).where(c.run_id == lease.run_id).values(
                state=text_state, seq=seq, epsilon_spent=spent, epsilon_committed=committed, heartbeat_at=time.time(),
                updated_at=_now(), tag=self._run_tag(lease.run_id, dataset.id, seq, text_state, row.claim_epsilon,
                                                     spent, committed)))
            self._update_releases(conn, lease.run_id, known.state["releases"], state["releases"])
            if payload is not None:
                self._store_payload(conn, lease.run_id, seq, payload.path, payload.data)

    def _store_payload(self, conn: Connection, run_id: str, seq: int, path: str, data: bytes) -> None:
        parts = PurePosixPath(path).parts
        if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
            raise RegistryError(f"Run {run_id}: the values' file {path!r} is not a path inside the run folder.")
        conn.execute(delete(t.payloads).where(t.payloads.c.run_id == run_id))
        conn.execute(insert(t.payloads).values(run_id=run_id, seq=seq, path=path, data=data, created_at=_now(),
                                               tag=self._payload_tag(run_id, seq, path, data)))

    def payload(self, run_id: str) -> StoredPayload | None:
        """The values of the run's latest durable block (tag checked), or ``None`` (none stored, or the run ended).

        Raises:
            TamperedError: the stored bytes, path or run were changed outside lightning-dp.
        """
        with self._errors("read the run's saved values"), self.engine.connect() as conn:
            row = conn.execute(select(t.payloads).where(t.payloads.c.run_id == run_id)).one_or_none()
        if row is None:
            return None
        data = bytes(row.data)
        if not hmac.compare_digest(row.tag, self._payload_tag(row.run_id, row.seq, row.path, data)):
            raise TamperedError(f"The budget registry's saved values of run {run_id} ({row.path}) were changed outside "
                                "lightning-dp (their tag does not match): they cannot be trusted, and the run cannot "
                                "be resumed from them. Restore the registry from a backup.")
        return StoredPayload(run_id=row.run_id, seq=int(row.seq), path=row.path, data=data)

    @staticmethod
    def _check_extends(old: dict[str, Any], new: dict[str, Any], run_id: str) -> None:
        """The registry never goes back: ``new`` must hold every release of ``old``, counts no smaller."""
        if _total(new) < _total(old):
            raise RegistryError(f"Run {run_id}: the new ledger state holds fewer releases than the registry's.")
        from lightning_dp.privacy.ledger import PrivacyLedger

        try:
            PrivacyLedger.most_advanced([("the budget registry", old), ("the run", new)])
        except ValueError as err:
            raise RegistryError(str(err)) from err

    def _insert_releases(self, conn: Connection, run_id: str, new: Sequence[dict[str, Any]], *, start: int) -> None:
        rows = [{"run_id": run_id, "position": start + i, **self._release_row(r)} for i, r in enumerate(new)]
        if rows:
            conn.execute(insert(t.releases), rows)

    @staticmethod
    def _release_row(r: dict[str, Any]) -> dict[str, Any]:
        keys = ("name", "mechanism", "sensitivity", "noise_multiplier", "epsilon", "sample_rate", "delta", "count",
                "first_at", "last_at")
        return {k: r.get(k) for k in keys}

    def _update_releases(self, conn: Connection, run_id: str, old: Sequence[dict[str, Any]],
                         new: Sequence[dict[str, Any]]) -> None:
        c = t.releases.c
        for i, (before, after) in enumerate(zip(old, new)):
            if before != after:
                conn.execute(update(t.releases).where(c.run_id == run_id, c.position == i)
                             .values(count=int(after["count"]), last_at=after["last_at"]))
        self._insert_releases(conn, run_id, new[len(old):], start=len(old))

    def heartbeat(self, lease: Lease) -> bool:
        """Refresh the lease (a live run keeps it); ``False`` when it was taken over."""
        c = t.runs.c
        with self._transaction("refresh the run's lease") as conn:
            result = conn.execute(update(t.runs).where(c.run_id == lease.run_id, c.lease == lease.token)
                                  .values(heartbeat_at=time.time()))
        return result.rowcount == 1

    def close_run(self, lease: Lease, *, outcome: str = "ended") -> None:
        """End the run's lease: from now on the data set is charged what it spent, not its claim.

        A run that ended normally (``outcome="ended"``) has written every value it was charged, so its stored payload
        is dropped; a stopped run keeps it for its resume.
        """
        c = t.runs.c
        with self._transaction("end the run") as conn:
            result = conn.execute(update(t.runs).where(c.run_id == lease.run_id, c.lease == lease.token).values(
                active=False, lease=None, heartbeat_at=None, closed_at=_now(), updated_at=_now()))
            if result.rowcount:
                self._event(conn, "end_run", dataset_id=lease.dataset.id, run_id=lease.run_id, outcome=outcome)
                if outcome == "ended":
                    conn.execute(delete(t.payloads).where(t.payloads.c.run_id == lease.run_id))

    def end_run(self, run_id: str, *, reason: str) -> float:
        """End a run whose process is gone (an explicit act, logged): its claim shrinks to what it spent.

        Returns:
            The run's charge from now on (its spend).

        Raises:
            RunBusyError: the run is live (its process still refreshes its lease).
            RegistryError: an unknown run, or no reason given.
        """
        if not reason.strip():
            raise RegistryError("Say why with --reason TEXT: ending a run is logged with who, when and why.")
        c = t.runs.c
        with self._transaction("end the run") as conn:
            row = conn.execute(select(t.runs).where(c.run_id == run_id).with_for_update()).one_or_none()
            if row is None:
                raise RegistryError(f"No run {run_id} in the registry at {self.display}.")
            run = self._run(row)
            if run.live:
                raise RunBusyError(f"Run {run_id} is running now ({run.host}, pid {run.pid}); it ends by itself.")
            conn.execute(update(t.runs).where(c.run_id == run_id).values(
                active=False, lease=None, heartbeat_at=None, closed_at=_now(), updated_at=_now()))
            self._event(conn, "end_run", dataset_id=run.dataset_id, run_id=run_id, outcome="ended by command",
                        reason=reason)
        return run.epsilon_committed

    # ------------------------------------------------------------------ reading (the CLI)
    def datasets(self) -> list[Dataset]:
        with self._errors("list the data sets"), self.engine.connect() as conn:
            return [self._dataset(r) for r in conn.execute(select(t.datasets).order_by(t.datasets.c.name))]

    def dataset(self, name: str) -> Dataset:
        with self._errors("read the data set"), self.engine.connect() as conn:
            row = conn.execute(select(t.datasets).where(t.datasets.c.name == name)).one_or_none()
        if row is None:
            raise RegistryError(f"No data set {name!r} in the registry at {self.display}; list them with python -m "
                                "lightning_dp.budget list.")
        return self._dataset(row)

    def runs(self, dataset: Dataset) -> list[RunRow]:
        now = time.time()
        with self._errors("read the runs"), self.engine.connect() as conn:
            rows = conn.execute(select(t.runs).where(t.runs.c.dataset_id == dataset.id).order_by(t.runs.c.created_at))
            return [self._run(r, now) for r in rows]

    def events(self, dataset: Dataset) -> list[dict[str, Any]]:
        with self._errors("read the event log"), self.engine.connect() as conn:
            rows = conn.execute(select(t.events).where(t.events.c.dataset_id == dataset.id).order_by(t.events.c.id))
            return [{"at": r.at, "actor": r.actor, "action": r.action, "run_id": r.run_id, **json.loads(r.detail)}
                    for r in rows]

    def versions(self, dataset: Dataset) -> int:
        with self._errors("read the data set"), self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(t.fingerprints)
                                    .where(t.fingerprints.c.dataset_id == dataset.id)).scalar_one())

    def close(self) -> None:
        self.engine.dispose()
