"""What makes a batch: every rule a batch's request must keep, in one place.

A batch is one household's jobs (1 to `MAX_BATCH_JOBS`), with no idempotency
key and no `depends_on` of their own (the batch is what they are enqueued
as), and an optional callback of the same household that depends on every
member and runs whatever their outcomes. A key for the whole batch is held
by its first member, with a digest of the whole request, so that a repeat is
told from another request with the same key.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marshmallow import ValidationError

from mealquest.jobs import enqueueing
from mealquest.jobs.enqueueing import JobRequest
from mealquest.jobs.registry import Registry
from mealquest.model.batches import MAX_BATCH_JOBS, NewBatch
from mealquest.model.jobs import NewJob


@dataclass(frozen=True)
class PreparedBatch:
    """A batch's rows, checked and ready to insert: its members, then its callback."""

    batch: NewBatch
    members: list[NewJob]
    callback: NewJob | None

    @property
    def jobs(self) -> list[NewJob]:
        return [*self.members, *([self.callback] if self.callback else [])]


def prepare_batch(
    registry: Registry,
    requests: Sequence[JobRequest],
    on_complete: JobRequest | None,
    unique_key: str | None,
) -> PreparedBatch:
    """Check a batch's request whole and make its rows; ValidationError,
    naming each bad member by its index (`on_complete` for the callback),
    and nothing made otherwise."""
    if not 1 <= len(requests) <= MAX_BATCH_JOBS:
        raise ValidationError({"jobs": [f"a batch holds 1 to {MAX_BATCH_JOBS:,} jobs"]})
    household_id = requests[0].household_id
    errors = _member_errors(requests, household_id)
    if on_complete is not None and on_complete.household_id != household_id:
        errors["on_complete"] = {"household_id": ["a batch's jobs are one household's"]}
    if errors:
        raise ValidationError(errors)
    members = enqueueing.prepare_all(registry, requests)
    callback = None if on_complete is None else _callback(registry, on_complete, members)
    if unique_key is not None:
        members[0] = dataclasses.replace(
            members[0],
            unique_key=enqueueing.check_unique_key(unique_key),
            request_digest=batch_digest([*members, *([callback] if callback else [])]),
        )
    batch = NewBatch(
        enqueueing.new_job_id(),
        household_id,
        tuple(job.job_id for job in members),
        None if callback is None else callback.job_id,
    )
    return PreparedBatch(batch, members, callback)


def _member_errors(requests: Sequence[JobRequest], household_id: int) -> dict[int | str, Any]:
    errors: dict[int | str, Any] = {}
    for index, request in enumerate(requests):
        if request.household_id != household_id:
            errors[index] = {"household_id": ["a batch's jobs are one household's"]}
        elif request.depends_on:
            errors[index] = {"depends_on": ["a batch's jobs depend on nothing"]}
        elif request.unique_key is not None:
            errors[index] = {"unique_key": ["a batch's jobs take no idempotency key"]}
    return errors


def _callback(registry: Registry, on_complete: JobRequest, members: list[NewJob]) -> NewJob:
    """The callback's row: it depends on every member, and runs whatever
    their outcomes (`needs_success` False)."""
    try:
        callback = enqueueing.prepare_all(
            registry,
            [dataclasses.replace(on_complete, depends_on=[job.job_id for job in members])],
        )[0]
    except ValidationError as error:
        raise ValidationError({"on_complete": error.normalized_messages().get(0, {})}) from None
    return dataclasses.replace(callback, needs_success=False)


def batch_digest(jobs: Sequence[NewJob]) -> str:
    """What tells a repeat of a batch's request from another: its jobs' kinds
    and canonical payloads, in order."""
    request = "\n".join(f"{job.kind}\n{job.payload}" for job in jobs)
    return hashlib.sha256(f"batch\n{request}".encode()).hexdigest()
