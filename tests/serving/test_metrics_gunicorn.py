"""GET /metrics under real gunicorn with two workers, on both databases:
whichever worker answers a scrape, it counts every worker's requests and
jobs (prometheus_client's multiprocess mode, set up by gunicorn.conf.py),
a SIGKILLed worker's counts stay counted, a file a worker left empty is
passed over, and the directory is fresh for each master and gone when it
stops."""

from __future__ import annotations

import os
import signal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mealquest.operators import create_operator
from tests.support.servers import Gunicorn, enqueue, final_jobs, http, serving_env, wait_until
from tests.support.serving_app import WORKER_PID_HEADER

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

HEALTHZ = ("mealquest_http_requests_total", {"route": "/healthz", "method": "GET", "status": "200"})


def value(text, name, labels):
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def test_every_scrape_sums_the_counts_of_every_worker(served, tmp_path, processes):
    parent = tmp_path / "metrics"
    parent.mkdir()
    env = serving_env(served.database)
    env["MEALQUEST_METRICS_DIR_PARENT"] = str(parent)
    server = Gunicorn(tmp_path / "gunicorn.log", env, workers=2)
    processes.append(server)
    server.wait_ready()
    [directory] = list(parent.iterdir())
    operator = create_operator(served.store, "Ada")
    # wait_ready's own requests count too: start from what the server says.
    start = value(
        http("GET", f"{server.url}/metrics", token=operator.token).body.decode(), *HEALTHZ
    )

    # Requests on new connections until both workers have answered some.
    sent = 0
    answered_by: set[str] = set()

    def both_answered() -> bool:
        nonlocal sent
        answer = http("GET", f"{server.url}/healthz")
        assert answer.status == 200
        sent += 1
        answered_by.add(answer.headers[WORKER_PID_HEADER])
        return len(answered_by) == 2 and sent >= 10

    wait_until(both_answered, 60, "both workers did not answer", interval=0)
    job_ids = [enqueue(server.url, served.token, "pid", {}) for _ in range(6)]
    wait_until(lambda: final_jobs(served.store, job_ids), 60, "the jobs did not finish")

    def scrape_by(pid: str) -> str | None:
        answer = http("GET", f"{server.url}/metrics", token=operator.token)
        assert answer.status == 200
        return answer.body.decode() if answer.headers[WORKER_PID_HEADER] == pid else None

    runs = ("mealquest_job_runs_total", {"kind": "pid", "outcome": "succeeded"})
    rows = ("mealquest_jobs", {"kind": "pid", "status": "succeeded"})

    def complete(text: str | None) -> str | None:
        # Counted once the outcome is stored, a moment after the row shows it;
        # the rows' gauge is read from the database at most every 1.5 s.
        done = text and value(text, *runs) == len(job_ids) and value(text, *rows) == len(job_ids)
        return text if done else None

    for pid in answered_by:
        text = wait_until(
            lambda pid=pid: complete(scrape_by(pid)),
            30,
            f"worker {pid} never scraped every job",
            interval=0.05,
        )
        assert value(text, *HEALTHZ) == start + sent

    # A SIGKILLed worker's counts stay counted by the survivor and its replacement.
    victim = int(sorted(answered_by)[0])
    os.kill(victim, signal.SIGKILL)

    def replaced() -> list[int] | None:
        pids = server.worker_pids()
        return pids if len(pids) == 2 and victim not in pids else None

    for pid in wait_until(replaced, 60, "the killed worker was not replaced"):
        text = wait_until(lambda pid=pid: scrape_by(str(pid)), 30, "no scrape by the worker", 0)
        assert value(text, *HEALTHZ) == start + sent
        assert value(text, *runs) == len(job_ids)

    # A worker killed between creating its file and sizing it leaves the file
    # empty: it holds no value, and no scrape fails on it.
    (directory / "counter_4194304.db").touch()
    for pid in server.worker_pids():
        text = wait_until(lambda pid=pid: scrape_by(str(pid)), 30, "no scrape by the worker", 0)
        assert value(text, *HEALTHZ) == start + sent
        assert value(text, *runs) == len(job_ids)

    # The master's hooks (child_exit marking the dead worker) ran without error.
    assert "Traceback" not in server.log()
    server.stop()
    assert not directory.exists()
    assert list(parent.iterdir()) == []
