"""Several real OS processes, each with its own pool, on one database (an SQLite
file, or a PostgreSQL database the processes reach by its URL)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from mealquest.clock import seconds, to_text, utc_now
from mealquest.model.jobs import Status
from tests.conftest import wait_for
from tests.support import sql
from tests.support.processes import Process, flask_jobs_work, process_group, wait_working

pytestmark = pytest.mark.both_databases

# Short maintenance intervals so expiries happen within a test; the lease is
# eight heartbeats long, so a loaded machine delaying one does not lose it.
FAST = {
    "JOB_POLL_SECONDS": 0.1,
    "JOB_LEASE_SECONDS": 2.0,
    "JOB_HEARTBEAT_SECONDS": 0.25,
    "JOB_RESCUE_SECONDS": 0.25,
    "JOB_STOP_TIMEOUT_SECONDS": 5,
    # Below the lease minus a heartbeat, as the configuration requires.
    "JOB_BLOCKED_EXIT_SECONDS": 1.5,
}
# Deadlines for what includes a process start (imports, a re-exec) on a loaded
# machine. A deadline is not a window: a test that passes never waits it out.
START_DEADLINE = 60.0


@pytest.fixture
def app(make_app):
    """These tests queue thousands of jobs for one household: a quota above that."""
    return make_app(JOB_MAX_PENDING_PER_HOUSEHOLD=10_000)


@pytest.fixture
def processes():
    with process_group() as group:
        yield group


@pytest.fixture
def start_worker(database, processes):
    """A `flask jobs work` process, returned once SIGTERM would stop it gracefully."""

    def start(*, wait: bool = True, **config: object) -> Process:
        worker = flask_jobs_work(database, **{**FAST, **config})
        processes.append(worker)
        if wait:
            wait_working(worker)
        return worker

    return start


def test_flask_jobs_work_runs_its_pool_monkey_patched(start_worker):
    worker = start_worker()
    assert "(monkey-patched)" in worker.output()
    assert worker.stop() == 0


def status_counts(store) -> dict[str, int]:
    rows = sql.rows(store, "SELECT status, count(*) AS n FROM jobs GROUP BY status")
    return {row["status"]: row["n"] for row in rows}


def test_several_processes_drain_2000_jobs_each_exactly_once(
    jobs, store, household, tmp_path, start_worker, processes
):
    log = str(tmp_path / "runs.log")
    # Every process polls before the first job exists, so none drains the
    # queue alone while another is still starting.
    for _ in range(3):
        start_worker(JOB_WORKERS=8)

    def enqueue_all(tx):
        return [
            jobs.enqueue("append_job_id", {"log": log}, household_id=household.household_id, tx=tx)
            for _ in range(2000)
        ]

    ids = store.write(enqueue_all)
    try:
        # Within pytest's own timeout (120 s), so that a failure shows what
        # the processes logged.
        wait_for(lambda: status_counts(store).get("succeeded") == 2000, timeout=90, interval=0.1)
    except AssertionError:
        logged = [line for p in processes for line in p.lines if " INFO " not in line]
        raise AssertionError(
            f"jobs by status: {status_counts(store)}; the processes logged, INFO left out:\n"
            + "\n".join(logged[-200:])
        ) from None
    for process in processes:
        assert process.stop() == 0, process.output()
    runs = Path(log).read_text().split("\n")[:-1]
    per_job = Counter(line.split()[0] for line in runs)
    assert set(per_job) == set(ids)
    assert set(per_job.values()) == {1}
    pids = Counter(line.split()[1] for line in runs)
    assert len(pids) >= 2, pids
    assert status_counts(store) == {"succeeded": 2000}


def test_a_new_process_does_not_touch_a_live_processs_jobs(jobs, household, start_worker, gates):
    first = start_worker()
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("job")}, household_id=household.household_id
    )
    wait_for(lambda: gates.arrivals("job") == 1, timeout=START_DEADLINE)
    claimed = jobs.get(job_id)
    second = start_worker()
    # The second process rescued at start and keeps rescuing; the job, held
    # until well past the lease it was claimed with, stays the first's.
    past_the_claimed_lease = claimed.lease_expires_at
    wait_for(
        lambda: (
            to_text(utc_now() - seconds(2 * FAST["JOB_RESCUE_SECONDS"])) > past_the_claimed_lease
        ),
        timeout=START_DEADLINE,
    )
    assert second.popen.poll() is None
    held = jobs.get(job_id)
    assert (held.status, held.lease_owner) == (Status.RUNNING, claimed.lease_owner)
    gates.open("job")
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.attempt, job.error) == (Status.SUCCEEDED, 1, None)
    assert job.result == {"pid": first.pid}
    assert gates.arrivals("job") == 1


def final(jobs, job_id):
    job = jobs.get(job_id)
    return job if job.status in (Status.SUCCEEDED, Status.FAILED) else None


def test_a_sigkilled_processs_jobs_are_rescued_by_another(jobs, household, start_worker, gates):
    victim = start_worker()
    gate = {"url": gates.url("victim")}
    once = jobs.enqueue("wait_for_gate", gate, household_id=household.household_id)
    retried = jobs.enqueue("wait_for_gate_retried", gate, household_id=household.household_id)
    wait_for(lambda: gates.arrivals("victim") == 2, timeout=START_DEADLINE)
    victim.signal(signal.SIGKILL)
    victim.popen.wait()
    gates.open("victim")  # whatever runs them next passes at once
    rescuer = start_worker(wait=False)
    failed = wait_for(lambda: final(jobs, once), timeout=START_DEADLINE)
    assert (failed.status, failed.error) == (Status.FAILED, "interrupted by restart")
    # A kind of several attempts: re-queued with its attempt refunded (its
    # process died, not the job), then run again, to success, by the survivor.
    done = wait_for(lambda: final(jobs, retried), timeout=START_DEADLINE)
    assert (done.status, done.attempt, done.interruptions, done.result) == (
        Status.SUCCEEDED,
        1,
        0,
        {"pid": rescuer.pid},
    )
    assert gates.arrivals("victim") == 3
    wait_working(rescuer)
    assert rescuer.stop() == 0


def test_a_frozen_process_that_lost_its_lease_cannot_overwrite_the_rescued_job(
    jobs, household, start_worker, gates
):
    frozen = start_worker()
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("frozen")}, household_id=household.household_id
    )
    wait_for(lambda: gates.arrivals("frozen") == 1, timeout=START_DEADLINE)
    frozen.signal(signal.SIGSTOP)
    # Working before it is stopped: its rescue at start may take the job back
    # before its SIGTERM handler exists.
    rescuer = start_worker()
    rescued = wait_for(lambda: final(jobs, job_id), timeout=START_DEADLINE)
    assert (rescued.status, rescued.error) == (Status.FAILED, "interrupted by restart")
    assert rescuer.stop() == 0, rescuer.output()
    frozen.signal(signal.SIGCONT)
    gates.open("frozen")
    # Thawed, it finds its lease gone (heartbeat or fenced final write) and writes nothing.
    wait_for(
        lambda: "lost its lease" in frozen.output() or "no longer ours" in frozen.output(),
        timeout=START_DEADLINE,
    )
    assert frozen.stop() == 0, frozen.output()
    after = jobs.get(job_id)
    assert (after.status, after.error, after.finished_at) == (
        Status.FAILED,
        "interrupted by restart",
        rescued.finished_at,
    )


# A lease with room for a process to exit after its loop stayed blocked past
# the limit (plus a heartbeat before the block began), and for the test to
# read the job's row after seeing it gone.
BLOCKING = {
    "JOB_LEASE_SECONDS": 3.0,
    "JOB_HEARTBEAT_SECONDS": 0.25,
    "JOB_BLOCKED_EXIT_SECONDS": 1.0,
}


def starts(log: Path) -> list[int]:
    """The pids that started a `block_hub_in` job, in order."""
    if not log.exists():
        return []
    return [int(line.split()[2]) for line in log.read_text().splitlines()]


def test_a_process_whose_event_loop_stays_blocked_exits_before_its_lease_can_expire(
    jobs, household, start_worker, tmp_path
):
    """Its heartbeats stop with its loop, so its leases would expire while its
    handler still runs, and another process would run the job beside it.
    It ends itself first; the job is then rescued once and runs elsewhere."""
    log = tmp_path / "runs.log"
    blocked = start_worker(**BLOCKING)
    job_id = jobs.enqueue(
        "block_hub_in",
        {"pid": blocked.pid, "log": str(log)},
        household_id=household.household_id,
    )
    wait_for(lambda: starts(log) == [blocked.pid], timeout=START_DEADLINE)
    # Not waited for: the test looks at the first process meanwhile.
    rescuer = start_worker(wait=False, **BLOCKING)

    wait_for(
        lambda: blocked.popen.poll() is not None or len(starts(log)) > 1,
        timeout=START_DEADLINE,
    )
    seen_gone_at = to_text(utc_now())
    held = jobs.get(job_id)
    assert starts(log) == [blocked.pid], "the job ran again while its first process lived"
    assert blocked.popen.returncode == 1, blocked.output()
    # Gone while its lease still held: no other process could have taken the job.
    assert held.status is Status.RUNNING
    assert held.lease_expires_at > seen_gone_at
    assert "has been blocked for" in blocked.output()
    assert "past MEALQUEST_JOB_BLOCKED_EXIT_SECONDS (1)" in blocked.output()

    done = wait_for(lambda: final(jobs, job_id), timeout=START_DEADLINE)
    # Re-queued with its attempt refunded (the process died, not the job).
    assert (done.status, done.attempt, done.result) == (
        Status.SUCCEEDED,
        1,
        {"pid": rescuer.pid},
    )
    assert starts(log) == [blocked.pid, rescuer.pid]
    wait_working(rescuer)
    assert rescuer.stop() == 0, rescuer.output()


def test_flask_jobs_work_stops_gracefully_and_records_what_it_had_to_stop(
    jobs, household, start_worker, gates
):
    # A lease far longer than the test: only the stopping pool can record the job.
    worker = start_worker(
        JOB_LEASE_SECONDS=600, JOB_HEARTBEAT_SECONDS=60, JOB_STOP_TIMEOUT_SECONDS=0.5
    )
    quick = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    slow = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("never")}, household_id=household.household_id
    )
    wait_for(lambda: jobs.get(quick).status == Status.SUCCEEDED, timeout=START_DEADLINE)
    wait_for(lambda: gates.arrivals("never") == 1, timeout=START_DEADLINE)
    assert worker.stop() == 0, worker.output()
    job = jobs.get(slow)
    assert (job.status, job.error) == (Status.FAILED, "interrupted by restart")
    assert "1 interrupted" in worker.output()
