"""The statements of a job that asks its household, each test on both
databases (and through PgBouncer): kept steps, waits, and signals."""

from __future__ import annotations

import dataclasses

from mealquest.model.jobs import Attempt, Status, Transition
from mealquest.model.signals import Signaled
from tests.conftest import wait_for
from tests.drivers.conftest import claim, enqueue, get, other_household, set_run_at

PROMPT = '{"question":"how many?"}'


def wait_in_queue(store, job_id: str, lease, seconds: float = 3600.0) -> bool:
    """What the completer writes for a wait: the refunded transition, then the mark."""

    def write(tx):
        moved = store.jobs.transition(
            tx, Transition(lease, Status.QUEUED, Attempt.REFUND, delay_seconds=seconds)
        )
        return moved and store.jobs.mark_waiting(tx, job_id, "answer", PROMPT)

    return store.write(write)


def test_a_step_is_kept_once_and_only_under_its_lease(store, household):
    job_id = enqueue(store, household)
    [job] = claim(store)
    assert store.read(store.signals.kept_step, job_id, "prepare") is None

    assert store.write(store.signals.keep_step, job.lease, "prepare", '{"n":1}')
    # Kept already: the first result stays.
    assert store.write(store.signals.keep_step, job.lease, "prepare", '{"n":2}')
    assert store.read(store.signals.kept_step, job_id, "prepare") == '{"n":1}'
    # A lease no longer held keeps nothing.
    gone = dataclasses.replace(job.lease, owner="someone-else")
    assert not store.write(store.signals.keep_step, gone, "other", "1")
    assert store.read(store.signals.kept_step, job_id, "other") is None


def test_a_wait_begins_once_and_times_out_by_the_databases_clock(store, household):
    job_id = enqueue(store, household)
    [job] = claim(store)
    assert store.read(store.signals.wait_state, job_id, "answer").timed_out is None

    left = store.write(store.signals.begin_wait, job.lease, "answer", 3600.0)
    assert 3590 < left <= 3600
    # Begun already: its deadline stays.
    again = store.write(store.signals.begin_wait, job.lease, "answer", 10.0)
    assert 3580 < again <= left
    state = store.read(store.signals.wait_state, job_id, "answer")
    assert (state.answer, state.timed_out) == (None, False)

    short = enqueue(store, household)
    [second] = claim(store)
    assert second.id == short
    assert store.write(store.signals.begin_wait, second.lease, "answer", 0.001) is not None
    # Past a deadline a millisecond away, by the database's clock.
    timed_out = wait_for(lambda: store.read(store.signals.wait_state, short, "answer").timed_out)
    assert timed_out is True
    gone = dataclasses.replace(second.lease, owner="someone-else")
    assert store.write(store.signals.begin_wait, gone, "other", 10.0) is None


def test_a_signal_resumes_a_waiting_job_and_is_kept_for_one_not_yet_waiting(store, household):
    job_id = enqueue(store, household)
    [job] = claim(store)
    # Running: kept for its wait.
    kept = store.write(
        store.signals.signal, job_id, "answer", '{"count":1}', household_id=household
    )
    assert (kept.signaled, kept.job.status) == (Signaled.KEPT, Status.RUNNING)
    # Its wait then finds the answer: due at once.
    assert wait_in_queue(store, job_id, job.lease)
    due = get(store, job_id)
    assert (due.status, due.waiting_signal) == (Status.QUEUED, None)
    assert store.read(store.signals.wait_state, job_id, "answer").answer == '{"count":1}'

    other = enqueue(store, household)
    set_run_at(store, job_id, 3600)  # out of the claim's way
    [waiting] = claim(store)
    assert waiting.id == other
    assert not wait_in_queue(store, other, waiting.lease)
    marked = get(store, other)
    assert (marked.status, marked.waiting_signal, marked.result) == (
        Status.QUEUED,
        "answer",
        {"question": "how many?"},
    )
    assert marked.attempt == 0
    assert [j.id for j in store.read(store.signals.waiting_jobs)] == [other]
    assert store.read(store.signals.waiting_jobs, household_id=other_household(store)) == []
    count, soonest = store.read(store.signals.waiting_summary)
    assert count == 1
    assert 3500 < soonest <= 3600

    resumed = store.write(
        store.signals.signal,
        other,
        "answer",
        '{"count":2}',
        household_id=household,
        idempotency_key="k",
    )
    assert resumed.signaled is Signaled.RESUMED
    assert (resumed.job.waiting_signal, resumed.job.version > marked.version) == (None, True)
    assert store.read(store.signals.waiting_summary) == (0, None)
    [again] = claim(store)
    assert again.id == other


def test_a_signal_is_refused_when_the_job_does_not_wait_for_it(store, household):
    job_id = enqueue(store, household)
    [job] = claim(store)
    wait_in_queue(store, job_id, job.lease)
    signal = store.signals.signal

    foreign = store.write(signal, job_id, "answer", "{}", household_id=other_household(store))
    unknown = store.write(signal, "f" * 32, "answer", "{}", household_id=household)
    assert (foreign.signaled, foreign.job, unknown.signaled) == (
        Signaled.NO_JOB,
        None,
        Signaled.NO_JOB,
    )
    assert store.write(signal, job_id, "other", "{}", household_id=household).signaled is (
        Signaled.NOT_WAITING
    )
    first = store.write(signal, job_id, "answer", "{}", household_id=None, idempotency_key="a")
    assert first.signaled is Signaled.RESUMED
    assert (
        store.write(
            signal, job_id, "answer", "{}", household_id=household, idempotency_key="a"
        ).signaled
        is Signaled.REPEATED
    )
    assert store.write(signal, job_id, "answer", "{}", household_id=household).signaled is (
        Signaled.NOT_WAITING
    )
    [again] = claim(store)
    store.write(store.jobs.transition, Transition(again.lease, Status.SUCCEEDED, result="{}"))
    assert store.write(signal, job_id, "other", "{}", household_id=household).signaled is (
        Signaled.NOT_WAITING
    )
