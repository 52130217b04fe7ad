"""Flow control with the real runner, on both databases (and through PgBouncer):
a kind paused across processes, jobs snoozed by their handlers, and limits
per partition held across two `flask jobs work` processes."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mealquest.clock import from_text
from mealquest.extensions import get_store
from mealquest.jobs.service import flow, get_jobs
from mealquest.model.jobs import MESSAGE_SNOOZED_TOO_OFTEN, Status
from tests.conftest import wait_for
from tests.support.kinds import RATED
from tests.support.pages import PageServer, Reply
from tests.support.processes import flask_jobs_work, process_group, wait_working

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


def final(jobs: Any, job_id: str) -> Any:
    job = jobs.get(job_id)
    return job if job.status in FINAL else None


def _pids_in(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {int(line.split()[1]) for line in path.read_text().splitlines() if line}


def claims_made_by_both(jobs: Any, household: Any, processes: list[Any], markers: Path) -> bool:
    """Enqueue a marker job; true once each process has run one: a claim of
    that process took a job enqueued after this point in the test."""
    jobs.enqueue(
        "append_job_id",
        {"log": str(markers), "seconds": 0.0},
        household_id=household.household_id,
    )
    return _pids_in(markers) >= {worker.pid for worker in processes}


# -- pause ------------------------------------------------------------------------------


def test_a_paused_kind_lets_its_running_jobs_finish_and_runs_the_queued_once_after_resume(
    database, make_app, household, gates, tmp_path
):
    # This app only enqueues and pauses: its pool never starts.
    app = make_app()
    jobs, store = get_jobs(app), get_store(app)
    log, markers = tmp_path / "runs.log", tmp_path / "markers.log"
    gated = [
        jobs.enqueue(
            "gated", {"url": gates.url("p"), "log": str(log)}, household_id=household.household_id
        )
        for _ in range(6)
    ]
    with process_group() as processes:
        processes.extend(
            flask_jobs_work(database, JOB_WORKERS=2, JOB_POLL_SECONDS=0.05) for _ in range(2)
        )
        for worker in processes:
            wait_working(worker)
        wait_for(lambda: gates.arrivals("p") == 4)

        assert flow.pause(store, jobs.registry, "gated", None) is flow.Change.PAUSED
        gates.open("p")
        # The four that ran when the kind was paused finish as they would.
        wait_for(lambda: sum(jobs.get(i).status is Status.SUCCEEDED for i in gated) == 4)
        # Both processes have claimed since (their slots freed): the two
        # older queued jobs came first in the claim's order, and stayed.
        wait_for(lambda: claims_made_by_both(jobs, household, processes, markers), interval=0.1)
        assert sorted(jobs.get(i).status for i in gated).count(Status.QUEUED) == 2
        assert gates.arrivals("p") == 4

        assert flow.resume(store, "gated", None) is flow.Change.RESUMED
        wait_for(lambda: all(final(jobs, i) for i in gated))
    assert all(jobs.get(i).status is Status.SUCCEEDED for i in gated)
    starts = Counter(line.split()[1] for line in log.read_text().splitlines() if line[0] == "+")
    assert starts == Counter(dict.fromkeys(gated, 1))


# -- snooze -----------------------------------------------------------------------------


def test_a_snoozed_job_runs_again_after_its_delay_without_spending_an_attempt(make_app, household):
    jobs = get_jobs(make_app())
    job_id = jobs.enqueue(
        "snooze_then_succeed", {"seconds": 0.2, "times": 2}, household_id=household.household_id
    )
    jobs.start_pool()

    done = wait_for(lambda: final(jobs, job_id))

    assert (done.status, done.result, done.attempt, done.snoozes) == (
        Status.SUCCEEDED,
        {"attempt": 1},
        1,
        2,
    )
    # Its last due time was set by the second snooze, 0.2 s after a run that
    # began after the first one's 0.2 s.
    assert from_text(done.run_at) - from_text(done.created_at) >= timedelta(seconds=0.4)


def test_a_job_snoozed_more_often_than_allowed_fails_snoozed_too_often(make_app, household):
    jobs = get_jobs(make_app(JOB_MAX_SNOOZES=3))
    job_id = jobs.enqueue(
        "snooze_then_succeed", {"seconds": 0.0, "times": 100}, household_id=household.household_id
    )
    jobs.start_pool()

    done = wait_for(lambda: final(jobs, job_id))

    assert (done.status, done.error, done.snoozes, done.attempt) == (
        Status.FAILED,
        MESSAGE_SNOOZED_TOO_OFTEN,
        3,
        1,
    )


def test_a_cancel_that_reaches_a_snoozing_handler_wins(make_app, household, gates):
    jobs = get_jobs(make_app())
    job_id = jobs.enqueue(
        "snooze_at_gate", {"url": gates.url("s")}, household_id=household.household_id
    )
    jobs.start_pool()
    wait_for(lambda: gates.arrivals("s") == 1)

    assert jobs.cancel(job_id).status is Status.RUNNING
    gates.open("s")

    done = wait_for(lambda: final(jobs, job_id))
    assert (done.status, done.snoozes) == (Status.CANCELLED, 0)


# -- limits per partition -----------------------------------------------------------------


def test_a_partitions_rate_is_never_exceeded_across_two_processes(database, make_app, household):
    app = make_app()
    jobs = get_jobs(app)
    keyed = {
        key: [
            jobs.enqueue("rated", {"key": key}, household_id=household.household_id)
            for _ in range(5)
        ]
        for key in ("p", "q")
    }
    with process_group() as processes:
        processes.extend(
            flask_jobs_work(database, JOB_WORKERS=3, JOB_POLL_SECONDS=0.05) for _ in range(2)
        )
        wait_for(lambda: all(final(jobs, i) for ids in keyed.values() for i in ids))
    count, per_seconds = RATED
    for ids in keyed.values():
        starts = sorted(from_text(jobs.get(i).started_at) for i in ids)
        # Any `count` + 1 starts of a partition span at least the window.
        spans = [starts[n + count] - starts[n] for n in range(len(starts) - count)]
        assert min(spans) >= timedelta(seconds=per_seconds), starts


def test_one_hosts_imports_run_at_most_its_limit_at_once_and_another_hosts_passes_them(
    database, make_app, household
):
    held = threading.Event()
    site_a, site_b = PageServer("127.0.0.1").start(), PageServer("127.0.0.2").start()
    try:
        # Each page answers (a 404: the import ends at once, nothing to parse)
        # only once the test lets it: until then, the import's fetch is in
        # flight, and the page server counts it.
        for number in range(40):
            site_a.add(f"/a/{number}", Reply(status=404, body=b"gone", hold=held))
        site_b.add("/b", Reply(status=404, body=b"gone"))
        jobs = get_jobs(make_app())

        def import_from(url: str) -> str:
            return jobs.enqueue("recipe_import", {"url": url}, household_id=household.household_id)

        from_a = [import_from(site_a.url(f"/a/{number}")) for number in range(40)]
        with process_group() as processes:
            processes.extend(
                flask_jobs_work(
                    database,
                    JOB_WORKERS=3,
                    JOB_POLL_SECONDS=0.05,
                    ALLOW_PRIVATE_URLS="true",
                    RECIPE_FETCH_MAX_PER_HOST=2,
                    RECIPE_FETCH_PER_HOST_PER_MINUTE=0,
                    RECIPE_FETCH_TIMEOUT_SECONDS=600,
                )
                for _ in range(2)
            )
            for worker in processes:
                wait_working(worker)
            wait_for(lambda: site_a.in_flight == 2)

            from_b = import_from(site_b.url("/b"))

            # B's import ran while A's backlog waited: the claims passed over it.
            assert wait_for(lambda: final(jobs, from_b)).status is Status.FAILED
            assert site_b.total_hits == 1
            assert (site_a.in_flight, site_a.total_hits) == (2, 2)
            assert sum(jobs.get(i).status is Status.QUEUED for i in from_a) == 38
            held.set()
            wait_for(lambda: all(final(jobs, i) for i in from_a), timeout=60)
    finally:
        held.set()
        site_a.stop()
        site_b.stop()
    assert site_a.most_in_flight == 2
    assert site_a.total_hits == 40
    assert {jobs.get(i).error for i in from_a} == {"the page was not found (HTTP 404)"}
