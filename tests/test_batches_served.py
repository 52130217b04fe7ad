"""A batch through real gunicorn workers, on both databases: its members fail,
are cancelled, and are killed with their process mid-run (one rescued and
run again, one failed as run at most once), and its callback still runs
exactly once, when the last of them is final."""

from __future__ import annotations

import os
import signal

import pytest

from mealquest.jobs.enqueueing import JobRequest
from mealquest.model.batches import BatchStatus
from mealquest.model.jobs import FINAL_STATUSES, MESSAGE_INTERRUPTED, Status
from tests.conftest import wait_for
from tests.support.servers import Gunicorn, serving_env
from tests.test_multiprocess import FAST, START_DEADLINE

# A lease past gunicorn's timeout plus a heartbeat, as the service requires;
# the killed workers' jobs are rescued a lease after their last renewal.
SERVED = {**FAST, "JOB_LEASE_SECONDS": 8.0, "JOB_HEARTBEAT_SECONDS": 0.5}

pytestmark = pytest.mark.both_databases


@pytest.fixture
def server(database, tmp_path):
    server = Gunicorn(tmp_path / "gunicorn.log", serving_env(database, **SERVED), workers=2)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_callback_runs_once_whatever_befell_the_members(
    server, jobs, household, gates, tmp_path
):
    hid = household.household_id
    log = tmp_path / "callback.log"
    killed = {"url": gates.url("killed")}
    batched = jobs.enqueue_batch(
        [
            JobRequest("wait_for_gate", killed, hid),  # one attempt: fails when killed
            JobRequest("wait_for_gate_retried", killed, hid),  # re-queued, runs again
            JobRequest("fail_with_failure", {"message": "no recipe"}, hid),
            JobRequest("wait_for_gate", {"url": gates.url("cancelled")}, hid),
            JobRequest("succeed", {"value": 3}, hid),
        ],
        on_complete=JobRequest("batch_report", {"log": str(log)}, hid),
    )
    once, retried, failing, cancelled, fine = batched.job_ids
    wait_for(
        lambda: gates.arrivals("killed") == 2 and gates.arrivals("cancelled") == 1,
        timeout=START_DEADLINE,
    )
    jobs.cancel(cancelled, hid)
    wait_for(lambda: jobs.get(cancelled).status is Status.CANCELLED, timeout=START_DEADLINE)
    assert jobs.get(batched.callback_job_id).status is Status.QUEUED

    for pid in server.worker_pids():  # both, mid-run: gunicorn starts new ones
        os.kill(pid, signal.SIGKILL)
    gates.open("killed")  # whatever runs them next passes at once

    callback = wait_for(
        lambda: (job := jobs.get(batched.callback_job_id)).status in FINAL_STATUSES and job,
        timeout=START_DEADLINE,
    )
    statuses = {job_id: jobs.get(job_id) for job_id in batched.job_ids}
    assert (statuses[once].status, statuses[once].error) == (Status.FAILED, MESSAGE_INTERRUPTED)
    assert statuses[retried].status is Status.SUCCEEDED
    assert statuses[failing].status is Status.FAILED
    assert statuses[cancelled].status is Status.CANCELLED
    assert statuses[fine].status is Status.SUCCEEDED
    assert callback.status is Status.SUCCEEDED
    assert callback.result == {
        "batch_id": batched.batch_id,
        "succeeded": [retried, fine],
        "failed": [once, failing],
        "cancelled": [cancelled],
    }
    assert callback.started_at >= max(job.finished_at for job in statuses.values())
    runs = log.read_text().splitlines()
    assert [line.split()[0] for line in runs] == [batched.callback_job_id]
    batch = jobs.batch(batched.batch_id, household_id=hid)
    assert batch.status is BatchStatus.FINISHED
