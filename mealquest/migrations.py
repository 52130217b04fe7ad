"""Schema migrations: plain SQL files in `migrations/`, applied in order, each once.

Each file runs in its own `BEGIN IMMEDIATE` transaction, statement by
statement (`executescript` would commit first and leave a failing file half
applied), with foreign keys off so that a table rebuild (sqlite.org's 12-step
procedure) cannot fire `ON DELETE CASCADE`, and ends with
`PRAGMA foreign_key_check` before it commits. An applied file whose checksum
changed is refused rather than skipped.

`upgrade` runs in the foreground (Flask CLI, before gunicorn starts), so it
uses a plain connection that may wait on locks. Serving processes check the
database with `require_migrated`, through their store, once.

A database may be *ahead* of the code: in a rolling deploy the new release's
`flask db upgrade` runs while the old release still serves, and old workers
restart (SIGHUP, `max_requests`, a crash) before the new code replaces them.
Such a database is served, with a warning naming the migrations this code
does not know, because a release's migrations are written so that the
previous release keeps working. It is accepted only in the shape a newer
release of this same code leaves: every migration this code knows applied,
and the unknown ones numbered above all of them. An unknown migration
numbered below one this code knows (a gap), or one applied while a known one
is still pending, cannot come from a newer release: the database and the
code have different histories, and that is refused like a changed checksum.
A database *behind* the code (pending migrations) is refused with the
command to run.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mealquest.clock import to_text, utc_now
from mealquest.store import connect

if TYPE_CHECKING:
    from mealquest.db.driver import Store

logger = logging.getLogger(__name__)

MIGRATIONS_ROOT = Path(__file__).resolve().parent.parent / "migrations"
# Each driver owns its migrations: these are SQLite's.
MIGRATIONS_DIR = MIGRATIONS_ROOT / "sqlite"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


class MigrationError(Exception):
    """A migration could not be applied; the database is at the previous version."""


class DatabaseNotMigrated(MigrationError):
    """The database is behind the code's migrations: run `flask db upgrade`."""

    def __init__(self, message: str | None = None, pending: Sequence[str] = ()) -> None:
        super().__init__(message or self.__doc__)
        self.pending = tuple(pending)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    checksum: str


@dataclass(frozen=True)
class MigrationState:
    migration: Migration
    applied_at: str | None

    @property
    def applied(self) -> bool:
        return self.applied_at is not None


@dataclass(frozen=True)
class Ledger:
    """What a database has applied, as this code sees it."""

    states: tuple[MigrationState, ...]
    """Every migration this code knows, applied or pending, in order."""
    unknown: tuple[str, ...] = ()
    """Applied migrations this code does not know (`NNNN_name`), all newer than its own."""

    @property
    def pending(self) -> tuple[Migration, ...]:
        return tuple(state.migration for state in self.states if not state.applied)


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file name not NNNN_name.sql: {path.name}")
        checksum = hashlib.sha256(path.read_bytes()).hexdigest()
        migrations.append(Migration(int(match[1]), match[2], path, checksum))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version number")
    return migrations


def split_statements(sql: str) -> Iterator[str]:
    """Yield the complete statements of a script, triggers included, without running it.

    A statement ends at a `;` that SQLite itself calls the end of a complete
    statement, so semicolons in strings, comments and trigger bodies do not
    split, and two statements on one line do.
    """
    start = 0
    for index, char in enumerate(sql):
        if char == ";" and sqlite3.complete_statement(sql[start : index + 1]):
            statement = sql[start : index + 1].strip()
            start = index + 1
            if _code_of(statement).strip(" \t\r\n;"):
                yield statement
    if _code_of(sql[start:]).strip():
        raise MigrationError("migration ends with an incomplete statement")


def _code_of(sql: str) -> str:
    """`sql` without its `--` and `/* */` comments (quoted text is kept as it is)."""
    code = []
    index = 0
    while index < len(sql):
        char = sql[index]
        if char in "'\"`[":
            end = sql.find("]" if char == "[" else char, index + 1)
            end = len(sql) if end < 0 else end + 1
            code.append(sql[index:end])
            index = end
        elif sql.startswith("--", index):
            end = sql.find("\n", index)
            index = len(sql) if end < 0 else end
        elif sql.startswith("/*", index):
            end = sql.find("*/", index + 2)
            index = len(sql) if end < 0 else end + 2
            code.append(" ")
        else:
            code.append(char)
            index += 1
    return "".join(code)


def _open(path: str) -> sqlite3.Connection:
    # A migration may sort a whole table (CREATE INDEX): that spills to a file.
    return connect(path, synchronous="FULL", busy_timeout_ms=30_000, temp_in_memory=False)


def _applied(conn: sqlite3.Connection) -> dict[int, sqlite3.Row]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return {}
    rows = conn.execute("SELECT version, name, checksum, applied_at FROM schema_migrations")
    return {row["version"]: row for row in rows}


def status_of(conn: sqlite3.Connection, migrations: list[Migration] | None = None) -> Ledger:
    """Every known migration with when it was applied, and the newer unknown
    ones; refuses changed applied files and a history this code does not share.

    Takes a connection so that a serving process can run it as a store read.
    """
    migrations = discover() if migrations is None else migrations
    applied = _applied(conn)
    unknown = check_ledger(migrations, applied)
    states = tuple(
        MigrationState(m, applied[m.version]["applied_at"] if m.version in applied else None)
        for m in migrations
    )
    return Ledger(states, unknown)


def status(path: str, directory: Path = MIGRATIONS_DIR) -> Ledger:
    known = discover(directory)
    if not Path(path).exists():
        # Nothing is applied yet; looking must not create the file (or fail
        # because its folder does not exist yet).
        return Ledger(tuple(MigrationState(m, None) for m in known))
    conn = _open(path)
    try:
        return status_of(conn, known)
    finally:
        conn.close()


def require_current_of(
    conn: sqlite3.Connection, migrations: list[Migration] | None = None
) -> tuple[str, ...]:
    """Raise DatabaseNotMigrated unless every known migration is applied; returns
    the applied migrations this code does not know (a newer release's).

    Checks on every call: serving code calls `require_migrated`, which caches a pass.
    """
    ledger = status_of(conn, migrations)
    if ledger.pending:
        names = [m.path.name for m in ledger.pending]
        raise DatabaseNotMigrated(
            f"the database is not migrated ({len(names)} pending: {', '.join(names)}); "
            "run `flask db upgrade`",
            names,
        )
    return ledger.unknown


def require_current(path: str, directory: Path = MIGRATIONS_DIR) -> tuple[str, ...]:
    """`require_current_of` on the file at `path`, with a plain connection."""
    if not Path(path).exists():
        raise DatabaseNotMigrated(
            f"the database {path} does not exist; run `flask db upgrade`",
            [m.path.name for m in discover(directory)],
        )
    conn = _open(path)
    try:
        return require_current_of(conn, discover(directory))
    finally:
        conn.close()


# The databases (absolute path, migrations folder) this process found migrated.
_passed: set[tuple[str, Path]] = set()


@functools.cache
def _known(directory: Path) -> list[Migration]:
    """The code's migrations, read and hashed once per process: its files do
    not change while it runs."""
    return discover(directory)


def require_migrated(store: Store, directory: Path | None = None) -> None:
    """Refuse a database behind this code's migrations (DatabaseNotMigrated,
    naming `flask db upgrade`) or with another history (MigrationError); let
    one ahead of it through, logging a WARNING that names what it does not know.

    The one check of every serving path: gunicorn's preflight and workers,
    `flask jobs work`, the CLI's commands, `/healthz`. A pass is remembered
    for the life of the process, per database: migrations are only ever
    added and the code's files do not change while it runs, so later calls
    cost nothing (the warning is logged once). A refusal is not remembered:
    after the operator's `flask db upgrade` the next call passes. Reads
    through `store`, so it never waits on a lock on the hub; a missing file is
    refused without being created.
    """
    directory = store.migrations.MIGRATIONS_DIR if directory is None else directory
    key = (store.describe(), directory)
    if key in _passed:
        return
    known = _known(directory)
    if not store.exists():
        raise DatabaseNotMigrated(
            f"the database {store.describe()} does not exist; run `flask db upgrade`",
            [m.path.name for m in known],
        )
    try:
        unknown = store.read(store.migrations.require_current_of, known)
    except DatabaseNotMigrated as error:
        raise DatabaseNotMigrated(
            f"the database {store.describe()} is not migrated ({len(error.pending)} pending: "
            f"{', '.join(error.pending)}); run `flask db upgrade`",
            error.pending,
        ) from None
    if unknown:
        logger.warning(
            "the database %s has migrations this code does not know (%s): serving it "
            "(a newer release applied them; its migrations keep this release working)",
            store.describe(),
            ", ".join(unknown),
        )
    _passed.add(key)


def check_ledger(migrations: list[Migration], applied: Mapping[int, Any]) -> tuple[str, ...]:
    """Refuse a changed applied file or a history this code does not share;
    return the applied migrations it does not know (all newer than its own)."""
    known = {m.version: m for m in migrations}
    for version, row in applied.items():
        migration = known.get(version)
        if migration is not None and migration.checksum != row["checksum"]:
            raise MigrationError(
                f"migration {migration.path.name} was changed after it was applied; "
                "add a new migration instead of editing an applied one"
            )
    unknown = sorted(version for version in applied if version not in known)
    if not unknown:
        return ()
    names = [f"{version:04d}_{applied[version]['name']}" for version in unknown]
    newest = max(known, default=0)
    if unknown[0] < newest:
        raise MigrationError(
            f"the database has migration {names[0]} that this code does not know, numbered "
            f"below its own {known[newest].path.name}: the database and the code have "
            "different migration histories"
        )
    pending = [m.path.name for m in migrations if m.version not in applied]
    if pending:
        raise MigrationError(
            f"the database has migration {names[0]} that this code does not know but not "
            f"its own {', '.join(pending)}: the database and the code have different "
            "migration histories"
        )
    return tuple(names)


def upgrade(
    path: str, directory: Path = MIGRATIONS_DIR, *, target: int | None = None
) -> list[Migration]:
    """Apply pending migrations (up to `target`), each in its own transaction."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = _open(path)
    try:
        # WAL is persistent in the file, so it is set here once, not per connection.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(_LEDGER)
        migrations = discover(directory)
        applied = _applied(conn)
        # A database ahead of this code has nothing pending for it.
        check_ledger(migrations, applied)
        done = []
        for migration in migrations:
            if migration.version in applied:
                continue
            if target is not None and migration.version > target:
                break
            if _apply(conn, migration):
                done.append(migration)
        return done
    finally:
        conn.close()


def _applied_meanwhile(conn: sqlite3.Connection, migration: Migration) -> bool:
    row = conn.execute(
        "SELECT name, checksum FROM schema_migrations WHERE version = ?", (migration.version,)
    ).fetchone()
    if row is None:
        return False
    check_ledger([migration], {migration.version: row})
    return True


def _apply(conn: sqlite3.Connection, migration: Migration) -> bool:
    """Apply one migration; False if another process applied it meanwhile."""
    sql = migration.path.read_text(encoding="utf-8")
    checksum = migration.checksum
    # Must be outside a transaction: inside one this pragma is silently ignored.
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another `flask db upgrade` may
            # have applied it since this one read the ledger.
            if _applied_meanwhile(conn, migration):
                conn.execute("ROLLBACK")
                return False
            for statement in split_statements(sql):
                conn.execute(statement)
            problems = conn.execute("PRAGMA foreign_key_check").fetchall()
            if problems:
                tables = sorted({row[0] for row in problems})
                raise MigrationError(
                    f"migration {migration.path.name} breaks foreign keys in: {', '.join(tables)}"
                )
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
                "VALUES (?, ?, ?, ?)",
                (migration.version, migration.name, checksum, to_text(utc_now())),
            )
            conn.execute("COMMIT")
            return True
        except sqlite3.Error as error:
            # Some errors (RAISE(ROLLBACK), a full disk) have already ended the
            # transaction: a second ROLLBACK would hide the real error.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise MigrationError(
                f"migration {migration.path.name} failed and was rolled back: {error}"
            ) from error
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
