"""The options every enqueue takes, in one place.

An option of an enqueue (when the job is due, its priority, its idempotency
key, what it waits for) is declared here once, and every enqueue path takes
it by `**options: Unpack[EnqueueOptions]`: `JobService.enqueue` and
`insert`, `mealquest.jobs.enqueue`, `enqueueing.prepare`, and a handler's
`ctx.enqueue` (which takes `FollowUpOptions`); `JobRequest`, a bulk
enqueue's item, has the same fields. A module of no imports of the project,
so the handler's context can name it without importing the enqueue itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypedDict


class FollowUpOptions(TypedDict, total=False):
    """When and how a job runs, as every enqueue takes it (a handler's
    follow-up, `ctx.enqueue`, takes these and no more: see `EnqueueOptions`).

    `run_at` (a timezone-aware datetime) or `delay` (seconds from the
    database's now) make it due later; claims take due jobs by `priority`,
    lower first (default 0); `unique_key` makes the enqueue idempotent per
    household for 24 hours (`JobService.insert`)."""

    run_at: datetime | None
    delay: float | None
    priority: int
    unique_key: str | None


class EnqueueOptions(FollowUpOptions, total=False):
    """The options of every enqueue outside a handler (`JobService.enqueue`
    and `insert`, `mealquest.jobs.enqueue`, `prepare`, and each `JobRequest`'s
    fields): `FollowUpOptions`, and the household's jobs this one waits for
    (`depends_on`: it runs once they all succeeded, and is cancelled if one
    did not). One type, so an option is added in one place."""

    depends_on: Sequence[str]
