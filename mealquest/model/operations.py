"""What the operator's bulk actions take and give, as the drivers see them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mealquest.model.jobs import Status


class BulkAction(enum.StrEnum):
    """An action on every job a filter matches, and the statuses it applies to."""

    RETRY = "retry"
    """A failed or cancelled job queued again, due now, with a fresh attempt budget."""
    CANCEL = "cancel"
    """A queued job cancelled at once; a running one told to stop (it ends cancelled)."""
    DELETE = "delete"
    """Any job but a running one deleted (its recipe, if any, stays)."""

    @property
    def statuses(self) -> tuple[Status, ...]:
        return _STATUSES[self]


_STATUSES = {
    BulkAction.RETRY: (Status.FAILED, Status.CANCELLED),
    BulkAction.CANCEL: (Status.QUEUED, Status.RUNNING),
    BulkAction.DELETE: (Status.QUEUED, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED),
}


@dataclass(frozen=True)
class JobFilter:
    """The jobs list's filter: any of status, kind and household (None: any)."""

    status: Status | None = None
    kind: str | None = None
    household_id: int | None = None


@dataclass(frozen=True)
class ActedJob:
    """A job a bulk batch acted on, and its status after (a deleted one: the status it had)."""

    seq: int
    id: str
    status: Status


@dataclass(frozen=True)
class BulkBatch:
    """One batch of a bulk action: the jobs acted on, how many the batch
    looked at (fewer than asked: none of that status is left), and the
    `seq` the next batch goes on after."""

    acted: list[ActedJob]
    picked: int
    resume_after: int
