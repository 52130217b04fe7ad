"""Cron schedules in UTC, read by cronsim (a maintained parser that follows
Debian's cron), never by a parser of our own.

Times are whole minutes. A schedule answers the two questions the scheduler
asks: the latest time at or before a moment (the slot that may be due now)
and the first time after it (when to wake next).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

_MINUTE = timedelta(minutes=1)


class CronSchedule:
    """A five-field cron expression (`minute hour day month weekday`), in UTC."""

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError("a cron schedule is a five-field cron expression")
        self.expression = expression
        try:
            CronSim(expression, datetime.now(UTC))
        except CronSimError as error:
            raise ValueError(str(error)) from None

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The latest scheduled time at or before `moment` (None: none in 50 years)."""
        # cronsim steps back from a start it excludes: start past the minute.
        start = _minute(moment) + _MINUTE
        return next(CronSim(self.expression, start, reverse=True), None)

    def next_after(self, moment: datetime) -> datetime | None:
        """The first scheduled time after `moment` (None: none in 50 years)."""
        return next(CronSim(self.expression, _minute(moment)), None)


def _minute(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)
