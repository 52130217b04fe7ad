"""A batch as households see it (`GET /api/v1/batches/{id}`)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from mealquest.jobs.web.schemas import JOB_ID_PATTERN, moment_field
from mealquest.model.batches import Batch, BatchStatus
from mealquest.model.jobs import Status

BATCH_ID_PATTERN = JOB_ID_PATTERN


class BatchPathSchema(Schema):
    """The batch id in a path: anything else is the same 404 as an unknown batch."""

    batch_id = fields.String(
        required=True,
        validate=validate.Regexp(BATCH_ID_PATTERN),
        metadata={"description": "the batch's id (32 lowercase hex digits)"},
    )


def _count(description: str) -> fields.Integer:
    return fields.Integer(required=True, strict=True, metadata={"description": description})


class BatchSchema(Schema):
    id = fields.String(required=True)
    status = fields.Enum(
        BatchStatus,
        by_value=True,
        required=True,
        metadata={
            "description": (
                "queued: no job started; running; finished: every job is final, "
                "and so is the callback"
            )
        },
    )
    total = _count("the jobs the batch was made with")
    queued = _count("its jobs queued (a job waiting for another counts here)")
    running = _count("its jobs running")
    succeeded = _count("its jobs that succeeded")
    failed = _count("its jobs that failed")
    cancelled = _count("its jobs cancelled")
    jobs = fields.List(
        fields.String(), required=True, metadata={"description": "its jobs' ids, in order"}
    )
    callback_job_id = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "the job that runs once every job is final (a shopping list)"},
    )
    version = fields.Integer(
        required=True,
        strict=True,
        metadata={"description": "grows with every change to its jobs: its ETag, its events' id"},
    )
    created_at = moment_field("when it was made", nullable=False)
    finished_at = moment_field("when it finished (null until then)")


def dump_batch(batch: Batch) -> dict[str, Any]:
    """The batch's object, as `BatchSchema` describes it."""
    counts = {status: batch.count(status) for status in Status}
    return {
        "id": batch.id,
        "status": str(batch.status),
        "total": batch.total,
        "queued": counts[Status.QUEUED],
        "running": counts[Status.RUNNING],
        "succeeded": counts[Status.SUCCEEDED],
        "failed": counts[Status.FAILED],
        "cancelled": counts[Status.CANCELLED],
        "jobs": [member.job_id for member in batch.members],
        "callback_job_id": batch.callback_job_id,
        "version": batch.version,
        "created_at": batch.created_at,
        "finished_at": batch.finished_at,
    }
