"""A job's page follows its job through the same event stream households read.

`GET /admin/jobs/{id}/events` is that stream, behind the operator's session
instead of a household's token: the process's one watcher feeds it, it sends
a heartbeat comment, ends after the final state, when the worker stops or
after `MEALQUEST_STREAM_MAX_SECONDS`, and at the next change or heartbeat
after the session ends (signed out, expired, its operator revoked).

Its events carry only the job's id, status and version, never the payload,
result or error: a value may hold a URL with a token in it, and the page
masks what it shows. Each event tells the page to fetch its live part again,
which is rendered (and masked) as the page itself is.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Response, request

from mealquest.households import token_digest
from mealquest.jobs.service.live import get_live
from mealquest.jobs.service.watcher import SESSION, Credential, WatcherClosed
from mealquest.jobs.web import events
from mealquest.model.jobs import Job

_VERSION = re.compile(events.LAST_EVENT_ID_PATTERN)


def shown(job: Job) -> dict[str, Any]:
    """A `job` event's data on the dashboard."""
    return {"id": job.id, "status": str(job.status), "version": job.version}


def version_known() -> int | None:
    """The version the page has: the browser's `Last-Event-ID` when it
    reconnects, else the `version` the page was rendered at (its first
    connection has no `Last-Event-ID`); None if neither is a version."""
    for value in (request.headers.get(events.LAST_EVENT_ID), request.args.get("version")):
        if value is not None and _VERSION.fullmatch(value):
            return int(value)
    return None


def job_stream(job: Job, session_id: str) -> Response | None:
    """The job's event stream for the page; None while the worker is stopping."""
    live = get_live()
    try:
        watch = live.watcher.watch(
            job.id, job.version, Credential(SESSION, token_digest(session_id))
        )
    except WatcherClosed:
        return None
    known = version_known()
    return events.stream_response(
        live, job, watch, render=shown, send_first=known is None or job.version > known
    )
