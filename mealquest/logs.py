"""The service's log lines: one handler on the `mealquest` logger, to stderr, set up once.

Job lines carry `extra={"job_id", "kind", "attempt"}`; the formatter appends
whichever of those a record has, so they can be searched for.
"""

from __future__ import annotations

import logging
import sys
import time

_CONTEXT_KEYS = ("job_id", "kind", "attempt", "household_id", "count")
_HANDLER_NAME = "mealquest-stderr"


class ContextFormatter(logging.Formatter):
    """Appends a record's job context, and formats the time of day once a
    second: `time.strftime` per record was a tenth of a log line's cost, and
    the runner writes one line per job."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        # (the second, its text): one tuple, so a reader never sees half of it.
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached, text = self._second
        if cached != second:
            text = time.strftime(self.default_time_format, self.converter(second))
            self._second = (second, text)
        return self.default_msec_format % (text, record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{key}={getattr(record, key)}" for key in _CONTEXT_KEYS if hasattr(record, key)
        )
        return f"{line} [{context}]" if context else line


def configure_logging(level: str) -> None:
    # Fields no format here prints, which every record would otherwise work
    # out (the logging HOWTO's "Optimization" switches). Under gevent the
    # thread's name makes each new greenlet (one per job) build a dummy
    # Thread: measured, 8 % of the hub's time in a drain. The caller's file,
    # line and function walk the stack, and the process's name asks
    # multiprocessing: together a tenth of a log line.
    logging.logThreads = False
    logging.logMultiprocessing = False
    logging._srcfile = None
    logger = logging.getLogger("mealquest")
    logger.setLevel(level.upper())
    if any(handler.get_name() == _HANDLER_NAME for handler in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        ContextFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    )
    logger.addHandler(handler)
    logger.propagate = False
