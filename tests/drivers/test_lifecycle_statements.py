"""The statements of a job's lifecycle beyond the claim, and of the other
statement sets, each test on both databases."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from mealquest.model.jobs import (
    Attempt,
    NewJob,
    OnInterrupt,
    Status,
    Transition,
)
from mealquest.model.operators import UnknownOperator
from tests.drivers.conftest import claim, db_now, enqueue, get, other_household


def new_job(household: int, job_id: str, **changes) -> NewJob:
    job = NewJob(
        job_id=job_id,
        household_id=household,
        kind="succeed",
        payload="{}",
        max_attempts=1,
        on_interrupt=OnInterrupt.FAIL,
    )
    return dataclasses.replace(job, **changes)


# -- inserts and idempotency keys -------------------------------------------------------------


def test_a_bulk_insert_queues_every_job_in_its_order(store, household):
    made = [new_job(household, f"{index:032x}") for index in range(5)]

    store.write(store.jobs.insert_jobs, made)

    listed = store.read(store.jobs.list_jobs, household_id=household)
    assert [job.id for job in reversed(listed)] == [job.job_id for job in made]
    with pytest.raises(ValueError, match="idempotency key"):
        store.write(store.jobs.insert_jobs, [new_job(household, "f" * 32, unique_key="k")])


def test_a_key_the_household_holds_inserts_nothing_and_names_its_holder(store, household):
    first = new_job(household, "a" * 32, unique_key="key-1")
    second = new_job(household, "b" * 32, unique_key="key-1")
    theirs = new_job(other_household(store), "c" * 32, unique_key="key-1")

    assert store.write(store.jobs.insert_job, first)
    assert not store.write(store.jobs.insert_job, second)
    assert store.write(store.jobs.insert_job, theirs)  # keys are per household

    holder = store.write(store.jobs.holder_of_key, household_id=household, unique_key="key-1")
    assert holder == (first.job_id, first.unique_digest)


def test_a_key_is_released_only_once_its_window_is_over(store, household):
    store.write(store.jobs.insert_job, new_job(household, "a" * 32, unique_key="key-1"))

    def release(older_than_seconds):
        return store.write(
            store.jobs.release_unique_key,
            household_id=household,
            unique_key="key-1",
            older_than_seconds=older_than_seconds,
        )

    assert release(3600) == 0
    assert release(-1) == 1
    assert store.write(store.jobs.holder_of_key, household_id=household, unique_key="key-1") is None


# -- cancel and retry -------------------------------------------------------------------------


def test_a_queued_job_is_cancelled_at_once_and_a_running_one_by_request(store, household):
    running = enqueue(store, household)
    [job] = claim(store, limit=1)
    queued = enqueue(store, household)

    assert store.write(store.jobs.cancel_job, queued).status is Status.CANCELLED
    asked = store.write(store.jobs.cancel_job, running)
    assert asked.status is Status.RUNNING
    assert asked.cancel_requested_at is not None
    assert store.write(store.jobs.cancel_requested, [job.lease]) == {running}
    # Another household cannot cancel it, nor see it.
    assert store.write(store.jobs.cancel_job, running, other_household(store)) is None


def test_a_failed_job_is_retried_with_a_fresh_attempt_budget_and_others_are_left(store, household):
    job_id = enqueue(store, household)
    [job] = claim(store)
    store.write(store.jobs.transition, Transition(job.lease, to=Status.FAILED, error="boom"))

    retried = store.write(store.jobs.retry_job, job_id)

    assert (retried.status, retried.attempt, retried.error) == (Status.QUEUED, 0, None)
    # Queued now: retrying again changes nothing.
    assert store.write(store.jobs.retry_job, job_id).status is Status.QUEUED
    assert store.write(store.jobs.retry_job, job_id, other_household(store)) is None


# -- batches, leases of a claim ---------------------------------------------------------------


def test_a_batch_of_transitions_answers_each_lease(store, household):
    for _ in range(3):
        enqueue(store, household, max_attempts=2)
    done, retried, refunded = claim(store, limit=3)
    stale = dataclasses.replace(done.lease, owner="someone-else")

    matched = store.write(
        store.jobs.transition_many,
        [
            Transition(done.lease, to=Status.SUCCEEDED, result='{"ok": 1}'),
            Transition(retried.lease, to=Status.QUEUED, delay_seconds=60),
            Transition(refunded.lease, to=Status.QUEUED, attempt=Attempt.REFUND),
            Transition(stale, to=Status.FAILED, error="late"),
        ],
    )

    assert matched == [True, True, True, False]
    assert get(store, done.id).result == {"ok": 1}
    assert (get(store, retried.id).status, get(store, retried.id).attempt) == (Status.QUEUED, 1)
    assert get(store, refunded.id).attempt == 0


def test_the_leases_of_a_claim_are_found_by_its_owner(store, household):
    for _ in range(3):
        enqueue(store, household)
    mine = claim(store, limit=2, owner="claim.1")
    claim(store, limit=1, owner="claim.2")

    leases = store.write(store.jobs.leases_of, "claim.1")

    assert sorted(leases, key=lambda lease: lease.job_id) == sorted(
        (job.lease for job in mine), key=lambda lease: lease.job_id
    )
    assert store.write(store.jobs.leases_of, "nobody") == []


# -- reads for the API and the quota ----------------------------------------------------------


def test_a_job_is_read_with_its_token_in_one_statement(store, household):
    job_id = enqueue(store, household)
    theirs = enqueue(store, other_household(store))

    household_of, job = store.read(store.jobs.get_job_with_token, job_id, "a" * 64)
    assert (household_of.id, job.id) == (household, job_id)
    assert store.read(store.jobs.get_job_with_token, theirs, "a" * 64) == (household_of, None)
    assert store.read(store.jobs.get_job_with_token, job_id, "f" * 64) is None


def test_the_quota_counts_queued_and_running_jobs_up_to_its_bound(store, household):
    for _ in range(4):
        enqueue(store, household)
    claim(store, limit=2)
    finished = claim(store, limit=1)[0]
    store.write(store.jobs.transition, Transition(finished.lease, to=Status.SUCCEEDED))

    assert store.write(store.jobs.count_pending, household, 100) == 3
    assert store.write(store.jobs.count_pending, other_household(store), 100) == 0
    running, mean = store.read(store.jobs.household_load, household)
    assert running == 2
    assert mean is not None
    assert mean >= 0


# -- periodic slots and retention -------------------------------------------------------------


def test_a_slot_makes_one_job_and_old_slots_are_deleted(store, household):
    now = db_now(store)
    slot = now.replace(microsecond=0) - timedelta(minutes=5)

    def schedule(tx):
        seen = store.periodic.first_seen(tx, kind="tick", moment=now)
        first = store.periodic.claim_slot(tx, kind="tick", slot_at=slot)
        second = store.periodic.claim_slot(tx, kind="tick", slot_at=slot)
        if first:
            store.periodic.record_job(tx, kind="tick", slot_at=slot, job_id="a" * 32)
        return seen, first, second

    seen, first, second = store.write(schedule)
    assert (first, second) == (True, False)
    assert seen == store.write(store.periodic.first_seen, kind="tick", moment=now + timedelta(1))
    assert store.write(store.periodic.delete_slots, older_than_seconds=3600, limit=10) == 0
    assert store.write(store.periodic.delete_slots, older_than_seconds=60, limit=10) == 1


def test_retention_deletes_only_finished_jobs_past_the_age(store, household):
    enqueue(store, household)
    [job] = claim(store, limit=1)
    store.write(store.jobs.transition, Transition(job.lease, to=Status.SUCCEEDED))
    queued = enqueue(store, household)

    assert store.write(store.retention.delete_finished, older_than_seconds=3600, limit=10) == 0
    later = db_now(store) + timedelta(hours=2)
    deleted = store.write(
        store.retention.delete_finished, older_than_seconds=3600, limit=10, now=later
    )
    assert deleted == 1
    assert get(store, job.id) is None
    assert get(store, queued) is not None


# -- operators and the operator's views -------------------------------------------------------


def test_operators_are_listed_found_by_digest_and_revoked(store):
    alice = store.write(store.operators.insert_operator, name="Alice", token_sha256="a" * 64)

    assert store.read(store.operators.operator_for_token_digest, "a" * 64).name == "Alice"
    store.write(store.operators.revoke_operator, alice)
    assert store.read(store.operators.operator_for_token_digest, "a" * 64) is None
    [listed] = store.read(store.operators.list_operators)
    assert (listed.id, listed.revoked_at is not None) == (alice, True)
    with pytest.raises(UnknownOperator):
        store.write(store.operators.revoke_operator, alice)


def test_queue_figures_count_by_kind_and_status_and_find_the_oldest_due(store, household):
    oldest = enqueue(store, household)
    enqueue(store, household)
    enqueue(store, household, kind="other")

    store.write(store.operations.fold_counts)
    figures = store.read(store.operations.queue_figures)

    assert figures.counts[("succeed", "queued")] == 2
    assert figures.counts[("other", "queued")] == 1
    assert figures.oldest_due["succeed"].job_id == oldest
    assert store.read(store.operations.kinds_of, [oldest, "missing"]) == {oldest: "succeed"}
    assert store.write(store.operations.delete_job, oldest)
    assert not store.write(store.operations.delete_job, oldest)


def test_a_session_names_its_live_operator_until_it_ends(store):
    alice = store.write(store.operators.insert_operator, name="Alice", token_sha256="a" * 64)
    bob = store.write(store.operators.insert_operator, name="Bob", token_sha256="b" * 64)

    def sign_in(digest, operator_id, lifetime=3600.0, keep=20):
        store.write(
            store.sessions.insert_session,
            id_sha256=digest,
            operator_id=operator_id,
            lifetime_seconds=lifetime,
            keep=keep,
        )

    sign_in("1" * 64, alice)
    sign_in("2" * 64, alice)
    sign_in("3" * 64, bob)
    sign_in("4" * 64, bob, lifetime=-1)  # already over
    assert store.read(store.sessions.session_operator, "1" * 64).name == "Alice"
    assert store.read(store.sessions.session_operator, "4" * 64) is None
    store.write(store.sessions.delete_session, "1" * 64)
    assert store.read(store.sessions.session_operator, "1" * 64) is None
    assert store.read(store.sessions.session_operator, "2" * 64).name == "Alice"
    store.write(store.sessions.delete_operator_sessions, alice)
    assert store.read(store.sessions.session_operator, "2" * 64) is None
    assert store.read(store.sessions.session_operator, "3" * 64).name == "Bob"
    # An operator keeps its newest `keep` sessions; a revoked one, none that work.
    sign_in("5" * 64, bob, keep=1)
    assert store.read(store.sessions.session_operator, "3" * 64) is None
    store.write(store.operators.revoke_operator, bob)
    assert store.read(store.sessions.session_operator, "5" * 64) is None


def test_a_statement_that_moves_many_jobs_counts_and_charts_each_of_them(store, household):
    """A claim and a completer's batch each move many jobs in one statement,
    and PostgreSQL notes the queue figures and the charts once per statement
    (a change per kind and status, with its sum): each job still counts
    once, where it went, and each start and end is charted; an update that
    moves no job (a lease renewed) notes nothing."""
    for kind, n in (("succeed", 6), ("other", 4)):
        for _ in range(n):
            enqueue(store, household, kind=kind)
    store.write(store.operations.fold_counts)
    store.write(store.history.fold_history)
    noted_before = _count_changes(store) if store.name == "postgresql" else 0

    jobs = claim(store, kinds=("succeed", "other"), limit=10)
    assert len(jobs) == 10
    store.write(store.jobs.renew_leases, [job.lease for job in jobs], lease_seconds=60.0)
    succeed = [job for job in jobs if job.kind == "succeed"]
    other = [job for job in jobs if job.kind == "other"]
    moves = (
        [Transition(job.lease, to=Status.SUCCEEDED, result="{}") for job in succeed[:3]]
        + [Transition(job.lease, to=Status.FAILED, error="no") for job in succeed[3:]]
        + [Transition(job.lease, to=Status.SUCCEEDED, result="{}") for job in other[:2]]
        + [Transition(job.lease, to=Status.QUEUED, delay_seconds=60.0) for job in other[2:]]
    )
    assert store.write(store.jobs.transition_many, moves) == [True] * 10

    if store.name == "postgresql":
        # The claim moved 10 jobs of 2 kinds (4 changes), the batch 10 into 4
        # places (6), the renewal none: the row triggers wrote 40. A fold
        # meanwhile (one statement in 2,000) only deletes changes.
        assert _count_changes(store) - noted_before <= 10
    store.write(store.operations.fold_counts)
    counts = store.read(store.operations.queue_figures).counts
    assert counts == {
        ("succeed", "succeeded"): 3,
        ("succeed", "failed"): 3,
        ("other", "succeeded"): 2,
        ("other", "queued"): 2,
    }
    for fold in (False, True):
        if fold:
            store.write(store.history.fold_history)
        rows = store.read(store.history.history, width=10, periods=2).rows
        totals = {
            kind: tuple(
                sum(getattr(row, field) for row in rows if row.kind == kind)
                for field in ("started", "succeeded", "failed", "cancelled")
            )
            for kind in ("succeed", "other")
        }
        assert totals == {"succeed": (6, 3, 3, 0), "other": (4, 2, 0, 0)}


def _count_changes(store) -> int:
    """The count changes waiting to be folded (PostgreSQL's)."""
    return store.read(
        lambda conn: conn.execute("SELECT count(*) AS n FROM job_count_changes").fetchone()["n"]
    )
