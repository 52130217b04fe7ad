"""The service under real gunicorn with gevent workers and the real gunicorn.conf.py.

Jobs are enqueued over HTTP (the test app's /api/v1/test-jobs) and their
outcome read from the database (an SQLite file, or PostgreSQL). Every wait is on a condition with a
deadline; no test asserts how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from mealquest.clock import seconds, utc_now
from tests.support.servers import (
    APP,
    BIN,
    RESCUE_SECONDS,
    TIMEOUT,
    HeldServer,
    Process,
    enqueue,
    final_jobs,
    http,
    job,
    jobs_by_id,
    partial_pid,
    running_pids,
    serving_env,
    wait_until,
)
from tests.support.serving_app import WORKER_PID_HEADER

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

# Deadlines, generous for a loaded machine: a test that passes never waits one out.
DEADLINE = 60.0
# Time for gunicorn to notice a dead worker and boot a new one (imports the app).
RESPAWN_SECONDS = 60.0


def runs_by_job(log: Path, event: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            name, job_id, *_ = line.split()
            if name == event:
                counts[job_id] = counts.get(job_id, 0) + 1
    return counts


def test_jobs_enqueued_over_http_run_in_both_workers(served, start_gunicorn, gates, tmp_path):
    """Eight jobs held running in two workers of four slots each: whichever
    worker answers the posts and claims first, the other must run the rest."""
    server = start_gunicorn(workers=2, config={"JOB_WORKERS": 4})
    workers = set(server.worker_pids())
    payload = {"url": gates.url("held"), "log": str(tmp_path / "runs.log")}
    ids = [enqueue(server.url, served.token, "pid_gate", payload) for _ in range(8)]

    pids = wait_until(
        lambda: running_pids(served.store, ids), DEADLINE, "jobs did not run in both workers"
    )
    assert set(pids.values()) == workers
    gates.open("held")
    rows = wait_until(lambda: final_jobs(served.store, ids), DEADLINE, "jobs did not finish")
    assert {row["status"] for row in rows.values()} == {"succeeded"}


def test_the_pool_runs_monkey_patched_socket_io_does_not_block_requests(served, start_gunicorn):
    """A job blocked in a stdlib `recv` (the server answers only when the test
    says so) must leave its worker's hub free: a GET answered by that same
    worker while the read is pending proves the pool's sockets are gevent's.
    Unpatched, that worker could not accept at all and every GET would land on
    the other one until the deadline."""
    server = start_gunicorn(workers=2)
    with HeldServer() as slow:
        job_id = enqueue(server.url, served.token, "socket_io", {"port": slow.port})
        wait_until(slow.connected.is_set, DEADLINE, "the job did not connect to the slow server")
        runner = wait_until(
            lambda: partial_pid(served.store, job_id), DEADLINE, "the job did not publish its pid"
        )
        answered_by: list[int] = []

        def get_answered_by_the_job_process() -> bool:
            answer = http("GET", f"{server.url}/api/v1/jobs/{job_id}", token=served.token)
            assert answer.status == 200
            assert answer.json["status"] == "running"  # its recv is still pending
            answered_by.append(int(answer.headers[WORKER_PID_HEADER]))
            return answered_by[-1] == runner

        wait_until(
            get_answered_by_the_job_process,
            DEADLINE,
            f"no GET was answered by worker {runner} while its job's socket read was "
            f"pending (answered by {sorted(set(answered_by))}): the pool is not patched",
        )
        assert not slow.release.is_set()
        slow.release.set()
        row = wait_until(
            lambda: final_jobs(served.store, [job_id]), DEADLINE, "the socket job did not finish"
        )[job_id]
    assert row["status"] == "succeeded"
    assert json.loads(row["result"]) == {"pid": runner, "received": len(slow.reply)}


def test_a_sigkilled_worker_is_respawned_and_its_job_is_rescued(
    served, start_gunicorn, gates, tmp_path
):
    server = start_gunicorn(workers=2, config={"JOB_WORKERS": 4})
    log = tmp_path / "runs.log"
    victim = enqueue(
        server.url, served.token, "pid_gate", {"url": gates.url("victim"), "log": str(log)}
    )
    others = [
        enqueue(
            server.url,
            served.token,
            "pid_gate_retried",
            {"url": gates.url("others"), "log": str(log)},
        )
        for _ in range(6)
    ]
    # Seven jobs held at once in eight slots: the victim's worker runs at
    # least two of the others, which its death interrupts too.
    pids = wait_until(
        lambda: running_pids(served.store, [victim, *others]), DEADLINE, "jobs not running"
    )
    killed = pids[victim]
    bystanders = [job_id for job_id in others if pids[job_id] == killed]
    assert len(bystanders) >= 2, pids
    before = set(server.worker_pids())
    os.kill(killed, signal.SIGKILL)
    gates.open("others")

    def respawned() -> set[int] | None:
        pids = set(server.worker_pids())
        return pids if len(pids) == 2 and killed not in pids else None

    assert (
        len(wait_until(respawned, RESPAWN_SECONDS, "the killed worker not respawned") - before) == 1
    )
    # The lease expires, then some pool's rescuer (every RESCUE_SECONDS) takes it back.
    row = wait_until(
        lambda: final_jobs(served.store, [victim]),
        DEADLINE,
        "the killed worker's job was not rescued",
    )[victim]
    assert (row["status"], row["error"]) == ("failed", "interrupted by restart")
    rows = wait_until(
        lambda: final_jobs(served.store, others), DEADLINE, "other jobs did not finish"
    )
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    # The bystanders ran again elsewhere; the others ran once, where they started.
    starts = runs_by_job(log, "start")
    assert {job_id: starts[job_id] for job_id in others} == {
        job_id: 2 if job_id in bystanders else 1 for job_id in others
    }
    assert all(json.loads(rows[job_id]["result"])["pid"] != killed for job_id in others)
    # The bystanders' interruption cost them no attempt: their kind re-queues.
    assert {rows[job_id]["attempt"] for job_id in others} == {1}


def test_sigterm_to_the_master_finishes_or_records_every_running_job(served, start_gunicorn, gates):
    # A lease above the longer timeout (6 s) that goes with the longer grace.
    server = start_gunicorn(workers=2, graceful_timeout=5, config={"JOB_LEASE_SECONDS": 7.0})
    short = enqueue(server.url, served.token, "pid_gate", {"url": gates.url("short")})
    long = enqueue(server.url, served.token, "pid_gate", {"url": gates.url("long")})
    long_retried = enqueue(server.url, served.token, "pid_gate_retried", {"url": gates.url("long")})
    wait_until(
        lambda: running_pids(served.store, [short, long, long_retried]),
        DEADLINE,
        "jobs not running",
    )

    server.signal(signal.SIGTERM)
    # Both workers are draining: the short job ends within the grace, the long ones never.
    wait_until(
        lambda: server.log().count("worker stopping:") == 2, DEADLINE, "workers did not drain"
    )
    gates.open("short")
    assert server.wait(timeout=server.graceful_timeout + DEADLINE) == 0, server.log()

    assert job(served.store, short)["status"] == "succeeded"  # finished within the grace
    assert (job(served.store, long)["status"], job(served.store, long)["error"]) == (
        "failed",
        "interrupted by restart",
    )
    # Its kind re-queues interrupted jobs with the attempt refunded: a deploy
    # is not the job's failure.
    requeued = job(served.store, long_retried)
    assert (
        requeued["status"],
        requeued["attempt"],
        requeued["interruptions"],
        requeued["lease_owner"],
    ) == ("queued", 0, 1, None)
    assert "worker exit:" in server.log()


def test_recycling_and_sighup_fail_no_job_and_run_none_twice(
    served, start_gunicorn, gates, tmp_path
):
    """Jobs held while their workers drain (SIGHUP and max_requests replace
    them): a draining worker keeps renewing their leases, and new workers'
    rescues leave live jobs alone. The grace is longer than any hold, and the
    lease longer than gunicorn's timeout that goes with it (as the
    configuration requires): the jobs finish when the test opens their gate.
    Each pool has a slot for every job, so whichever worker still claims can
    hold them all."""
    server = start_gunicorn(
        workers=2,
        graceful_timeout=60,
        config={"JOB_WORKERS": 12, "JOB_LEASE_SECONDS": 62.0},
        extra_args=("--max-requests", "4", "--max-requests-jitter", "0"),
    )
    log = tmp_path / "runs.log"
    first_workers = set(server.worker_pids())
    payload = {"url": gates.url("held"), "log": str(log)}
    # With the readiness check, seven requests or more on two workers: one
    # reaches max_requests and drains while jobs are held.
    ids = [enqueue(server.url, served.token, "pid_gate", payload) for _ in range(6)]
    wait_until(
        lambda: (
            len(runs_by_job(log, "start")) == len(ids)
            or server.log().count("worker stopping:") == len(first_workers)
        ),
        DEADLINE,
        "jobs did not start in the first workers",
    )
    server.signal(signal.SIGHUP)
    # Six requests on the two new workers: one of them at least keeps claiming.
    ids += [enqueue(server.url, served.token, "pid_gate", payload) for _ in range(6)]
    wait_until(lambda: len(runs_by_job(log, "start")) == len(ids), DEADLINE, "jobs did not start")
    rows = jobs_by_id(served.store)
    claimed_until = {job_id: rows[job_id]["lease_expires_at"] for job_id in ids}
    held_since = utc_now()

    def renewed_while_held() -> bool:
        rows = jobs_by_id(served.store)
        states = {job_id: (rows[job_id]["status"], rows[job_id]["attempt"]) for job_id in ids}
        assert set(states.values()) == {("running", 1)}, states
        renewed = all(rows[job_id]["lease_expires_at"] > claimed_until[job_id] for job_id in ids)
        # Every worker's rescuer has looked at them a few times meanwhile.
        return renewed and utc_now() > held_since + seconds(3 * RESCUE_SECONDS)

    # The draining workers' leases too: renewed by the heartbeats of a drain.
    wait_until(renewed_while_held, DEADLINE, "the held jobs' leases were not renewed")
    assert "Autorestarting worker" in server.log()
    assert "Hang up" in server.log()
    gates.open("held")

    rows = wait_until(lambda: final_jobs(served.store, ids), DEADLINE, "jobs did not finish")
    assert {job_id: row["status"] for job_id, row in rows.items()} == dict.fromkeys(
        ids, "succeeded"
    )
    assert runs_by_job(log, "start") == dict.fromkeys(ids, 1)  # none ran twice
    assert {row["attempt"] for row in rows.values()} == {1}
    # Both mechanisms really replaced workers while jobs ran.
    wait_until(
        lambda: not first_workers & set(server.worker_pids()),
        DEADLINE,
        "the first workers did not exit after their drain",
    )


def test_web_only_workers_leave_jobs_to_flask_jobs_work(
    served, start_gunicorn, processes, tmp_path
):
    # gunicorn's own timeout: web-only workers hold no lease it could outlast.
    server = start_gunicorn(workers=1, config={"JOB_POOL_IN_WEB": False}, timeout=30)
    job_id = enqueue(server.url, served.token, "pid", {})
    env = serving_env(served.database)
    env["FLASK_APP"] = "tests.support.serving_app"
    worker = Process([str(BIN / "flask"), "jobs", "work"], env, tmp_path / "work.log")
    processes.append(worker)

    row = wait_until(
        lambda: final_jobs(served.store, [job_id]),
        DEADLINE,
        "flask jobs work did not run the job",
    )[job_id]
    assert row["status"] == "succeeded"
    assert json.loads(row["result"])["pid"] == worker.pid
    assert "job pool started" not in server.log()


def test_gunicorn_refuses_an_unmigrated_database_with_one_clear_first_line(tmp_path):
    from mealquest.db.sqlite import migrate

    behind = str(tmp_path / "behind.sqlite3")
    migrate.upgrade(behind, target=2)
    for path in (behind, str(tmp_path / "missing.sqlite3")):
        result = subprocess.run(
            [
                *(str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "--bind", "127.0.0.1:0"),
                # The timeout that fits the tests' short lease.
                *("--timeout", str(TIMEOUT), APP),
            ],
            cwd=Path(__file__).resolve().parents[2],
            env=serving_env(path),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        output = (result.stderr + result.stdout).strip()
        assert result.returncode != 0, output
        first = output.splitlines()[0]
        assert first.startswith("mealquest: refusing to start: the database"), output
        assert "flask db upgrade" in first
        assert "Listening at" not in output
