"""Where a job stands, statement by statement, on both databases: its version,
the changed jobs a stream watcher reads, the live processes, the households'
open streams, and a queued job's place in line (claims played one at a time)."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from mealquest.model.jobs import Status, Transition
from mealquest.model.processes import ProcessEntry
from tests.conftest import wait_for
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

AT_MOST = 100


def standing(store, job_id, at_most=AT_MOST):
    job = get(store, job_id)
    return store.read(store.jobs.queue_standings, [job], at_most=at_most)[job_id]


def positions(store, job_ids, at_most=AT_MOST):
    jobs = [get(store, job_id) for job_id in job_ids]
    found = store.read(store.jobs.queue_standings, jobs, at_most=at_most)
    return {job_id: found[job_id].position for job_id in found}


# -- versions ---------------------------------------------------------------------------------


def test_every_write_that_shows_makes_a_new_version_and_a_lease_renewal_does_not(store, household):
    job_id = enqueue(store, household)
    assert get(store, job_id).version == 1
    [job] = claim(store)
    assert job.version == 2
    assert get(store, job_id).version == 2
    assert store.write(store.jobs.publish, job.lease, result='{"step": 1}')
    assert get(store, job_id).version == 3
    store.write(store.jobs.renew_leases, [job.lease], lease_seconds=LEASE)
    assert get(store, job_id).version == 3
    assert store.write(store.jobs.transition, Transition(job.lease, to=Status.FAILED, error="x"))
    assert get(store, job_id).version == 4
    store.write(store.jobs.retry_job, job_id)
    assert get(store, job_id).version == 5
    store.write(store.jobs.cancel_job, job_id)
    assert get(store, job_id).version == 6
    # A cancel that changes nothing (the job is final) writes nothing.
    store.write(store.jobs.cancel_job, job_id)
    assert get(store, job_id).version == 6


def test_a_repeated_cancel_of_a_running_job_keeps_its_version(store, household):
    job_id = enqueue(store, household)
    claim(store)
    store.write(store.jobs.cancel_job, job_id)
    asked = get(store, job_id).version
    store.write(store.jobs.cancel_job, job_id)
    assert get(store, job_id).version == asked


def test_any_other_write_of_what_shows_makes_a_new_version_too(store, household):
    """The trigger: a write that does not set the version itself still makes one."""
    job_id = enqueue(store, household)
    sql.execute(store, "UPDATE jobs SET priority = 5 WHERE id = ?", (job_id,))
    assert get(store, job_id).version == 2
    sql.execute(store, "UPDATE jobs SET unique_key = NULL WHERE id = ?", (job_id,))
    assert get(store, job_id).version == 2


def test_interruptions_and_rescues_make_new_versions(store, household):
    first, second = enqueue(store, household), enqueue(store, household)
    a, b = claim(store)
    store.write(store.jobs.interrupt, [a.lease])
    assert get(store, a.id).version == 3
    held = store.read(store.jobs.running_leases)
    store.write(store.jobs.rescue_unrenewed, held, now=db_now(store) + timedelta(seconds=LEASE + 1))
    assert get(store, b.id).version == 3
    assert {first, second} == {a.id, b.id}


def test_changed_jobs_come_back_whole_and_gone_ones_as_none(store, household):
    same, moved, gone = (enqueue(store, household) for _ in range(3))
    known = {job_id: get(store, job_id).version for job_id in (same, moved, gone)}
    sql.execute(store, "UPDATE jobs SET priority = 3 WHERE id = ?", (moved,))
    store.write(store.operations.delete_job, gone)

    changed = store.read(store.jobs.changed_jobs, known)

    assert set(changed) == {moved, gone}
    assert changed[moved].version == 2
    assert changed[moved].priority == 3
    assert changed[gone] is None
    assert store.read(store.jobs.changed_jobs, {}) == {}


def test_many_watched_jobs_are_read_in_batches(store, household):
    made = [enqueue(store, household) for _ in range(3)]
    known = {job_id: 1 for job_id in made}
    known.update({f"{index:032x}": 1 for index in range(1_200)})  # unknown: gone

    changed = store.read(store.jobs.changed_jobs, known)

    assert len(changed) == 1_200
    assert not set(made) & set(changed)


def test_live_token_digests_leave_out_revoked_unknown_suspended_and_erased_ones(store):
    store.write(store.households.create_household, name="A", token_sha256="a" * 64)
    _, revoked = store.write(store.households.create_household, name="B", token_sha256="b" * 64)
    store.write(store.households.revoke_token, revoked)
    suspended, _ = store.write(store.households.create_household, name="D", token_sha256="d" * 64)
    store.write(store.households.suspend_household, suspended)
    erased, _ = store.write(store.households.create_household, name="E", token_sha256="e" * 64)
    store.write(store.households.mark_erased, erased, name="erased household")

    asked = {"a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64}
    live = store.read(store.households.live_token_digests, asked)

    assert live == {"a" * 64}
    assert store.read(store.households.live_token_digests, set()) == set()


# -- live processes -----------------------------------------------------------------------------


def entry(owner: str, **changes) -> ProcessEntry:
    values = {"host": "web-1", "pid": 4242, "kinds": ("b", "a"), "slots": 4, "busy": 0}
    return ProcessEntry(owner=owner, **{**values, **changes})


def test_a_process_is_registered_renewed_and_removed(store):
    store.write(store.processes.register_process, entry("p1"), forget_after_seconds=3600)
    store.write(store.processes.register_process, entry("p2", pid=7), forget_after_seconds=3600)

    assert store.write(store.processes.renew_process, "p1", busy=3)
    [first, second] = store.read(store.processes.live_processes, stale_after_seconds=60)
    assert (first.owner, first.host, first.pid, first.kinds, first.slots, first.busy) == (
        "p1",
        "web-1",
        4242,
        ("a", "b"),
        4,
        3,
    )
    assert first.started_at <= first.last_seen_at
    assert second.owner == "p2"
    assert second.pid == 7

    store.write(store.processes.remove_process, "p1")
    assert [
        p.owner for p in store.read(store.processes.live_processes, stale_after_seconds=60)
    ] == ["p2"]
    assert not store.write(store.processes.renew_process, "p1", busy=0)


def test_a_process_not_renewed_for_its_staleness_is_not_live(store):
    store.write(store.processes.register_process, entry("p1"), forget_after_seconds=3600)
    later = db_now(store) + timedelta(seconds=61)

    assert store.read(store.processes.live_processes, stale_after_seconds=60, now=later) == []
    assert len(store.read(store.processes.live_processes, stale_after_seconds=62, now=later)) == 1


def test_registering_forgets_processes_long_gone(store):
    store.write(store.processes.register_process, entry("old"), forget_after_seconds=3600)
    sql.execute(
        store,
        "UPDATE processes SET last_seen_at = ? WHERE owner = 'old'",
        ("2000-01-01T00:00:00.000000Z",),
    )
    store.write(store.processes.register_process, entry("new"), forget_after_seconds=3600)

    owners = sql.rows(store, "SELECT owner FROM processes ORDER BY owner")
    assert owners == [{"owner": "new"}]


# -- households' open streams -------------------------------------------------------------------


def open_stream(store, household, stream_id, owner="w1", at_most=2, stale=30.0):
    return store.write(
        store.streams.open_stream,
        stream_id=stream_id,
        household_id=household,
        owner=owner,
        at_most=at_most,
        stale_after_seconds=stale,
    )


def test_a_household_opens_streams_up_to_its_limit_and_one_closed_frees_a_place(store, household):
    theirs = other_household(store)
    assert open_stream(store, household, "s1") is None
    assert open_stream(store, household, "s2", owner="w2") is None
    age = open_stream(store, household, "s3")
    assert age is not None
    assert 0 <= age < 60
    assert open_stream(store, theirs, "t1") is None  # limits are per household

    store.write(store.streams.close_stream, "s1")
    assert open_stream(store, household, "s3") is None


def test_a_stream_its_process_stopped_renewing_no_longer_counts(store, household):
    assert open_stream(store, household, "s1", owner="dead") is None
    assert open_stream(store, household, "s2", owner="live") is None
    stale = "2000-01-01T00:00:00.000000Z"
    sql.execute(store, "UPDATE job_streams SET seen_at = ? WHERE owner = 'dead'", (stale,))

    assert store.write(store.streams.renew_streams, "live", stale_after_seconds=30) == 1
    assert open_stream(store, household, "s3") is None
    # The renewal deleted the dead process's row.
    assert sql.scalar(store, "SELECT count(*) FROM job_streams WHERE owner = 'dead'") == 0


# -- a queued job's place in line ------------------------------------------------------------


def test_one_households_jobs_stand_oldest_first(store, household):
    made = [enqueue(store, household) for _ in range(3)]

    found = [standing(store, job_id) for job_id in made]

    assert [(s.position, s.ahead_in_household) for s in found] == [(0, 0), (1, 1), (2, 2)]
    assert all(s.kind_running == 0 for s in found)


def test_households_take_turns_in_the_line(store, household):
    theirs = other_household(store)
    mine = [enqueue(store, household) for _ in range(3)]
    their_one = enqueue(store, theirs)

    # Mine first (its oldest is older), then theirs, then my second and third.
    assert positions(store, [*mine, their_one]) == {
        mine[0]: 0,
        their_one: 1,
        mine[1]: 2,
        mine[2]: 3,
    }
    assert standing(store, their_one).ahead_in_household == 0
    assert standing(store, mine[2]).ahead_in_household == 2


def test_a_household_with_a_job_running_waits_behind_one_with_none(store, household):
    theirs = other_household(store)
    mine = [enqueue(store, household) for _ in range(2)]
    [running] = claim(store, limit=1)
    their_one = enqueue(store, theirs)

    assert running.id == mine[0]
    assert positions(store, [mine[1], their_one]) == {their_one: 0, mine[1]: 1}
    assert standing(store, mine[1]).kind_running == 1


def test_better_priorities_go_first_whichever_household(store, household):
    theirs = other_household(store)
    mine = enqueue(store, household)
    urgent = enqueue(store, theirs)
    sql.execute(store, "UPDATE jobs SET priority = -1 WHERE id = ?", (urgent,))

    assert positions(store, [mine, urgent]) == {urgent: 0, mine: 1}


def test_a_job_not_yet_due_stands_behind_every_due_job(store, household):
    theirs = other_household(store)
    later = enqueue(store, household)
    set_run_at(store, later, 3600)
    due = [enqueue(store, household), enqueue(store, theirs), enqueue(store, theirs)]

    found = standing(store, later)

    assert (found.position, found.ahead_in_household) == (3, 1)
    assert standing(store, due[0]).position == 0


def test_a_position_past_the_bound_says_the_bound(store, household):
    made = [enqueue(store, household) for _ in range(6)]

    assert standing(store, made[5], at_most=3).position == 3
    assert standing(store, made[2], at_most=3).position == 2


def test_a_job_behind_the_bound_in_its_household_says_the_bound_whatever_the_priorities(
    store, household
):
    made = [enqueue(store, household) for _ in range(8)]
    # Two of them, and one more made later, of a better priority: ahead of
    # every job of the default one.
    urgent = [*made[1:3], enqueue(store, household)]
    for job_id in urgent:
        sql.execute(store, "UPDATE jobs SET priority = -1 WHERE id = ?", (job_id,))
    line = [*urgent, *(job_id for job_id in made if job_id not in urgent)]

    for at_most in (2, 3, 4, 20):
        found = {job_id: standing(store, job_id, at_most=at_most) for job_id in line}
        assert [(s.position, s.ahead_in_household) for s in found.values()] == [
            (min(place, at_most), min(place, at_most)) for place in range(len(line))
        ]


def test_a_job_at_the_end_of_a_long_household_queue_is_placed_reading_about_the_bound(
    store, household
):
    # A job just posted behind its household's long queue (an import of each
    # recipe of a site): its place says the bound, read in about as many
    # rows, not the whole queue read and sorted at every answer.
    if store.name != "sqlite":
        pytest.skip("SQLite's virtual machine steps are what is counted here")

    def steps_to_place(job_id: str) -> int:
        counted = [0]

        def count() -> int:
            counted[0] += 1
            return 0

        def place(conn):
            conn.set_progress_handler(count, 100)
            try:
                return store.jobs.queue_standings(conn, [get(store, job_id)], at_most=AT_MOST)
            finally:
                conn.set_progress_handler(None, 0)

        assert store.read(place)[job_id].position == AT_MOST
        return counted[0]

    for _ in range(AT_MOST + 10):
        last = enqueue(store, household)
    short = steps_to_place(last)
    for _ in range(2_000):
        last = enqueue(store, household)
    assert steps_to_place(last) < 2 * short


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_claim_of_a_job_ahead_lowers_every_position_by_one(store, household, seed):
    """The exactness the docs state: claims of one job each, nothing else
    changing, and the play's next job is the one the claim takes."""
    rng = random.Random(seed)
    households = [household] + [other_household(store, f"H{n}", str(n)) for n in range(3)]
    made = []
    for _ in range(14):
        job_id = enqueue(store, rng.choice(households))
        if rng.random() < 0.3:
            sql.execute(store, "UPDATE jobs SET priority = ? WHERE id = ?", (-1, job_id))
        made.append(job_id)
    # Some jobs already run (as a deployment's would), with their households.
    claim(store, limit=3)
    waiting = [job_id for job_id in made if get(store, job_id).status == Status.QUEUED]
    before = positions(store, waiting)
    while waiting:
        [taken] = claim(store, limit=1)
        assert before[taken.id] == 0, (before, taken.id)
        waiting.remove(taken.id)
        after = positions(store, waiting)
        assert after == {job_id: before[job_id] - 1 for job_id in waiting}
        before = after


def test_a_kinds_recent_run_time_is_read_from_its_finished_jobs(store, household):
    assert store.read(store.jobs.kind_run_seconds, "succeed") is None
    enqueue(store, household)
    [job] = claim(store)
    store.write(store.jobs.transition, Transition(job.lease, to=Status.SUCCEEDED, result="{}"))

    seconds = store.read(store.jobs.kind_run_seconds, "succeed")

    assert seconds is not None
    assert 0 <= seconds < 60
    assert store.read(store.jobs.kind_run_seconds, "other") is None


def test_a_jobs_changes_are_seen_by_the_stores_mark(store, household):
    mark, _ = store.job_changes(None)
    job_id = enqueue(store, household)
    sql.execute(store, "UPDATE jobs SET priority = 1 WHERE id = ?", (job_id,))

    def seen():
        nonlocal mark
        mark, changed = store.job_changes(mark)
        return changed is None or job_id in changed

    wait_for(seen)
