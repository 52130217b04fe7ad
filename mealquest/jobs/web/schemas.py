"""The jobs API's shapes: a job as households see it, and the list's query."""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, INCLUDE, Schema, fields, validate

from mealquest.ascii_numbers import DecimalField
from mealquest.jobs.service.standing import POSITION_COUNTED, WaitingFor
from mealquest.model.jobs import Job, Status
from mealquest.model.signals import NAME_PATTERN as SIGNAL_NAME_PATTERN
from mealquest.pagination import PageQuerySchema

JOB_ID_PATTERN = r"^[0-9a-f]{32}$"


class JobPathSchema(Schema):
    """The job id in a path: anything else is the same 404 as an unknown job."""

    job_id = fields.String(
        required=True,
        validate=validate.Regexp(JOB_ID_PATTERN),
        metadata={"description": "the job's id (32 lowercase hex digits)"},
    )


class SignalPathSchema(JobPathSchema):
    """A job's id and the name of a signal its kind declares."""

    name = fields.String(
        required=True,
        validate=validate.Regexp(SIGNAL_NAME_PATTERN),
        metadata={"description": "the signal's name, as the job's `queue.signal` gives it"},
    )


class SignalBodySchema(Schema):
    """The household's answer: an object, validated by the schema the job's
    kind declares for the signal (a field that does not fit is `400`, named)."""

    class Meta:
        unknown = INCLUDE


def moment_field(description: str, *, nullable: bool = True) -> fields.String:
    """A moment as stored: RFC 3339 UTC text with microseconds (`...T10:00:00.000000Z`)."""
    return fields.String(
        required=True,
        allow_none=nullable,
        metadata={"format": "date-time", "description": f"{description} (RFC 3339, UTC)"},
    )


class QueueSchema(Schema):
    """Where a queued job stands (how exact each figure is: the docs'
    guide "Waiting for a job", docs/guides/waiting.md)."""

    position = fields.Integer(
        required=True,
        validate=validate.Range(min=0, max=POSITION_COUNTED),
        metadata={
            "description": (
                "the due jobs claims take before this one, as of this answer "
                f"({POSITION_COUNTED} means {POSITION_COUNTED} or more)"
            )
        },
    )
    ahead_in_household = fields.Integer(
        required=True,
        validate=validate.Range(min=0, max=POSITION_COUNTED),
        metadata={"description": "how many of those are the household's own"},
    )
    estimated_start_at = moment_field(
        "when it may start, estimated from its kind's recent run times and the slots "
        "that serve it; null without a live process for its kind or a run to judge by"
    )
    waiting_for = fields.Enum(
        WaitingFor,
        by_value=True,
        required=True,
        metadata={"description": "why it is not running yet"},
    )
    signal = fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": (
                "with `waiting_for` `household`: the signal it waits for "
                "(`POST /api/v1/jobs/{job_id}/signals/{name}`); null otherwise"
            )
        },
    )


class JobSchema(Schema):
    id = fields.String(
        required=True,
        validate=validate.Regexp(JOB_ID_PATTERN),
        metadata={"description": "the job's id"},
    )
    kind = fields.String(required=True, metadata={"example": "recipe_import"})
    status = fields.Enum(Status, by_value=True, required=True)
    result = fields.Raw(
        allow_none=True,
        required=True,
        metadata={"description": "the latest partial or final result; null until one exists"},
    )
    error = fields.String(
        allow_none=True, required=True, metadata={"description": "set only on a failed job"}
    )
    attempt = fields.Integer(
        required=True,
        validate=validate.Range(min=0),
        metadata={"description": "attempts started so far (0 until the first starts)"},
    )
    max_attempts = fields.Integer(
        required=True,
        validate=validate.Range(min=1),
        metadata={"description": "attempts the job may have"},
    )
    created_at = moment_field("when the job was enqueued", nullable=False)
    run_at = moment_field("when the job is (or was last) due to run", nullable=False)
    started_at = moment_field("when its latest attempt started; null until one has")
    finished_at = moment_field("when it ended (succeeded, failed or cancelled); null until then")
    version = fields.Integer(
        required=True,
        validate=validate.Range(min=1),
        metadata={
            "description": (
                "one more at every change of the job; its `ETag`, and the `id` of its "
                "stream's events"
            )
        },
    )
    queue = fields.Nested(
        QueueSchema,
        required=True,
        allow_none=True,
        metadata={"description": "where it stands while it is queued; null once it runs"},
    )


def dump_job(job: Job, queue: dict[str, Any] | None = None) -> dict[str, Any]:
    """`JobSchema().dump(...)` of the job and its `queue` object, written out for
    the hottest route (marshmallow's dump was a fifth of that route's own
    time); a test holds the two equal."""
    return {
        "id": job.id,
        "kind": job.kind,
        "status": job.status.value,
        "result": job.result,
        "error": job.error,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
        "run_at": job.run_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "version": job.version,
        "queue": queue,
    }


class JobListSchema(Schema):
    jobs = fields.List(fields.Nested(JobSchema), required=True)
    next_cursor = fields.String(allow_none=True, required=True)


class JobWaitQuerySchema(Schema):
    """`GET /api/v1/jobs/{id}`'s query: how long to hold a conditional request.
    Other parameters (a client's cache-buster) are left alone, as before."""

    class Meta:
        unknown = EXCLUDE

    wait = DecimalField(
        load_default=None,
        validate=validate.Range(min=0, max=30, min_inclusive=False),
        metadata={
            "exclusiveMinimum": True,
            "description": (
                "with `If-None-Match` naming the current version: hold the request "
                "until it changes (200) or this many seconds pass (304); 0 < wait <= 30"
            ),
        },
    )


class JobListQuerySchema(PageQuerySchema):
    status = fields.Enum(Status, by_value=True, load_default=None)
    kind = fields.String(load_default=None, validate=validate.Length(1, 100))
