"""What routes that enqueue a job share: the `Idempotency-Key` header, and the answer.

A request with an `Idempotency-Key` (1 to 255 visible ASCII characters) is
enqueued with it as the job's unique key, per household: the same request
again within 24 hours answers `200` with the job the first one made (and its
`Location`), creating nothing; the same key with another request is `422
idempotency_key_reused`; a bad key is `400 validation_error` naming the
header. Without the header every request makes a job (`202`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from flask import request, url_for
from marshmallow import Schema, ValidationError

from mealquest.auth import current_household
from mealquest.errors import APIError, not_found
from mealquest.jobs.enqueueing import UNIQUE_KEY_PATTERN, UNIQUE_KEY_RULE, Enqueued
from mealquest.jobs.errors import IdempotencyKeyReused
from mealquest.jobs.service import get_jobs
from mealquest.jobs.web.answers import job_answer
from mealquest.jobs.web.schemas import JobSchema
from mealquest.openapi import operation

IDEMPOTENCY_HEADER = "Idempotency-Key"

# The header as the OpenAPI document describes it (`@operation(headers=...)`).
IDEMPOTENCY_HEADER_PARAMETER: dict[str, Any] = {
    "name": IDEMPOTENCY_HEADER,
    "required": False,
    "description": (
        "makes the request idempotent for 24 hours, per household: a repeat with the "
        "same key and body answers 200 with the same job and creates nothing; the same "
        "key with another body is 422 `idempotency_key_reused`"
    ),
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}
ENQUEUED_HEADERS: dict[str, dict[str, Any]] = {
    "Location": {"description": "the job's URL", "required": True, "schema": {"type": "string"}}
}
REPLAYED = "a repeat of an earlier request with the same `Idempotency-Key`: the job it made"


_job_schema = JobSchema()

Answer = tuple[dict[str, Any], int, dict[str, str]]


def enqueues(
    kind: str, *, body: Schema, summary: str | None = None
) -> Callable[[Callable[[Any], Mapping[str, Any]]], Callable[[], Answer]]:
    """Make a route that enqueues a job of `kind` from its JSON body.

    The decorated function gets the body as `body` loaded it and returns the
    job's payload. The route reads the `Idempotency-Key`, answers `202` (or
    `200` for a repeat) with the job and its `Location`, and declares all of
    that in the OpenAPI document; a body that does not fit is `400` and
    nothing is written. The summary is the function's docstring's first
    line unless given.
    """

    def decorate(payload_of: Callable[[Any], Mapping[str, Any]]) -> Callable[[], Answer]:
        @functools.wraps(payload_of)
        def view() -> Answer:
            # get_json: a body that is not JSON is Flask's 415 (wrong type) or
            # 400 (malformed); an oversized one is 413. The key and the body
            # are checked before any write.
            key = idempotency_key()
            payload = payload_of(body.load(request.get_json()))
            return answer(enqueue(kind, payload, key))

        return operation(
            body=body,
            response=_job_schema,
            status=202,
            also={200: REPLAYED},
            errors=(422, 429),
            headers=(IDEMPOTENCY_HEADER_PARAMETER,),
            summary=summary,
            response_headers=ENQUEUED_HEADERS,
        )(view)

    return decorate


def idempotency_key() -> str | None:
    """The request's `Idempotency-Key`, checked (ValidationError naming the header)."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not UNIQUE_KEY_PATTERN.match(key):
        raise ValidationError({IDEMPOTENCY_HEADER: [UNIQUE_KEY_RULE]})
    return key


def enqueue(kind: str, payload: Mapping[str, Any], key: str | None) -> Enqueued:
    """Enqueue for the authenticated household with the request's key (see the module)."""
    try:
        return get_jobs().insert(kind, payload, household_id=current_household().id, unique_key=key)
    except IdempotencyKeyReused:
        raise key_reused() from None


def key_reused() -> APIError:
    """`422 idempotency_key_reused`: the key was used with another request."""
    return APIError(
        422,
        "idempotency_key_reused",
        f"that {IDEMPOTENCY_HEADER} was already used with another request",
    )


def answer(enqueued: Enqueued) -> Answer:
    """`202` with a new job, `200` with the one a repeated key names; `Location` either way."""
    job = get_jobs().get(enqueued.job_id, household_id=current_household().id)
    if job is None:  # deleted since (a retention prune): the key went with it
        raise not_found("job not found")
    location = url_for("api.jobs.get_job", job_id=job.id)
    return job_answer(job), 202 if enqueued.created else 200, {"Location": location}
