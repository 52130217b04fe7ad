"""An enqueue that meets a connection the database dropped (a killed backend,
a restart, a failover) is tried again on a new one, and one whose COMMIT's
answer was lost is looked for by its job ids before anything is inserted
again: nothing is lost, nothing is inserted twice. PostgreSQL, whose
connections can be dropped under the service (SQLite's cannot)."""

from __future__ import annotations

import psycopg
import pytest

from mealquest.extensions import get_store
from mealquest.jobs import enqueueing
from mealquest.jobs.enqueueing import JobRequest
from mealquest.jobs.service import get_jobs
from tests.support import sql

pytestmark = pytest.mark.both_databases


def _end_every_connection_of(store, database) -> int:
    """Terminate every client backend of the service's database but ours;
    how many there were."""
    url = database.get("DATABASE_URL")
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND usename = current_user"
        ).fetchall()
    return len(rows)


@pytest.fixture(autouse=True)
def _postgresql_only(database):
    if "DATABASE_URL" not in database:
        pytest.skip("an SQLite connection is not the server's to drop")


def test_an_enqueue_after_the_servers_connections_were_killed_is_made_once(
    make_app, database, household
):
    app = make_app()
    jobs, store = get_jobs(app), get_store(app)
    # Connections in the pools, as a serving process has them.
    first = jobs.enqueue_many(
        [JobRequest("succeed", {"value": n}, household.household_id) for n in range(3)]
    )
    assert _end_every_connection_of(store, database) >= 1

    again = jobs.enqueue("succeed", {"value": 7}, household_id=household.household_id)
    many = jobs.enqueue_many(
        [JobRequest("succeed", {"value": n}, household.household_id) for n in range(5)]
    )

    made = sql.rows(store, "SELECT id FROM jobs")
    assert sorted(row["id"] for row in made) == sorted(
        [*(e.job_id for e in first), again, *(e.job_id for e in many)]
    )


def test_an_enqueue_whose_commit_answer_was_lost_is_found_not_made_again(
    make_app, database, household
):
    app = make_app()
    jobs, store = get_jobs(app), get_store(app)
    prepared = enqueueing.prepare_all(
        jobs.registry,
        [JobRequest("succeed", {"value": n}, household.household_id) for n in range(4)],
    )
    # What committed before the answer was lost.
    store.write(enqueueing.insert_all, store.jobs, prepared)

    found = jobs.writer.committed(prepared)

    assert found is not None
    assert [(e.job_id, e.created) for e in found] == [(job.job_id, True) for job in prepared]
    assert sql.scalar(store, "SELECT count(*) FROM jobs") == 4
    # Nothing of it committed: nothing to find, and the enqueue is tried again.
    others = enqueueing.prepare_all(
        jobs.registry, [JobRequest("succeed", {"value": 9}, household.household_id)]
    )
    assert jobs.writer.committed(others) is None
