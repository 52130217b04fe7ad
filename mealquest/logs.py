"""The service's log lines: one handler on the `mealquest` logger, to stderr, set up once.

Job lines carry `extra={"job_id", "kind", "attempt"}`; the formatter appends
whichever of those a record has, so they can be searched for. A line written
while a request is served also names its request id (the `X-Request-ID` the
response carries).

Two formats (`MEALQUEST_LOG_FORMAT`): `text`, one readable line per record,
and `json`, one JSON object per line for a log pipeline. Both show the same
message: what a caller masks before logging (URLs' secrets) is masked in
either, and `json.dumps` escapes every character that could end the line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from opentelemetry import trace

_CONTEXT_KEYS = ("job_id", "kind", "attempt", "household_id", "count", "trace_id")
_HANDLER_NAME = "mealquest-stderr"
FORMATS = ("text", "json")


def _trace_id(record: logging.LogRecord) -> str | None:
    """The trace the record was made in (tracing on), unless it names one itself."""
    if hasattr(record, "trace_id"):
        return None
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def _request_id() -> str | None:
    """The request id of the request this record was made in, if any."""
    # Imported here: a record made outside Flask (a parser process) needs none.
    from flask import g, has_request_context

    if not has_request_context():
        return None
    request_id: str | None = g.get("request_id")
    return request_id


class ContextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [(key, getattr(record, key)) for key in _CONTEXT_KEYS if hasattr(record, key)]
        request_id = _request_id()
        if request_id is not None:
            pairs.append(("request_id", request_id))
        trace_id = _trace_id(record)
        if trace_id is not None:
            pairs.append(("trace_id", trace_id))
        context = " ".join(f"{key}={value}" for key, value in pairs)
        return f"{line} [{context}]" if context else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `time` (RFC 3339 UTC), `level`, `logger`,
    `message`, `pid`, and whichever of the job's and the request's fields
    the record has; `exception` with the traceback of a record that has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key in _CONTEXT_KEYS:
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        request_id = _request_id()
        if request_id is not None:
            entry["request_id"] = request_id
        trace_id = _trace_id(record)
        if trace_id is not None:
            entry["trace_id"] = trace_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _utc(created: float) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{whole}.{int(created % 1 * 1000):03d}Z"


def configure_logging(level: str, log_format: str = "text") -> None:
    # Under gevent every record would ask for the current thread's name, which
    # makes each new greenlet (one per job) build a dummy Thread: measured, 8 %
    # of the hub's time in a drain, for a field no format here prints.
    logging.logThreads = False
    # Nor does any format here print where a record was made: without this,
    # each record walks the stack to find its caller (`findCaller`), which
    # was 16 % of the hub's time in a drain (one line per job's outcome).
    # The documented switch (the logging HOWTO's "Optimization").
    logging._srcfile = None
    logger = logging.getLogger("mealquest")
    logger.setLevel(level.upper())
    formatter: logging.Formatter = (
        JsonFormatter()
        if log_format == "json"
        else ContextFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    )
    for handler in logger.handlers:
        if handler.get_name() == _HANDLER_NAME:
            handler.setFormatter(formatter)
            return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.propagate = False
