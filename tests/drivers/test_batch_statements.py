"""The driver statements of dependencies and batches, of a job's log lines and
traces, and of the recipes a batch imported: each on both databases (and
through PgBouncer), against what the service asks of it.

`test_every_statement_is_exercised_by_a_driver_test` holds every statement
of the contract to some test of this directory."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

from mealquest.model.batches import NewBatch
from mealquest.model.jobs import (
    WAITING_RUN_AT,
    Lease,
    LogLine,
    NewJob,
    OnInterrupt,
    Status,
    Transition,
)
from mealquest.model.recipes import ParsedRecipe
from tests.drivers.conftest import claim, enqueue, get
from tests.drivers.test_contract import SETS, members


def other_household(store) -> int:
    return store.write(store.households.create_household, name="Joneses", token_sha256="b" * 64)[0]


def waiting_job(store, household: int, depends_on: tuple[str, ...], *, needs_success=True) -> str:
    """A job queued to wait for `depends_on`, as `enqueue(..., depends_on=)` stores it."""
    job = NewJob(
        job_id=uuid.uuid4().hex,
        household_id=household,
        kind="succeed",
        payload="{}",
        max_attempts=1,
        on_interrupt=OnInterrupt.FAIL,
        run_at=WAITING_RUN_AT,
        depends_on=depends_on,
        needs_success=needs_success,
    )

    def write(tx):
        store.jobs.insert_job(tx, job)
        store.batches.insert_dependencies(tx, [job])

    store.write(write)
    return job.job_id


def run_to(store, job_id: str, status: Status) -> None:
    """Claim the job (it must be the only due one) and end it `status`."""
    [job] = claim(store, limit=1, owner="worker-1")
    assert job.id == job_id
    ended = Transition(
        Lease(job.id, "worker-1", job.attempt),
        to=status,
        result="{}" if status is Status.SUCCEEDED else None,
        error="burnt" if status is Status.FAILED else None,
    )
    assert store.write(store.jobs.transition, ended)


def test_missing_jobs_are_those_not_of_the_household(store, household):
    mine = enqueue(store, household)
    theirs = enqueue(store, other_household(store))
    missing = store.read(store.batches.missing_jobs, household, [mine, theirs, "f" * 32])
    assert missing == {theirs, "f" * 32}


def test_a_job_waits_until_what_it_depends_on_succeeds(store, household):
    first = enqueue(store, household)
    waiting = waiting_job(store, household, (first,))
    assert store.read(store.batches.has_dependencies)
    # Nothing to resolve while the job it waits for is queued.
    assert store.write(store.batches.resolve_dependencies, limit=100).due == ()
    run_to(store, first, Status.SUCCEEDED)

    unblocked = store.write(store.batches.resolve_dependencies, limit=100, depends_on=[first])

    assert unblocked.due == (waiting,)
    assert unblocked.resolved == 1
    assert not store.read(store.batches.has_dependencies)
    assert get(store, waiting).status is Status.QUEUED
    assert [job.id for job in claim(store, limit=5)] == [waiting]


def test_a_job_whose_dependency_failed_is_cancelled_and_a_callback_runs_anyway(store, household):
    first = enqueue(store, household)
    needs = waiting_job(store, household, (first,))
    callback = waiting_job(store, household, (first,), needs_success=False)
    run_to(store, first, Status.FAILED)

    unblocked = store.write(store.batches.resolve_dependencies, limit=100)

    assert unblocked.cancelled == (needs,)
    assert unblocked.due == (callback,)
    assert get(store, needs).status is Status.CANCELLED
    assert get(store, callback).status is Status.QUEUED


def test_a_batch_its_members_outcomes_and_its_households_listing(store, household):
    members = [enqueue(store, household) for _ in range(2)]
    callback = waiting_job(store, household, tuple(members), needs_success=False)
    batch_id = uuid.uuid4().hex
    store.write(store.batches.insert_batch, NewBatch(batch_id, household, tuple(members), callback))
    run_to(store, members[0], Status.SUCCEEDED)
    run_to(store, members[1], Status.FAILED)

    outcome = store.read(store.batches.batch_outcome, callback)

    assert outcome is not None
    assert (outcome.batch_id, outcome.succeeded, outcome.failed) == (
        batch_id,
        (members[0],),
        (members[1],),
    )
    assert store.read(store.batches.batch_outcome, members[0]) is None  # no batch's callback
    listed = store.read(store.batches.household_batches, household, limit=10)
    assert [batch.id for batch in listed] == [batch_id]
    assert store.read(store.batches.household_batches, other_household(store), limit=10) == []


def test_batches_go_when_their_jobs_are_gone_and_with_their_household(store, household):
    gone, kept = (enqueue(store, household) for _ in range(2))
    store.write(store.batches.insert_batch, NewBatch(uuid.uuid4().hex, household, (gone,)))
    store.write(store.batches.insert_batch, NewBatch(uuid.uuid4().hex, household, (kept,)))
    assert store.write(store.batches.delete_empty_batches, limit=10) == 0
    store.write(lambda tx: tx.execute(_dialect(store, "DELETE FROM jobs WHERE id = ?"), (gone,)))

    assert store.write(store.batches.delete_empty_batches, limit=10) == 1
    assert len(store.read(store.batches.household_batches, household, limit=10)) == 1
    assert store.write(store.batches.delete_household_batches, household, limit=10) == 1
    assert store.read(store.batches.household_batches, household, limit=10) == []


def test_a_jobs_log_lines_and_traceparent_are_kept_and_read_back(store, household):
    job_id = enqueue(store, household)
    lines = [
        LogLine(1, 1, "INFO", "fetched the page", "2026-12-06T10:00:00.000000Z"),
        LogLine(1, 2, "ERROR", "attempt 1 failed: no answer", "2026-12-06T10:00:01.000000Z"),
        LogLine(2, 1, "INFO", "fetched again", "2026-12-06T10:00:05.000000Z"),
    ]
    store.write(store.jobs.add_log_lines, job_id, lines[2:])
    store.write(store.jobs.add_log_lines, job_id, lines[:2])
    assert store.read(store.jobs.log_lines, job_id) == lines
    assert store.read(store.jobs.log_lines, "f" * 32) == []

    traceparent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    other = enqueue(store, household)
    store.write(store.jobs.add_traceparents, [(job_id, traceparent)])
    assert store.read(store.jobs.traceparents, [job_id, other]) == {job_id: traceparent}


def test_the_recipes_a_batch_imported_in_its_jobs_order(store, household):
    jobs = [enqueue(store, household, kind="recipe_import") for _ in range(3)]
    for index in (2, 0):  # the middle import made none
        store.write(
            store.recipes.upsert_for_job,
            household_id=household,
            job_id=jobs[index],
            source_url=f"https://example.test/{index}",
            parsed=ParsedRecipe(f"Dish {index}", ["salt"], ["cook"], None, None, None, None),
        )

    recipes = store.read(store.recipes.recipes_of_jobs, household, jobs)

    assert [recipe.title for recipe in recipes] == ["Dish 0", "Dish 2"]
    assert store.read(store.recipes.recipes_of_jobs, other_household(store), jobs) == []


def _dialect(store, sql: str) -> str:
    return sql.replace("?", "%s") if store.name == "postgresql" else sql


# -- coverage of the contract ---------------------------------------------------------------


def _statements_called() -> set[tuple[str, str]]:
    """(set, statement) of every `<set>.<statement>` this directory's tests
    name (`store.jobs.claim`, or a driver module's `jobs.claim`)."""
    called = set()
    for path in Path(__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                owner = node.value
                if isinstance(owner, ast.Attribute):
                    called.add((owner.attr, node.attr))
                elif isinstance(owner, ast.Name):
                    called.add((owner.id, node.attr))
    return called


def test_every_statement_is_exercised_by_a_driver_test():
    # A statement no driver test runs can differ between the drivers unseen
    # (16 of 104 were so, all of the batches' among them).
    called = _statements_called()
    unexercised = [
        f"{set_name}.{name}"
        for set_name, protocol in SETS.items()
        for name in members(protocol)
        if (set_name, name) not in called
    ]
    assert unexercised == []
