"""The service's log lines: one handler on the `mealquest` logger, to stderr, set up once.

Job lines carry `extra={"job_id", "kind", "attempt"}`; the formatter appends
whichever of those a record has, so they can be searched for. A line written
while a request is served also names its request id (the `X-Request-ID` the
response carries).

Two formats (`MEALQUEST_LOG_FORMAT`): `text`, one readable line per record,
and `json`, one JSON object per line for a log pipeline. Both show the same
message, masked by the function that masks the lines handlers keep
(`mealquest.masking.mask_text`: URLs' secrets, tokens, `Bearer …`,
`password=…`), tracebacks included; `json.dumps` escapes every character
that could end the line.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from gevent import monkey
from opentelemetry import trace

from mealquest.masking import mask_text

_CONTEXT_KEYS = ("job_id", "kind", "attempt", "claim", "household_id", "count", "trace_id")
_HANDLER_NAME = "mealquest-stderr"
FORMATS = ("text", "json")
# Most records are a constant text (`logger.info("job succeeded")`, no
# arguments): its masked form is kept, not worked out again for each of a
# drain's thousands of lines. Bounded: a caller that logs texts it built
# itself only turns this cache over.
_CONSTANT_TEXTS_KEPT = 1024
_masked_constant = functools.lru_cache(maxsize=_CONSTANT_TEXTS_KEPT)(mask_text)


def _masked_message(record: logging.LogRecord) -> str:
    """The record's message, masked."""
    if not record.args and type(record.msg) is str:
        return _masked_constant(record.msg)
    return mask_text(record.getMessage())


def _trace_id(record: logging.LogRecord) -> str | None:
    """The trace the record was made in (tracing on), unless it names one itself."""
    if hasattr(record, "trace_id"):
        return None
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def _request_id() -> str | None:
    """The request id of the request this record was made in, if any."""
    # Looked up, not imported: a process without Flask (a parser process)
    # has no request, and the import statement's lookup on every record was
    # a measurable part of a job's log line.
    flask = sys.modules.get("flask")
    if flask is None or not flask.has_request_context():
        return None
    request_id: str | None = flask.g.get("request_id")
    return request_id


class _SecondsCache:
    """A record time's whole-second part as `time.strftime` writes it, kept
    for the second it names: a drain logs thousands of lines a second (one
    per job), and a `localtime` and a `strftime` for each were about a fifth
    of the text formatter's time (measured: the formatter went from 5.0 to
    2.8 us a line with this and the context fields read from the record's
    dict)."""

    def __init__(self, fmt: str, convert: Callable[[float | None], time.struct_time]) -> None:
        self._fmt = fmt
        self._convert = convert
        # One tuple, replaced whole: a thread that logs meanwhile reads
        # either the old pair or the new one, never one's second with the
        # other's text.
        self._cached: tuple[int, str] = (-1, "")

    def text(self, created: float) -> str:
        second = int(created)
        cached_second, text = self._cached
        if second != cached_second:
            text = time.strftime(self._fmt, self._convert(second))
            self._cached = (second, text)
        return text


class ContextFormatter(logging.Formatter):
    """The text format: the line `fmt` makes, then the job's and the
    request's fields in brackets (`job_id=... kind=...`)."""

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._seconds = _SecondsCache(self.default_time_format, self.converter)
        self._uses_time = self.usesTime()

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        msec_format = self.default_msec_format
        if datefmt is not None or msec_format is None:
            return super().formatTime(record, datefmt)
        return msec_format % (self._seconds.text(record.created), record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            line = super().format(record)
        else:
            # `logging.Formatter.format` without the parts such a record
            # has no use for: a job's outcome line is one of these.
            record.message = _masked_message(record)
            if self._uses_time:
                record.asctime = self.formatTime(record)
            line = self._style.format(record)
        fields = record.__dict__
        context = [f"{key}={fields[key]}" for key in _CONTEXT_KEYS if key in fields]
        request_id = _request_id()
        if request_id is not None:
            context.append(f"request_id={request_id}")
        trace_id = _trace_id(record)
        if trace_id is not None:
            context.append(f"trace_id={trace_id}")
        return f"{line} [{' '.join(context)}]" if context else line

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _masked_message(record)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return mask_text(super().formatException(ei))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `time` (RFC 3339 UTC), `level`, `logger`,
    `message`, `pid`, and whichever of the job's and the request's fields
    the record has; `exception` with the traceback of a record that has one."""

    def __init__(self) -> None:
        super().__init__()
        self._seconds = _SecondsCache("%Y-%m-%dT%H:%M:%S", time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": f"{self._seconds.text(record.created)}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": _masked_message(record),
            "pid": record.process,
        }
        fields = record.__dict__
        for key in _CONTEXT_KEYS:
            if key in fields:
                entry[key] = fields[key]
        request_id = _request_id()
        if request_id is not None:
            entry["request_id"] = request_id
        trace_id = _trace_id(record)
        if trace_id is not None:
            entry["trace_id"] = trace_id
        if record.exc_info:
            entry["exception"] = mask_text(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class _StderrHandler(logging.StreamHandler):
    """`logging.StreamHandler` whose lock is the thread's own, even under gevent.

    Patched, `threading.RLock` is gevent's, written in Python: a line took
    it twice (to write, to flush), a tenth of a job's log line in a drain.
    Greenlets need no lock here: a line is formatted and written without
    yielding to the hub (the stream is a plain file, not a cooperative
    one), so no other greenlet runs in between. Threads (the SQLite
    writer, the connection pool's workers) are kept apart by this lock as
    by any other.
    """

    def createLock(self) -> None:
        super().createLock()
        self.lock = monkey.get_original("_thread", "RLock")()


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
    # Nor the process's name (the pid is what the formats print): each record
    # would look up multiprocessing's current process (the same HOWTO section).
    logging.logMultiprocessing = False
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
    handler = _StderrHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.propagate = False
