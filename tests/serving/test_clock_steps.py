"""A clock step on SQLite, with the real parts: a `flask jobs work` process
whose wall clock is ten minutes ahead (Debian's libfaketime) beside a live
gunicorn worker, on one SQLite file.

SQLite leases are the hosts' wall clock, which NTP may step. By the ahead
process's clock the worker's lease expired ten minutes ago the moment it is
claimed; the worker renews it every heartbeat all the same, and a rescue
that waits to see a lease go unrenewed for a whole lease of its own
monotonic clock takes none of it. Only CLOCK_REALTIME is moved
(`FAKETIME_DONT_FAKE_MONOTONIC`), as a step moves it: libfaketime moves
CLOCK_MONOTONIC too by default, and Python's timed lock waits then hang.
`time.sleep` fails there all the same (EINVAL from `clock_nanosleep`), which
gevent's hub monitor thread calls: the ahead process runs without it.
"""

from __future__ import annotations

import glob
import json
from datetime import timedelta

import pytest

from mealquest.clock import to_text, utc_now
from tests.support.servers import (
    BIN,
    LEASE_SECONDS,
    RESCUE_SECONDS,
    Process,
    enqueue,
    final_jobs,
    job,
    jobs_by_id,
    running_pids,
    serving_env,
    wait_until,
)

pytestmark = pytest.mark.sqlite_only(
    "a SQLite lease is the hosts' wall clock; PostgreSQL's is the server's one clock"
)

# Generous for a loaded machine (a process start imports the app): a test
# that passes never waits one out.
DEADLINE = 60.0
AHEAD = "+10m"


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise AssertionError(
            "libfaketime is not installed: `scripts/test` installs it from Debian's packages "
            "(apt-get install faketime); the clock-step test needs it"
        )
    return found[0]


def runs(log, event: str) -> dict[str, list[int]]:
    """The pids that logged `event` for each job (`event job_id attempt pid` lines)."""
    pids: dict[str, list[int]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            name, job_id, _, pid = line.split()
            if name == event:
                pids.setdefault(job_id, []).append(int(pid))
    return pids


def test_a_process_ten_minutes_ahead_takes_no_live_job_and_runs_none_twice(
    served, start_gunicorn, processes, gates, tmp_path
):
    log = tmp_path / "runs.log"
    held = {"url": gates.url("held"), "log": str(log)}
    # One slot, held by its job: the job enqueued later is the ahead process's.
    server = start_gunicorn(workers=1, config={"JOB_WORKERS": 1})
    (worker,) = server.worker_pids()
    on_gunicorn = enqueue(server.url, served.token, "pid_gate", held)
    wait_until(lambda: running_pids(served.store, [on_gunicorn]), DEADLINE, "not running")
    gunicorn_owner = job(served.store, on_gunicorn)["lease_owner"]

    env = serving_env(served.database, JOB_MAX_BLOCKING_SECONDS=0)
    env.update(
        {
            "FLASK_APP": "tests.support.serving_app",
            "LD_PRELOAD": libfaketime(),
            "FAKETIME": AHEAD,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    )
    ahead = Process([str(BIN / "flask"), "jobs", "work"], env, tmp_path / "ahead.log")
    processes.append(ahead)
    wait_until(lambda: "Ctrl-C stops" in ahead.log(), DEADLINE, "the ahead process did not start")

    def owners() -> dict[str, str]:
        rows = jobs_by_id(served.store)
        return {job_id: (row["status"], row["lease_owner"]) for job_id, row in rows.items()}

    on_ahead = enqueue(server.url, served.token, "pid_gate", held)

    def ahead_running() -> dict[str, int] | None:
        # The ahead process's rescue at start, and every one since, left it alone.
        assert owners()[on_gunicorn] == ("running", gunicorn_owner), ahead.log()
        return running_pids(served.store, [on_ahead])

    assert wait_until(ahead_running, DEADLINE, "not running") == {on_ahead: ahead.pid}
    # The fake is in force: claimed by a clock ten minutes ahead.
    claimed = job(served.store, on_ahead)
    assert claimed["lease_expires_at"] > to_text(utc_now() + timedelta(minutes=9))
    expected = {
        on_gunicorn: ("running", gunicorn_owner),
        on_ahead: ("running", claimed["lease_owner"]),
    }

    # Held until both processes' rescuers have looked at the other's job for
    # more than a whole lease, however its expiry reads to them.
    since = utc_now()

    def held_past_a_lease() -> bool:
        assert owners() == expected, ahead.log()
        return utc_now() > since + timedelta(seconds=LEASE_SECONDS + 4 * RESCUE_SECONDS)

    wait_until(held_past_a_lease, DEADLINE, "the jobs were not held")
    gates.open("held")
    rows = wait_until(
        lambda: final_jobs(served.store, [on_gunicorn, on_ahead]), DEADLINE, "not final"
    )
    assert {job_id: (row["status"], row["attempt"]) for job_id, row in rows.items()} == {
        on_gunicorn: ("succeeded", 1),
        on_ahead: ("succeeded", 1),
    }
    assert json.loads(rows[on_gunicorn]["result"])["pid"] == worker
    assert json.loads(rows[on_ahead]["result"])["pid"] == ahead.pid
    # Each ran once, where it was claimed.
    assert runs(log, "start") == {on_gunicorn: [worker], on_ahead: [ahead.pid]}
    assert runs(log, "end") == {on_gunicorn: [worker], on_ahead: [ahead.pid]}
