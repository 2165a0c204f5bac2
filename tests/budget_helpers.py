"""Budget registries for tests: a fresh SQLite file, or a fresh database on the PostgreSQL server that ``.ci/run``
starts (``LIGHTNING_DP_TEST_POSTGRES``; the PostgreSQL cases skip only when it is not set)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

POSTGRES_ENV = "LIGHTNING_DP_TEST_POSTGRES"
BACKENDS = ("sqlite", "postgresql")


@contextmanager
def registry_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty registry on ``backend``; a PostgreSQL database is created for it and dropped after."""
    if backend == "sqlite":
        yield str(tmp_path / "budget.sqlite")
        return
    server = os.environ.get(POSTGRES_ENV)
    if not server:
        pytest.skip(f"no PostgreSQL server: set {POSTGRES_ENV} (.ci/run starts one with scripts/postgres.sh)")
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server)
    name = f"ldp_test_{secrets.token_hex(6)}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
