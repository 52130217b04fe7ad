"""A handler that holds the event loop (a poison pill) under real gunicorn.

gunicorn kills a worker whose loop is blocked past its `timeout`; the hub
monitor names the job that held it first. Each kill interrupts the pill (its
kind re-queues interrupted jobs, attempt refunded), and at its third
interruption in a row it fails `interrupted by restart`, instead of taking
down one worker after another forever. (Innocent jobs of a killed worker:
`test_gunicorn.py`'s SIGKILL test.)
"""

from __future__ import annotations

import pytest

from mealquest.jobs.service.flow import resume
from tests.support.servers import enqueue, final_jobs, wait_until

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

DEADLINE = 120.0
# gunicorn kills the blocked worker before its lease can expire (gunicorn.conf.py).
TIMEOUT_SECONDS = 3
CONFIG = {
    "JOB_LEASE_SECONDS": 6.0,
    "JOB_HEARTBEAT_SECONDS": 1.0,
    "JOB_RESCUE_SECONDS": 1.0,
    "JOB_MAX_BLOCKING_SECONDS": 0.5,
    "JOB_BLOCKED_EXIT_SECONDS": 4.0,
}


def test_a_poison_pill_fails_at_its_third_interruption(served, start_gunicorn):
    server = start_gunicorn(
        workers=1,
        config=CONFIG,
        graceful_timeout=2,
        timeout=TIMEOUT_SECONDS,
    )
    # The one worker that answers the enqueue also runs the pill: were it
    # claimed before the answer was written, gunicorn would kill the worker
    # with the answer unsent. Held paused until the answer is in hand.
    served.store.write(served.store.flow.pause_kind, "hog", operator_id=None)
    pill = enqueue(server.url, served.token, "hog", {})
    resume(served.store, "hog", None)
    row = wait_until(lambda: final_jobs(served.store, [pill]), DEADLINE, "the pill never ended")
    assert (row[pill]["status"], row[pill]["error"]) == ("failed", "interrupted by restart")
    # Three interruptions, none of which spent an attempt.
    assert (row[pill]["attempt"], row[pill]["interruptions"]) == (1, 3)
    log = server.log()
    assert log.count("WORKER TIMEOUT") == 3
    assert "job's handler blocked the event loop" in log
    assert f"job_id={pill} kind=hog" in log
    # The server kept serving throughout, and serves on.
    wait_until(lambda: server.log().count("job pool started") == 4, DEADLINE, "no new worker")
    assert server.popen.poll() is None
