"""Keep the driver's error texts out of log lines below ERROR.

psycopg_pool logs its failed connects and discarded connections as warnings
that quote the driver's exception ("connection to server at ... failed:
..."), and such texts quote hosts, users and the server's own words. Our
rule is that a dependency's error text appears in no log line below ERROR,
so a filter on psycopg's loggers replaces an exception argument of such a
record by its class name: the line still says what happened.
"""

from __future__ import annotations

import logging

# psycopg's own logger and its pool's: a logger's filters apply only to the
# records made through it, not to those of its children.
LOGGERS = ("psycopg", "psycopg.pool")


class ErrorTextFilter(logging.Filter):
    """Below ERROR, replace exception arguments by their class name."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and isinstance(record.args, tuple):
            record.args = tuple(
                type(arg).__name__ if isinstance(arg, BaseException) else arg for arg in record.args
            )
        return True


def quiet_driver_logs() -> None:
    """Install the filter once per process (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, ErrorTextFilter) for existing in logger.filters):
            logger.addFilter(ErrorTextFilter())
