"""What a job is: its states, the messages the runner stores, and the row as read."""

from __future__ import annotations

import enum
import json
import sqlite3
from dataclasses import dataclass
from typing import Any


class Status(enum.StrEnum):
    QUEUED = "queued"
    """Waiting to run. The pool's claim moves it to running."""
    RUNNING = "running"
    """Held under a lease by one worker. That worker moves it to succeeded or
    failed, or back to queued for a retry; the rescuer or a stopping pool moves
    it to queued or failed when the lease is lost or the pool stops."""
    SUCCEEDED = "succeeded"
    """Final."""
    FAILED = "failed"
    """Final."""


FINAL_STATUSES = (Status.SUCCEEDED, Status.FAILED)

# Errors the runner stores itself; each is safe to show the household.
MESSAGE_INTERNAL = "internal error"
MESSAGE_INTERRUPTED = "interrupted by restart"
MESSAGE_TIMED_OUT = "timed out"


def message_no_handler(kind: str) -> str:
    return f"no handler for job kind {kind}"


class Failure(Exception):
    """A handler's failure whose message is safe to show the household.

    It is stored as the job's error and never retried: raise it for what
    another attempt cannot fix. Every other exception is stored as
    `internal error` (its text is only logged) and retried while attempts last.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Job:
        values = dict(row)
        values["status"] = Status(values["status"])
        values["result"] = None if values["result"] is None else json.loads(values["result"])
        return cls(**values)
