"""`/api/v1/jobs`: a household reads its own jobs, and only its own."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue

from mealquest.auth import (
    authenticated_as,
    bearer_token,
    current_household,
    refuse_token,
    require_token,
)
from mealquest.errors import conflict, error_response, not_found
from mealquest.extensions import get_store
from mealquest.households import TOKEN_PREFIX, digest_of_wellformed
from mealquest.jobs.errors import TooManyJobs
from mealquest.jobs.schemas import (
    JOB_ID_PATTERN,
    JobListQuerySchema,
    JobListSchema,
    JobPathSchema,
    JobSchema,
    dump_job,
)
from mealquest.jobs.service import get_jobs
from mealquest.model.households import Household
from mealquest.model.jobs import Status
from mealquest.openapi import operation
from mealquest.pagination import decode_cursor, paginate
from mealquest.read_cache import ReadCache

bp = Blueprint("jobs", __name__, url_prefix="/jobs")


@bp.app_errorhandler(TooManyJobs)
def _too_many_jobs(error: TooManyJobs) -> tuple[Response, int]:
    """429 `too_many_jobs`, from any route that enqueues: the household is at
    its quota of queued and running jobs; `Retry-After` is about when one of
    them will have finished."""
    response, status = error_response(
        429, "too_many_jobs", "the household has too many jobs queued or running; try again later"
    )
    response.headers["Retry-After"] = str(error.retry_after)
    return response, status


# The document's path schema; the view checks the same pattern directly (a
# schema validation per request cost 25 times the regex on the hottest route).
_path_schema = JobPathSchema()
_job_id = re.compile(JOB_ID_PATTERN)
_job_schema = JobSchema()
_list_schema = JobListSchema()
_query_schema = JobListQuerySchema()


# Answers of `GET /jobs/<id>` a process gives again while nothing commits:
# about the jobs being polled at once; each entry holds a job's encoded body,
# and a larger body than this is read every time.
ANSWERS_KEPT = 256
LARGEST_BODY_KEPT = 64 * 1024
_ANSWERS_KEY = "mealquest.jobs.answers"

# An answer: the token's household (None: no live token) and the job's
# encoded body (None: the household has no job of that id).
_Answer = tuple[Household | None, bytes | None]


@bp.record_once
def _keep_answers(state: BlueprintSetupState) -> None:
    app = state.app
    assert isinstance(app, Flask)
    app.extensions[_ANSWERS_KEY] = ReadCache(get_store(app), ANSWERS_KEPT)


@bp.get("/<job_id>")
@operation(path=_path_schema, response=_job_schema)
def get_job(job_id: str) -> ResponseReturnValue:
    """One of the household's jobs."""
    # Authenticated here (the API's hook lets this route through): the job is
    # read in the statement that checks the token is live, so a revoked token
    # is refused by the very request after its revocation, from any process.
    # A household polls this route, so its answer is kept while nothing
    # commits (`ReadCache`: a commit anywhere, a revocation included, drops
    # it). Keyed by the header as sent, which is all the answer depends on
    # besides the database. A malformed id, an unknown id and another
    # household's job all answer the same 404, so ids cannot be probed
    # across households. A header that cannot hold one of our tokens is
    # refused as the hook refuses it, reading nothing and keeping nothing.
    header = request.headers.get("Authorization")
    if header is None or TOKEN_PREFIX not in header or not _job_id.match(job_id):
        refused = require_token()
        if refused is not None:
            return refused
        raise not_found("job not found")
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    answers: ReadCache[tuple[str, str], _Answer] = app.extensions[_ANSWERS_KEY]
    household, body = answers.get((job_id, header), lambda: _read_answer(job_id), _small)
    if household is None:
        return refuse_token()
    authenticated_as(household)
    if body is None:
        raise not_found("job not found")
    answer: Response = app.response_class(body, mimetype="application/json")
    return answer


def _small(answer: _Answer) -> bool:
    return answer[1] is None or len(answer[1]) <= LARGEST_BODY_KEPT


def _read_answer(job_id: str) -> _Answer:
    """The household of the request's token and its job's body, from the database."""
    digest = digest_of_wellformed(bearer_token())
    found = None if digest is None else get_jobs().get_with_token(job_id, digest)
    if found is None:
        return None, None
    household, job = found
    if job is None:
        return household, None
    response = current_app.json.response(dump_job(job))
    assert isinstance(response, Response)
    return household, response.get_data()


@bp.get("")
@operation(query=_query_schema, response=_list_schema)
def list_jobs() -> dict[str, Any]:
    """The household's jobs, newest first, a page at a time."""
    query = _query_schema.load(request.args)
    limit = query["limit"]
    before = decode_cursor(query["cursor"]) if query["cursor"] else None
    jobs = get_jobs().list_jobs(
        household_id=current_household().id,
        status=query["status"],
        kind=query["kind"],
        before_seq=before,
        limit=limit + 1,
    )
    page, cursor = paginate(jobs, limit, lambda job: job.seq, dump_job)
    return {"jobs": page, "next_cursor": cursor}


@bp.post("/<job_id>/cancel")
@operation(
    path=_path_schema,
    response=_job_schema,
    status=200,
    also={202: "the job is running: it is being stopped, and ends cancelled"},
    errors=(409,),
)
def cancel_job(job_id: str) -> tuple[dict[str, Any], int]:
    """Cancel one of the household's jobs.

    A queued job is cancelled at once (200, the job); cancelling a cancelled
    job again is the same 200. A running job answers 202 with the job as it
    is: its handler is told, and killed if it does not stop, and the job ends
    cancelled (unless it finishes first, which keeps its outcome). A
    succeeded or failed job is 409 `conflict`. Its error stays null and its
    last partial result stays.
    """
    job = None
    if _job_id.match(job_id):
        job = get_jobs().cancel(job_id, household_id=current_household().id)
    if job is None:
        raise not_found("job not found")
    if job.status in (Status.SUCCEEDED, Status.FAILED):
        raise conflict(f"the job has already {job.status.value}")
    return _job_schema.dump(job), 202 if job.status is Status.RUNNING else 200
