"""Several real OS processes, each with its own pool, on one database file."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from mealquest.jobs.model import Status
from tests.conftest import wait_for
from tests.support.processes import flask_jobs_work, process_group

# Short lease and maintenance intervals so expiries happen within a test.
FAST = {
    "JOB_POLL_SECONDS": 0.1,
    "JOB_LEASE_SECONDS": 1.0,
    "JOB_HEARTBEAT_SECONDS": 0.25,
    "JOB_RESCUE_SECONDS": 0.25,
    "JOB_STOP_TIMEOUT_SECONDS": 5,
}


def ready(process) -> bool:
    if process.popen.poll() is not None:
        raise AssertionError(f"worker exited early:\n{process.output()}")
    return "job pool started" in process.output()


def test_flask_jobs_work_runs_its_pool_monkey_patched(db_path, processes):
    worker = flask_jobs_work(db_path, **FAST)
    processes.append(worker)
    wait_for(lambda: ready(worker))
    assert "(monkey-patched)" in worker.output()
    assert worker.stop() == 0


def status_counts(store) -> dict[str, int]:
    rows = store.read(
        lambda conn: conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
    )
    return {row[0]: row[1] for row in rows}


@pytest.fixture
def processes():
    with process_group() as group:
        yield group


def test_several_processes_drain_2000_jobs_each_exactly_once(
    db_path, jobs, store, household, tmp_path, processes
):
    log = str(tmp_path / "runs.log")

    def enqueue_all(tx):
        return [
            jobs.enqueue("append_job_id", {"log": log}, household_id=household.household_id, tx=tx)
            for _ in range(2000)
        ]

    ids = store.write(enqueue_all)
    for _ in range(3):
        processes.append(flask_jobs_work(db_path, JOB_WORKERS=8, **FAST))
    wait_for(lambda: status_counts(store).get("succeeded") == 2000, timeout=120, interval=0.1)
    for process in processes:
        assert process.stop() == 0, process.output()
    runs = Path(log).read_text().split("\n")[:-1]
    per_job = Counter(line.split()[0] for line in runs)
    assert set(per_job) == set(ids)
    assert set(per_job.values()) == {1}
    pids = Counter(line.split()[1] for line in runs)
    assert len(pids) >= 2, pids
    assert status_counts(store) == {"succeeded": 2000}


def test_a_new_process_does_not_touch_a_live_processs_jobs(db_path, jobs, household, processes):
    first = flask_jobs_work(db_path, **FAST)
    processes.append(first)
    wait_for(lambda: ready(first))
    job_id = jobs.enqueue("sleep", {"seconds": 2.0}, household_id=household.household_id)
    owner = wait_for(lambda: jobs.get(job_id).lease_owner)
    second = flask_jobs_work(db_path, **FAST)
    processes.append(second)
    wait_for(lambda: ready(second))
    # The second process rescued at start and keeps rescuing; the job stays the first's.
    assert jobs.get(job_id).lease_owner == owner
    job = wait_for(
        lambda: jobs.get(job_id).status in (Status.SUCCEEDED, Status.FAILED) and jobs.get(job_id)
    )
    assert (job.status, job.attempt, job.error) == (Status.SUCCEEDED, 1, None)


def test_a_sigkilled_processs_jobs_are_rescued_by_another(db_path, jobs, household, processes):
    victim = flask_jobs_work(db_path, **FAST)
    processes.append(victim)
    wait_for(lambda: ready(victim))
    once = jobs.enqueue("sleep", {"seconds": 60}, household_id=household.household_id)
    retried = jobs.enqueue(
        "sleep_on_first_attempt", {"seconds": 60}, household_id=household.household_id
    )
    wait_for(lambda: jobs.get(once).status == jobs.get(retried).status == Status.RUNNING)
    victim.signal(signal.SIGKILL)
    victim.popen.wait()
    rescuer = flask_jobs_work(db_path, **FAST)
    processes.append(rescuer)
    failed = wait_for(lambda: jobs.get(once).status == Status.FAILED and jobs.get(once))
    assert failed.error == "interrupted by restart"
    # Attempts left: re-queued, then run to success by the surviving process.
    done = wait_for(lambda: jobs.get(retried).status == Status.SUCCEEDED and jobs.get(retried))
    assert done.attempt == 2
    assert rescuer.stop() == 0


def test_a_frozen_process_that_lost_its_lease_cannot_overwrite_the_rescued_job(
    db_path, jobs, household, processes
):
    frozen = flask_jobs_work(db_path, **FAST)
    processes.append(frozen)
    wait_for(lambda: ready(frozen))
    job_id = jobs.enqueue("sleep", {"seconds": 1.5}, household_id=household.household_id)
    wait_for(lambda: jobs.get(job_id).status == Status.RUNNING)
    frozen.signal(signal.SIGSTOP)
    rescuer = flask_jobs_work(db_path, **FAST)
    processes.append(rescuer)
    rescued = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert rescued.error == "interrupted by restart"
    assert rescuer.stop() == 0
    frozen.signal(signal.SIGCONT)
    # Thawed, it finds its lease gone (heartbeat or fenced final write) and writes nothing.
    wait_for(lambda: "lost its lease" in frozen.output() or "no longer ours" in frozen.output())
    assert frozen.stop() == 0
    after = jobs.get(job_id)
    assert (after.status, after.error, after.finished_at) == (
        Status.FAILED,
        "interrupted by restart",
        rescued.finished_at,
    )


def test_flask_jobs_work_stops_gracefully_and_records_what_it_had_to_stop(
    db_path, jobs, household, processes
):
    # A lease far longer than the test: only the stopping pool can record the job.
    worker = flask_jobs_work(
        db_path, JOB_LEASE_SECONDS=600, JOB_HEARTBEAT_SECONDS=60, JOB_STOP_TIMEOUT_SECONDS=0.5
    )
    processes.append(worker)
    wait_for(lambda: ready(worker))
    quick = jobs.enqueue("sleep", {"seconds": 0.1}, household_id=household.household_id)
    slow = jobs.enqueue("sleep", {"seconds": 60}, household_id=household.household_id)
    wait_for(lambda: jobs.get(quick).status == Status.SUCCEEDED)
    wait_for(lambda: jobs.get(slow).status == Status.RUNNING)
    assert worker.stop() == 0, worker.output()
    job = jobs.get(slow)
    assert (job.status, job.error) == (Status.FAILED, "interrupted by restart")
    assert "1 interrupted" in worker.output()
