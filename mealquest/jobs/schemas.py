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


class JobListSchema(Schema):
    jobs = fields.List(fields.Nested(JobSchema), required=True)
    next_cursor = fields.String(allow_none=True, required=True)


class JobListQuerySchema(PageQuerySchema):
    status = fields.Enum(Status, by_value=True, load_default=None)
    kind = fields.String(load_default=None, validate=validate.Length(1, 100))
