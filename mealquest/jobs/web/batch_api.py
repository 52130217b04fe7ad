"""`/api/v1/batches`: a household watches its own batches, and only its own.

A batch answers as a job does (`mealquest.jobs.web.api`): its `ETag` is its
version, `If-None-Match` with `wait` holds the request until one of its
jobs changes, and `/events` streams it. Held requests count with the
household's streams and the process's, as a job's do.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Flask, current_app, request
from flask.typing import ResponseReturnValue
from gevent.queue import Empty, Queue

from mealquest.auth import current_household, refuse_suspended, refuse_token
from mealquest.errors import APIError, not_found
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.live import get_live
from mealquest.jobs.service.watcher import (
    ENDED,
    STOPPING,
    Credential,
    JobWatcher,
    Watch,
    WatcherClosed,
)
from mealquest.jobs.web import conditional, events
from mealquest.jobs.web.batch_schemas import (
    BATCH_ID_PATTERN,
    BatchPathSchema,
    BatchSchema,
    dump_batch,
)
from mealquest.jobs.web.schemas import JobWaitQuerySchema
from mealquest.model.batches import Batch, BatchStatus
from mealquest.openapi import operation

bp = Blueprint("batches", __name__, url_prefix="/batches")

_path_schema = BatchPathSchema()
_batch_id = re.compile(BATCH_ID_PATTERN)
_batch_schema = BatchSchema()
_wait_schema = JobWaitQuerySchema()

ETAG_HEADERS = conditional.etag_headers("batch")
IF_NONE_MATCH_PARAMETER = conditional.if_none_match_parameter("batch", "one of its jobs changes")
LAST_EVENT_ID_PARAMETER = events.last_event_id_parameter("batch")


def _read(batch_id: str, household_id: int) -> Batch:
    batch = (
        get_jobs().batch(batch_id, household_id=household_id) if _batch_id.match(batch_id) else None
    )
    if batch is None:
        # Malformed, unknown and another household's ids answer the same 404.
        raise not_found("batch not found")
    return batch


def _credential() -> Credential:
    credential = conditional.token_credential()
    assert credential is not None  # the API's hook let a live token of ours through
    return credential


def watch_batch(watcher: JobWatcher, batch: Batch, credential: Credential | None) -> list[Watch]:
    """One watch per job of the batch (and its callback), all into one inbox:
    the process's one watcher still does all the reading of changes."""
    inbox: Queue = Queue()
    watched = batch.members + ((batch.callback,) if batch.callback else ())
    watches: list[Watch] = []
    try:
        for member in watched:
            watches.append(watcher.watch(member.job_id, member.version, credential, inbox))
    except Exception:
        for watch in watches:
            watcher.unwatch(watch)
        raise
    return watches


def batch_changed(
    watcher: JobWatcher, batch: Batch, seconds: float, credential: Credential | None
) -> bool:
    """Wait until a job of the batch changes, the credential ends, or `seconds`
    pass; whether to read the batch again."""
    watches = watch_batch(watcher, batch, credential)
    try:
        try:
            kind, why = watches[0].inbox.get(timeout=seconds)
        except Empty:
            return False
        return bool(kind != ENDED or why != STOPPING)
    finally:
        for watch in watches:
            watcher.unwatch(watch)


def is_finished(batch: Batch) -> bool:
    return batch.status is BatchStatus.FINISHED


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
    conditional.check_if_none_match()
    household = current_household()
    batch = _read(batch_id, household.id)
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    if conditional.not_modified(batch.version):
        live = get_live()
        held = batch
        # A finished batch cannot change: its long poll is answered at once.
        if (
            wait is None
            or is_finished(batch)
            or not conditional.hold(
                live,
                household.id,
                wait,
                lambda seconds: batch_changed(live.watcher, held, seconds, _credential()),
            )
        ):
            return conditional.unchanged(app, batch.version)
        # Held: the token or the household may have gone meanwhile.
        store = get_store()
        again = store.read(store.households.household_for_token_digest, _credential().digest)
        if again is None:
            return refuse_token()
        if again.suspended:
            return refuse_suspended()
        batch = _read(batch_id, household.id)
        if conditional.not_modified(batch.version):
            return conditional.unchanged(app, batch.version)
    answer = app.json.response(dump_batch(batch))
    answer.headers["ETag"] = conditional.etag(batch.version)
    return answer


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
    last = events.last_seen_version()
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

    def follow(inbox: Queue, what: str, _value: Any) -> Batch | None:
        """The batch as it now is, read once for whatever changed meanwhile
        (a change to any of its jobs; two read together make one event)."""
        while what != ENDED and not inbox.empty():
            what, _value = inbox.get()
        if what == ENDED:
            return None  # the worker stops, or the credential was revoked
        with app.app_context():
            return get_jobs(app).batch(batch.id, household_id=household.id)

    return events.stream_response(
        live,
        batch,
        watches,
        render=dump_batch,
        send_first=last is None or batch.version > last,
        on_close=lambda: live.places.release(place),
        name="batch",
        is_final=is_finished,
        follow=follow,
    )
