"""Counting HTTP requests by URL rule (`/api/v1/jobs/<job_id>`), never by raw
path: a job id in a label would make a series per job."""

from __future__ import annotations

import time

from flask import Flask, Response, g, request

from mealquest.metrics.registry import HTTP_REQUEST_DURATION, HTTP_REQUESTS

# Any other method token a client sends is counted as `other`, so a client
# cannot make series of its own.
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
# The route of a request no rule matched (a 404, or a refusal before routing).
UNMATCHED = "unmatched"


def init_app(app: Flask) -> None:
    """Registered before every other hook, so requests refused by one (401,
    414) are timed and counted too."""
    app.before_request_funcs.setdefault(None, []).insert(0, _start)
    app.after_request(_count)


def _start() -> None:
    g.mealquest_request_started = time.perf_counter()


def _count(response: Response) -> Response:
    started = g.get("mealquest_request_started")
    route = request.url_rule.rule if request.url_rule is not None else UNMATCHED
    method = request.method if request.method in _METHODS else "other"
    HTTP_REQUESTS.labels(route=route, method=method, status=str(response.status_code)).inc()
    if started is not None:
        HTTP_REQUEST_DURATION.labels(route=route).observe(time.perf_counter() - started)
    return response
