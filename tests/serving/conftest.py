"""Fixtures for the serving tests: a migrated database (an SQLite file, or a
PostgreSQL database in modules marked `both_databases`) with a household, and
factories for real gunicorn and nginx processes, all stopped by pid."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mealquest.db.driver import Store
from mealquest.households import create_household
from tests.support.servers import Gunicorn, Nginx, Process, open_test_store, serving_env


@dataclass(frozen=True)
class Served:
    """The served database (as the `database` fixture names it), a household's
    token, and a store on the database for the test to read what servers wrote."""

    database: dict[str, Any]
    token: str
    store: Store

    @property
    def db_path(self) -> str:
        """The SQLite file, for a test of SQLite only."""
        return self.database["DATABASE"]


@pytest.fixture
def served(database: dict[str, Any]) -> Iterator[Served]:
    store = open_test_store(database)
    try:
        token = create_household(store, "The Servers").token
        yield Served(database, token, store)
    finally:
        store.close()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Every process a test starts; stopped (then their groups killed) after it."""
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


@pytest.fixture
def start_gunicorn(
    served: Served, tmp_path: Path, processes: list[Process]
) -> Callable[..., Gunicorn]:
    def start(
        *, ready: bool = True, config: dict[str, Any] | None = None, **options: Any
    ) -> Gunicorn:
        log = tmp_path / f"gunicorn-{len(processes)}.log"
        server = Gunicorn(log, serving_env(served.database, **(config or {})), **options)
        processes.append(server)
        if ready:
            server.wait_ready(pools=(config or {}).get("JOB_POOL_IN_WEB", True))
        return server

    return start


@pytest.fixture
def start_nginx(tmp_path: Path, processes: list[Process]) -> Callable[[int], Nginx]:
    def start(upstream_port: int) -> Nginx:
        server = Nginx(tmp_path / f"nginx-{len(processes)}", upstream_port)
        processes.append(server)
        server.wait_ready()
        return server

    return start
