"""Traces through real gunicorn to a real OTLP receiver on loopback: the
standard `OTEL_EXPORTER_OTLP_ENDPOINT` alone turns tracing on, each worker
sets up its own SDK, and what the exporter sends (OTLP over HTTP, protobuf,
decoded here by the test's own small server) is one trace from the `POST`
that enqueued a job through both of its attempts, the retried one included,
named for the service; and on both databases, as every serving test is."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.servers import Gunicorn, enqueue, final_jobs, serving_env, wait_until

pytestmark = pytest.mark.both_databases

# A request's body is bounded; the exporter's batches are far smaller.
MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    attributes: dict[str, Any]
    service: str


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            _attributes(span.attributes),
                            str(resource.get("service.name")),
                        )
                    )
        with self.lock:
            self.spans.extend(found)


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        if self.path != "/v1/traces" or not 0 < length <= MAX_BODY:
            self.send_error(400)
            return
        if self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(415)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(length))
        self.server.keep(request)
        body = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _attributes(pairs: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        which = pair.value.WhichOneof("value")
        values[pair.key] = getattr(pair.value, which) if which else None
    return values


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.thread.start()
    yield server
    server.shutdown()
    server.server_close()
    server.thread.join(10)


def test_one_trace_from_the_post_through_a_retried_attempt_reaches_the_collector(
    served, receiver, tmp_path, processes
):
    env = serving_env(served.database)
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "mealquest-test",
            # Export within a moment, not the default 5 s.
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    server = Gunicorn(tmp_path / "gunicorn.log", env, workers=2)
    processes.append(server)
    server.wait_ready()

    job_id = enqueue(
        server.url, served.token, "talk", {"lines": 1, "text": "hello", "fail_first": True}
    )
    job = wait_until(lambda: final_jobs(served.store, [job_id]), 60, "the job did not end")[job_id]
    assert (job["status"], job["attempt"]) == ("succeeded", 2)

    def whole_trace() -> tuple[ReceivedSpan, list[ReceivedSpan]] | None:
        spans = receiver.received()
        posts = [span for span in spans if span.name == "POST /api/v1/test-jobs"]
        attempts = [span for span in spans if span.attributes.get("mealquest.job.id") == job_id]
        if len(posts) != 1 or len(attempts) != 2:
            return None
        return posts[0], sorted(attempts, key=lambda span: span.attributes["mealquest.job.attempt"])

    post, attempts = wait_until(whole_trace, 60, "the spans did not reach the collector")
    assert [span.attributes["mealquest.job.outcome"] for span in attempts] == [
        "retried",
        "succeeded",
    ]
    for span in attempts:
        assert span.name == "talk"
        assert span.trace_id == post.trace_id
        assert span.parent_span_id == post.span_id
        assert span.service == "mealquest-test"
    # Probes are not traced.
    assert not [span for span in receiver.received() if span.name.endswith("/healthz")]
    assert "Traceback" not in server.log()
