"""A job's story, as its dashboard page tells it: when it was enqueued, each
attempt with the lines its handler logged and how it ended, and how the job
ended; and the batch it belongs to.

An operator opens a job's page to learn what happened to it, and a dump of
the row's columns does not say. The attempts are told by their log lines:
the handler's own (`ctx.log`), and the line the runner adds when an attempt
did not succeed (failed, retried, snoozed, cancelled, put back). The row
tells the rest: its creation, its last attempt's start, its end and error.
Every text is masked, as everything on the dashboard is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mealquest.db.driver import Reads, Store
from mealquest.masking import mask
from mealquest.model.jobs import FINAL_STATUSES, Job, LogLine


@dataclass(frozen=True)
class Line:
    """A line of an attempt: when, how loud, what."""

    logged_at: str
    level: str
    message: str


@dataclass
class Attempt:
    """One attempt: its number, the lines it logged, and its start when known
    (the row keeps only the last attempt's)."""

    number: int
    started_at: str | None = None
    lines: list[Line] = field(default_factory=list)


@dataclass(frozen=True)
class Story:
    enqueued_at: str
    attempts: list[Attempt]
    # How the job ended (None while it has not): its status, when, and the
    # error the household reads.
    ended: tuple[str, str | None, str | None] | None
    interruptions: int
    # The batch the job is a member of, and the one whose callback it is.
    member_of: str | None
    callback_of: str | None


def story(store: Store, job: Job, log: list[LogLine]) -> Story:
    attempts = {number: Attempt(number) for number in range(1, job.attempt + 1)}
    for line in log:
        attempts.setdefault(line.attempt, Attempt(line.attempt)).lines.append(
            Line(line.logged_at, line.level, mask(line.message))
        )
    if job.attempt in attempts:
        attempts[job.attempt].started_at = job.started_at
    ended = None
    if job.status in FINAL_STATUSES:
        error = mask(job.error) if job.error else None
        ended = (str(job.status), job.finished_at, error)

    def batches(conn: Reads) -> tuple[str | None, str | None]:
        outcome = store.batches.batch_outcome(conn, job.id)
        member = store.batches.batch_of_member(conn, job.id)
        return member, outcome.batch_id if outcome is not None else None

    member_of, callback_of = store.read(batches)
    return Story(
        enqueued_at=job.created_at,
        attempts=[attempts[number] for number in sorted(attempts)],
        ended=ended,
        interruptions=job.interruptions,
        member_of=member_of,
        callback_of=callback_of,
    )
