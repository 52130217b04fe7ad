"""The blocked-loop exit of `flask jobs work`: what its thread concludes from
its readings (times given), and a real process that is busy, or stopped
whole for a while, but whose loop is live: it goes on.

The exit itself, in a real process whose handler blocks the loop, is
`test_multiprocess.py`'s (with the rescue that follows, on both databases).
"""

from __future__ import annotations

import signal
import time

import pytest

from mealquest.model.jobs import Status
from mealquest.serving.blocked_exit import BlockedLoop
from tests.conftest import wait_for
from tests.support.processes import flask_jobs_work, process_group, wait_working

pytestmark = pytest.mark.sqlite_only(
    "the exit reads the event loop, not the database (the rescue after it: test_multiprocess.py)"
)

LIMIT = 1.0
TICK = 0.05
START_DEADLINE = 60.0


def test_a_loop_left_unstamped_past_the_limit_is_the_verdict_at_the_second_reading_past_it():
    loop = BlockedLoop(LIMIT, TICK)
    assert [loop.read(now, stamp=0.0) for now in (0.4, 0.8, 1.2)] == [None] * 3  # 1.2: once
    assert loop.read(1.6, stamp=0.0) == pytest.approx(1.6)


def test_a_stamped_loop_is_never_the_verdict():
    loop = BlockedLoop(LIMIT, TICK)
    assert all(loop.read(n * TICK, stamp=n * TICK - 0.01) is None for n in range(1, 100))


def test_one_reading_past_the_limit_then_a_stamp_is_not_the_verdict():
    loop = BlockedLoop(LIMIT, TICK)
    assert [loop.read(now, stamp=0.0) for now in (0.4, 0.8, 1.2)] == [None] * 3
    assert loop.read(1.25, stamp=1.22) is None
    assert [loop.read(now, stamp=1.22) for now in (1.6, 2.0)] == [None, None]


def test_a_process_stopped_whole_gets_no_verdict_when_it_resumes():
    """Stopped for 10 s (SIGSTOP, a paused machine): the thread's own readings
    have a gap, so the stamp's age is not the loop's fault."""
    loop = BlockedLoop(LIMIT, TICK)
    assert all(loop.read(n * 0.1, stamp=n * 0.1 - 0.01) is None for n in range(1, 6))
    # Resumed: the thread reads first, the loop stamps a moment later.
    assert loop.read(10.5, stamp=0.49) is None
    assert loop.read(10.55, stamp=0.49) is None
    assert all(loop.read(10.5 + n * 0.1, stamp=10.49 + n * 0.1) is None for n in range(1, 20))


def test_a_loop_blocked_across_a_stop_still_gets_its_verdict_on_the_thread_clock():
    loop = BlockedLoop(LIMIT, TICK)
    assert [loop.read(n * 0.1, stamp=0.0) for n in range(1, 6)] == [None] * 5
    # The stop counts as one on-time gap (0.5 s), not as its 10 s; the
    # readings after it find the loop still blocked.
    assert loop.read(10.5, stamp=0.0) is None
    assert loop.read(10.55, stamp=0.0) is None  # past the limit once, on time
    assert loop.read(10.6, stamp=0.0) == pytest.approx(1.1)


def test_a_late_reading_past_the_limit_is_not_one_of_the_two():
    loop = BlockedLoop(LIMIT, TICK)
    assert [loop.read(now, stamp=0.0) for now in (0.4, 0.8)] == [None, None]
    assert loop.read(2.0, stamp=0.0) is None  # past the limit, but late
    assert loop.read(2.05, stamp=0.0) is None  # the first on-time one past it
    assert loop.read(2.1, stamp=0.0) is not None


def test_a_busy_process_and_one_stopped_whole_for_a_while_go_on(jobs, household, database):
    """Its handler keeps the CPU busy three times the limit, letting the loop
    run between slices; meanwhile the whole process is stopped for longer
    than the limit, then resumed. Neither is a blocked loop."""
    with process_group() as processes:
        worker = flask_jobs_work(
            database,
            # Long enough that the stop below leaves its lease renewable (the
            # pool stops a handler whose lease it could not renew in time).
            JOB_LEASE_SECONDS=6.0,
            JOB_HEARTBEAT_SECONDS=0.5,
            JOB_BLOCKED_EXIT_SECONDS=LIMIT,
            JOB_POLL_SECONDS=0.1,
        )
        processes.append(worker)
        wait_working(worker)
        job_id = jobs.enqueue("busy", {"seconds": 3 * LIMIT}, household_id=household.household_id)
        wait_for(lambda: jobs.get(job_id).status is Status.RUNNING, timeout=START_DEADLINE)
        worker.signal(signal.SIGSTOP)
        time.sleep(1.5 * LIMIT)  # the stop is what is tested: longer than the limit
        worker.signal(signal.SIGCONT)

        try:
            done = wait_for(
                lambda: (job := jobs.get(job_id)).status is not Status.RUNNING and job,
                timeout=START_DEADLINE,
            )
        except AssertionError:
            # Once, under load, the job was still running a minute later: the
            # worker's own account is what can say why.
            raise AssertionError(f"still running: {jobs.get(job_id)}\n{worker.output()}") from None
        assert (done.status, done.attempt, done.error) == (Status.SUCCEEDED, 1, None), (
            worker.output()
        )
        assert worker.popen.poll() is None, worker.output()
        assert worker.stop() == 0, worker.output()
        assert "has been blocked" not in worker.output()
