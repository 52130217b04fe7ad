"""Fixtures for the serving tests: a migrated database file with a household,
and factories for real gunicorn and nginx processes, all stopped by pid."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mealquest.households import create_household
from mealquest.store import Store
from tests.support.servers import Gunicorn, Nginx, Process, serving_env


@dataclass(frozen=True)
class Served:
    db_path: str
    token: str


@pytest.fixture
def served(db_path: str) -> Served:
    store = Store(db_path)
    try:
        token = create_household(store, "The Servers").token
    finally:
        store.close()
    return Served(db_path, token)


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
        server = Gunicorn(log, serving_env(served.db_path, **(config or {})), **options)
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
