"""Each request lets the event loop run first (`mealquest.serving.middleware`).

gevent's server serves a keep-alive connection's next request without
yielding when it has already arrived, so under load a fast client could
hold a worker while other connections waited past their clients' timeouts
(wrk's 2 s, in the bench). A greenlet made ready before a request must
therefore have run by the time the request's view does."""

from __future__ import annotations

import gevent
import pytest

pytestmark = pytest.mark.both_databases


def test_a_greenlet_ready_before_a_request_runs_before_its_view(make_app):
    app = make_app()
    ran: list[str] = []
    app.add_url_rule("/turns", "turns", lambda: {"ran": list(ran)})
    client = app.test_client()

    gevent.spawn(ran.append, "other")  # ready, not yet run: nothing has yielded
    assert ran == []
    answer = client.get("/turns")

    assert answer.get_json() == {"ran": ["other"]}
