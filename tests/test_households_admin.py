"""Suspending, resuming and erasing a household, through the CLI, on both
databases: a suspended household's requests answer `403 household_suspended`
from the very next one (its cached job answer included) and its queued jobs
wait while others' run; an erasure cancels its running jobs and deletes its
tokens, jobs, keys and recipes, leaving other households' rows and an audit
record; the prune job finishes what running jobs held up."""

from __future__ import annotations

import json

import pytest

from mealquest.extensions import get_store
from mealquest.households import create_household, create_token
from mealquest.jobs.service.retention import prune
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID, HouseholdErased
from mealquest.model.jobs import Status
from mealquest.model.recipes import ParsedRecipe
from tests.conftest import wait_for
from tests.support import sql

pytestmark = pytest.mark.both_databases


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rows_of(store, household_id: int) -> dict[str, int]:
    return {
        table: sql.scalar(
            store, f"SELECT count(*) FROM {table} WHERE household_id = ?", (household_id,)
        )
        for table in ("jobs", "recipes", "api_tokens")
    }


def store_recipe(store, household_id: int, job_id: str) -> None:
    store.write(
        store.recipes.upsert_for_job,
        household_id=household_id,
        job_id=job_id,
        source_url="https://example.test/soup",
        parsed=ParsedRecipe(
            title="Soup",
            ingredients=["water"],
            instructions=["boil"],
            yields=None,
            total_time_minutes=None,
            image_url=None,
            author=None,
        ),
    )


def audit_rows(store) -> list[dict]:
    return sql.rows(store, "SELECT actor, action, target, count FROM audit_log ORDER BY seq")


def test_a_suspended_households_requests_are_refused_from_the_next_one(
    app, client, runner, jobs, household, auth
):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    # Read once, so this process keeps the answer (SQLite) for the next poll.
    assert client.get(f"/api/v1/jobs/{job_id}", headers=auth).status_code == 200
    assert client.get(f"/api/v1/jobs/{job_id}", headers=auth).status_code == 200

    done = runner.invoke(args=["households", "suspend", str(household.household_id)])
    assert done.exit_code == 0, done.output
    assert f"household {household.household_id} suspended" in done.output

    for method, path in (
        ("GET", f"/api/v1/jobs/{job_id}"),
        ("GET", "/api/v1/jobs"),
        ("POST", f"/api/v1/jobs/{job_id}/cancel"),
        ("GET", "/api/v1/recipes"),
    ):
        answer = client.open(path, method=method, headers=auth)
        assert answer.status_code == 403, (method, path)
        assert answer.json["error"]["code"] == "household_suspended"
    assert "suspended" in runner.invoke(args=["households", "list"]).output
    again = runner.invoke(args=["households", "suspend", str(household.household_id)])
    assert "was already suspended" in again.output

    assert runner.invoke(args=["households", "resume", str(household.household_id)]).exit_code == 0
    assert client.get(f"/api/v1/jobs/{job_id}", headers=auth).status_code == 200
    actions = [row["action"] for row in audit_rows(get_store(app))]
    # After the households' creation.
    assert actions[-3:] == ["suspend", "suspend", "resume"]
    assert [row["count"] for row in audit_rows(get_store(app))][-3:] == [1, 0, 1]
    assert audit_rows(get_store(app))[0]["actor"].startswith("command line (")


def test_a_suspended_households_queued_job_waits_while_others_run(
    runner, jobs, household, other_household
):
    waiting = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    assert runner.invoke(args=["households", "suspend", str(household.household_id)]).exit_code == 0
    # Enqueued after it (an operator may enqueue for a suspended household).
    later = jobs.enqueue("succeed", {"value": 2}, household_id=other_household.household_id)
    jobs.start_pool()

    wait_for(lambda: jobs.get(later).status is Status.SUCCEEDED)
    # The pool claimed past it: it was due first, and it still waits.
    assert jobs.get(waiting).status is Status.QUEUED

    assert runner.invoke(args=["households", "resume", str(household.household_id)]).exit_code == 0
    jobs.pool.wake()
    wait_for(lambda: jobs.get(waiting).status is Status.SUCCEEDED)


def test_erase_cancels_running_jobs_then_deletes_the_households_rows_only(
    app, client, runner, jobs, store, household, other_household
):
    mine = household.household_id
    create_token(store, mine)
    finished = jobs.enqueue("succeed", {"value": 1}, household_id=mine, unique_key="order-1")
    theirs = jobs.enqueue("succeed", {"value": 2}, household_id=other_household.household_id)
    jobs.start_pool()
    wait_for(lambda: jobs.get(finished).status is Status.SUCCEEDED)
    wait_for(lambda: jobs.get(theirs).status is Status.SUCCEEDED)
    store_recipe(store, mine, finished)
    store_recipe(store, other_household.household_id, theirs)
    running = jobs.enqueue("until_cancelled", {}, household_id=mine)
    wait_for(lambda: jobs.get(running).status is Status.RUNNING)
    before = rows_of(store, other_household.household_id)

    refused = runner.invoke(args=["households", "erase", str(mine)])
    assert refused.exit_code != 0
    assert "--yes" in refused.output
    assert rows_of(store, mine)["jobs"] == 2

    done = runner.invoke(args=["households", "erase", str(mine), "--yes", "--wait", "30"])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output.strip().splitlines()[-1])
    assert summary == {
        "household_id": mine,
        "cancelled": 1,
        "tokens": 2,
        "jobs": 2,
        "recipes": 1,
        "still_running": 0,
        "forgotten": True,
    }
    assert rows_of(store, mine) == {"jobs": 0, "recipes": 0, "api_tokens": 0}
    assert rows_of(store, other_household.household_id) == before
    state = sql.rows(
        store, "SELECT name, erased_at, suspended_at FROM households WHERE id = ?", (mine,)
    )
    assert state[0]["name"] == "erased household"
    assert state[0]["erased_at"] is not None
    assert client.get("/api/v1/jobs", headers=bearer(household.token)).status_code == 401
    with pytest.raises(HouseholdErased):
        create_token(store, mine)
    assert "erased" in runner.invoke(args=["tokens", "create", str(mine)]).output
    [entry] = [row for row in audit_rows(store) if row["action"] == "erase"]
    assert entry["target"] == f"household {mine}"
    assert entry["count"] == 5


def test_after_an_erase_no_byte_of_the_household_is_left_in_the_sqlite_files(
    app, runner, jobs, store, household, other_household, database
):
    if "DATABASE" not in database:
        pytest.skip("PostgreSQL keeps dead tuples until VACUUM: the docs say what stays")
    mine = household.household_id
    secret = "q7TOKENq7"
    for n in range(40):
        jobs.enqueue(
            "recipe_import",
            {"url": f"https://soup.example/r/{n}?token={secret}{n}"},
            household_id=mine,
            unique_key=f"key-{secret}-{n}",
        )
    finished = jobs.enqueue("succeed", {"value": 1}, household_id=mine, unique_key=f"k{secret}")
    jobs.enqueue("succeed", {"value": 2}, household_id=other_household.household_id)
    jobs.start_pool()
    wait_for(lambda: jobs.get(finished).status is Status.SUCCEEDED)
    store.write(
        store.recipes.upsert_for_job,
        household_id=mine,
        job_id=finished,
        source_url=f"https://soup.example/soup?token={secret}",
        parsed=ParsedRecipe(
            title=f"Soup {secret}",
            ingredients=[f"water {secret}"],
            instructions=["boil"],
            yields=None,
            total_time_minutes=None,
            image_url=None,
            author=None,
        ),
    )
    path = app.config["DATABASE"]

    def copies() -> dict[str, int]:
        found = {}
        for suffix in ("", "-wal", "-shm"):
            try:
                with open(path + suffix, "rb") as file:
                    found[suffix or "db"] = file.read().count(secret.encode())
            except FileNotFoundError:
                found[suffix or "db"] = 0
        return found

    assert sum(copies().values()) > 0  # what the check looks for is there before
    done = runner.invoke(args=["households", "erase", str(mine), "--yes", "--wait", "30"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.strip().splitlines()[-1])["forgotten"] is True
    assert copies() == {"db": 0, "-wal": 0, "-shm": 0}


def test_the_prune_job_finishes_an_erasure_that_a_running_job_held_up(
    app, runner, jobs, store, household, gates
):
    mine = household.household_id
    held = jobs.enqueue("wait_for_gate", {"url": gates.url("held")}, household_id=mine)
    jobs.start_pool()
    wait_for(lambda: gates.arrivals("held") == 1)

    # No wait: the job is told to stop, but its handler ignores that until
    # the kill grace ends; the erasure leaves it.
    done = runner.invoke(args=["households", "erase", str(mine), "--yes", "--wait", "0"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.strip().splitlines()[0])["still_running"] == 1
    assert "still running" in done.output
    gates.open("held")
    wait_for(lambda: jobs.get(held).status in (Status.CANCELLED, Status.SUCCEEDED))
    store_recipe(store, mine, held)  # as an import that finished meanwhile would

    pruned = prune(store, older_than_days=14, catchup_seconds=3600)

    assert pruned.erased == 2
    assert rows_of(store, mine) == {"jobs": 0, "recipes": 0, "api_tokens": 0}


def test_the_system_and_unknown_households_are_refused_in_one_line(runner, store):
    for command in ("suspend", "resume"):
        answer = runner.invoke(args=["households", command, str(SYSTEM_HOUSEHOLD_ID)])
        assert answer.exit_code == 1
        assert "system household" in answer.output
        unknown = runner.invoke(args=["households", command, "987654"])
        assert unknown.exit_code == 1
        assert "No household has that id" in unknown.output
    erase = runner.invoke(args=["households", "erase", str(SYSTEM_HOUSEHOLD_ID), "--yes"])
    assert erase.exit_code == 1
    assert "system household" in erase.output
    assert "Traceback" not in erase.output
    other = create_household(store, "Them")
    gone = runner.invoke(args=["households", "erase", "987654", "--yes", "--wait", "0"])
    assert gone.exit_code == 1
    assert "No household has that id" in gone.output
    assert rows_of(store, other.household_id)["api_tokens"] == 1
