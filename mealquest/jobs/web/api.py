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
    refuse_suspended,
    refuse_token,
    require_token,
)
from mealquest.errors import APIError, conflict, error_response, not_found
from mealquest.extensions import get_store
from mealquest.households import TOKEN_PREFIX, digest_of_wellformed
from mealquest.jobs.errors import ProcessHoldsTooMany, TooManyJobs, TooManyStreams, UnknownSignal
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.live import get_live
from mealquest.jobs.service.watcher import TOKEN, Credential, WatcherClosed, wait_for_version
from mealquest.jobs.web import conditional, events
from mealquest.jobs.web.answers import job_answer, job_dumper
from mealquest.jobs.web.enqueue_route import IDEMPOTENCY_HEADER_PARAMETER, idempotency_key
from mealquest.jobs.web.schemas import (
    JOB_ID_PATTERN,
    JobListQuerySchema,
    JobListSchema,
    JobPathSchema,
    JobSchema,
    JobWaitQuerySchema,
    SignalBodySchema,
    SignalPathSchema,
    dump_job,
)
from mealquest.model.households import Household
from mealquest.model.jobs import FINAL_STATUSES, Job, Status
from mealquest.model.signals import NAME_PATTERN as SIGNAL_NAME_PATTERN
from mealquest.model.signals import Signaled
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


@bp.app_errorhandler(ProcessHoldsTooMany)
def _process_holds_too_many(error: ProcessHoldsTooMany) -> tuple[Response, int]:
    """503 `unavailable`: this process holds as many streams and long polls as
    it may (`MEALQUEST_WAIT_MAX_PER_PROCESS`); `Retry-After` says when to
    come back."""
    response, status = error_response(
        503, "unavailable", "the service holds as many open streams as it may; try again shortly"
    )
    response.headers["Retry-After"] = str(error.retry_after)
    return response, status


@bp.app_errorhandler(TooManyStreams)
def _too_many_streams(error: TooManyStreams) -> tuple[Response, int]:
    """429 `too_many_streams`: the household holds as many open event streams as
    it may; `Retry-After` is when its oldest one ends."""
    response, status = error_response(
        429, "too_many_streams", "the household has too many event streams open; try again later"
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
_wait_schema = JobWaitQuerySchema()


# Answers of `GET /jobs/<id>` a process gives again while nothing commits:
# about the jobs being polled at once; each entry holds a job's encoded body,
# and a larger body than this is read every time.
ANSWERS_KEPT = 256
LARGEST_BODY_KEPT = 64 * 1024
# A queued job's place in line is kept as long as nothing commits, and a
# second at most: time moves it too (a job falls due, an estimate ages).
QUEUE_KEPT_SECONDS = 1.0
_ANSWERS_KEY = "mealquest.jobs.web.answers"
_QUEUES_KEY = "mealquest.jobs.queues"

# An answer: the token's household (None: no live token), the household's job
# of that id (None: it has none), and the job's encoded body (None for a
# queued job, whose place in line is added per answer).
_Answer = tuple[Household | None, Job | None, bytes | None]

ETAG_HEADERS = conditional.etag_headers("job")
IF_NONE_MATCH_PARAMETER = conditional.if_none_match_parameter("job", "the job changes")
LAST_EVENT_ID_PARAMETER = events.last_event_id_parameter("job")


@bp.record_once
def _keep_answers(state: BlueprintSetupState) -> None:
    app = state.app
    assert isinstance(app, Flask)
    app.extensions[_ANSWERS_KEY] = ReadCache(get_store(app), ANSWERS_KEPT)
    app.extensions[_QUEUES_KEY] = ReadCache(
        get_store(app), ANSWERS_KEPT, ttl_seconds=QUEUE_KEPT_SECONDS
    )


@bp.get("/<job_id>")
@operation(
    path=_path_schema,
    query=_wait_schema,
    response=_job_schema,
    response_headers=ETAG_HEADERS,
    headers=(IF_NONE_MATCH_PARAMETER,),
    not_modified=True,
)
def get_job(job_id: str) -> ResponseReturnValue:
    """One of the household's jobs.

    Its `ETag` is its version. With `If-None-Match` naming it, `304` while
    the job has not changed; with `wait` as well, the request is held until
    the job changes (then `200`) or `wait` seconds pass (then `304`). A long
    poll counts with the household's streams
    (`MEALQUEST_STREAM_MAX_PER_HOUSEHOLD`) and the process's held requests:
    past either, it is answered at once, as without `wait`. A held long poll
    whose token is revoked or whose household is suspended or erased is
    answered within a second (`401`, `403 household_suspended`).
    """
    # Authenticated here (the API's hook lets this route through): the job is
    # read in the statement that checks the token is live, so a revoked token
    # is refused by the very request after its revocation, from any process;
    # likewise a suspension (403), read with the token's household.
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
    wait = _wait_schema.load(request.args)["wait"] if request.args else None
    conditional.check_if_none_match()
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    household, job, body = _answer(app, job_id, header)
    if household is None:
        return refuse_token()
    if household.suspended:
        return refuse_suspended()
    authenticated_as(household)
    if job is None:
        raise not_found("job not found")
    if conditional.not_modified(job.version):
        # A final job cannot change: its long poll is answered at once.
        if wait is None or job.status in FINAL_STATUSES or not _changed(app, household, job, wait):
            return conditional.unchanged(app, job.version)
        household, job, body = _answer(app, job_id, header)
        if household is None:
            return refuse_token()
        if household.suspended:
            return refuse_suspended()
        if job is None:
            raise not_found("job not found")
        if conditional.not_modified(job.version):
            return conditional.unchanged(app, job.version)
    if body is None:
        queues: ReadCache[tuple[str, int], dict[str, Any] | None] = app.extensions[_QUEUES_KEY]
        queue = queues.get((job.id, job.version), lambda: get_live(app).standings.queue(job))
        body = _encoded(app, dump_job(job, queue))
    answer: Response = app.response_class(body, mimetype="application/json")
    answer.headers["ETag"] = conditional.etag(job.version)
    return answer


def _answer(app: Flask, job_id: str, header: str) -> _Answer:
    answers: ReadCache[tuple[str, str], _Answer] = app.extensions[_ANSWERS_KEY]
    return answers.get((job_id, header), lambda: _read_answer(app, job_id), _small)


def _small(answer: _Answer) -> bool:
    return answer[2] is None or len(answer[2]) <= LARGEST_BODY_KEPT


def _read_answer(app: Flask, job_id: str) -> _Answer:
    """The household of the request's token, its job, and the job's body unless
    it is queued, from the database."""
    digest = digest_of_wellformed(bearer_token())
    found = None if digest is None else get_jobs().get_with_token(job_id, digest)
    if found is None:
        return None, None, None
    household, job = found
    if job is None or job.status is Status.QUEUED:
        return household, job, None
    return household, job, _encoded(app, dump_job(job))


def _encoded(app: Flask, body: dict[str, Any]) -> bytes:
    response = app.json.response(body)
    assert isinstance(response, Response)
    return response.get_data()


def _changed(app: Flask, household: Household, job: Job, seconds: float) -> bool:
    """Hold a long poll until the job has another version, its token or
    household may no longer read it, or `seconds` pass; whether to read again."""
    live, credential = get_live(app), conditional.token_credential()
    return conditional.hold(
        live,
        household.id,
        seconds,
        lambda held: wait_for_version(live.watcher, job, held, credential),
    )


@bp.get("/<job_id>/events")
@operation(
    path=_path_schema,
    response=_job_schema,
    media_type=events.MEDIA_TYPE,
    headers=(LAST_EVENT_ID_PARAMETER,),
    errors=(429, 503),
)
def job_events(job_id: str) -> ResponseReturnValue:
    """The job's events, as they happen (server-sent events).

    `text/event-stream`: at once an event `job` with the job's object (as
    `GET /api/v1/jobs/{job_id}` answers it) as data and `id:` its version,
    unless `Last-Event-ID` already names that version; then one `job` event
    per later version, a comment line at least every 15 seconds, and after
    the final state an event `end`. The stream also ends when its worker
    stops, after `MEALQUEST_STREAM_MAX_SECONDS`, or when the token is
    revoked or its household suspended or erased (within a second): reconnect
    with `Last-Event-ID`. A household may hold
    `MEALQUEST_STREAM_MAX_PER_HOUSEHOLD` streams and long polls together: one
    more stream is `429 too_many_streams`; one more than the serving process
    may hold is `503 unavailable`, both with `Retry-After`. A client that
    stops reading is dropped after `MEALQUEST_STREAM_SEND_TIMEOUT_SECONDS`.
    """
    last = events.last_seen_version()
    household = current_household()
    job = get_jobs().get(job_id, household_id=household.id) if _job_id.match(job_id) else None
    if job is None:
        raise not_found("job not found")
    digest = digest_of_wellformed(bearer_token())
    assert digest is not None  # the API's hook let a live token of ours through
    live = get_live()
    place = live.places.take(household.id)
    try:
        watch = live.watcher.watch(job.id, job.version, Credential(TOKEN, digest))
    except WatcherClosed:
        live.places.release(place)
        raise APIError(503, "unavailable", "the service is restarting; try again") from None
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]

    def render(changed: Job) -> dict[str, Any]:
        with app.app_context():
            return job_answer(changed)

    return events.stream_response(
        live,
        job,
        watch,
        render=render,
        send_first=last is None or job.version > last,
        on_close=lambda: live.places.release(place),
    )


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
    # Each job as `dump_job` writes `JobSchema`'s dump out (see the job route).
    page, cursor = paginate(jobs, limit, lambda job: job.seq, job_dumper(jobs[:limit]))
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
    return job_answer(job), 202 if job.status is Status.RUNNING else 200


_signal_path_schema = SignalPathSchema()
_signal_body_schema = SignalBodySchema()
_signal_name = re.compile(SIGNAL_NAME_PATTERN)


@bp.post("/<job_id>/signals/<name>")
@operation(
    path=_signal_path_schema,
    body=_signal_body_schema,
    response=_job_schema,
    status=202,
    errors=(409,),
    headers=(IDEMPOTENCY_HEADER_PARAMETER,),
)
def signal_job(job_id: str, name: str) -> tuple[dict[str, Any], int]:
    """Answer a job that asks its household (`queue.waiting_for` `household`).

    The body is checked by the schema the job's kind declares for the signal
    `name` (`400` naming the field that does not fit, and nothing stored).
    A job waiting for it is due at once (`202`, the job); one still running,
    or not started yet, keeps the answer for its wait (`202`). A final job,
    one waiting for another signal, or one answered already is `409
    not_waiting`; the same request again with its `Idempotency-Key` answers
    `202` with the job as it is. A name the job's kind does not take is
    `404`, as is another household's job.
    """
    key = idempotency_key()
    answer = request.get_json()
    if not _job_id.match(job_id) or not _signal_name.match(name):
        raise not_found("job not found")
    try:
        result = get_jobs().signal(
            job_id,
            name,
            answer,
            household_id=current_household().id,
            idempotency_key=key,
        )
    except UnknownSignal:
        raise not_found("the job's kind takes no signal of that name") from None
    if result.job is None:
        raise not_found("job not found")
    if result.signaled is Signaled.NOT_WAITING:
        raise APIError(
            409,
            "not_waiting",
            "the job does not wait for that signal: it has ended, waits for another, "
            "or has its answer",
        )
    return job_answer(result.job), 202
