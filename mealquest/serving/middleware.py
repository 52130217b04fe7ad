"""The app side of serving: trusted proxy headers, and a request id on every response."""

from __future__ import annotations

import re
import uuid

from flask import Flask, Response, g, request
from werkzeug.middleware.proxy_fix import ProxyFix

REQUEST_ID_HEADER = "X-Request-ID"
# A forwarded request id is echoed only if it is short and plain: it ends up
# in log lines.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def init_app(app: Flask) -> None:
    """Trust `PROXY_FIX_HOPS` proxies' `X-Forwarded-*` headers, and give every
    response an `X-Request-ID` (the proxy's, or a new one) for the access log."""
    hops = app.config["PROXY_FIX_HOPS"]  # a whole number, 0 or more (`check_config`)
    if hops:
        # Only as many hops as configured: a client can send its own
        # X-Forwarded-For, and trusting one hop too many lets it pick its address.
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops, x_port=hops
        )
    app.before_request(_take_request_id)
    app.after_request(_set_request_id)


def _take_request_id() -> None:
    """The request's id, known from its start: log lines made while it is
    served name it (`mealquest.logs`)."""
    forwarded = request.headers.get(REQUEST_ID_HEADER, "")
    g.request_id = forwarded if _REQUEST_ID.match(forwarded) else uuid.uuid4().hex


def _set_request_id(response: Response) -> Response:
    # A request answered before the hooks ran (a routing error) still gets one.
    if "request_id" not in g:
        _take_request_id()
    response.headers[REQUEST_ID_HEADER] = g.request_id
    return response
