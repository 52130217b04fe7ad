"""Schemathesis holds the served app to its own OpenAPI document.

A real gunicorn (gevent worker) on loopback serves the real app on a real
migrated SQLite file holding real jobs (succeeded, failed) of a household
whose real token authenticates the run. Schemathesis's engine (what
`schemathesis run` drives) runs every phase on every operation of the
document the server publishes: the document's examples; coverage (boundary
and negative values, a missing token, unexpected methods); fuzzing in
positive and negative modes; stateful sequences. Every check runs: no 5xx,
answers match their documented schemas, statuses and headers, valid input is
accepted, invalid input is a documented 4xx, a wrong token is refused.

Over HTTP rather than in-process: schemathesis 4.32's WSGI transport breaks
on its `ignored_auth` probe, and its pytest fixture loader does not run
under pytest 9. Bounded (examples per operation, a fixed seed,
derandomised, no example database) so it stays fast and a failure replays
exactly. Run it alone with `.venv/bin/pytest tests/test_openapi_fuzz.py`;
hunt longer with `MQ_FUZZ_EXAMPLES=500`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from schemathesis.engine import Status as RunStatus
from schemathesis.engine import events, from_schema

from mealquest.model.jobs import Status
from mealquest.model.recipes import ParsedRecipe
from tests.conftest import wait_for

pytestmark = pytest.mark.both_databases

SEED = 20260406
MAX_EXAMPLES = int(os.environ.get("MQ_FUZZ_EXAMPLES", "50"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def served(database: dict, tmp_path: Path) -> Iterator[str]:
    """gunicorn on loopback with only the flags given here (no config file is
    read: it runs in an empty directory), so no job pool runs and the data
    the fuzzer reads stays as the test made it."""
    port = _free_port()
    env = {
        **{f"MEALQUEST_{key}": value for key, value in database.items()},
        "MEALQUEST_LOG_LEVEL": "WARNING",
        # Every event stream (and long poll) the fuzzer opens ends within a
        # tenth of a second, its heartbeat sent on the way: its read is
        # bounded, whatever the job does. The fuzzer's batches are never run
        # (no pool), so each of their streams lasts this long: at a second
        # it was most of the run.
        "MEALQUEST_STREAM_MAX_SECONDS": "0.1",
        "MEALQUEST_STREAM_HEARTBEAT_SECONDS": "0.05",
        "GUNICORN_CMD_ARGS": "",
    }
    args = [sys.executable, "-m", "gunicorn", "--worker-class", "gevent", "--workers", "1"]
    args += ["--bind", f"127.0.0.1:{port}", "--no-control-socket", "--graceful-timeout", "2"]
    # Every request line reaches the app, whose own 414 the document lists
    # (deployed, nginx answers an even longer one itself, in the same envelope).
    args += ["--limit-request-line", "0"]
    args += ["mealquest:create_app()"]
    server = subprocess.Popen(
        args,
        cwd=tmp_path,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # A deadline for a slow start on a loaded machine, never waited out by a pass.
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:  # not listening yet, or slow to answer
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("gunicorn did not come up")
            time.sleep(0.05)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def api_schema(served, app, store, jobs, household, auth):
    """The document the server publishes, with a real job of each final state
    and a real recipe behind it to find (the fuzzer reuses ids it lists)."""
    mine = household.household_id
    done = jobs.enqueue("succeed", {"value": 7}, household_id=mine)
    failed = jobs.enqueue("fail_with_failure", {"message": "no such recipe"}, household_id=mine)
    pool = jobs.start_pool()
    wait_for(
        lambda: (
            jobs.get(done).status == Status.SUCCEEDED and jobs.get(failed).status == Status.FAILED
        )
    )
    pool.stop(timeout=1)
    recipe = ParsedRecipe(
        title="Pancakes",
        ingredients=["2 eggs", "1 cup flour"],
        instructions=["Mix.", "Fry."],
        yields="4 servings",
        total_time_minutes=20,
        image_url=None,
        author=None,
    )
    store.write(
        lambda tx: store.recipes.upsert_for_job(
            tx,
            household_id=mine,
            job_id=done,
            source_url="https://example.com/pancakes",
            parsed=recipe,
        )
    )

    # Fetched here rather than by `from_url`, which leaves out the operation
    # that serves the document: that route is held to the document too.
    answer = requests.get(f"{served}/api/v1/openapi.json", headers=auth, timeout=10)
    assert answer.status_code == 200
    schema = schemathesis.openapi.from_dict(answer.json())
    schema.config.update(base_url=served, headers=auth, workers=1)
    schema.config.seed = SEED
    schema.config.generation.update(max_examples=MAX_EXAMPLES, deterministic=True, database="none")
    # Nor a cache of failing cases to replay in the next run (a directory in
    # the working tree): each run is the seed's, and only the seed's.
    schema.config.cache.enabled = False
    # A valid request may meet state it cannot change: an Idempotency-Key the
    # fuzzer already sent with another body (422), or a finished job to
    # cancel (409, already expected). Both answers are in the document.
    acceptance = schema.config.checks.positive_data_acceptance
    acceptance.expected_statuses = [*acceptance.expected_statuses, "422"]
    # A body's whole size is bounded (`413`, in the document) where JSON Schema
    # cannot say so: a hundred URLs each valid may add up to more.
    acceptance.expected_statuses = [*acceptance.expected_statuses, "413"]
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    return schema


def _describe(event: events.ScenarioFinished) -> list[str]:
    found = []
    for checks in event.recorder.checks.values():
        for check in checks:
            if check.failure_info is not None:
                failure = check.failure_info.failure
                found.append(
                    f"{event.label} [{event.phase.name}] {check.name}: {failure.title}\n"
                    f"{failure.message}\n{check.failure_info.code_sample}"
                )
    return found or [f"{event.label} [{event.phase.name}]: {event.status}"]


@pytest.mark.timeout(300)
def test_every_operation_keeps_to_the_document(api_schema):
    failures: list[str] = []
    scenarios = 0
    for event in from_schema(api_schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            if event.status in (RunStatus.FAILURE, RunStatus.ERROR):
                failures += _describe(event)
        elif isinstance(event, events.NonFatalError):
            failures.append(f"{event.label}: {event.info.title}\n{event.info.message}")
        elif isinstance(event, events.FatalError):
            raise event.exception
    assert not failures, "\n\n".join(dict.fromkeys(failures))
    assert scenarios > 0
