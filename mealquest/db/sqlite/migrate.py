"""SQLite's migrator: each file in its own transaction, statement by statement.

Each file runs in its own `BEGIN IMMEDIATE` transaction, statement by
statement (`executescript` would commit first and leave a failing file half
applied), with foreign keys off so that a table rebuild (sqlite.org's 12-step
procedure) cannot fire `ON DELETE CASCADE`, and ends with
`PRAGMA foreign_key_check` before it commits. What the ledger means is
`mealquest.db.migrations`'.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from mealquest.clock import to_text, utc_now
from mealquest.db import migrations
from mealquest.db.driver import Reads
from mealquest.db.migrations import (
    MIGRATIONS_ROOT,
    AppliedMigration,
    DatabaseNotMigrated,
    Ledger,
    Migration,
    MigrationError,
    MigrationState,
    check_ledger,
    discover,
    ledger_of,
)
from mealquest.db.sqlite.connection import connect

MIGRATIONS_DIR = MIGRATIONS_ROOT / "sqlite"
_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


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


def applied(conn: Reads) -> dict[int, AppliedMigration]:
    """The database's ledger rows by version (none before the first upgrade)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return {}
    rows = conn.execute(
        "SELECT version, name, checksum, applied_at FROM schema_migrations"
    ).fetchall()
    return {
        row["version"]: AppliedMigration(row["name"], row["checksum"], row["applied_at"])
        for row in rows
    }


def status(path: str, directory: Path = MIGRATIONS_DIR) -> Ledger:
    """The ledger of the file at `path` as this code sees it."""
    known = discover(directory)
    if not Path(path).exists():
        # Nothing is applied yet; looking must not create the file (or fail
        # because its folder does not exist yet).
        return Ledger(tuple(MigrationState(m, None) for m in known))
    conn = _open(path)
    try:
        return ledger_of(known, applied(conn))
    finally:
        conn.close()


def require_current(path: str, directory: Path = MIGRATIONS_DIR) -> tuple[str, ...]:
    """DatabaseNotMigrated unless the file at `path` has every migration of
    `directory`; the applied ones this code does not know (a newer release's)."""
    if not Path(path).exists():
        raise DatabaseNotMigrated(
            f"the database {path} does not exist; run `flask db upgrade`",
            [m.path.name for m in discover(directory)],
        )
    conn = _open(path)
    try:
        return migrations.require_current(ledger_of(discover(directory), applied(conn)))
    finally:
        conn.close()


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
        done_before = applied(conn)
        # A database ahead of this code has nothing pending for it.
        check_ledger(migrations, done_before)
        done = []
        for migration in migrations:
            if migration.version in done_before:
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
    check_ledger(
        [migration], {migration.version: AppliedMigration(row["name"], row["checksum"], "")}
    )
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
