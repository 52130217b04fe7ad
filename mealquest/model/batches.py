"""What a batch is: jobs a household enqueued together, watched as one, and
the job (its callback) that runs once every one of them is final."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mealquest.model.jobs import FINAL_STATUSES, Status

# The most jobs one batch holds, and one job may depend on.
MAX_BATCH_JOBS = 1_000


class BatchStatus(enum.StrEnum):
    QUEUED = "queued"
    """No member has started."""
    RUNNING = "running"
    """Some member has started, and a member or the callback is not final."""
    FINISHED = "finished"
    """Every member is final, and so is the callback (if the batch has one)."""


@dataclass(frozen=True)
class NewBatch:
    """A batch to insert with its jobs, in their order."""

    batch_id: str
    household_id: int
    job_ids: tuple[str, ...]
    callback_job_id: str | None = None


@dataclass(frozen=True)
class Batched:
    """What an enqueue of a batch made: the batch, its jobs in order, its callback."""

    batch_id: str
    job_ids: list[str]
    callback_job_id: str | None = None
    # False: a repeat of the request that made it, with the same idempotency key.
    created: bool = True


@dataclass(frozen=True)
class BatchMember:
    """One job of a batch (or its callback) as the batch's reader needs it."""

    job_id: str
    status: Status
    version: int
    started: bool
    finished_at: str | None


@dataclass(frozen=True)
class Batch:
    """A batch as read: its members in their order (a pruned member is gone
    from them, not from `total`) and its callback (None: none, or pruned)."""

    id: str
    household_id: int
    total: int
    created_at: str
    members: tuple[BatchMember, ...]
    callback: BatchMember | None = None
    callback_job_id: str | None = None

    def count(self, status: Status) -> int:
        return sum(1 for member in self.members if member.status is status)

    @property
    def status(self) -> BatchStatus:
        watched = self.members + ((self.callback,) if self.callback else ())
        if all(member.status in FINAL_STATUSES for member in watched):
            return BatchStatus.FINISHED
        if any(member.started for member in watched):
            return BatchStatus.RUNNING
        return BatchStatus.QUEUED

    @property
    def version(self) -> int:
        """Grows with every write to a member or the callback (each one's
        version does), so it is the batch's ETag and its stream's event id."""
        watched = self.members + ((self.callback,) if self.callback else ())
        return sum(member.version for member in watched)

    @property
    def finished_at(self) -> str | None:
        if self.status is not BatchStatus.FINISHED:
            return None
        watched = self.members + ((self.callback,) if self.callback else ())
        return max((m.finished_at for m in watched if m.finished_at), default=self.created_at)


@dataclass(frozen=True)
class BatchOutcome:
    """What a batch's callback is given: its members' ids by outcome."""

    batch_id: str
    succeeded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "batch_id": self.batch_id,
            "succeeded": list(self.succeeded),
            "failed": list(self.failed),
            "cancelled": list(self.cancelled),
        }


@dataclass(frozen=True)
class Unblocked:
    """What the unblocker did: jobs made due, jobs cancelled, and how many
    dependencies it resolved to do so."""

    due: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    resolved: int = 0
    # Another process's pass was under way (PostgreSQL): this one did nothing.
    busy: bool = False
