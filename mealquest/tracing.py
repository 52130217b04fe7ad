"""OpenTelemetry traces: one trace from the request that enqueues a job to each of its attempts.

Off by default. On with `MEALQUEST_TRACING=true`, or when the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set; the SDK
then reads the other standard variables itself (`OTEL_SERVICE_NAME`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, the exporter's headers and timeout).
Spans go out through OTLP over HTTP (protobuf), the protocol OTLP
recommends by default: the gRPC exporter brings grpcio, whose own native
threads a gevent process cannot make cooperative. `OTEL_TRACES_EXPORTER=none`
keeps the spans in the process (for a processor of one's own).

What is traced: every request but `/healthz` and `/metrics` (Flask's
instrumentation; `OTEL_PYTHON_FLASK_EXCLUDED_URLS` to change that), streams
and long polls included; and every attempt of a job, as a span named for
its kind, a child of the span the job was enqueued under. That span's
W3C `traceparent` is stored with the job when it is enqueued
(`job_traces`), so the trace crosses processes and restarts; a job that a
handler enqueues (`ctx.enqueue`) or a batch's members and callback carry
the enqueuing span's, and so continue the trace. With tracing off there is
no current span, so nothing is stored and no attempt reads anything: the
cost is one look at a context variable per enqueue.

A request's own `traceparent` header is not trusted by default
(`MEALQUEST_TRACING_TRUST_INCOMING`): a client would choose the trace id of
its request and of every job it enqueues, and its sampled flag would
override the operator's sampler. The header is taken off the request before
the instrumentation reads it, so the request starts a trace of its own, and
its span links to the client's (a valid one), which a collector can follow.

The SDK is set up once per process, in the process that serves (gunicorn
loads the app in each worker after its fork, never before it: see
`gunicorn.conf.py`), so the batch processor's thread is the worker's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

TRACER_NAME = "mealquest"
# The standard variables that turn export on by themselves.
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Probes and scrapes, every few seconds each: spans nobody follows.
_UNTRACED_URLS = "healthz,metrics"
_PROPAGATOR = TraceContextTextMapPropagator()
# Where an untrusted request's own `traceparent` is kept, for the link.
_CLIENT_TRACEPARENT = "mealquest.client_traceparent"
# Outcomes that end an attempt's span with an error status.
_ERRORS = frozenset({"failed", "retried"})

_installed_in: int | None = None


def wanted(config: Mapping[str, Any]) -> bool:
    """Whether this configuration and environment turn tracing on."""
    return bool(config["TRACING"]) or any(os.environ.get(name) for name in _ENDPOINT_VARIABLES)


def init_app(app: Any) -> None:
    """Trace the app's requests and its pool's attempts, if tracing is wanted
    (`app.config["TRACING"]` says afterwards whether it is)."""
    app.config["TRACING"] = wanted(app.config)
    if not app.config["TRACING"]:
        return
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    install_provider()
    excluded = os.environ.get("OTEL_PYTHON_FLASK_EXCLUDED_URLS", _UNTRACED_URLS)
    if app.config["TRACING_TRUST_INCOMING"]:
        FlaskInstrumentor().instrument_app(app, excluded_urls=excluded)
        return
    FlaskInstrumentor().instrument_app(
        app, excluded_urls=excluded, request_hook=_link_to_the_clients_trace
    )
    # Outermost, so that the header is gone before the instrumentation looks.
    app.wsgi_app = _UntrustedTraceHeaders(app.wsgi_app)


class _UntrustedTraceHeaders:
    """WSGI middleware: moves a request's trace headers aside (see the module)."""

    def __init__(self, wsgi_app: Any) -> None:
        self.wsgi_app = wsgi_app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        header = environ.pop("HTTP_TRACEPARENT", None)
        environ.pop("HTTP_TRACESTATE", None)
        if header is not None:
            environ[_CLIENT_TRACEPARENT] = header
        return self.wsgi_app(environ, start_response)


def _link_to_the_clients_trace(span: Span, environ: Mapping[str, Any]) -> None:
    header = environ.get(_CLIENT_TRACEPARENT)
    if header is None or not span.is_recording():
        return
    client = trace.get_current_span(
        _PROPAGATOR.extract({"traceparent": header}, context=Context())
    ).get_span_context()
    if client.is_valid:
        span.add_link(client, {"mealquest.link": "client traceparent, not trusted"})


def install_provider() -> Any:
    """This process's SDK tracer provider, made (once) with the exporter the
    environment names: OTLP over HTTP unless `OTEL_TRACES_EXPORTER=none`."""
    global _installed_in
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = trace.get_tracer_provider()
    if _installed_in == os.getpid() and isinstance(provider, TracerProvider):
        return provider
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporters = {
        name.strip().lower()
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
        if name.strip()
    }
    if "otlp" in exporters:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    for name in sorted(exporters - {"otlp", "none"}):
        logger.error("OTEL_TRACES_EXPORTER %r is not one this service ships; ignored", name)
    _installed_in = os.getpid()
    return provider


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the span current here, or None when there is none."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def trace_id_of(traceparent: str) -> str | None:
    """The trace id a stored `traceparent` names (32 hex digits), or None."""
    span_context = trace.get_current_span(
        _PROPAGATOR.extract({"traceparent": traceparent}, context=Context())
    ).get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


@contextlib.contextmanager
def attempt_span(
    kind: str, job_id: str, attempt: int, household_id: int, traceparent: str | None
) -> Iterator[Span]:
    """A span for one attempt of a job, current while it runs: a child of
    (and linked to) the span it was enqueued under, or a trace of its own.
    Exceptions are not recorded on it (their text may quote a payload); the
    caller sets the outcome (`end_attempt`)."""
    parent = Context()
    links: list[Link] = []
    if traceparent is not None:
        parent = _PROPAGATOR.extract({"traceparent": traceparent}, context=Context())
        enqueued_under = trace.get_current_span(parent).get_span_context()
        if enqueued_under.is_valid:
            links.append(Link(enqueued_under))
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        kind,
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "mealquest.job.id": job_id,
            "mealquest.job.kind": kind,
            "mealquest.job.attempt": attempt,
            "mealquest.household.id": household_id,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_attempt(span: Span, outcome: str) -> None:
    """Name how the attempt ended on its span (`succeeded`, `failed`, ...)."""
    span.set_attribute("mealquest.job.outcome", outcome)
    if outcome in _ERRORS:
        span.set_status(Status(StatusCode.ERROR, outcome))
