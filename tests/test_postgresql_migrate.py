"""PostgreSQL migrations: the ledger, checksums, whole-file transactions, concurrent upgrades."""

from __future__ import annotations

import shutil
import threading

import psycopg
import pytest

from mealquest.db.errors import StoreUnavailable
from mealquest.db.migrations import DatabaseNotMigrated, MigrationError, discover
from mealquest.db.postgresql import migrate
from tests.conftest import wait_for
from tests.support.postgres import fresh_database, require_postgres_url
from tests.support.servers import free_port


@pytest.fixture
def empty_url():
    with fresh_database(require_postgres_url()) as url:
        yield url


@pytest.fixture
def directory(tmp_path):
    """A copy of the first real migration, which a test may add to or edit (later
    real migrations would take the numbers the tests add)."""
    copy = tmp_path / "migrations"
    copy.mkdir()
    shutil.copy(migrate.MIGRATIONS_DIR / "0001_init.sql", copy)
    return copy


def tables(url):
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {row[0] for row in rows}


def ledger(url):
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]


def test_a_fresh_database_is_migrated_once(empty_url):
    known = migrate.discover(migrate.MIGRATIONS_DIR)

    applied = migrate.upgrade(empty_url)

    assert applied == known
    assert {"households", "api_tokens", "jobs", "recipes", "schema_migrations"} <= tables(empty_url)
    states = migrate.status(empty_url).states
    assert all(state.applied for state in states)
    assert all(state.applied_at.endswith("Z") for state in states)
    migrate.require_current(empty_url)
    assert migrate.upgrade(empty_url) == []


def test_status_of_an_empty_database_lists_everything_pending_and_creates_nothing(empty_url):
    states = migrate.status(empty_url).states

    assert states
    assert not any(state.applied for state in states)
    assert tables(empty_url) == set()
    with pytest.raises(DatabaseNotMigrated):
        migrate.require_current(empty_url)


def test_upgrade_stops_at_the_target(empty_url, directory):
    real = [m.version for m in discover(directory)]
    # Numbered above every real migration, whichever exist.
    (directory / "9000_more.sql").write_text("CREATE TABLE more (id integer);\n")

    assert [m.version for m in migrate.upgrade(empty_url, directory, target=max(real))] == real
    assert "more" not in tables(empty_url)
    with pytest.raises(DatabaseNotMigrated):
        migrate.require_current(empty_url, directory)
    assert [m.version for m in migrate.upgrade(empty_url, directory)] == [9000]


def test_an_applied_file_that_changed_is_refused(empty_url, directory):
    migrate.upgrade(empty_url, directory)
    init = directory / "0001_init.sql"
    init.write_text(init.read_text() + "\n-- edited after it was applied\n")

    for look in (migrate.status, migrate.upgrade, migrate.require_current):
        with pytest.raises(MigrationError, match=r"0001_init\.sql was changed"):
            look(empty_url, directory)


def test_a_database_ahead_of_the_code_is_served_naming_what_it_does_not_know(empty_url, directory):
    shutil.copytree(migrate.MIGRATIONS_DIR, directory, dirs_exist_ok=True)
    newest = max(m.version for m in migrate.discover(directory))
    (directory / f"{newest + 1:04d}_newer.sql").write_text("CREATE TABLE newer (id integer);\n")
    migrate.upgrade(empty_url, directory)

    # This code's own migrations are all applied, so it serves, with a warning.
    assert migrate.status(empty_url).unknown == (f"{newest + 1:04d}_newer",)
    assert migrate.require_current(empty_url) == (f"{newest + 1:04d}_newer",)


def test_a_failing_file_leaves_nothing_of_itself(empty_url, directory):
    (directory / "0002_broken.sql").write_text(
        "CREATE TABLE half (id integer);\nINSERT INTO half VALUES (1);\nSELECT 1 / 0;\n"
    )

    with pytest.raises(MigrationError, match=r"0002_broken\.sql failed.*division by zero"):
        migrate.upgrade(empty_url, directory)

    assert "half" not in tables(empty_url)
    assert ledger(empty_url) == [1]


def test_two_upgrades_at_once_take_turns_and_apply_each_file_once(empty_url, directory):
    real = [m.version for m in discover(directory)]
    (directory / "9000_more.sql").write_text("CREATE TABLE more (id integer);\n")
    outcomes: list[object] = []

    def upgrade():
        try:
            outcomes.append([m.version for m in migrate.upgrade(empty_url, directory)])
        except BaseException as error:
            outcomes.append(error)

    with psycopg.connect(empty_url, autocommit=True) as holder:
        # Both upgrades are made to wait on the lock, then let go together.
        holder.execute("SELECT pg_advisory_lock(%s)", (migrate.LOCK_KEY,))
        threads = [threading.Thread(target=upgrade) for _ in range(2)]
        for thread in threads:
            thread.start()

        def both_wait() -> bool:
            assert not outcomes, outcomes  # neither may get past the lock, nor fail
            waiting = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0]
            return waiting == 2

        # A deadline for connecting on a loaded machine; never waited out by a pass.
        wait_for(both_wait, timeout=60)
        holder.execute("SELECT pg_advisory_unlock(%s)", (migrate.LOCK_KEY,))
        for thread in threads:
            thread.join(30)

    assert not any(isinstance(outcome, BaseException) for outcome in outcomes), outcomes
    assert sorted(version for done in outcomes for version in done) == [*real, 9000]
    assert ledger(empty_url) == [*real, 9000]


def test_an_unreachable_server_is_one_clear_error_without_the_url():
    url = f"postgresql://mealquest:s3cret-pw@127.0.0.1:{free_port()}/mealquest"

    for look in (migrate.status, migrate.upgrade, migrate.require_current):
        with pytest.raises(StoreUnavailable) as raised:
            look(url)
        assert str(raised.value) == "the PostgreSQL server could not be reached"


def test_the_migrated_jobs_table_keeps_every_trigger_and_claim_index(empty_url):
    """The triggers that keep the queue figures and the households' turns, and
    the indexes the claim uses, after every real migration."""
    migrate.upgrade(empty_url)
    with psycopg.connect(empty_url) as conn:
        triggers = {
            row[0]
            for row in conn.execute(
                "SELECT tgname FROM pg_trigger "
                "WHERE tgrelid = 'jobs'::regclass AND NOT tgisinternal"
            )
        }
        indexes = {
            row[0]
            for row in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")
        }
    assert triggers >= {
        "job_counts_insert",
        "job_counts_delete",
        "job_counts_update",
        "jobs_queue_insert",
        "jobs_queue_update",
        "jobs_queue_delete",
        "job_history_update",
    }
    assert indexes >= {"jobs_claim", "jobs_finished"}


# `n` queued jobs of household %s, written as 0006's schema takes them.
_QUEUE_JOBS = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "run_at, created_at, updated_at) SELECT md5(random()::text), %s, 'succeed', '{}', "
    "'queued', 1, 'fail', now(), now(), now() FROM generate_series(1, %s)"
)


def test_the_queue_counts_migration_counts_the_jobs_already_queued(empty_url):
    """0007 adds each household's queued count to its queue row, counting the
    jobs queued before it; the triggers keep it from there."""
    migrate.upgrade(empty_url, target=6)
    with psycopg.connect(empty_url, autocommit=True) as conn:
        households = [
            conn.execute(
                "INSERT INTO households (name) VALUES (%s) RETURNING id", (name,)
            ).fetchone()[0]
            for name in ("Smiths", "Joneses")
        ]
        for household, queued in zip(households, (3, 1), strict=True):
            conn.execute(_QUEUE_JOBS, (household, queued))
        conn.execute(
            "UPDATE jobs SET status = 'running', attempt = 1, started_at = now(), "
            "lease_owner = 'w', lease_expires_at = now() + interval '1 minute' "
            "WHERE seq = (SELECT min(seq) FROM jobs)"
        )
    migrate.upgrade(empty_url)
    with psycopg.connect(empty_url, autocommit=True) as conn:

        def counts():
            rows = conn.execute("SELECT household_id, queued FROM household_queues")
            return dict(rows.fetchall())

        assert counts() == {households[0]: 2, households[1]: 1}
        conn.execute(_QUEUE_JOBS, (households[1], 1))
        conn.execute(
            "DELETE FROM jobs WHERE household_id = %s AND status = 'queued'", (households[0],)
        )
        assert counts() == {households[1]: 2}


def test_a_job_written_while_the_queue_counts_migration_runs_is_counted(empty_url, tmp_path):
    """The old code serves while 0007 runs: an enqueue made meanwhile must be
    counted, whether it was in flight when the migration began or came after.
    The test holds the migration after its first statements (an advisory lock
    it waits on), makes an enqueue while it waits, then lets both go."""
    directory = tmp_path / "migrations"
    directory.mkdir()
    for migration in discover(migrate.MIGRATIONS_DIR):
        if migration.version <= 7:
            shutil.copy(migration.path, directory)
    counts_file = next(directory.glob("0007_*.sql"))
    held = 0x6D71_7465  # the test's own advisory lock
    text = counts_file.read_text()
    first_function = text.index("CREATE OR REPLACE FUNCTION")
    counts_file.write_text(
        f"{text[:first_function]}SELECT pg_advisory_xact_lock({held});\n\n{text[first_function:]}"
    )
    migrate.upgrade(empty_url, directory, target=6)
    with psycopg.connect(empty_url, autocommit=True) as conn:
        household = conn.execute(
            "INSERT INTO households (name) VALUES ('Smiths') RETURNING id"
        ).fetchone()[0]
        conn.execute(_QUEUE_JOBS, (household, 2))
    outcomes: list[object] = []

    def run(work):
        try:
            outcomes.append(work())
        except BaseException as error:
            outcomes.append(error)

    def enqueue():
        with psycopg.connect(empty_url, autocommit=True) as writer:
            writer.execute(_QUEUE_JOBS, (household, 1))
        return "enqueued"

    def waiting_on_locks() -> int:
        return holder.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> pg_backend_pid()"
        ).fetchone()[0]

    with psycopg.connect(empty_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (held,))
        migration = threading.Thread(
            target=run, args=(lambda: migrate.upgrade(empty_url, directory),)
        )
        migration.start()
        # A deadline for a loaded machine; a passing test never waits it out.
        wait_for(lambda: waiting_on_locks() == 1, timeout=60)
        writer = threading.Thread(target=run, args=(enqueue,))
        writer.start()
        # The enqueue waits too: on the migration's lock of `jobs` (before
        # writing its row), never half done behind the migration.
        wait_for(lambda: waiting_on_locks() == 2, timeout=60)
        holder.execute("SELECT pg_advisory_unlock(%s)", (held,))
        migration.join(60)
        writer.join(60)

    assert not any(isinstance(outcome, BaseException) for outcome in outcomes), outcomes
    with psycopg.connect(empty_url) as conn:
        counted = conn.execute(
            "SELECT queued FROM household_queues WHERE household_id = %s", (household,)
        ).fetchone()[0]
        actual = conn.execute(
            "SELECT count(*) FROM jobs WHERE household_id = %s AND status = 'queued'", (household,)
        ).fetchone()[0]
    assert (counted, actual) == (3, 3)
