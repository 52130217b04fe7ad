"""Schema migrations: plain SQL files in `migrations/`, applied in order, each once.

Each file runs in its own `BEGIN IMMEDIATE` transaction, statement by
statement (`executescript` would commit first and leave a failing file half
applied), with foreign keys off so that a table rebuild (sqlite.org's 12-step
procedure) cannot fire `ON DELETE CASCADE`, and ends with
`PRAGMA foreign_key_check` before it commits. An applied file whose checksum
changed is refused rather than skipped.

This runs in the foreground (Flask CLI, before gunicorn starts), so it uses a
plain connection that may wait on locks.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mealquest.clock import to_text, utc_now
from mealquest.store import connect

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
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
    return connect(path, synchronous="FULL", busy_timeout_ms=30_000)


def _applied(conn: sqlite3.Connection) -> dict[int, sqlite3.Row]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return {}
    rows = conn.execute("SELECT version, name, checksum, applied_at FROM schema_migrations")
    return {row["version"]: row for row in rows}


def status_of(
    conn: sqlite3.Connection, migrations: list[Migration] | None = None
) -> list[MigrationState]:
    """Every known migration with when it was applied; refuses changed applied files.

    Takes a connection so that a serving process can run it as a store read.
    """
    migrations = discover() if migrations is None else migrations
    applied = _applied(conn)
    _check_checksums(migrations, applied)
    return [
        MigrationState(m, applied[m.version]["applied_at"] if m.version in applied else None)
        for m in migrations
    ]


def status(path: str, directory: Path = MIGRATIONS_DIR) -> list[MigrationState]:
    known = discover(directory)
    if not Path(path).exists():
        # Nothing is applied yet; looking must not create the file (or fail
        # because its folder does not exist yet).
        return [MigrationState(m, None) for m in known]
    conn = _open(path)
    try:
        return status_of(conn, known)
    finally:
        conn.close()


def require_current_of(conn: sqlite3.Connection, migrations: list[Migration] | None = None) -> None:
    """Raise DatabaseNotMigrated unless every migration is applied."""
    if any(not state.applied for state in status_of(conn, migrations)):
        raise DatabaseNotMigrated(DatabaseNotMigrated.__doc__)


def require_current(path: str, directory: Path = MIGRATIONS_DIR) -> None:
    if not Path(path).exists():
        raise DatabaseNotMigrated(DatabaseNotMigrated.__doc__)
    conn = _open(path)
    try:
        require_current_of(conn, discover(directory))
    finally:
        conn.close()


def _check_checksums(migrations: list[Migration], applied: dict[int, sqlite3.Row]) -> None:
    known = {m.version: m for m in migrations}
    for version, row in applied.items():
        migration = known.get(version)
        if migration is None:
            raise MigrationError(
                f"the database has migration {version:04d}_{row['name']} "
                "that this code does not know: is the code older than the database?"
            )
        if migration.checksum != row["checksum"]:
            raise MigrationError(
                f"migration {migration.path.name} was changed after it was applied; "
                "add a new migration instead of editing an applied one"
            )


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
        _check_checksums(migrations, applied)
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
    _check_checksums([migration], {migration.version: row})
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
