"""The budget registry's tables (SQLAlchemy Core): data sets, their fingerprints, runs, releases, the values of a run's
latest durable block, and an event log.

One schema for SQLite (the embedded default) and PostgreSQL (teams, many machines). Every budget decision reads
and writes these rows inside one transaction that first locks the data set's row (``SELECT ... FOR UPDATE`` on
PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` write lock), so two processes can never both spend the last of a budget.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

SCHEMA_VERSION = "2"  # 2: a δ budget and the owner's "separate" mark per data set, sketches of the rows
metadata = MetaData()

# registry-wide settings: schema_version, key_check (HMAC of a fixed text: proves LIGHTNING_DP_REGISTRY_KEY is
# this registry's key), key (the HMAC key itself, only when none is supplied from the environment), and the owner's
# policy (``registered_only``, ``overlap_threshold``: python -m lightning_dp.budget policy)
meta = Table(
    "ldp_meta", metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

# one row per data set: its budget (ε, composed across runs by adding their ε) and the owner's name for it
datasets = Table(
    "ldp_datasets", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("budget_epsilon", Float, nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("tag", String(64), nullable=False),  # HMAC over (id, name, budgets, separate): an edit outside lightning-dp shows
    Column("budget_delta", Float, nullable=True),  # Σ δ of its runs may not exceed it (null: the registry's default)
    # the owner declared it separate: rows that overlap other data sets may join it (python -m lightning_dp.budget set
    # NAME E --create --separate); otherwise a version that overlaps another data set is refused
    Column("separate", Boolean, nullable=False, default=False),
)

# keyed fingerprints of the canonical rows that belong to a data set (a named data set may hold several versions)
fingerprints = Table(
    "ldp_fingerprints", metadata,
    Column("fingerprint", String(64), primary_key=True),
    Column("dataset_id", Integer, ForeignKey("ldp_datasets.id"), nullable=False, index=True),
    Column("first_seen", String(32), nullable=False),
)

# a keyed bottom-k sketch of each version's rows (lightning_dp/budget/sketch.py): a changed file that is mostly the same
# rows as a registered data set is charged to it, not given a fresh budget
sketches = Table(
    "ldp_sketches", metadata,
    Column("fingerprint", String(64), ForeignKey("ldp_fingerprints.fingerprint"), primary_key=True),
    Column("dataset_id", Integer, ForeignKey("ldp_datasets.id"), nullable=False, index=True),
    Column("sketch", LargeBinary, nullable=False),
)

# one row per run: its claim on the data set's budget, what it has spent, its whole ledger state, and its lease
runs = Table(
    "ldp_runs", metadata,
    Column("run_id", String(64), primary_key=True),
    Column("dataset_id", Integer, ForeignKey("ldp_datasets.id"), nullable=False, index=True),
    Column("output_dir", Text, nullable=False),
    Column("target_epsilon", Float, nullable=False),
    Column("delta", Float, nullable=False),
    Column("claim_epsilon", Float, nullable=False),       # held while active: the most the run may still spend
    Column("epsilon_spent", Float, nullable=False),       # the ledger's ε of its releases
    Column("epsilon_committed", Float, nullable=False),   # with the budget it reserved for later releases
    Column("seq", Integer, nullable=False),               # number of recorded states (never goes back)
    Column("state", Text, nullable=False),                # the ledger's state_dict (JSON), the run's source of truth
    Column("tag", String(64), nullable=False),            # HMAC over the fields above
    Column("external_of", Text, nullable=True),           # the checkpoint it was started from (resume_external)
    Column("active", Boolean, nullable=False),
    Column("lease", String(64), nullable=True),           # token of the process that may record (one at a time)
    Column("host", String(255), nullable=True),
    Column("pid", Integer, nullable=True),
    Column("heartbeat_at", Float, nullable=True),         # seconds since the epoch, refreshed while it runs
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("closed_at", String(32), nullable=True),
)

# the run's releases as rows (compliance queries in SQL); the same content as ``runs.state``
releases = Table(
    "ldp_releases", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("ldp_runs.run_id"), nullable=False, index=True),
    Column("position", Integer, nullable=False),
    Column("name", String(200), nullable=False),
    Column("mechanism", String(32), nullable=False),
    Column("sensitivity", Float, nullable=False),
    Column("noise_multiplier", Float, nullable=True),
    Column("epsilon", Float, nullable=True),
    Column("sample_rate", Float, nullable=False),
    Column("delta", Float, nullable=False),
    Column("count", Integer, nullable=False),
    Column("first_at", String(32), nullable=False),
    Column("last_at", String(32), nullable=False),
    UniqueConstraint("run_id", "position", name="uq_ldp_release_position"),
)

# the values of a run's latest durable block (lightning_dp/privacy/durable.py, Payload): the bytes of the file that holds
# them and its path in the run folder, stored in the transaction that charges them (Registry.record), so that a run
# killed after the charge and before the file is written resumes from these bytes, never drawing the values again. One
# row per run (the next block's replaces it), dropped when the run ends normally. Added after schema 2: an existing
# registry gains the table when it is opened (``create_all`` creates missing tables), and earlier releases ignore it.
payloads = Table(
    "ldp_payloads", metadata,
    Column("run_id", String(64), ForeignKey("ldp_runs.run_id"), primary_key=True),
    Column("seq", Integer, nullable=False),               # the run's seq of the charge that stored it
    Column("path", Text, nullable=False),                 # relative to the run folder (``checkpoints/last.ckpt``)
    Column("data", LargeBinary, nullable=False),          # SQLite BLOB, PostgreSQL bytea
    Column("tag", String(64), nullable=False),            # HMAC over (run_id, seq, path, SHA-256 of data)
    Column("created_at", String(32), nullable=False),
)

# every explicit act and every run's start, resume and end: who, when, what
events = Table(
    "ldp_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", String(32), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("action", String(32), nullable=False),
    Column("dataset_id", Integer, nullable=True, index=True),
    Column("run_id", String(64), nullable=True),
    Column("detail", Text, nullable=False),
)
