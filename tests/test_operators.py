"""Operators: `flask operators`, their tokens, and the store functions of the
operator's views and actions, on both databases."""

from __future__ import annotations

import json

import pytest

from mealquest.model.jobs import Status
from mealquest.operators import TOKEN_PREFIX, create_operator, operator_for_token
from tests.conftest import wait_for
from tests.support import sql

pytestmark = pytest.mark.both_databases


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_operators_create_prints_a_token_shown_once_and_stored_as_a_digest(runner, client, store):
    result = runner.invoke(args=["operators", "create", "Ada"])
    assert result.exit_code == 0, result.output
    issued = json.loads(result.output)
    assert set(issued) == {"operator_id", "token"}
    assert issued["token"].startswith(TOKEN_PREFIX)
    [row] = sql.rows(store, "SELECT * FROM operators WHERE id = ?", (issued["operator_id"],))
    assert issued["token"] not in json.dumps(row, default=str)
    assert len(row["token_sha256"]) == 64
    assert client.get("/metrics", headers=bearer(issued["token"])).status_code == 200


@pytest.mark.parametrize(
    ("name", "message"),
    [("", "1 to 200"), ("a\nb", "control characters"), ("Ada\udcff", "not UTF-8")],
)
def test_operators_create_refuses_a_bad_name(runner, store, name, message):
    result = runner.invoke(args=["operators", "create", name])
    assert result.exit_code == 1
    assert message in result.output
    assert sql.scalar(store, "SELECT count(*) FROM operators") == 0


def test_operators_list_shows_live_and_revoked(runner, store):
    live = create_operator(store, "Ada")
    gone = create_operator(store, "Grace")
    assert runner.invoke(args=["operators", "revoke", str(gone.operator_id)]).exit_code == 0
    lines = runner.invoke(args=["operators", "list"]).output.splitlines()
    assert lines[0].startswith(f"{live.operator_id}  Ada  created ")
    assert lines[0].endswith("live")
    assert lines[1].startswith(f"{gone.operator_id}  Grace  created ")
    assert "revoked " in lines[1]
    assert live.token not in "\n".join(lines)


def test_operators_revoke_stops_the_token_at_once(runner, client, store):
    issued = create_operator(store, "Ada")
    assert client.get("/metrics", headers=bearer(issued.token)).status_code == 200
    result = runner.invoke(args=["operators", "revoke", str(issued.operator_id)])
    assert result.exit_code == 0, result.output
    assert client.get("/metrics", headers=bearer(issued.token)).status_code == 401
    again = runner.invoke(args=["operators", "revoke", str(issued.operator_id)])
    assert again.exit_code == 1
    assert "no live operator" in again.output.lower()
    unknown = runner.invoke(args=["operators", "revoke", "999999"])
    assert unknown.exit_code == 1


def test_household_and_operator_tokens_are_never_interchangeable(client, store, household):
    operator = create_operator(store, "Ada")
    # A household's token is no operator's: not by lookup, not on /metrics.
    assert operator_for_token(store, household.token) is None
    assert client.get("/metrics", headers=bearer(household.token)).status_code == 401
    # An operator's token is no household's: not on the API.
    assert client.get("/api/v1/jobs", headers=bearer(operator.token)).status_code == 401
    # Nor is a household token with the operators' prefix pasted on.
    assert operator_for_token(store, TOKEN_PREFIX + household.token) is None
    # Both still work where they belong.
    assert client.get("/api/v1/jobs", headers=bearer(household.token)).status_code == 200
    assert client.get("/metrics", headers=bearer(operator.token)).status_code == 200


# -- the store functions of the operator's views and actions ---------------------------------


def _insert(jobs, kind, payload, household):
    return jobs.enqueue(kind, payload, household_id=household.household_id)


def _force(store, job_id, status, error=None):
    """Put a job in a final state as the runner leaves it (attempt 1, finished)."""
    sql.execute(
        store,
        "UPDATE jobs SET status = ?, attempt = 1, error = ?, finished_at = updated_at WHERE id = ?",
        (status, error, job_id),
    )


def test_queue_figures_count_by_kind_and_status_and_find_the_oldest_due(store, jobs, household):
    first = _insert(jobs, "succeed", {"value": 1}, household)
    _insert(jobs, "succeed", {"value": 2}, household)
    done = _insert(jobs, "sleep", {"seconds": 0}, household)
    _force(store, done, "failed", "boom")
    figures = store.read(store.operations.queue_figures)
    assert figures.counts == {("succeed", "queued"): 2, ("sleep", "failed"): 1}
    assert figures.by_status() == {"queued": 2, "failed": 1}
    assert figures.oldest_due["succeed"].job_id == first
    assert figures.oldest_due["succeed"].age_seconds >= 0
    assert "sleep" not in figures.oldest_due
    assert figures.oldest().job_id == first
    assert figures.finished_last_hour == 1


def test_retry_job_queues_a_failed_job_afresh_and_nothing_else(store, jobs, household):
    failed = _insert(jobs, "succeed", {"value": 1}, household)
    _force(store, failed, "failed", "boom")
    assert store.write(store.jobs.retry_job, failed).status is Status.QUEUED
    [row] = sql.rows(store, "SELECT * FROM jobs WHERE id = ?", (failed,))
    assert row["status"] == Status.QUEUED
    assert row["attempt"] == 0
    assert row["error"] is None
    assert row["finished_at"] is None
    assert row["interruptions"] == 0
    # A job that is not failed (or cancelled) is left alone.
    queued = _insert(jobs, "succeed", {"value": 2}, household)
    succeeded = _insert(jobs, "succeed", {"value": 3}, household)
    _force(store, succeeded, "succeeded")
    assert store.write(store.jobs.retry_job, queued).status is Status.QUEUED
    assert store.write(store.jobs.retry_job, succeeded).status is Status.SUCCEEDED
    assert store.write(store.jobs.retry_job, "no-such-job") is None
    assert sql.scalar(store, "SELECT status FROM jobs WHERE id = ?", (succeeded,)) == "succeeded"


def test_delete_job_deletes_any_job_but_a_running_one(store, jobs, household):
    queued = _insert(jobs, "succeed", {"value": 1}, household)
    running = _insert(jobs, "succeed", {"value": 2}, household)
    sql.execute(
        store,
        "UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'x', "
        "lease_expires_at = run_at WHERE id = ?",
        (running,),
    )
    assert store.write(store.operations.delete_job, running) is False
    assert store.write(store.operations.delete_job, queued) is True
    assert store.write(store.operations.delete_job, queued) is False
    assert [r["id"] for r in sql.rows(store, "SELECT id FROM jobs")] == [running]


def test_kinds_of_names_each_existing_job(store, jobs, household):
    one = _insert(jobs, "succeed", {"value": 1}, household)
    two = _insert(jobs, "sleep", {"seconds": 0}, household)
    assert store.read(store.operations.kinds_of, [one, two, "gone"]) == {
        one: "succeed",
        two: "sleep",
    }
    assert store.read(store.operations.kinds_of, []) == {}


def test_queue_figures_agree_with_the_table_after_every_kind_of_change(store, jobs, household):
    """The counts are kept by triggers; they must match a count of the rows
    after inserts, runs, retries, renames and deletes, folded or not."""
    ids = [_insert(jobs, "succeed", {"value": n}, household) for n in range(5)]
    ids += [_insert(jobs, "fail_with_failure", {"message": "no"}, household) for _ in range(2)]
    pool = jobs.start_pool()
    wait_for(lambda: all(jobs.get(i).status in (Status.SUCCEEDED, Status.FAILED) for i in ids))
    pool.stop(timeout=1)
    assert store.write(store.jobs.retry_job, ids[-1]).status is Status.QUEUED
    assert store.write(store.operations.delete_job, ids[0])
    sql.execute(store, "UPDATE jobs SET kind = 'renamed' WHERE id = ?", (ids[1],))
    sql.execute(store, "DELETE FROM jobs WHERE id = ?", (ids[2],))
    counted = {
        (row["kind"], row["status"]): row["n"]
        for row in sql.rows(store, "SELECT kind, status, count(*) AS n FROM jobs GROUP BY 1, 2")
    }
    assert store.read(store.operations.queue_figures).counts == counted
    # Folded (PostgreSQL keeps changes apart until then), the same.
    store.write(store.operations.fold_counts)
    assert store.read(store.operations.queue_figures).counts == counted
    sql.execute(store, "DELETE FROM jobs WHERE id = ?", (ids[3],))
    store.write(store.operations.fold_counts)
    counted[("succeed", "succeeded")] -= 1
    assert store.read(store.operations.queue_figures).counts == counted
    counted[("succeed", "succeeded")] += 1
    assert counted == {
        ("succeed", "succeeded"): 2,
        ("renamed", "succeeded"): 1,
        ("fail_with_failure", "failed"): 1,
        ("fail_with_failure", "queued"): 1,
    }
