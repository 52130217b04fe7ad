"""`GET /metrics` on a port of its own, for `flask jobs work` (no gunicorn).

Served by gevent's WSGI server in the worker's own process, on
`MEALQUEST_METRICS_HOST`:`MEALQUEST_METRICS_PORT`, only when the port is set
(unset: not served at all). The same answer as the app's route: an
operator's bearer token, the same text, the same error envelope; every other
path is a 404.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask
from gevent.pywsgi import WSGIServer

from mealquest.db.driver import Store
from mealquest.db.errors import StoreUnavailable
from mealquest.extensions import get_store
from mealquest.metrics.registry import CONTENT_TYPE, render
from mealquest.operators import operator_for_token
from mealquest.queue_stats import CachedFigures

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


def _error(start_response: StartResponse, status: str, code: str, message: str) -> list[bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if code == "unauthorized":
        headers.append(("WWW-Authenticate", 'Bearer realm="Authentication Required"'))
    start_response(status, headers)
    return [body]


def metrics_app(store: Store) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    figures = CachedFigures(store)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            return _error(start_response, "404 Not Found", "not_found", "not found")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _error(
                start_response, "405 Method Not Allowed", "method_not_allowed", "method not allowed"
            )
        scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        try:
            bearer = scheme.lower() == "bearer"
            operator = operator_for_token(store, token.strip()) if bearer else None
            body = render(figures.get()) if operator is not None else b""
        except StoreUnavailable:
            return _error(
                start_response,
                "503 Service Unavailable",
                "unavailable",
                "the service cannot use its storage now; try again shortly",
            )
        if operator is None:
            return _error(
                start_response,
                "401 Unauthorized",
                "unauthorized",
                "a valid operator token is required",
            )
        headers = [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))]
        start_response("200 OK", headers)
        return [body]

    return app


def serve_configured(app: Flask) -> WSGIServer | None:
    """Serve on `METRICS_PORT` if it is set; None (nothing served) if not."""
    port = app.config["METRICS_PORT"]
    if port is None:
        return None
    return serve(get_store(app), app.config["METRICS_HOST"], port)


def serve(store: Store, host: str, port: int) -> WSGIServer:
    """Start serving in this process's event loop; `stop()` the server to end."""
    server = WSGIServer((host, port), metrics_app(store), log=None, error_log=logger)
    server.start()
    logger.info("metrics served on %s:%d/metrics", host, server.server_port)
    return server
