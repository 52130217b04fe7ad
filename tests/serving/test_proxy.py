"""ProxyFix trusts exactly the configured number of proxy hops; every answer has a request id."""

from __future__ import annotations

import pytest
from flask import request

pytestmark = pytest.mark.sqlite_only("forwarded headers are read before any database is")


def _whoami_app(make_app, **config):
    app = make_app(**config)
    app.add_url_rule(
        "/whoami",
        "whoami",
        lambda: {"addr": request.remote_addr, "scheme": request.scheme, "host": request.host},
    )
    return app.test_client()


FORWARDED = {
    "X-Forwarded-For": "203.0.113.9, 198.51.100.7",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "meals.example",
}


def test_forwarded_headers_are_ignored_by_default(make_app):
    client = _whoami_app(make_app)
    body = client.get("/whoami", headers=FORWARDED).json
    assert body == {"addr": "127.0.0.1", "scheme": "http", "host": "localhost"}


def test_one_trusted_hop_takes_only_the_address_the_proxy_saw(make_app):
    client = _whoami_app(make_app, PROXY_FIX_HOPS=1)
    body = client.get("/whoami", headers=FORWARDED).json
    # The first address was written by the client itself and is not trusted.
    assert body == {"addr": "198.51.100.7", "scheme": "https", "host": "meals.example"}


def test_every_answer_carries_a_request_id(make_app):
    client = make_app().test_client()
    forwarded = client.get("/api/v1/jobs", headers={"X-Request-ID": "abc-123"})
    assert forwarded.status_code == 401  # error answers too
    assert forwarded.headers["X-Request-ID"] == "abc-123"
    minted = client.get("/healthz").headers["X-Request-ID"]
    assert len(minted) == 32
    unsafe = client.get("/healthz", headers={"X-Request-ID": "x" * 200}).headers["X-Request-ID"]
    assert unsafe != "x" * 200
