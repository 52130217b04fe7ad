"""Migrations: the legacy jobs mapping, table rebuilds that cannot cascade, refusals, rollback."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from mealquest.db import migrations
from mealquest.db.sqlite import migrate
from mealquest.db.sqlite.store import SqliteStore
from mealquest.households import household_for_token, token_digest
from tests.conftest import wait_for
from tests.support.write_lock import LockHolder

T0 = "2025-01-01T10:00:00.000000Z"
T1 = "2025-01-01T10:05:00.000000Z"


def raw(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def ledger(path: str) -> list[int]:
    conn = raw(path)
    try:
        return [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    finally:
        conn.close()


def tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def write_migrations(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(exist_ok=True)
    for name, sql in files.items():
        (directory / name).write_text(sql, encoding="utf-8")
    return directory


# -- the legacy jobs table (0002) rebuilt by 0003 --------------------------------------------

LEGACY_JOBS = [
    # id, kind, payload, status, result, error
    ("j-pending", "recipe_import", '{"url": "a"}', "pending", None, None),
    ("j-pending-err", "recipe_import", '{"url": "b"}', "pending", None, "stale text"),
    ("j-done", "recipe_import", '{"url": "c"}', "done", '{"title": "Soup"}', None),
    ("j-done-failed", "recipe_import", '{"url": "d"}', "done", None, "no recipe found on the page"),
]


@pytest.fixture
def legacy_db(tmp_path: Path) -> str:
    path = str(tmp_path / "legacy.sqlite3")
    applied = migrate.upgrade(path, target=2)
    assert [m.version for m in applied] == [1, 2]
    conn = raw(path)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO households (id, name, created_at) VALUES (1, 'Smiths', ?)", (T0,))
        conn.execute(
            "INSERT INTO households (id, name, created_at) VALUES (2, 'Joneses', ?)", (T0,)
        )
        conn.execute(
            "INSERT INTO api_tokens (id, household_id, token_sha256, created_at) "
            "VALUES (?, ?, ?, ?)",
            (7, 1, token_digest("mq_legacy-token"), T0),
        )
        for index, (job_id, kind, payload, status, result, error) in enumerate(LEGACY_JOBS):
            conn.execute(
                "INSERT INTO jobs (id, household_id, kind, payload, status, result, error, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, 1 + index % 2, kind, payload, status, result, error, T0, T1),
            )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return path


def test_legacy_database_is_at_version_two(legacy_db):
    assert ledger(legacy_db) == [1, 2]
    assert migrate.status(legacy_db).pending[0].version == 3


def test_legacy_jobs_are_mapped_to_the_new_statuses(legacy_db):
    conn = raw(legacy_db)
    before_tokens = [tuple(r) for r in conn.execute("SELECT * FROM api_tokens ORDER BY id")]
    before_households = [tuple(r) for r in conn.execute("SELECT * FROM households ORDER BY id")]
    conn.close()

    applied = migrate.upgrade(legacy_db)
    assert applied[0].version == 3

    conn = raw(legacy_db)
    try:
        rows = {r["id"]: r for r in conn.execute("SELECT * FROM jobs")}
        assert set(rows) == {job[0] for job in LEGACY_JOBS}
        expected = {
            "j-pending": ("queued", None, 0, None, None),
            # A pending row has not run: error text on it is dropped.
            "j-pending-err": ("queued", None, 0, None, None),
            "j-done": ("succeeded", None, 1, T0, T1),
            # The legacy code recorded a failure as done + error: it stays a failure.
            "j-done-failed": ("failed", "no recipe found on the page", 1, T0, T1),
        }
        for index, (job_id, kind, payload, _status, result, _error) in enumerate(LEGACY_JOBS):
            row = rows[job_id]
            status, error, attempt, started_at, finished_at = expected[job_id]
            assert row["status"] == status
            assert row["error"] == error
            assert row["attempt"] == attempt
            assert row["started_at"] == started_at
            assert row["finished_at"] == finished_at
            # Every other column kept.
            assert row["household_id"] == 1 + index % 2
            assert row["kind"] == kind
            assert row["payload"] == payload
            assert row["result"] == result
            assert row["created_at"] == T0
            assert row["updated_at"] == T1
            assert row["run_at"] == T0
            assert row["max_attempts"] == 1
            assert row["lease_owner"] is None
            assert row["lease_expires_at"] is None
        # Insertion order survives as seq (ties in "oldest first").
        ordered = [r["id"] for r in conn.execute("SELECT id FROM jobs ORDER BY seq")]
        assert ordered == [job[0] for job in LEGACY_JOBS]

        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # Every token kept as it was (a later migration adds columns of its own).
        columns = "id, household_id, token_sha256, created_at, revoked_at"
        assert [
            tuple(r) for r in conn.execute(f"SELECT {columns} FROM api_tokens ORDER BY id")
        ] == before_tokens
        # Every household kept; a later migration adds the system household (id 0),
        # and later ones columns of their own.
        assert [
            tuple(r)
            for r in conn.execute(
                "SELECT id, name, created_at FROM households WHERE id <> 0 ORDER BY id"
            )
        ] == before_households
        # The legacy status index went with the old table; the new ones exist.
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "jobs_status" not in indexes
        assert {"jobs_claim", "jobs_lease", "jobs_household"} <= indexes
        # The foreign key still holds after the rebuild: a job of no household is refused.
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO jobs (id, household_id, kind, payload, status, run_at, "
                "created_at, updated_at) VALUES ('x', 99, 'k', '{}', 'queued', ?, ?, ?)",
                (T0, T0, T0),
            )
        # ... and deleting a household still cascades to its jobs.
        conn.execute("DELETE FROM households WHERE id = 2")
        assert conn.execute("SELECT count(*) FROM jobs WHERE household_id = 2").fetchone()[0] == 0
    finally:
        conn.close()

    store = SqliteStore(legacy_db)
    try:
        household = household_for_token(store, "mq_legacy-token")
        assert household is not None
        assert household.id == 1
    finally:
        store.close()


def test_the_full_chain_on_a_fresh_file_leaves_a_consistent_schema(tmp_path):
    path = str(tmp_path / "fresh.sqlite3")
    applied = migrate.upgrade(path)
    assert [m.version for m in applied] == [
        m.version for m in migrations.discover(migrate.MIGRATIONS_DIR)
    ]
    assert migrate.upgrade(path) == []
    conn = raw(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()
    migrate.require_current(path)


# -- 0006: the job lifecycle's rebuild of jobs ----------------------------------------------

JOB_COLUMNS = (
    "id, household_id, kind, payload, status, result, error, attempt, max_attempts, run_at, "
    "lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, "
    "on_interrupt, interruptions"
)


def test_the_lifecycle_rebuild_keeps_every_job_recipe_and_invariant(tmp_path):
    path = str(tmp_path / "at5.sqlite3")
    migrate.upgrade(path, target=5)
    conn = raw(path)
    conn.execute("INSERT INTO households (id, name, created_at) VALUES (1, 'H', ?)", (T0,))
    before = [
        (
            "q",
            1,
            "k",
            "{}",
            "queued",
            None,
            None,
            0,
            1,
            T0,
            None,
            None,
            T0,
            T0,
            None,
            None,
            "fail",
            0,
        ),
        (
            "r",
            1,
            "k",
            "{}",
            "running",
            '{"step": 1}',
            None,
            1,
            3,
            T0,
            "o.1",
            T1,
            T0,
            T0,
            T0,
            None,
            "requeue",
            1,
        ),
        (
            "s",
            1,
            "k",
            "{}",
            "succeeded",
            "{}",
            None,
            1,
            1,
            T0,
            None,
            None,
            T0,
            T1,
            T0,
            T1,
            "fail",
            0,
        ),
        (
            "f",
            1,
            "k",
            "{}",
            "failed",
            None,
            "boom",
            1,
            1,
            T0,
            None,
            None,
            T0,
            T1,
            T0,
            T1,
            "fail",
            0,
        ),
    ]
    conn.executemany(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 18)})", before)
    conn.execute(
        "INSERT INTO recipes (id, household_id, job_id, title, ingredients, instructions, "
        "source_url, created_at, updated_at) VALUES (?, 1, 's', 'Soup', '[]', '[]', 'u', ?, ?)",
        ("a" * 32, T0, T0),
    )
    conn.close()

    migrate.upgrade(path)

    conn = raw(path)
    try:
        after = [tuple(row) for row in conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY seq")]
        assert after == before
        assert {tuple(row) for row in conn.execute("SELECT priority, unique_key FROM jobs")} == {
            (0, None)
        }
        # The recipe still points at its job, and the foreign key still acts.
        assert conn.execute("SELECT job_id FROM recipes").fetchone()[0] == "s"
        conn.execute("DELETE FROM jobs WHERE id = 's'")
        assert conn.execute("SELECT job_id FROM recipes").fetchone()[0] is None
        # A queued job may be cancelled (attempt 0), finished, and with an
        # error only to say why (a job it depended on did not succeed)...
        conn.execute("UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE id = 'q'", (T1,))
        conn.execute("UPDATE jobs SET error = 'x' WHERE id = 'q'")
        conn.execute("UPDATE jobs SET error = NULL WHERE id = 'q'")
        # ...but never without finished_at, queued with an error, or with a
        # cancel request while queued; and a key needs its digest.
        for statement in (
            "UPDATE jobs SET finished_at = NULL WHERE id = 'q'",
            "UPDATE jobs SET status = 'queued', finished_at = NULL, error = 'x' WHERE id = 'q'",
            "UPDATE jobs SET status = 'bogus' WHERE id = 'q'",
            "UPDATE jobs SET unique_key = 'k' WHERE id = 'f'",
            "UPDATE jobs SET status = 'queued', finished_at = NULL, cancel_requested_at = 'x' "
            "WHERE id = 'q'",
        ):
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute(statement)
        plan = " ".join(
            row[3]
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT seq FROM jobs WHERE status = 'queued' "
                "AND run_at <= ? ORDER BY priority, run_at, seq LIMIT 1",
                (T1,),
            )
        )
        assert "jobs_claim" in plan
        assert "TEMP B-TREE" not in plan
    finally:
        conn.close()


# -- the rebuild mechanism ------------------------------------------------------------------

PARENT_CHILD = """
CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE child (
    id INTEGER PRIMARY KEY,
    parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE,
    note TEXT
);
CREATE TABLE grandchild (
    id INTEGER PRIMARY KEY,
    child_id INTEGER NOT NULL REFERENCES child (id) ON DELETE CASCADE
);
"""

REBUILD_PARENT = """
-- A 12-step rebuild of the parent: new table, copy, drop, rename.
CREATE TABLE parent_new (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT 'x'
);
INSERT INTO parent_new (id, name) SELECT id, name FROM parent;
DROP TABLE parent;
ALTER TABLE parent_new RENAME TO parent;
"""

REBUILD_CHILD = """
CREATE TABLE child_new (
    id INTEGER PRIMARY KEY,
    parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE,
    note TEXT NOT NULL DEFAULT ''
);
INSERT INTO child_new (id, parent_id, note) SELECT id, parent_id, coalesce(note, '') FROM child;
DROP TABLE child;
ALTER TABLE child_new RENAME TO child;
"""


def fill_parent_child(path: str) -> None:
    conn = raw(path)
    try:
        conn.execute("BEGIN")
        for parent in range(1, 4):
            conn.execute("INSERT INTO parent (id, name) VALUES (?, ?)", (parent, f"p{parent}"))
            for n in range(5):
                child = parent * 10 + n
                conn.execute(
                    "INSERT INTO child (id, parent_id, note) VALUES (?, ?, ?)",
                    (child, parent, None if n % 2 else f"c{child}"),
                )
                conn.execute("INSERT INTO grandchild (child_id) VALUES (?)", (child,))
        conn.execute("COMMIT")
    finally:
        conn.close()


def counts(path: str) -> tuple[int, int, int]:
    conn = raw(path)
    try:
        return tuple(
            conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("parent", "child", "grandchild")
        )
    finally:
        conn.close()


def test_a_rebuild_with_foreign_keys_on_would_cascade(tmp_path):
    """The control: run naively, the same rebuild wipes the children."""
    path = str(tmp_path / "naive.sqlite3")
    directory = write_migrations(tmp_path / "m", {"0001_tables.sql": PARENT_CHILD})
    migrate.upgrade(path, directory)
    fill_parent_child(path)
    conn = raw(path)
    try:
        conn.executescript(REBUILD_PARENT)
    finally:
        conn.close()
    assert counts(path) == (3, 0, 0)


def test_rebuilding_a_parent_table_keeps_every_child_row(tmp_path):
    path = str(tmp_path / "rebuild.sqlite3")
    directory = write_migrations(tmp_path / "m", {"0001_tables.sql": PARENT_CHILD})
    migrate.upgrade(path, directory)
    fill_parent_child(path)
    conn = raw(path)
    before_children = [tuple(r) for r in conn.execute("SELECT * FROM child ORDER BY id")]
    conn.close()

    write_migrations(
        directory,
        {"0002_rebuild_parent.sql": REBUILD_PARENT, "0003_rebuild_child.sql": REBUILD_CHILD},
    )
    applied = migrate.upgrade(path, directory)

    assert [m.version for m in applied] == [2, 3]
    assert counts(path) == (3, 15, 15)
    conn = raw(path)
    try:
        after = {r["id"]: r for r in conn.execute("SELECT * FROM child")}
        for child_id, parent_id, note in before_children:
            assert after[child_id]["parent_id"] == parent_id
            assert after[child_id]["note"] == (note or "")
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        # The rebuilt tables still enforce and cascade.
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO child (parent_id) VALUES (99)")
        conn.execute("DELETE FROM parent WHERE id = 1")
    finally:
        conn.close()
    assert counts(path) == (2, 10, 10)


# -- refusals and rollback ------------------------------------------------------------------


def test_a_changed_applied_migration_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / "changed.sqlite3")
    directory = write_migrations(tmp_path / "m", {"0001_tables.sql": PARENT_CHILD})
    migrate.upgrade(path, directory)
    (directory / "0001_tables.sql").write_text(PARENT_CHILD + "\n-- edited\n", encoding="utf-8")
    write_migrations(directory, {"0002_more.sql": "CREATE TABLE more (id INTEGER PRIMARY KEY);"})

    with pytest.raises(migrations.MigrationError, match=r"0001_tables\.sql"):
        migrate.status(path, directory)
    with pytest.raises(migrations.MigrationError, match=r"0001_tables\.sql"):
        migrate.upgrade(path, directory)
    with pytest.raises(migrations.MigrationError, match=r"0001_tables\.sql"):
        migrate.require_current(path, directory)
    assert ledger(path) == [1]
    conn = raw(path)
    try:
        assert "more" not in tables(conn)
    finally:
        conn.close()


# -- a database ahead of the code, behind it, or with another history ----------------------

THREE = {
    "0001_a.sql": "CREATE TABLE a (id INTEGER PRIMARY KEY);",
    "0002_b.sql": "CREATE TABLE b (id INTEGER PRIMARY KEY);",
    "0003_c.sql": "CREATE TABLE c (id INTEGER PRIMARY KEY);",
}


def migrated_by(tmp_path: Path, files: dict[str, str]) -> str:
    """A database migrated by a release whose migrations are `files`."""
    path = str(tmp_path / "db.sqlite3")
    migrate.upgrade(path, write_migrations(tmp_path / "release", files))
    return path


def code_with(tmp_path: Path, names: list[str]) -> Path:
    """The migrations folder of a release that has only `names` of THREE."""
    return write_migrations(tmp_path / "code", {name: THREE[name] for name in names})


@pytest.fixture
def store_of():
    stores: list[SqliteStore] = []

    def open_store(path: str) -> SqliteStore:
        stores.append(SqliteStore(path))
        return stores[-1]

    yield open_store
    for store in stores:
        store.close()


def test_a_database_ahead_of_the_code_is_served_with_one_warning(tmp_path, store_of):
    path = migrated_by(tmp_path, THREE)
    older = code_with(tmp_path, ["0001_a.sql", "0002_b.sql"])
    store = store_of(path)

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("mealquest.db.migrations")
    logger.addHandler(handler)
    try:
        migrations.require_migrated(store, older)
        migrations.require_migrated(store, older)
    finally:
        logger.removeHandler(handler)
    warnings = [record.getMessage() for record in records]
    assert len(warnings) == 1
    assert "0003_c" in warnings[0]
    assert migrate.require_current(path, older) == ("0003_c",)
    # `flask db upgrade` of the older release has nothing to do there.
    assert migrate.upgrade(path, older) == []
    ledger = migrate.status(path, older)
    assert (ledger.pending, ledger.unknown) == ((), ("0003_c",))


def test_a_pass_is_checked_once_per_process_and_database(tmp_path, store_of):
    path = migrated_by(tmp_path, THREE)
    directory = tmp_path / "release"
    store = store_of(path)
    migrations.require_migrated(store, directory)
    # Edited behind its back: a fresh check refuses it, the remembered pass does not look.
    conn = raw(path)
    try:
        conn.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
    finally:
        conn.close()
    with pytest.raises(migrations.MigrationError, match="changed after it was applied"):
        migrate.require_current(path, directory)
    migrations.require_migrated(store, directory)
    # Another database is checked on its own.
    other = str(tmp_path / "other.sqlite3")
    migrate.upgrade(other, directory, target=2)
    with pytest.raises(migrations.DatabaseNotMigrated):
        migrations.require_migrated(store_of(other), directory)


def test_a_database_behind_the_code_is_refused_naming_what_to_run(tmp_path, store_of):
    path = migrated_by(tmp_path, {name: THREE[name] for name in ["0001_a.sql"]})
    newer = code_with(tmp_path, list(THREE))
    store = store_of(path)
    with pytest.raises(migrations.DatabaseNotMigrated) as raised:
        migrations.require_migrated(store, newer)
    assert str(raised.value) == (
        f"the database {path} is not migrated (2 pending: 0002_b.sql, 0003_c.sql); "
        "run `flask db upgrade`"
    )
    assert raised.value.pending == ("0002_b.sql", "0003_c.sql")
    # A refusal is not remembered: once migrated, the next check passes.
    migrate.upgrade(path, newer)
    migrations.require_migrated(store, newer)


def test_a_missing_database_is_refused_and_not_created(tmp_path, store_of):
    path = tmp_path / "missing" / "db.sqlite3"
    with pytest.raises(migrations.DatabaseNotMigrated, match="does not exist; run `flask db"):
        migrations.require_migrated(store_of(str(path)))
    assert not path.parent.exists()


@pytest.mark.parametrize(
    ("applied", "known"),
    [
        (["0001_a.sql", "0002_b.sql", "0003_c.sql"], ["0001_a.sql", "0003_c.sql"]),
        (["0001_a.sql", "0003_c.sql"], ["0001_a.sql", "0002_b.sql"]),
    ],
    ids=["unknown-below-a-known-one", "unknown-while-a-known-one-is-pending"],
)
def test_an_unknown_migration_that_no_newer_release_could_have_applied_is_refused(
    tmp_path, store_of, applied, known
):
    """A newer release numbers its migrations after every older one and
    applies them in order, so these databases have another history."""
    path = migrated_by(tmp_path, {name: THREE[name] for name in applied})
    code = code_with(tmp_path, known)
    for check in (
        lambda: migrations.require_migrated(store_of(path), code),
        lambda: migrate.status(path, code),
        lambda: migrate.upgrade(path, code),
    ):
        with pytest.raises(migrations.MigrationError, match="different migration histories"):
            check()
    assert len(ledger(path)) == len(applied)


def test_a_changed_applied_migration_is_refused_by_the_serving_check(tmp_path, store_of):
    path = migrated_by(tmp_path, THREE)
    (tmp_path / "release" / "0002_b.sql").write_text("-- edited\n" + THREE["0002_b.sql"])
    with pytest.raises(migrations.MigrationError, match=r"0002_b\.sql was changed"):
        migrations.require_migrated(store_of(path), tmp_path / "release")


def test_a_broken_migration_rolls_back_whole(tmp_path):
    path = str(tmp_path / "broken.sqlite3")
    directory = write_migrations(tmp_path / "m", {"0001_tables.sql": PARENT_CHILD})
    migrate.upgrade(path, directory)
    fill_parent_child(path)
    write_migrations(
        directory,
        {
            "0002_broken.sql": (
                "CREATE TABLE first_statement (id INTEGER PRIMARY KEY);\n"
                "INSERT INTO parent (id, name) VALUES (100, 'added');\n"
                "DELETE FROM grandchild;\n"
                "INSERT INTO no_such_table VALUES (1);\n"
            ),
            "0003_after.sql": "CREATE TABLE after_broken (id INTEGER PRIMARY KEY);",
        },
    )

    with pytest.raises(migrations.MigrationError, match=r"0002_broken\.sql") as raised:
        migrate.upgrade(path, directory)

    assert "no_such_table" in str(raised.value)
    assert ledger(path) == [1]
    assert counts(path) == (3, 15, 15)
    conn = raw(path)
    try:
        assert {"first_statement", "after_broken"}.isdisjoint(tables(conn))
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    finally:
        conn.close()
    states = migrate.status(path, directory).states
    assert [(s.migration.version, s.applied) for s in states] == [(1, True), (2, False), (3, False)]


def test_a_migration_that_breaks_foreign_keys_is_refused(tmp_path):
    path = str(tmp_path / "fk.sqlite3")
    directory = write_migrations(tmp_path / "m", {"0001_tables.sql": PARENT_CHILD})
    migrate.upgrade(path, directory)
    fill_parent_child(path)
    write_migrations(
        directory,
        {
            # Foreign keys are off while a migration runs, so these succeed on
            # their own; the check before commit catches them.
            "0002_orphans.sql": (
                "INSERT INTO child (id, parent_id) VALUES (500, 999);\n"
                "DELETE FROM parent WHERE id = 1;\n"
            )
        },
    )

    with pytest.raises(migrations.MigrationError, match=r"0002_orphans\.sql.*child"):
        migrate.upgrade(path, directory)

    assert ledger(path) == [1]
    assert counts(path) == (3, 15, 15)
    conn = raw(path)
    try:
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


def test_a_statement_that_ends_the_transaction_itself_still_reports_the_migration(tmp_path):
    """A failing statement whose error already rolled SQLite back is reported, not masked."""
    path = str(tmp_path / "raise.sqlite3")
    directory = write_migrations(
        tmp_path / "m",
        {
            "0001_tables.sql": PARENT_CHILD,
            "0002_trigger.sql": (
                "CREATE TABLE audit (id INTEGER PRIMARY KEY);\n"
                "CREATE TRIGGER parent_guard BEFORE INSERT ON parent\n"
                "BEGIN SELECT RAISE(ROLLBACK, 'parents are frozen'); END;\n"
                "INSERT INTO parent (name) VALUES ('x');\n"
            ),
        },
    )
    with pytest.raises(migrations.MigrationError, match=r"0002_trigger\.sql.*frozen"):
        migrate.upgrade(path, directory)
    assert ledger(path) == [1]
    conn = raw(path)
    try:
        assert "audit" not in tables(conn)
    finally:
        conn.close()


def test_upgrade_to_a_target_stops_there(tmp_path):
    path = str(tmp_path / "target.sqlite3")
    directory = write_migrations(
        tmp_path / "m",
        {
            "0001_a.sql": "CREATE TABLE a (id INTEGER PRIMARY KEY);",
            "0002_b.sql": "CREATE TABLE b (id INTEGER PRIMARY KEY);",
            "0003_c.sql": "CREATE TABLE c (id INTEGER PRIMARY KEY);",
        },
    )
    assert [m.version for m in migrate.upgrade(path, directory, target=2)] == [1, 2]
    with pytest.raises(migrations.DatabaseNotMigrated, match="flask db upgrade"):
        migrate.require_current(path, directory)
    assert [m.version for m in migrate.upgrade(path, directory)] == [3]
    migrate.require_current(path, directory)


def test_statements_are_split_whole_with_comments_and_triggers():
    sql = (
        "-- a comment; with a semicolon\n"
        "CREATE TABLE t (x TEXT DEFAULT '--;');\n"
        "/* a block comment; */\n"
        "CREATE TRIGGER t_ai AFTER INSERT ON t BEGIN\n"
        "  UPDATE t SET x = 'a;b' WHERE rowid = new.rowid;\n"
        "END;\n"
        "CREATE TABLE u (y); CREATE TABLE v (z);\n"
        "-- trailing comment\n"
        "/* trailing block comment */\n"
    )
    statements = list(migrate.split_statements(sql))
    assert len(statements) == 4
    assert statements[0].endswith("CREATE TABLE t (x TEXT DEFAULT '--;');")
    assert "CREATE TRIGGER" in statements[1]
    assert statements[1].endswith("END;")
    assert statements[2:] == ["CREATE TABLE u (y);", "CREATE TABLE v (z);"]
    conn = sqlite3.connect(":memory:")
    for statement in statements:
        conn.execute(statement)
    conn.execute("INSERT INTO t DEFAULT VALUES")
    assert conn.execute("SELECT x FROM t").fetchone()[0] == "a;b"
    assert list(migrate.split_statements("/* only a comment */\n-- and another\n")) == []
    with pytest.raises(migrations.MigrationError, match="incomplete"):
        list(migrate.split_statements("CREATE TABLE t (x TEXT"))
    with pytest.raises(migrations.MigrationError, match="incomplete"):
        list(migrate.split_statements("SELECT 1; SELECT 'unterminated;"))


def test_bad_file_names_and_duplicate_versions_are_refused(tmp_path):
    bad = write_migrations(tmp_path / "bad", {"1_init.sql": "SELECT 1;"})
    with pytest.raises(migrations.MigrationError, match=r"1_init\.sql"):
        migrations.discover(bad)
    dup = write_migrations(tmp_path / "dup", {"0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 1;"})
    with pytest.raises(migrations.MigrationError, match="share a version"):
        migrations.discover(dup)


def test_two_upgrades_at_once_apply_each_migration_once(tmp_path):
    """Both read the ledger, then queue for the write lock; the second must not re-apply."""
    path = str(tmp_path / "race.sqlite3")
    directory = write_migrations(
        tmp_path / "m",
        {
            "0001_a.sql": "CREATE TABLE a (id INTEGER PRIMARY KEY);",
            "0002_b.sql": "CREATE TABLE b (id INTEGER PRIMARY KEY);",
        },
    )
    # An empty, WAL-mode database with the ledger, so neither upgrade needs
    # the write lock before its first migration.
    migrate.upgrade(path, write_migrations(tmp_path / "none", {}))
    holder = LockHolder(path)
    outcomes = {}

    def run(name):
        try:
            outcomes[name] = [m.version for m in migrate.upgrade(path, directory)]
        except BaseException as error:
            outcomes[name] = error

    threads = [threading.Thread(target=run, args=(name,)) for name in ("first", "second")]
    try:
        holder.hold()
        started = time.monotonic()
        for thread in threads:
            thread.start()
        # Give both time to read the ledger and wait on the lock (if either is
        # slower, it reads the ledger after the other's commit: still correct).
        wait_for(lambda: time.monotonic() > started + 1.0)
        holder.release()
        for thread in threads:
            thread.join(60)
    finally:
        holder.stop()

    assert not any(isinstance(outcome, BaseException) for outcome in outcomes.values()), outcomes
    assert sorted(outcomes["first"] + outcomes["second"]) == [1, 2]
    assert ledger(path) == [1, 2]


def test_the_migrated_jobs_table_keeps_every_trigger_and_claim_index(tmp_path):
    """The triggers that keep the queue figures and the households' turns, and
    the indexes the claim names: a later rebuild of `jobs` that forgot one
    would make figures silently wrong or every claim fail."""
    path = str(tmp_path / "head.db")
    migrate.upgrade(path)
    conn = raw(path)
    try:
        rows = conn.execute("SELECT type, name FROM sqlite_master WHERE tbl_name = 'jobs'")
        names = {(row["type"], row["name"]) for row in rows}
    finally:
        conn.close()
    triggers = {name for kind, name in names if kind == "trigger"}
    assert triggers >= {
        "job_counts_insert",
        "job_counts_update",
        "job_counts_delete",
        "jobs_queue_insert",
        "jobs_queue_enter",
        "jobs_queue_leave",
        "jobs_queue_delete",
        "job_history_started",
        "job_history_ended",
        "job_history_cancelled_queued",
    }
    indexes = {name for kind, name in names if kind == "index"}
    assert indexes >= {"jobs_claim", "jobs_running", "jobs_household_queued", "jobs_finished"}
