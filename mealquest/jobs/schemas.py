"""The jobs API's shapes: a job as households see it, and the list's query."""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from mealquest.jobs.model import Status
from mealquest.pagination import PageQuerySchema

JOB_ID_PATTERN = r"^[0-9a-f]{32}$"


class JobPathSchema(Schema):
    """The job id in a path: anything else is the same 404 as an unknown job."""

    job_id = fields.String(
        required=True,
        validate=validate.Regexp(JOB_ID_PATTERN),
        metadata={"description": "the job's id (32 lowercase hex digits)"},
    )


def _time(description: str, *, nullable: bool = True) -> fields.String:
    """A moment as stored: RFC 3339 UTC text with microseconds (`...T10:00:00.000000Z`)."""
    return fields.String(
        required=True,
        allow_none=nullable,
        metadata={"format": "date-time", "description": f"{description} (RFC 3339, UTC)"},
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
    created_at = _time("when the job was enqueued", nullable=False)
    run_at = _time("when the job is (or was last) due to run", nullable=False)
    started_at = _time("when its latest attempt started; null until one has")
    finished_at = _time("when it ended (succeeded, failed or cancelled); null until then")


class JobListSchema(Schema):
    jobs = fields.List(fields.Nested(JobSchema), required=True)
    next_cursor = fields.String(allow_none=True, required=True)


class JobListQuerySchema(PageQuerySchema):
    status = fields.Enum(Status, by_value=True, load_default=None)
    kind = fields.String(load_default=None, validate=validate.Length(1, 100))
