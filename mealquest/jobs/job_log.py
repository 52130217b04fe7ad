"""A handler's own log lines (`ctx.log`), kept with its attempt.

Operators follow one job by what its handler said: `ctx.log.info("fetched
%s", url)` keeps the line in the database with the attempt that wrote it,
shown on the dashboard's job page and by `flask jobs show`, never in the
households' API. It is bounded, so a chatty handler cannot fill the table:
at most `MAX_LINES` lines and `MAX_BYTES` of text an attempt, the last of
them saying how many more were not kept. Each line is masked by the function
that masks the service's own log lines (`masking.mask_text`: a URL's query
values, fragment and user info, tokens, `Bearer …`, `password=…`, addresses
without their scheme), and made storable by both databases. The lines are written when the attempt
ends, fenced on its lease: a handler whose job was taken back keeps none.
"""

from __future__ import annotations

from typing import Any

from mealquest.clock import to_text, utc_now
from mealquest.masking import bounded_failure_message, mask_text
from mealquest.model.jobs import LogLine
from mealquest.storable import storable_text

MAX_LINES = 100
MAX_BYTES = 16 * 1024
# Room kept for the line that says how many were not kept.
_NOTE_BYTES = 120


class JobLog:
    """`ctx.log`: `debug`, `info`, `warning` and `error`, each with a message
    and its `%` arguments, as `logging` takes them."""

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self._lines: list[LogLine] = []
        self._bytes = 0
        self._dropped = 0

    def debug(self, message: str, *args: Any) -> None:
        self._keep("DEBUG", message, args)

    def info(self, message: str, *args: Any) -> None:
        self._keep("INFO", message, args)

    def warning(self, message: str, *args: Any) -> None:
        self._keep("WARNING", message, args)

    def error(self, message: str, *args: Any) -> None:
        self._keep("ERROR", message, args)

    def kept(self) -> list[LogLine]:
        """The lines to store, with a last one for those that were not kept."""
        if not self._dropped:
            return list(self._lines)
        note = (
            f"{self._dropped} more line(s) not kept: at most {MAX_LINES} lines and "
            f"{MAX_BYTES // 1024} KiB an attempt"
        )
        return [*self._lines, self._line("WARNING", note)]

    def ending(self, level: str, text: str) -> LogLine:
        """The attempt's last line, saying how it ended: numbered after every
        line kept (and the note of those not), outside their bounds."""
        number = len(self._lines) + (2 if self._dropped else 1)
        return LogLine(
            self.attempt,
            number,
            level,
            mask_text(storable_text(bounded_failure_message(text))),
            to_text(utc_now()),
        )

    def _keep(self, level: str, message: str, args: tuple[Any, ...]) -> None:
        try:
            text = str(message) % args if args else str(message)
        except (TypeError, ValueError):
            # As logging does with a bad format: the line, not a failed job.
            text = f"{message} {args!r}"
        text = mask_text(storable_text(bounded_failure_message(text)))
        size = len(text.encode())
        full = len(self._lines) >= MAX_LINES - 1 or self._bytes + size > MAX_BYTES - _NOTE_BYTES
        if full or self._dropped:
            self._dropped += 1
            return
        self._bytes += size
        self._lines.append(self._line(level, text))

    def _line(self, level: str, text: str) -> LogLine:
        return LogLine(self.attempt, len(self._lines) + 1, level, text, to_text(utc_now()))
