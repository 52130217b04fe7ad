"""The statements of flow control, each test on both databases (and through
PgBouncer): paused kinds, snoozes, and the claim's limits per partition."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from mealquest.clock import from_text
from mealquest.db import claiming
from mealquest.model.jobs import (
    Attempt,
    ClaimRequest,
    Job,
    NewJob,
    OnInterrupt,
    PartitionLimits,
    Rate,
    Status,
    Transition,
)
from mealquest.model.queue import QueueFigures
from tests.drivers.conftest import (
    LEASE,
    claim,
    db_now,
    enqueue,
    get,
    other_household,
    set_run_at,
)
from tests.support import sql

RUNNING_TWO = {"succeed": PartitionLimits(max_running=2)}
TWO_A_MINUTE = {"succeed": PartitionLimits(rate=Rate(2, 60.0))}


def enqueue_in(store, household: int, partition: str | None, *, kind="succeed", priority=0):
    job_id = uuid.uuid4().hex
    store.write(
        store.jobs.insert_job,
        NewJob(
            job_id=job_id,
            household_id=household,
            kind=kind,
            payload="{}",
            max_attempts=3,
            on_interrupt=OnInterrupt.REQUEUE,
            priority=priority,
            partition_key=partition,
        ),
    )
    return job_id


def claim_limited(store, partitions, *, limit=10, kinds=("succeed",), now=None) -> list[Job]:
    return store.write(
        store.jobs.claim,
        ClaimRequest(
            owner=f"w.{uuid.uuid4().hex[:6]}",
            lease_seconds=LEASE,
            limit=limit,
            kinds=tuple(kinds),
            partitions=partitions,
            now=now,
        ),
    )


def claimed_job(store, household: int) -> Job:
    enqueue_in(store, household, None)
    [job] = claim(store, limit=1)
    return job


# -- inserts ------------------------------------------------------------------------------


def test_a_jobs_partition_is_stored_by_the_single_and_the_bulk_insert(store, household):
    one = enqueue_in(store, household, "example.com")
    bulk = [
        NewJob(
            job_id=f"{index:032x}",
            household_id=household,
            kind="succeed",
            payload="{}",
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
            partition_key=key,
        )
        for index, key in enumerate(["a.example", None])
    ]
    store.write(store.jobs.insert_jobs, bulk)

    assert (get(store, one).partition_key, get(store, one).snoozes) == ("example.com", 0)
    assert [get(store, job.job_id).partition_key for job in bulk] == ["a.example", None]


# -- paused kinds -------------------------------------------------------------------------


def test_a_paused_kind_is_neither_claimed_nor_due_until_it_is_resumed(store, household):
    paused = enqueue(store, household)
    other = enqueue(store, household, kind="sleep")

    assert store.write(store.flow.pause_kind, "succeed", operator_id=None)
    assert not store.write(store.flow.pause_kind, "succeed", operator_id=None)

    assert not store.read(store.jobs.has_due_job, ["succeed"])
    assert [job.id for job in claim(store, kinds=("succeed", "sleep"))] == [other]
    assert get(store, paused).status is Status.QUEUED
    [entry] = store.read(store.flow.paused_kinds)
    assert (entry.kind, entry.operator_id) == ("succeed", None)
    assert abs(from_text(entry.paused_at) - db_now(store)) < timedelta(minutes=5)

    assert store.write(store.flow.resume_kind, "succeed")
    assert not store.write(store.flow.resume_kind, "succeed")
    assert store.read(store.flow.paused_kinds) == []
    assert store.read(store.jobs.has_due_job, ["succeed"])
    assert [job.id for job in claim(store)] == [paused]


def test_a_pause_names_the_operator_and_shows_in_the_queue_figures(store, household):
    operator = store.write(store.operators.insert_operator, name="Ada", token_sha256="c" * 64)
    enqueue(store, household)
    store.write(store.flow.pause_kind, "succeed", operator_id=operator)
    store.write(store.flow.pause_kind, "sleep", operator_id=None)

    assert [(e.kind, e.operator_id) for e in store.read(store.flow.paused_kinds)] == [
        ("sleep", None),
        ("succeed", operator),
    ]
    figures: QueueFigures = store.read(store.operations.queue_figures)
    assert figures.paused == ("sleep", "succeed")


# -- snoozes ------------------------------------------------------------------------------


def test_a_snooze_queues_the_job_again_later_refunded_and_counted(store, household):
    job = claimed_job(store, household)
    sql.execute(store, "UPDATE jobs SET interruptions = 2 WHERE id = ?", (job.id,))

    assert store.write(
        store.jobs.transition,
        Transition(
            job.lease, to=Status.QUEUED, attempt=Attempt.REFUND, delay_seconds=600, snoozed=True
        ),
    )

    back = get(store, job.id)
    assert (back.status, back.attempt, back.snoozes, back.interruptions) == (
        Status.QUEUED,
        0,
        1,
        0,
    )
    assert from_text(back.run_at) - from_text(job.started_at) >= timedelta(seconds=600)
    assert claim(store) == []
    [again] = claim(store, now=db_now(store) + timedelta(seconds=601))
    assert (again.attempt, again.snoozes) == (1, 1)


def test_a_batch_of_snoozes_is_counted_per_job_and_a_cancel_wins(store, household):
    for _ in range(3):
        enqueue_in(store, household, None)
    snoozed, cancelling, done = claim(store, limit=3)
    store.write(store.jobs.cancel_job, cancelling.id)
    snooze = {"to": Status.QUEUED, "attempt": Attempt.REFUND, "delay_seconds": 5, "snoozed": True}

    matched = store.write(
        store.jobs.transition_many,
        [
            Transition(snoozed.lease, **snooze),
            Transition(cancelling.lease, **snooze),
            Transition(done.lease, to=Status.SUCCEEDED, result="{}"),
        ],
    )

    assert matched == [True, True, True]
    assert (get(store, snoozed.id).status, get(store, snoozed.id).snoozes) == (Status.QUEUED, 1)
    assert get(store, snoozed.id).attempt == 0
    assert (get(store, cancelling.id).status, get(store, cancelling.id).snoozes) == (
        Status.CANCELLED,
        0,
    )
    assert get(store, done.id).snoozes == 0


def test_a_single_snooze_of_a_job_whose_cancel_was_requested_ends_it_cancelled(store, household):
    job = claimed_job(store, household)
    store.write(store.jobs.cancel_job, job.id)

    store.write(
        store.jobs.transition,
        Transition(job.lease, to=Status.QUEUED, attempt=Attempt.REFUND, snoozed=True),
    )

    assert (get(store, job.id).status, get(store, job.id).snoozes) == (Status.CANCELLED, 0)


def test_a_snooze_must_refund_its_attempt_and_a_retry_forgets_the_snoozes(store, household):
    job = claimed_job(store, household)
    with pytest.raises(ValueError, match="refunds"):
        store.write(store.jobs.transition, Transition(job.lease, to=Status.QUEUED, snoozed=True))
    sql.execute(store, "UPDATE jobs SET snoozes = 7 WHERE id = ?", (job.id,))
    store.write(store.jobs.transition, Transition(job.lease, to=Status.FAILED, error="boom"))

    assert store.write(store.jobs.retry_job, job.id).snoozes == 0


# -- limits per partition -----------------------------------------------------------------


def test_a_partition_at_its_running_limit_is_passed_over_for_the_next_job(store, household):
    others = other_household(store)
    busy = [enqueue_in(store, household, "a.example") for _ in range(4)]
    theirs = enqueue_in(store, others, "a.example")
    later = enqueue_in(store, household, "b.example")
    free = enqueue_in(store, others, None)

    first = claim_limited(store, RUNNING_TWO)

    # Two of a.example's (one per household, in turn), and every other job:
    # the partition's backlog hides none of them.
    taken = {job.id for job in first}
    assert len(taken & {*busy, theirs}) == 2
    assert {later, free} <= taken
    assert len(first) == 4
    assert store.read(store.flow.partition_state, "succeed", "a.example").running == 2
    # At its limit, nothing more of it, however many claims ask.
    assert claim_limited(store, RUNNING_TWO) == []
    assert not store.read(store.jobs.has_due_job, ["succeed"], partitions=RUNNING_TWO)
    assert store.read(store.jobs.has_due_job, ["succeed"])
    # A claim without the limit (another kind's rules) is not held to it.
    [done, _] = [job for job in first if job.partition_key == "a.example"]
    store.write(store.jobs.transition, Transition(done.lease, to=Status.SUCCEEDED, result="{}"))
    [next_one] = claim_limited(store, RUNNING_TWO)
    assert next_one.partition_key == "a.example"


def test_a_batch_takes_no_more_of_a_partition_than_it_has_room_for(store, household):
    for _ in range(5):
        enqueue_in(store, household, "a.example")
    tail = enqueue_in(store, household, "b.example")

    batch = claim_limited(store, RUNNING_TWO, limit=10)

    assert sorted(job.partition_key for job in batch) == ["a.example", "a.example", "b.example"]
    assert tail in {job.id for job in batch}


def test_jobs_of_the_best_priority_all_at_their_limit_leave_the_next_priority_its_turn(
    store, household
):
    for _ in range(3):
        enqueue_in(store, household, "a.example", priority=-5)
    low = enqueue_in(store, household, "b.example", priority=5)

    batch = claim_limited(store, RUNNING_TWO, limit=4)

    assert [job.priority for job in batch] == [-5, -5, 5]
    assert batch[-1].id == low


def test_a_partitions_rate_is_counted_from_its_ledger_and_frees_as_the_window_moves(
    store, household
):
    for _ in range(5):
        enqueue_in(store, household, "a.example")
    other = enqueue_in(store, household, "b.example")
    now = db_now(store)

    first = claim_limited(store, TWO_A_MINUTE, now=now)

    assert sorted(job.partition_key for job in first) == ["a.example", "a.example", "b.example"]
    assert other in {job.id for job in first}
    for job in first:
        store.write(store.jobs.transition, Transition(job.lease, to=Status.SUCCEEDED, result="{}"))
    # Nothing runs, but two started within the minute: a.example waits.
    state = store.read(store.flow.partition_state, "succeed", "a.example")
    assert state.running == 0
    assert state.blocked_until is not None
    assert claim_limited(store, TWO_A_MINUTE, now=now + timedelta(seconds=59)) == []
    assert not store.read(store.jobs.has_due_job, ["succeed"], partitions=TWO_A_MINUTE)
    # A minute after the first two, two more; never a third in any minute.
    later = now + timedelta(seconds=60)
    assert len(claim_limited(store, TWO_A_MINUTE, now=later)) == 2
    assert claim_limited(store, TWO_A_MINUTE, now=later + timedelta(seconds=30)) == []
    [last] = claim_limited(store, TWO_A_MINUTE, now=later + timedelta(seconds=60))
    assert last.partition_key == "a.example"
    # One ledger per partition with a rate that started jobs: a's and b's.
    assert sql.scalar(store, "SELECT count(*) FROM partition_rates") == 2


def test_both_limits_hold_together_and_the_kinds_cap_counts_what_is_left(store, household):
    limits = {"succeed": PartitionLimits(max_running=2, rate=Rate(3, 60.0))}
    for _ in range(4):
        enqueue_in(store, household, "a.example")
    for _ in range(2):
        enqueue_in(store, household, "b.example")
    now = db_now(store)
    request = ClaimRequest(
        owner="w.capped",
        lease_seconds=LEASE,
        limit=10,
        kinds=("succeed",),
        kind_caps={"succeed": 3},
        partitions=limits,
        now=now,
    )

    batch = store.write(store.jobs.claim, request)

    # The cap of 3 for the kind, from what the partitions let start: a's two
    # (its running limit) and b's first.
    assert sorted(job.partition_key for job in batch) == ["a.example", "a.example", "b.example"]
    for job in batch[:2]:
        store.write(store.jobs.transition, Transition(job.lease, to=Status.SUCCEEDED, result="{}"))
    # Room again to run, but the rate's third start of a is the last in the minute.
    again = claim_limited(store, limits, now=now + timedelta(seconds=1))
    assert sorted(job.partition_key for job in again) == ["a.example", "b.example"]
    for job in again:
        store.write(store.jobs.transition, Transition(job.lease, to=Status.SUCCEEDED, result="{}"))
    assert claim_limited(store, limits, now=now + timedelta(seconds=2)) == []


def test_stale_rate_ledgers_are_deleted_in_batches_and_live_ones_kept(store, household):
    for partition in ("a.example", "b.example", "c.example"):
        set_run_at(store, enqueue_in(store, household, partition), -3 * 86_400)
    now = db_now(store)
    claim_limited(store, TWO_A_MINUTE, now=now - timedelta(days=2), limit=2)
    claim_limited(store, TWO_A_MINUTE, now=now, limit=1)

    assert (
        store.write(store.flow.delete_stale_rates, older_than_seconds=86_400, limit=1, now=now) == 1
    )
    assert (
        store.write(store.flow.delete_stale_rates, older_than_seconds=86_400, limit=10, now=now)
        == 1
    )
    assert sql.scalar(store, "SELECT count(*) FROM partition_rates") == 1


def held_household(store, household: int, *, waiting: int = 70) -> tuple[int, list[Job]]:
    """A household of its own whose due jobs (`waiting` of them: past what a
    look reads before it reads households) all wait on a.example, at its
    limit of two running (`household`'s), held by a claim's sweep: its id
    and the two running jobs."""
    for _ in range(2):
        enqueue_in(store, household, "a.example")
    running = claim_limited(store, RUNNING_TWO)
    assert len(running) == 2
    held = other_household(store)
    for _ in range(waiting):
        enqueue_in(store, held, "a.example")
    return held, running


def sweep_due(store):
    """A moment at which a claim sweeps again (a claim sweeps at most once per
    `claiming.HOLD_SECONDS`)."""
    return db_now(store) + timedelta(seconds=2 * claiming.HOLD_SECONDS)


def test_a_household_held_by_its_partition_is_claimed_from_once_the_partition_frees(
    store, household
):
    held, running = held_household(store, household)
    assert claim_limited(store, RUNNING_TWO, now=sweep_due(store)) == []
    assert not store.read(store.jobs.has_due_job, ["succeed"], partitions=RUNNING_TWO)

    # One of the host's jobs ends: its household's hold ends with it, not
    # at the hold's moment.
    store.write(
        store.jobs.transition, Transition(running[0].lease, to=Status.SUCCEEDED, result="{}")
    )
    assert store.read(store.jobs.has_due_job, ["succeed"], partitions=RUNNING_TWO)
    [taken] = claim_limited(store, RUNNING_TWO)
    assert taken.household_id == held


def test_a_job_joining_a_held_households_queue_is_claimed_at_once(store, household):
    held, _ = held_household(store, household)
    assert claim_limited(store, RUNNING_TWO, now=sweep_due(store)) == []

    joining = enqueue_in(store, held, None)

    assert store.read(store.jobs.has_due_job, ["succeed"], partitions=RUNNING_TWO)
    assert [job.id for job in claim_limited(store, RUNNING_TWO)] == [joining]


def test_a_held_households_job_that_falls_due_is_claimed_once_the_hold_is_over(store, household):
    held, _ = held_household(store, household)
    falling_due = enqueue_in(store, held, None)
    swept = sweep_due(store)
    # Due half a hold after the sweep that holds its household.
    set_run_at(store, falling_due, 2.5 * claiming.HOLD_SECONDS)
    assert claim_limited(store, RUNNING_TWO, now=swept) == []

    # Due, but within the hold: passed over.
    due = swept + timedelta(seconds=0.75 * claiming.HOLD_SECONDS)
    assert claim_limited(store, RUNNING_TWO, now=due) == []
    # Past the hold's moment, looked at again.
    over = swept + timedelta(seconds=1.25 * claiming.HOLD_SECONDS)
    assert [job.id for job in claim_limited(store, RUNNING_TWO, now=over)] == [falling_due]


def test_a_household_held_by_a_paused_kind_is_claimed_from_once_the_kind_is_resumed(
    store, household
):
    held = other_household(store)
    paused = enqueue_in(store, held, None, kind="resting")
    mine = enqueue_in(store, household, None)
    store.write(store.flow.pause_kind, "resting", operator_id=None)
    kinds = ("succeed", "resting")

    taken = claim_limited(store, {}, kinds=kinds, now=sweep_due(store))
    assert [job.id for job in taken] == [mine]

    store.write(store.flow.resume_kind, "resting")
    assert [job.id for job in claim_limited(store, {}, kinds=kinds)] == [paused]


def test_a_household_held_by_a_kind_at_its_cap_is_claimed_from_once_a_job_of_it_ends(
    store, household
):
    def claim_capped(now=None) -> list[Job]:
        return store.write(
            store.jobs.claim,
            ClaimRequest(
                owner=f"w.{uuid.uuid4().hex[:6]}",
                lease_seconds=LEASE,
                limit=10,
                kinds=("succeed",),
                kind_caps={"succeed": 1},
                now=now,
            ),
        )

    enqueue_in(store, household, None)
    [running] = claim_capped()
    held = other_household(store)
    waiting = enqueue_in(store, held, None)
    assert claim_capped(now=sweep_due(store)) == []

    store.write(store.jobs.transition, Transition(running.lease, to=Status.SUCCEEDED, result="{}"))
    assert [job.id for job in claim_capped()] == [waiting]


def test_a_suspended_household_is_held_and_claimed_from_once_its_suspension_is_lifted(
    store, household
):
    held = other_household(store)
    waiting = enqueue_in(store, held, None)
    store.write(store.households.suspend_household, held)
    assert claim_limited(store, {}, now=sweep_due(store)) == []

    store.write(store.households.resume_household, held)
    assert [job.id for job in claim_limited(store, {})] == [waiting]


def test_a_job_of_a_kind_without_limits_keeps_its_partition_but_is_not_held(store, household):
    for _ in range(3):
        enqueue_in(store, household, "a.example")

    assert len(claim_limited(store, {}, limit=3)) == 3
    assert dataclasses.asdict(store.read(store.flow.partition_state, "succeed", "a.example")) == {
        "running": 3,
        "blocked_until": None,
    }


def _recording(tx):
    """The transaction, of its own driver's type, recording its statements."""

    class Recording(type(tx)):
        def execute(self, statement, params=None, /):
            statements.append(statement)
            return super().execute(statement, params)

    statements: list[str] = []
    recording = object.__new__(Recording)
    recording.__dict__.update(tx.__dict__)
    return recording, statements


def test_a_claim_leaves_out_the_partition_limits_while_no_queued_job_has_a_partition(
    store, household
):
    limits = {"succeed": PartitionLimits(max_running=1, rate=Rate(1, 60.0))}

    def claim_recorded(tx):
        recording, statements = _recording(tx)
        request = ClaimRequest(
            owner="w.1", lease_seconds=LEASE, limit=10, kinds=("succeed",), partitions=limits
        )
        return store.jobs.claim(recording, request), statements

    plain = [enqueue_in(store, household, None) for _ in range(3)]
    claimed, statements = store.write(claim_recorded)
    # No ledger read or written, no lock taken: the limits hold no job here.
    assert {job.id for job in claimed} == set(plain)
    assert not [s for s in statements if "partition_rates" in s or "advisory" in s]

    # Once a queued job has a partition, the limits apply again.
    limited = [enqueue_in(store, household, "a.example") for _ in range(2)]
    claimed, statements = store.write(claim_recorded)
    assert [job.id for job in claimed] == limited[:1]
    assert [s for s in statements if "partition_rates" in s]
