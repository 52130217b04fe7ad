"""The databases: the driver contract (`driver`), the errors and the migration
ledger both drivers share, and their drivers (`sqlite`, `postgresql`).

Which database the service uses: `MEALQUEST_DATABASE_URL`, or the SQLite
file `MEALQUEST_DATABASE`. `open_store` is the one place above the drivers
that names one; opening a store connects to nothing: the first use does, in
the process that uses it."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from mealquest.db.driver import Store
from mealquest.db.errors import DatabaseURLError, StoreError

SQLITE_SCHEME = "sqlite"
POSTGRES_SCHEMES = ("postgresql", "postgres")


def database_errors() -> tuple[type[Exception], ...]:
    """Every exception a use of the database may raise: the store's own
    (`StoreError`, migration errors included), and the base exceptions of the
    database libraries this process has loaded: sqlite3's, and psycopg's once
    imported (never imported here: importing it fixes whether its waits
    yield to gevent)."""
    psycopg = sys.modules.get("psycopg")
    libraries = (sqlite3.Error,) if psycopg is None else (sqlite3.Error, psycopg.Error)
    return (StoreError, *libraries)


def sqlite_path(url: str) -> str:
    """The file of `sqlite:///relative/path` or `sqlite:////absolute/path`."""
    parts = urlsplit(url)
    if parts.scheme != SQLITE_SCHEME or parts.netloc or not parts.path.startswith("/"):
        raise DatabaseURLError("must be sqlite:///relative/path or sqlite:////absolute/path")
    path = unquote(parts.path[1:])
    if not path or path.endswith("/"):
        raise DatabaseURLError("must name a file, e.g. sqlite:///instance/mealquest.sqlite3")
    return path


def check_url(url: str) -> str:
    """The URL's driver (`sqlite` or `postgresql`); DatabaseURLError if neither."""
    scheme = urlsplit(url).scheme
    if scheme == SQLITE_SCHEME:
        sqlite_path(url)
        return "sqlite"
    if scheme in POSTGRES_SCHEMES:
        parts = urlsplit(url)
        if not parts.hostname or not parts.path.strip("/"):
            raise DatabaseURLError("must be postgresql://user:password@host:port/database")
        return "postgresql"
    raise DatabaseURLError("must start with sqlite:// or postgresql://")


def open_store(config: Mapping[str, Any]) -> Store:
    """The store the configuration names (the URL wins over the file)."""
    url = config.get("DATABASE_URL")
    busy = float(config["DB_BUSY_TIMEOUT_SECONDS"])
    if url and check_url(url) == "postgresql":
        from mealquest.db.postgresql.store import PostgresStore

        pooler = config.get("PG_POOLER") or "none"
        # Unset (a configuration not checked yet): on, unless the pooler cannot hold it.
        listen = config.get("PG_LISTEN")
        return PostgresStore(
            url,
            busy_timeout_seconds=busy,
            pool_size=int(config["PG_POOL_SIZE"]),
            listen=pooler != "transaction" if listen is None else bool(listen),
            pooler=pooler,
            runner_pool_size=config.get("PG_RUNNER_POOL_SIZE"),
            dead_socket_seconds=int(config.get("PG_DEAD_SOCKET_SECONDS") or 15),
        )
    from mealquest.db.sqlite.store import SqliteStore

    path = sqlite_path(url) if url else config["DATABASE"]
    return SqliteStore(path, synchronous=config["DB_SYNCHRONOUS"], busy_timeout_seconds=busy)
