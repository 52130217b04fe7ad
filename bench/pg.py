"""PostgreSQL for the bench: a server, and a fresh database per measurement.

The server is the test command's when `MEALQUEST_TEST_POSTGRES_URL` names one
(the bench then only adds databases to it, and drops them), else a private
one that `scripts/postgres` starts in the bench's work directory and stops
when the section ends, however it ends. Each measurement gets a database of
its own, made for it and dropped after, so no run finds another's rows,
dead tuples or cached plans.

This runs in the parent, which gevent does not patch: plain psycopg.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench.common import REPO

TEST_SERVER_VARIABLE = "MEALQUEST_TEST_POSTGRES_URL"


def test_server_url() -> str | None:
    """The test command's server, when it runs one."""
    return os.environ.get(TEST_SERVER_VARIABLE) or None


def _script(command: str, directory: Path) -> str:
    completed = subprocess.run(
        [str(REPO / "scripts" / "postgres"), command, str(directory)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"scripts/postgres {command} failed:\n{completed.stderr[-2000:]}")
    return completed.stdout.strip()


@contextmanager
def server(workdir: Path) -> Iterator[str]:
    """The URL of a server to measure on: the test command's, or a private one."""
    url = test_server_url()
    if url:
        yield url
        return
    directory = workdir / "postgres"
    # The server runs as the `postgres` user when we are root: it must be able
    # to reach its directory through the (private) work directory.
    workdir.chmod(0o711)
    try:
        url = _script("start", directory)
        yield url
    finally:
        _script("stop", directory)


def with_database(url: str, name: str) -> str:
    """`url` naming another database of the same server."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def _admin(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def _drop(admin, name: str) -> None:
    """Drop the database `name`, cutting its connections (FORCE). A server's
    background worker (autovacuum) inside it cannot be cut but by a superuser:
    the drop is tried again until it has left (30 s at most)."""
    # FORCE: a killed child's connection may linger.
    from psycopg import errors, sql

    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.execute(statement)
            return
        except errors.InsufficientPrivilege:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class DrainCpu:
    """CPU a drain used, from `start()` to `stop()`: its process's (every
    thread, `time.process_time`) and the PostgreSQL server's, when the server
    runs on this machine (its postmaster and every backend, read from
    `/proc`: a backend that exits meanwhile is counted in the postmaster's
    reaped children). CPU moves far less than wall time on a busy machine,
    and with both sides a reader sees where a system's time goes."""

    def __init__(self, url: str) -> None:
        self.postmaster = _postmaster(url)
        self.process = 0.0
        self.server: float | None = None

    def start(self) -> None:
        self._process = time.process_time()
        self._server = _server_cpu(self.postmaster)

    def stop(self) -> None:
        self.process = time.process_time() - self._process
        after = _server_cpu(self.postmaster)
        if after is not None and self._server is not None:
            self.server = after - self._server

    def figures(self) -> dict[str, float | None]:
        return {"drain_cpu_seconds": self.process, "server_cpu_seconds": self.server}


def _postmaster(url: str) -> int | None:
    """The pid of the server's postmaster, the parent of a backend of ours;
    None when the server is not on this machine."""
    # Read while the connection is open: its backend exits once it closes.
    with _admin(url) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        try:
            parent = _stat(backend)[1]
            return parent if _stat(parent)[0] == "postgres" else None
        except OSError:
            return None


def _stat(pid: int) -> tuple[str, int, float, float]:
    """A process's name, parent, its own CPU seconds and its reaped children's."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / tick
    children = (int(fields[13]) + int(fields[14])) / tick
    return name, int(fields[1]), own, children


def _server_cpu(postmaster: int | None) -> float | None:
    """CPU seconds of the postmaster, its live children and those it reaped."""
    if postmaster is None:
        return None
    try:
        _, _, own, reaped = _stat(postmaster)
    except OSError:
        return None
    total = own + reaped
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            _, parent, child_own, _ = _stat(int(entry))
        except (OSError, ValueError):
            continue  # gone meanwhile
        if parent == postmaster:
            total += child_own
    return total


class Databases:
    """Fresh databases on one server, migrated ones cloned from a template that is
    migrated once (migrating takes seconds on a busy machine, a clone a fraction)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self._template: str | None = None
        # A peer's schema made once by `make(url)` and cloned for each of its
        # runs: awa's client takes about six seconds to migrate an empty
        # database and a few milliseconds to find a migrated one up to date.
        self._peer_templates: dict[str, str] = {}

    def _create(self, name: str, template: str | None = None) -> None:
        from psycopg import sql

        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with _admin(self.server_url) as admin:
            admin.execute(statement)

    def _migrated_template(self) -> str:
        if self._template is None:
            from mealquest.db.postgresql import migrate

            name = f"mq_bench_template_{secrets.token_hex(6)}"
            self._create(name)
            self._template = name
            migrate.upgrade(with_database(self.server_url, name))
        return self._template

    def _peer_template(self, peer: str, make: Callable[[str], object]) -> str:
        if peer not in self._peer_templates:
            name = f"mq_bench_{peer}_template_{secrets.token_hex(6)}"
            self._create(name)
            self._peer_templates[peer] = name
            make(with_database(self.server_url, name))
        return self._peer_templates[peer]

    @contextmanager
    def new(
        self,
        *,
        migrated: bool = True,
        peer_schema: tuple[str, Callable[[str], object]] | None = None,
    ) -> Iterator[tuple[str, int]]:
        """A new database for one measurement: its URL and a household's id. Not
        `migrated`: an empty database (household 0), for a peer that brings its
        own schema; with `peer_schema`, (peer, make), a clone of that peer's
        schema, made once by `make(url)`. Dropped afterwards."""
        if peer_schema is not None:
            migrated = False
            template: str | None = self._peer_template(*peer_schema)
        elif migrated:
            template = self._migrated_template()
        else:
            template = None
        name = f"mq_bench_{secrets.token_hex(6)}"
        self._create(name, template)
        url = with_database(self.server_url, name)
        try:
            household = 0
            if migrated:
                with _admin(url) as conn:
                    row = conn.execute(
                        "INSERT INTO households (name) VALUES ('bench') RETURNING id"
                    ).fetchone()
                    household = int(row[0])
            yield url, household
        finally:
            with _admin(self.server_url) as admin:
                _drop(admin, name)

    def close(self) -> None:
        """Drop the templates."""
        names = [*self._peer_templates.values()]
        if self._template is not None:
            names.append(self._template)
        with _admin(self.server_url) as admin:
            for name in names:
                _drop(admin, name)
        self._template = None
        self._peer_templates.clear()


def wal_mark(url: str) -> tuple[int, int]:
    """Where the server's WAL and transaction ids stand now: the WAL's byte
    position and the next transaction id. Each throughput child reads it
    before its enqueues and after its drain, so that what a peer writes to
    make its schema is not counted. Exact and at once (the statistics views
    lag by up to a second, and by a backend's exit)."""
    with _admin(url) as conn:
        row = conn.execute(
            "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, "
            "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        ).fetchone()
    return int(row[0]), int(row[1])


def written_since(url: str, mark: tuple[int, int], jobs: int) -> dict[str, float]:
    """WAL bytes and write transactions (transaction ids taken) per job since `mark`."""
    lsn, xid = wal_mark(url)
    return {"wal_bytes": (lsn - mark[0]) / jobs, "write_transactions": (xid - mark[1]) / jobs}


def dead_tuples(url: str) -> float:
    """Dead tuples in the database's tables, as the statistics last saw them."""
    with _admin(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
        ).fetchone()
    return float(row[0])


@contextmanager
def databases(server_url: str) -> Iterator[Databases]:
    made = Databases(server_url)
    try:
        yield made
    finally:
        made.close()


def server_version(server_url: str) -> str:
    with _admin(server_url) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]
