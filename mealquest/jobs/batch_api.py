"""`/api/v1/batches`: a household watches its own batches, and only its own.

A batch answers as a job does (`mealquest.jobs.api`): its `ETag` is its
version, `If-None-Match` with `wait` holds the request until one of its
jobs changes, and `/events` streams it. Held requests count with the
household's streams and the process's, as a job's do.
"""

from __future__ import annotations

import re

from flask import Blueprint, Flask, Response, current_app, request
from flask.typing import ResponseReturnValue
from marshmallow import ValidationError

from mealquest.auth import bearer_token, current_household, refuse_suspended, refuse_token
from mealquest.errors import APIError, not_found
from mealquest.extensions import get_store
from mealquest.households import digest_of_wellformed
from mealquest.jobs import events
from mealquest.jobs.api import (
    IF_NONE_MATCH_MAX_LENGTH,
    etag_headers,
    if_none_match_parameter,
    last_event_id_parameter,
)
from mealquest.jobs.batch_events import BatchEventStream, batch_changed, watch_batch
from mealquest.jobs.batch_schemas import BATCH_ID_PATTERN, BatchPathSchema, BatchSchema, dump_batch
from mealquest.jobs.errors import ProcessHoldsTooMany, TooManyStreams
from mealquest.jobs.live import Live, get_live
from mealquest.jobs.schemas import JobWaitQuerySchema
from mealquest.jobs.service import get_jobs
from mealquest.jobs.watcher import TOKEN, Credential, WatcherClosed
from mealquest.model.batches import Batch, BatchStatus
from mealquest.model.households import Household
from mealquest.openapi import operation

bp = Blueprint("batches", __name__, url_prefix="/batches")

_path_schema = BatchPathSchema()
_batch_id = re.compile(BATCH_ID_PATTERN)
_batch_schema = BatchSchema()
_wait_schema = JobWaitQuerySchema()
_last_event_id = re.compile(events.LAST_EVENT_ID_PATTERN)

ETAG_HEADERS = etag_headers("batch")
IF_NONE_MATCH_PARAMETER = if_none_match_parameter("batch", "one of its jobs changes")
LAST_EVENT_ID_PARAMETER = last_event_id_parameter("batch")


def _read(batch_id: str, household_id: int) -> Batch:
    batch = (
        get_jobs().batch(batch_id, household_id=household_id) if _batch_id.match(batch_id) else None
    )
    if batch is None:
        # Malformed, unknown and another household's ids answer the same 404.
        raise not_found("batch not found")
    return batch


def _credential() -> Credential:
    digest = digest_of_wellformed(bearer_token())
    assert digest is not None  # the API's hook let a live token of ours through
    return Credential(TOKEN, digest)


@bp.get("/<batch_id>")
@operation(
    path=_path_schema,
    query=_wait_schema,
    response=_batch_schema,
    response_headers=ETAG_HEADERS,
    headers=(IF_NONE_MATCH_PARAMETER,),
    not_modified=True,
)
def get_batch(batch_id: str) -> ResponseReturnValue:
    """One of the household's batches: its jobs' progress, and its callback.

    Its `ETag` is its version, which grows with every change to one of its
    jobs. With `If-None-Match` naming it, `304` while nothing changed; with
    `wait` as well, the request is held until a job of the batch changes
    (then `200`) or `wait` seconds pass (then `304`), counted as a job's
    long poll is.
    """
    wait = _wait_schema.load(request.args)["wait"] if request.args else None
    if len(request.headers.get("If-None-Match", "")) > IF_NONE_MATCH_MAX_LENGTH:
        raise ValidationError(
            {"If-None-Match": [f"must be at most {IF_NONE_MATCH_MAX_LENGTH} characters"]}
        )
    household = current_household()
    batch = _read(batch_id, household.id)
    if _not_modified(batch):
        live = get_live()
        # A finished batch cannot change: its long poll is answered at once.
        if (
            wait is None
            or batch.status is BatchStatus.FINISHED
            or not _changed(live, household, batch, min(wait, live.max_seconds))
        ):
            return _unchanged(batch)
        # Held: the token or the household may have gone meanwhile.
        store = get_store()
        again = store.read(store.households.household_for_token_digest, _credential().digest)
        if again is None:
            return refuse_token()
        if again.suspended:
            return refuse_suspended()
        batch = _read(batch_id, household.id)
        if _not_modified(batch):
            return _unchanged(batch)
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    answer = app.json.response(dump_batch(batch))
    answer.headers["ETag"] = f'"{batch.version}"'
    return answer


def _not_modified(batch: Batch) -> bool:
    tags = request.if_none_match
    return bool(tags) and tags.contains_weak(str(batch.version))


def _unchanged(batch: Batch) -> Response:
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    answer: Response = app.response_class(status=304)
    answer.headers["ETag"] = f'"{batch.version}"'
    return answer


def _changed(live: Live, household: Household, batch: Batch, seconds: float) -> bool:
    """Hold a long poll (see `mealquest.jobs.api`'s); whether to read again."""
    try:
        place = live.places.take(household.id)
    except (TooManyStreams, ProcessHoldsTooMany):
        return False
    try:
        return batch_changed(live.watcher, batch, seconds, _credential())
    except WatcherClosed:
        return False
    finally:
        live.places.release(place)


@bp.get("/<batch_id>/events")
@operation(
    path=_path_schema,
    response=_batch_schema,
    media_type=events.MEDIA_TYPE,
    event="batch",
    headers=(LAST_EVENT_ID_PARAMETER,),
    errors=(429, 503),
)
def batch_events(batch_id: str) -> ResponseReturnValue:
    """The batch's events, as they happen (server-sent events).

    As a job's stream: at once an event `batch` with the batch's object as
    data and `id:` its version (unless `Last-Event-ID` already names it),
    then one per later version, a comment line at least every 15 seconds,
    and once the batch is finished (every job and the callback final) an
    event `end`. It ends, and is counted, as a job's stream is.
    """
    value = request.headers.get(events.LAST_EVENT_ID)
    if value is not None and not _last_event_id.fullmatch(value):
        raise ValidationError({events.LAST_EVENT_ID: ["must be an event's id: a version"]})
    last = None if value is None else int(value)
    household = current_household()
    batch = _read(batch_id, household.id)
    live = get_live()
    place = live.places.take(household.id)
    try:
        watches = watch_batch(live.watcher, batch, _credential())
    except WatcherClosed:
        live.places.release(place)
        raise APIError(503, "unavailable", "the service is restarting; try again") from None
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]

    def read() -> Batch | None:
        with app.app_context():
            return get_jobs(app).batch(batch.id, household_id=household.id)

    stream = BatchEventStream(
        batch,
        watches,
        live.watcher,
        read=read,
        render=dump_batch,
        send_first=last is None or batch.version > last,
        heartbeat_seconds=live.heartbeat_seconds,
        max_seconds=live.max_seconds,
        send_timeout_seconds=live.send_timeout_seconds,
        writes_each_chunk=events.served_by_gunicorn(request.environ),
        on_close=lambda: live.places.release(place),
    )
    return Response(stream, mimetype=events.MEDIA_TYPE, headers=events.STREAM_HEADERS)
