"""PostgreSQL for tests: a fresh database per test on the server the test command started.

`scripts/postgres start DIR` starts a private server and prints its URL; the
test command exports it as `MEALQUEST_TEST_POSTGRES_URL`. Its role may
create databases, so each test gets one of its own (`CREATE DATABASE` with
a random name), dropped after the test even while connections to it remain.
A migrated database is cloned from a template migrated once per set of
migration files, and after its test emptied and handed to the next one:
making a database takes most of a second, emptying one milliseconds.

Without the variable, tests that need PostgreSQL fail under CI (it must run
them) and are skipped elsewhere, saying how to run them.

`scripts/pgbouncer start DIR URL` starts a PgBouncer in transaction mode in
front of that server; the test command exports its URL as
`MEALQUEST_TEST_PGBOUNCER_URL`, and `through_pgbouncer` reaches a test's
database through it (same role, same database name).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from mealquest.db.postgresql import migrate

POSTGRES_URL = os.environ.get("MEALQUEST_TEST_POSTGRES_URL")
PGBOUNCER_URL = os.environ.get("MEALQUEST_TEST_PGBOUNCER_URL")
_HOW = (
    "MEALQUEST_TEST_POSTGRES_URL is not set: start a server with "
    "`scripts/postgres start DIR` and export the URL it prints"
)
_HOW_PGBOUNCER = (
    "MEALQUEST_TEST_PGBOUNCER_URL is not set: start one with "
    "`scripts/pgbouncer start DIR $MEALQUEST_TEST_POSTGRES_URL` and export the URL it prints"
)


def _required(url: str | None, how: str) -> str:
    """`url`; without one, fails the test under CI (it must run), else skips it."""
    if url:
        return url
    if os.environ.get("CI"):
        pytest.fail(how)
    pytest.skip(how)


def require_postgres_url() -> str:
    """The server's URL; fails the test under CI when there is none, else skips it."""
    return _required(POSTGRES_URL, _HOW)


def require_pgbouncer_url() -> str:
    """The test PgBouncer's URL, under the same rule as the server's."""
    return _required(PGBOUNCER_URL, _HOW_PGBOUNCER)


def through_pgbouncer(url: str) -> str:
    """The database of `url` (on the test server), reached through the test PgBouncer."""
    bouncer = urlsplit(require_pgbouncer_url())
    return urlunsplit(bouncer._replace(path=urlsplit(url).path))


def with_database(url: str, name: str) -> str:
    """`url` naming another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def _create(admin: psycopg.Connection, name: str, template: str | None = None) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    admin.execute(statement)


def _drop(admin: psycopg.Connection, name: str) -> None:
    """Drop the database `name`, cutting its connections (FORCE). A server's
    background worker (autovacuum) inside it cannot be cut but by a superuser:
    the drop is tried again until it has left (30 s at most)."""
    # FORCE: a test's pool, listener or killed process may still be connected.
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.execute(statement)
            return
        except psycopg.errors.InsufficientPrivilege:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@functools.cache
def _migrated_template(url: str) -> str:
    """A database with every migration applied, named by the files' checksums:
    made once per server (by whichever test process needs it first), looked
    for once per test process."""
    digest = hashlib.sha256()
    for migration in migrate.discover(migrate.MIGRATIONS_DIR):
        digest.update(migration.checksum.encode())
    name = f"mq_template_{digest.hexdigest()[:16]}"
    with _admin(url) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return name
        # Built under another name and renamed when complete, so that a
        # concurrent test process never clones a half-migrated template.
        building = f"mq_building_{secrets.token_hex(6)}"
        _create(admin, building)
        try:
            migrate.upgrade(with_database(url, building))
            admin.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(building), sql.Identifier(name)
                )
            )
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            pass  # another process finished first (a concurrent rename is the latter)
        finally:
            _drop(admin, building)
    return name


# Migrated databases this process made and may hand out again, emptied.
_spare: list[str] = []
_made: list[tuple[str, str]] = []  # (server URL, database name), dropped at exit


def _emptied(url: str, name: str, tables: list[str]) -> bool:
    """Empty a used database for the next test (much faster than making one):
    no rows, sequences restarted, no connections. False if it cannot be made
    as good as new, and must be dropped instead.

    Two statements, whatever the schema: one ends the test's connections and
    reads what there is, one empties every table and restarts every
    sequence. A statement a table was most of a PostgreSQL test's teardown."""
    with psycopg.connect(with_database(url, name), autocommit=True, connect_timeout=10) as conn:
        found = conn.execute(
            # The test's connections (and those of processes it killed) go
            # first: one may hold a lock, a LISTEN, or a session setting. Only
            # client sessions of our own role: the server's own workers
            # (autovacuum) may be in the database too, and are not ours to end.
            "SELECT (SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND usename = current_user) AS ended, "
            "ARRAY(SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' "
            "ORDER BY tablename) AS present, "
            "ARRAY(SELECT ARRAY[sequencename::text, start_value::text] FROM pg_sequences "
            "WHERE schemaname = 'public' ORDER BY sequencename) AS sequences"
        ).fetchone()
        assert found is not None
        _, present, sequences = found
        if present != tables:
            return False  # the test changed the schema
        try:
            # No parameters: one simple query, all of it one transaction.
            conn.execute(
                _emptying(url, _template_of(name), tuple(tables), tuple(map(tuple, sequences)))
            )
        except psycopg.errors.LockNotAvailable:
            return False
    return True


@functools.cache
def _emptying(
    url: str, template: str, tables: tuple[str, ...], sequences: tuple[tuple[str, str], ...]
) -> str:
    """The statements that empty a database cloned from `template`, as one
    text (made once: composing them took a tenth of the emptying)."""
    # DELETE, not TRUNCATE: on a few rows it takes a millisecond, TRUNCATE a
    # hundred (it makes new files for every table).
    statements = [sql.SQL("SET lock_timeout = '5s'")]
    statements += [
        sql.SQL("DELETE FROM {}").format(sql.Identifier(table))
        for table in tables
        if table != "schema_migrations"
    ]
    statements += [
        sql.SQL("SELECT setval({}, {}, false)").format(
            sql.Literal(f"public.{sequence}"), sql.Literal(int(start))
        )
        for sequence, start in sequences
    ]
    # Rows the migrations themselves insert (the system household) come back.
    for table, (columns, rows) in _template_rows(url, template).items():
        statements += [
            sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE VALUES ({})").format(
                sql.Identifier(table),
                sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(map(sql.Literal, row)),
            )
            for row in rows
        ]
    return sql.SQL("; ").join(statements).as_string(None)


# The template each database handed out was cloned from.
_templates: dict[str, str] = {}


def _template_of(name: str) -> str:
    return _templates[name]


@functools.cache
def _template_rows(url: str, template: str) -> dict[str, tuple[list[str], list[tuple]]]:
    """The rows of each table the migrations leave filled (the ledger aside)."""
    filled = {}
    with psycopg.connect(with_database(url, template), autocommit=True) as conn:
        for table in _tables_of(with_database(url, template)):
            if table == "schema_migrations":
                continue
            cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            rows = cursor.fetchall()
            if rows:
                filled[table] = ([column.name for column in cursor.description], rows)
    return filled


def _tables_of(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        return [row[0] for row in rows]


@atexit.register
def _drop_made() -> None:
    for url, name in _made:
        with contextlib.suppress(psycopg.Error), _admin(url) as admin:
            _drop(admin, name)


@contextmanager
def fresh_database(url: str, *, migrated: bool = False) -> Iterator[str]:
    """A database on the server of `url` for one test, as new: its URL.

    An empty one is made and dropped after. A migrated one is cloned from the
    migrated template, and after the test emptied (its rows deleted,
    identities restarted, its connections cut) and kept for the next test of
    this process: making a database takes most of a second.
    """
    if not migrated:
        name = f"mq_test_{secrets.token_hex(6)}"
        with _admin(url) as admin:
            _create(admin, name)
        try:
            yield with_database(url, name)
        finally:
            with _admin(url) as admin:
                _drop(admin, name)
        return
    template = _migrated_template(url)
    if _spare:
        name = _spare.pop()
    else:
        name = f"mq_test_{secrets.token_hex(6)}"
        with _admin(url) as admin:
            _create(admin, name, template)
        _made.append((url, name))
    _templates[name] = template
    try:
        yield with_database(url, name)
    finally:
        if _emptied(url, name, _template_tables(url, template)):
            _spare.append(name)
        else:
            _made.remove((url, name))
            with _admin(url) as admin:
                _drop(admin, name)


@functools.cache
def _template_tables(url: str, template: str) -> list[str]:
    return _tables_of(with_database(url, template))
