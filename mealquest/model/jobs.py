"""What a job is: its states, the messages the runner stores, the row as read,
and the values the drivers' job statements take."""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any


class Status(enum.StrEnum):
    QUEUED = "queued"
    """Waiting to run. The pool's claim moves it to running."""
    RUNNING = "running"
    """Held under a lease by one worker. That worker moves it to succeeded or
    failed, or back to queued for a retry; the rescuer or a stopping pool moves
    it to queued or failed (the kind's `on_interrupt`) when the lease is lost
    or the pool stops. Once a cancel was requested, each of them moves it to
    cancelled instead of queued (and the worker instead of failed, when the
    cancel reached it first)."""
    SUCCEEDED = "succeeded"
    """Final."""
    FAILED = "failed"
    """Final."""
    CANCELLED = "cancelled"
    """Final: a cancel moves a queued job here at once, and a running one
    through the worker that runs it (see `RUNNING`)."""


FINAL_STATUSES = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

# How lower and higher priorities run: lower first, as in Oban and River.
DEFAULT_PRIORITY = 0
MIN_PRIORITY = -32768
MAX_PRIORITY = 32767


class OnInterrupt(enum.StrEnum):
    """What an interruption (a stop that cut the job short, or its process's
    death) does to a job; stored on the row so any process's rescuer applies it."""

    REQUEUE = "requeue"
    """Back to the queue with the attempt refunded; failed at the
    `MAX_INTERRUPTIONS`-th interruption in a row."""
    FAIL = "fail"
    """Failed `interrupted by restart` at once: the job runs at most once."""


# Interruptions in a row after which a `requeue` job fails: a job that kills
# its process (a poison pill) stops coming back.
MAX_INTERRUPTIONS = 3
# The largest result, partial or final, a job may store (as JSON): every poll
# of the job reads and answers it, and a list answers a page of them.
MAX_RESULT_BYTES = 256 * 1024

# Errors the runner stores itself; each is safe to show the household.
MESSAGE_INTERNAL = "internal error"
MESSAGE_INTERRUPTED = "interrupted by restart"
MESSAGE_TIMED_OUT = "timed out"
MESSAGE_SNOOZED_TOO_OFTEN = "snoozed too often"
# The error of a job cancelled because a job it depends on failed or was cancelled.
MESSAGE_DEPENDENCY_FAILED = "a job it depends on did not succeed"

# The longest a job can be put off, by a delay or a snooze (100 years): a due
# time far past it overflows a date.
MAX_DELAY_SECONDS = 100 * 365 * 24 * 60 * 60
# Where a job that waits for the jobs it depends on is due: past any delay
# (`MAX_DELAY_SECONDS` ends about 7,900 years before), so no claim takes it
# and no household's head of queue is it while a due job waits. The
# unblocker makes it due (now) once every job it depends on is final.
WAITING_RUN_AT = datetime(9999, 1, 1, tzinfo=UTC)


def message_no_handler(kind: str) -> str:
    return f"no handler for job kind {kind}"


class Failure(Exception):
    """A handler's failure whose message is safe to show the household.

    It is stored as the job's error (a NUL or lone surrogate as U+FFFD,
    see `mealquest.storable`; past 2,000 characters, cut) and never
    retried: raise it for what another
    attempt cannot fix. Every other exception is stored as
    `internal error` (its text is only logged) and retried while attempts last.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Snooze(Exception):
    """A handler putting its job off: queued again, due in `seconds`, without
    spending an attempt (as River's `JobSnooze` and Oban's `{:snooze, s}`).

    For what is not a failure but cannot be done now: a server that said
    when to come back, a resource another job holds. Each snooze counts on
    the job (`snoozes`); one past `MEALQUEST_JOB_MAX_SNOOZES` fails it
    `snoozed too often`, so a handler that always snoozes still ends. A
    cancel requested meanwhile wins: the job ends cancelled.
    """

    def __init__(self, seconds: float) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_DELAY_SECONDS
        ):
            raise ValueError(f"Snooze takes a number of seconds from 0 to {MAX_DELAY_SECONDS:,}")
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = float(seconds)


class Attempt(enum.Enum):
    """Whether the attempt that ends counts against the job's `max_attempts`."""

    SPEND = "spend"
    """It counts: the job ran and ended (a retry resets the interruptions in a row)."""
    REFUND = "refund"
    """It does not: the job never ran, or storage, not the job, failed."""


@dataclass(frozen=True)
class LogLine:
    """One line a job's handler logged (`ctx.log`), kept with its attempt."""

    attempt: int
    line: int
    level: str
    message: str
    logged_at: str


@dataclass(frozen=True)
class Recovered:
    """Jobs taken back from a worker that no longer runs them."""

    requeued: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    # Jobs whose cancel was requested: interrupted, they end cancelled.
    cancelled: tuple[str, ...] = ()

    def __add__(self, other: Recovered) -> Recovered:
        return Recovered(
            self.requeued + other.requeued,
            self.failed + other.failed,
            self.cancelled + other.cancelled,
        )


@dataclass(frozen=True)
class Lease:
    """What fences a running job's writes: the claim's token and the attempt."""

    job_id: str
    owner: str
    attempt: int


@dataclass(frozen=True)
class HeldLease:
    """A running job's lease as the database holds it now: `expires_at` (as
    stored, fixed-width UTC text) changes at every renewal, so a rescuer that
    reads the same value again knows nobody renewed the lease in between."""

    lease: Lease
    expires_at: str


@dataclass(frozen=True)
class Transition:
    """One running job's move out of `running`, fenced on its lease: what
    `transition` takes, as a value, so a batch of them can be one statement."""

    lease: Lease
    to: Status
    attempt: Attempt = Attempt.SPEND
    result: str | None = None
    error: str | None = None
    delay_seconds: float | None = None
    # A snooze: back to the queue, the attempt refunded, the job's `snoozes`
    # counted (and its interruptions in a row ended: the attempt ended).
    snoozed: bool = False


# Where a running job may go through its own worker's fenced write.
_LEAVING_RUNNING = frozenset((Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.QUEUED))


def check_transition(to: Status, attempt: Attempt, snoozed: bool = False) -> None:
    """ValueError unless a running job may move to `to` spending or refunding
    its attempt (a refunded attempt only goes back to the queue, and a
    snooze is such a refund)."""
    if to not in _LEAVING_RUNNING or (attempt is Attempt.REFUND and to is not Status.QUEUED):
        raise ValueError(f"no transition from running to {to} with {attempt}")
    if snoozed and attempt is not Attempt.REFUND:
        raise ValueError("a snooze refunds its attempt")


@dataclass(frozen=True)
class Job:
    """A job row as the runner and the API read it."""

    id: str
    seq: int
    household_id: int
    kind: str
    payload: str
    status: Status
    result: Any
    error: str | None
    attempt: int
    max_attempts: int
    run_at: str
    lease_owner: str | None
    lease_expires_at: str | None
    created_at: str
    updated_at: str
    started_at: str | None
    finished_at: str | None
    on_interrupt: OnInterrupt
    interruptions: int
    priority: int = DEFAULT_PRIORITY
    unique_key: str | None = None
    # When a cancel reached the job while it ran (it then ends cancelled).
    cancel_requested_at: str | None = None
    # How many times its handler snoozed it (`Snooze`).
    snoozes: int = 0
    # The partition of its payload its kind's limits count it in (None: none).
    partition_key: str | None = None
    # One more at every write that changes what the household sees of the job
    # (the `ETag` of its object, the id of its stream's events).
    version: int = 1
    # The signal a queued job waits for from its household (`ctx.wait_for`);
    # None when it waits for nothing of theirs.
    waiting_signal: str | None = None
    # Set when the stored result is not JSON (a legacy or hand-edited row):
    # the result reads as None, and the runner fails such a job alone.
    result_undecodable: bool = False

    @property
    def lease(self) -> Lease:
        """What fences the writes of the claim that made this job running."""
        if self.lease_owner is None:
            raise ValueError("a job that is not running has no lease")
        return Lease(self.id, self.lease_owner, self.attempt)

    @classmethod
    def from_row(cls, row: Any) -> Job:
        """The row as read; never raises on a stored result that is not JSON,
        so one bad row cannot fail a whole claim or listing.

        Every claim converts the rows it takes, and the job route one row a
        request, so this is on the hot paths: the row's values become the
        job's attributes at once, since the frozen dataclass's `__init__`
        sets its 23 fields one `object.__setattr__` at a time (measured: 20
        us a row that way, about 9 this way). The columns are checked instead: a
        row must hold every field without a default and no other.
        """
        # By position: a `sqlite3.Row` looks a name up by comparing it with
        # each column's, so `dict(row)` of a wide row costs twice as much.
        values = dict(row) if isinstance(row, dict) else dict(zip(row.keys(), row, strict=True))
        if not _JOB_COLUMNS_REQUIRED <= values.keys() <= _JOB_FIELDS.keys():
            raise TypeError(f"not a job row: columns {sorted(values)}")
        # By a dict first: calling an enum is ten times the look-up.
        status, on_interrupt = values["status"], values["on_interrupt"]
        values["status"] = _STATUSES.get(status) or Status(status)
        values["on_interrupt"] = _ON_INTERRUPT.get(on_interrupt) or OnInterrupt(on_interrupt)
        stored = values["result"]
        values["result"] = None
        if stored is not None:
            try:
                values["result"] = json.loads(stored)
            except (TypeError, ValueError):
                values["result_undecodable"] = True
        job = object.__new__(cls)
        # Every field, as `__init__` would set them: the defaults, then the row.
        job.__dict__.update(_JOB_FIELDS)
        job.__dict__.update(values)
        return job


# The enums' members by their stored values.
_STATUSES = {member.value: member for member in Status}
_ON_INTERRUPT = {member.value: member for member in OnInterrupt}
# Each field's default (None where it has none: the row must hold those).
_JOB_FIELDS = {
    field.name: None if field.default is MISSING else field.default for field in fields(Job)
}
_JOB_COLUMNS_REQUIRED = frozenset(field.name for field in fields(Job) if field.default is MISSING)


@dataclass(frozen=True)
class NewJob:
    """A validated job, ready to be inserted (nothing about it can fail validation any more).

    Due at `run_at`, `delay_seconds` from the database's now, or now.
    """

    job_id: str
    household_id: int
    kind: str
    payload: str
    max_attempts: int
    on_interrupt: OnInterrupt
    priority: int = DEFAULT_PRIORITY
    run_at: datetime | None = None
    delay_seconds: float | None = None
    unique_key: str | None = None
    partition_key: str | None = None
    # The jobs (of its household) it waits for; it is stored due at
    # `WAITING_RUN_AT` while it does.
    depends_on: tuple[str, ...] = ()
    # Whether it runs only if they all succeed (else it is cancelled), or
    # once they are final whatever their outcomes (a batch's callback).
    needs_success: bool = True
    # The W3C traceparent of the span it was enqueued under (tracing on).
    traceparent: str | None = None
    # What its `unique_key` stands for when that is more than this job: a
    # batch's key is held by its first member, for the whole batch's request.
    request_digest: str | None = None

    @property
    def due_now(self) -> bool:
        return self.run_at is None and not self.delay_seconds

    @property
    def unique_digest(self) -> str | None:
        """What tells a repeat of the request from another request reusing the key:
        the kind and the canonical payload (so `{"a":1}` and `{ "a": 1 }` are
        the same request)."""
        if self.unique_key is None:
            return None
        if self.request_digest is not None:
            return self.request_digest
        return hashlib.sha256(f"{self.kind}\n{self.payload}".encode()).hexdigest()


@dataclass(frozen=True)
class Rate:
    """At most `count` starts in any `per_seconds` (a sliding window)."""

    count: int
    per_seconds: float


@dataclass(frozen=True)
class PartitionLimits:
    """What one partition of a kind may do: run at most `max_running` jobs at
    once, start at most `rate` (None: no such limit)."""

    max_running: int | None = None
    rate: Rate | None = None


@dataclass(frozen=True)
class PausedKind:
    """A kind no claim takes: since when, and the operator who paused it (None: the CLI)."""

    kind: str
    paused_at: str
    operator_id: int | None = None


@dataclass(frozen=True)
class PartitionState:
    """One partition of a kind now: its running jobs, and until when its rate
    leaves it out (None: it does not)."""

    running: int
    blocked_until: str | None = None


@dataclass(frozen=True)
class ClaimRequest:
    """What one claim takes: up to `limit` due jobs of `kinds`, each leased to
    `owner` for `lease_seconds`.

    `owner` is the claim's own fencing token (a boot id and a claim number),
    so that no two claims share one. `kind_limits` caps how many of a kind
    this claim takes (the process's room for it); `kind_caps` how many of a
    kind may run at once in the whole deployment. `now` stands in for the
    database's clock (tests that claim in the future).
    """

    owner: str
    lease_seconds: float
    limit: int
    kinds: tuple[str, ...]
    kind_limits: Mapping[str, int] = field(default_factory=dict)
    kind_caps: Mapping[str, int] = field(default_factory=dict)
    partitions: Mapping[str, PartitionLimits] = field(default_factory=dict)
    now: datetime | None = None
