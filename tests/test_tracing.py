"""OpenTelemetry (`mealquest.tracing`): one trace from the request that
enqueues a job through each of its attempts, a retried one included; the
jobs a handler enqueues and a batch's members continue it; log lines name
it; and with tracing off nothing is stored and no attempt is a span. On
both databases, through the real pool and a real page server, with the
SDK's in-memory exporter."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from mealquest import tracing
from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs import JobRequest
from mealquest.jobs.service import get_jobs
from mealquest.logs import JsonFormatter
from mealquest.model.jobs import Status
from mealquest.operators import create_operator
from tests.conftest import wait_for
from tests.support.pages import Reply, recipe_page
from tests.test_admin import SECRET_KEY, signed_in
from tests.test_recipe_import import (  # noqa: F401 - the fixtures `pages` and `start`
    finished,
    import_url,
    pages,
    start,
)

pytestmark = pytest.mark.both_databases

FINAL = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process's SDK provider (made once, exporting nowhere else), with
    an in-memory exporter that keeps every span ended from now on."""
    before = os.environ.get("OTEL_TRACES_EXPORTER")
    os.environ["OTEL_TRACES_EXPORTER"] = "none"
    try:
        provider = tracing.install_provider()
    finally:
        if before is None:
            del os.environ["OTEL_TRACES_EXPORTER"]
        else:
            os.environ["OTEL_TRACES_EXPORTER"] = before
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    memory.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """The service's log lines from now on, as `MEALQUEST_LOG_FORMAT=json` writes them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("mealquest")
    logger.addHandler(handler)
    yield out
    logger.removeHandler(handler)


def attempt_spans(spans: InMemorySpanExporter, job_id: str, count: int) -> list[ReadableSpan]:
    """The job's attempt spans once `count` have ended, by attempt."""

    def ended() -> list[ReadableSpan] | None:
        found = [
            span
            for span in spans.get_finished_spans()
            if span.attributes and span.attributes.get("mealquest.job.id") == job_id
        ]
        return found if len(found) >= count else None

    found = wait_for(ended)
    return sorted(found, key=lambda span: span.attributes["mealquest.job.attempt"])  # type: ignore[index]


def request_span(spans: InMemorySpanExporter, method: str, route: str) -> ReadableSpan:
    found = [
        span
        for span in spans.get_finished_spans()
        if span.kind is SpanKind.SERVER and span.name == f"{method} {route}"
    ]
    assert len(found) == 1, [span.name for span in spans.get_finished_spans()]
    return found[0]


def test_an_import_is_one_trace_from_its_post_through_a_retried_attempt(
    start,  # noqa: F811 - the fixture imported above
    pages,  # noqa: F811
    auth,
    household,
    spans,
    json_lines,
    store,
):
    app = start(TRACING=True, DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    client = app.test_client()
    pages.add("/flaky", Reply(status=503, body=b"busy"), Reply(body=recipe_page()))

    job_id = import_url(client, auth, pages.url("/flaky"))
    assert finished(client, auth, job_id)["status"] == "succeeded"

    post = request_span(spans, "POST", "/api/v1/recipe-imports")
    first, second = attempt_spans(spans, job_id, 2)
    for attempt, span in enumerate((first, second), start=1):
        assert span.name == "recipe_import"
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == post.context.trace_id
        assert span.parent is not None
        assert span.parent.span_id == post.context.span_id
        assert [link.context.span_id for link in span.links] == [post.context.span_id]
        assert span.attributes == {
            "mealquest.job.id": job_id,
            "mealquest.job.kind": "recipe_import",
            "mealquest.job.attempt": attempt,
            "mealquest.household.id": household.household_id,
            "mealquest.job.outcome": "retried" if attempt == 1 else "succeeded",
        }
    assert first.status.status_code is StatusCode.ERROR
    assert second.status.status_code is StatusCode.UNSET
    assert first.end_time is not None
    assert second.start_time is not None
    assert first.end_time <= second.start_time

    # Every line the attempts logged names the trace, in JSON as in text.
    trace_id = format(post.context.trace_id, "032x")
    lines = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    of_the_job = [line for line in lines if line.get("job_id") == job_id]
    assert {"job re-queued for attempt 2", "job succeeded"} <= {x["message"] for x in of_the_job}
    assert {line.get("trace_id") for line in of_the_job} == {trace_id}

    # Operators find the trace from the job: `flask jobs show` and its page.
    shown = json.loads(app.test_cli_runner().invoke(args=["jobs", "show", job_id]).output)
    assert shown["trace_id"] == trace_id
    client_of_operator, _ = signed_in(app, create_operator(store, "Ada").token)
    page = client_of_operator.get(f"/admin/jobs/{job_id}").get_data(as_text=True)
    assert f"Trace: <code>{trace_id}</code>" in page

    # A long poll's and a stream's requests are spans too.
    assert client.get(f"/api/v1/jobs/{job_id}?wait=1", headers=auth).status_code == 200
    stream = client.get(f"/api/v1/jobs/{job_id}/events", headers=auth)
    assert "event: end" in stream.get_data(as_text=True)
    served = {span.name for span in spans.get_finished_spans() if span.kind is SpanKind.SERVER}
    assert {"GET /api/v1/jobs/<job_id>", "GET /api/v1/jobs/<job_id>/events"} <= served


def test_follow_ups_and_a_batchs_members_continue_the_trace(
    app_with_pool, household, spans, tmp_path
):
    app = app_with_pool
    jobs = get_jobs(app)
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("enqueuing") as enqueuing:
        parent_id = jobs.enqueue(
            "enqueue_follow_ups", {"values": [5]}, household_id=household.household_id
        )
        hid = household.household_id
        batch = jobs.enqueue_batch(
            [JobRequest("succeed", {"value": 1}, hid), JobRequest("succeed", {"value": 2}, hid)],
            on_complete=JobRequest("batch_report", {"log": str(tmp_path / "runs")}, hid),
        )
    trace_id = enqueuing.get_span_context().trace_id

    (parent,) = attempt_spans(spans, parent_id, 1)
    assert parent.context.trace_id == trace_id
    follow_up = wait_for(
        lambda: [
            span
            for span in spans.get_finished_spans()
            if span.parent is not None and span.parent.span_id == parent.context.span_id
        ]
    )
    assert [span.name for span in follow_up] == ["succeed"]
    assert follow_up[0].context.trace_id == trace_id

    members = [*batch.job_ids, batch.callback_job_id]
    for job_id in members:
        (span,) = attempt_spans(spans, job_id, 1)
        assert span.context.trace_id == trace_id
        assert span.parent is not None
        assert span.parent.span_id == enqueuing.get_span_context().span_id


@pytest.fixture
def app_with_pool(make_app: Callable[..., Flask]) -> Flask:
    app = make_app(TRACING=True)
    get_jobs(app).start_pool()
    return app


def test_with_tracing_off_nothing_is_stored_and_no_attempt_is_a_span(
    start,  # noqa: F811 - the fixture imported above
    pages,  # noqa: F811
    auth,
    spans,
    json_lines,
):
    app = start()
    assert app.config["TRACING"] is False
    client = app.test_client()
    pages.page("/soup", recipe_page())

    job_id = import_url(client, auth, pages.url("/soup"))
    assert finished(client, auth, job_id)["status"] == "succeeded"

    store = get_store(app)
    assert store.read(store.jobs.traceparents, [job_id]) == {}
    assert not spans.get_finished_spans()
    lines = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    assert lines
    assert not [line for line in lines if "trace_id" in line]


def test_an_attempt_whose_enqueuer_was_not_traced_is_a_trace_of_its_own(
    app_with_pool, household, spans
):
    jobs = get_jobs(app_with_pool)
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    store = get_store(app_with_pool)
    assert store.read(store.jobs.traceparents, [job_id]) == {}
    (span,) = attempt_spans(spans, job_id, 1)
    assert span.parent is None
    assert not span.links
    assert span.attributes is not None
    assert span.attributes["mealquest.job.outcome"] == "succeeded"


CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def post_with_traceparent(app: Flask, flags: str) -> str:
    """An import posted with the client's own `traceparent`; its job's id."""
    token = create_household(get_store(app), "The Tracers").token
    answer = app.test_client().post(
        "/api/v1/recipe-imports",
        json={"url": "https://recipes.example/soup"},
        headers={
            "Authorization": f"Bearer {token}",
            "traceparent": f"00-{CLIENT_TRACE}-b7ad6b7169203331-{flags}",
        },
    )
    assert answer.status_code == 202, answer.get_json()
    return answer.get_json()["id"]


def stored_trace_id(app: Flask, job_id: str) -> str | None:
    store = get_store(app)
    stored = store.read(store.jobs.traceparents, [job_id])
    return tracing.trace_id_of(stored[job_id]) if job_id in stored else None


def test_a_clients_traceparent_is_linked_not_continued(make_app, spans):
    app = make_app(TRACING=True)
    job_id = post_with_traceparent(app, "01")

    post = request_span(spans, "POST", "/api/v1/recipe-imports")
    own = format(post.context.trace_id, "032x")
    assert own != CLIENT_TRACE
    assert post.parent is None
    assert [format(link.context.trace_id, "032x") for link in post.links] == [CLIENT_TRACE]
    # The job is in the service's trace, not the client's.
    assert stored_trace_id(app, job_id) == own


def test_a_clients_sampled_flag_does_not_decide_what_is_traced(make_app, spans):
    # The client says "not sampled"; the operator's sampler (always, here) decides.
    app = make_app(TRACING=True)
    job_id = post_with_traceparent(app, "00")
    post = request_span(spans, "POST", "/api/v1/recipe-imports")
    assert stored_trace_id(app, job_id) == format(post.context.trace_id, "032x")


def test_a_trusted_traceparent_is_continued(make_app, spans):
    app = make_app(TRACING=True, TRACING_TRUST_INCOMING=True)
    job_id = post_with_traceparent(app, "01")
    post = request_span(spans, "POST", "/api/v1/recipe-imports")
    assert format(post.context.trace_id, "032x") == CLIENT_TRACE
    assert stored_trace_id(app, job_id) == CLIENT_TRACE
