"""The service's log lines: one handler on the `mealquest` logger, to stderr, set up once.

Job lines carry `extra={"job_id", "kind", "attempt"}`; the formatter appends
whichever of those a record has, so they can be searched for.
"""

from __future__ import annotations

import logging
import sys

_CONTEXT_KEYS = ("job_id", "kind", "attempt", "household_id", "count")
_HANDLER_NAME = "mealquest-stderr"


class ContextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{key}={getattr(record, key)}" for key in _CONTEXT_KEYS if hasattr(record, key)
        )
        return f"{line} [{context}]" if context else line


def configure_logging(level: str) -> None:
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
    if any(handler.get_name() == _HANDLER_NAME for handler in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        ContextFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    )
    logger.addHandler(handler)
    logger.propagate = False
