"""Schema migrations on PostgreSQL: `migrations/postgresql/NNNN_name.sql`, each applied once.

The same ledger as on SQLite (`schema_migrations`: version, name, checksum,
time), the same file names, and the same refusal of an applied file whose
checksum changed. Each file runs whole in one transaction (PostgreSQL's DDL
is transactional, so a failing file leaves nothing behind), under a
transaction-level advisory lock: two `flask db upgrade` at once take turns,
and the second finds the work done.

This runs in the foreground (Flask CLI, before gunicorn starts), on a plain
connection that may wait for the lock. It holds nothing across transactions
(no session lock, no setting, no prepared statement), so it may run through
a pooler in transaction mode (PgBouncer's `pool_mode = transaction`) as well
as directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mealquest.clock import to_text
from mealquest.db import migrations
from mealquest.db.driver import Reads
from mealquest.db.errors import StoreUnavailable
from mealquest.db.migrations import (
    MIGRATIONS_ROOT,
    AppliedMigration,
    Ledger,
    Migration,
    MigrationError,
    check_ledger,
    discover,
    ledger_of,
)

if TYPE_CHECKING:
    import psycopg

MIGRATIONS_DIR = MIGRATIONS_ROOT / "postgresql"
# One key for every migration run against a database ("mealques" as a bigint).
LOCK_KEY = int.from_bytes(b"mealques", "big")
_CONNECT_TIMEOUT_SECONDS = 10

_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    """A plain autocommit connection; an unreachable server is `StoreUnavailable`
    (whose text, unlike the driver's, names neither the host nor the password)."""
    import psycopg
    from psycopg.rows import dict_row

    try:
        return psycopg.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=_CONNECT_TIMEOUT_SECONDS,
            application_name="mealquest-migrate",
            # Each migration is a transaction of its own, which a transaction
            # pooler may run on another server connection: nothing prepared.
            prepare_threshold=None,
        )
    except psycopg.OperationalError:
        raise StoreUnavailable("the PostgreSQL server could not be reached") from None
    except psycopg.Error:
        raise StoreUnavailable("the PostgreSQL URL is not valid") from None


def applied(conn: Reads) -> dict[int, AppliedMigration]:
    """The database's ledger rows by version (none before the first upgrade)."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS e").fetchone()
    if not exists or not exists["e"]:
        return {}
    rows = conn.execute("SELECT version, name, checksum, applied_at FROM schema_migrations")
    return {
        row["version"]: AppliedMigration(row["name"], row["checksum"], to_text(row["applied_at"]))
        for row in rows.fetchall()
    }


def status(url: str, directory: Path = MIGRATIONS_DIR) -> Ledger:
    """The ledger of the database at `url` as this code sees it."""
    known = discover(directory)
    with connect(url) as conn:
        return ledger_of(known, applied(conn))


def require_current(url: str, directory: Path = MIGRATIONS_DIR) -> tuple[str, ...]:
    """DatabaseNotMigrated unless the database has every migration of
    `directory`; the applied ones this code does not know (a newer release's)."""
    known = discover(directory)
    with connect(url) as conn:
        return migrations.require_current(ledger_of(known, applied(conn)))


def upgrade(
    url: str, directory: Path = MIGRATIONS_DIR, *, target: int | None = None
) -> list[Migration]:
    """Apply pending migrations (up to `target`), each in its own transaction."""
    known = discover(directory)
    with connect(url) as conn:
        _locked(conn, lambda: conn.execute(_LEDGER))
        # A database ahead of this code has nothing pending for it.
        check_ledger(known, applied(conn))
        done = []
        for migration in known:
            if target is not None and migration.version > target:
                break
            if _apply(conn, migration):
                done.append(migration)
        return done


def _locked(conn: psycopg.Connection[Any], work: Any) -> None:
    """Run `work()` in one transaction holding the migrations' advisory lock."""
    import psycopg

    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        work()
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.close()
        raise


def _apply(conn: psycopg.Connection[dict[str, Any]], migration: Migration) -> bool:
    """Apply one migration; False if it was applied already (maybe by another process)."""
    import psycopg

    sql = migration.path.read_text(encoding="utf-8")
    applied = False

    def apply() -> None:
        nonlocal applied
        # Read again under the lock: another upgrade may have applied it.
        row = conn.execute(
            "SELECT name, checksum FROM schema_migrations WHERE version = %s",
            (migration.version,),
        ).fetchone()
        if row is not None:
            check_ledger(
                [migration], {migration.version: AppliedMigration(row["name"], row["checksum"], "")}
            )
            return
        # The whole file at once (no parameters: several statements are allowed).
        conn.execute(sql.encode("utf-8"))
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            (migration.version, migration.name, migration.checksum),
        )
        applied = True

    try:
        _locked(conn, apply)
    except psycopg.Error as error:
        applied = False
        raise MigrationError(
            f"migration {migration.path.name} failed and was rolled back: "
            f"{error.diag.message_primary or type(error).__name__}"
        ) from None
    return applied
