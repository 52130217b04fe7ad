"""The bench's load generators fail a figure whose connections failed.

A load run against a server that resets its connections must not print a
rate: requests that got no answer would make the route look fast. Both
generators are run against a real loopback listener that accepts each
connection and closes it at once, unread (the peer sees a reset or an
empty answer). A run with answers that were not 2xx fails its figure
with what the server's log says of them.
"""

from __future__ import annotations

import shutil
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from bench.loadgen import LoadError, answers_not_ok, run_load


@pytest.fixture
def resetting_server() -> Iterator[str]:
    """A loopback URL whose server closes every connection with a reset."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    # accept() wakes this often to see whether the test is over.
    listener.settimeout(0.1)
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            # SO_LINGER of 0: close sends a reset, not an orderly end.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        stopped.set()
        listener.close()
        thread.join(5)


@pytest.mark.parametrize("generator", ["python", "wrk"])
def test_a_load_run_whose_connections_failed_fails(resetting_server, generator):
    if generator == "wrk" and shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (the test command installs it)")
    with pytest.raises(LoadError):
        run_load(resetting_server, {}, 1, 2, generator)


def test_answers_not_ok_are_counted_from_the_servers_log(tmp_path):
    log = tmp_path / "gunicorn.log"
    log.write_text(
        '"127.0.0.1" fwd="-" "GET /bench/trivial HTTP/1.1" 200 16 1ms rid=a pid=7 "wrk"\n'
        '"127.0.0.1" fwd="-" "GET /api/v1/jobs/j1 HTTP/1.1" 503 96 5003ms rid=b pid=7 "wrk"\n'
        "2026-12-07 13:00:00,000 8 WARNING mealquest.errors: database busy past its timeout\n"
        '"127.0.0.1" fwd="-" "GET /api/v1/jobs/j1 HTTP/1.1" 503 96 5001ms rid=c pid=8 "wrk"\n'
        '{"level": "INFO", "logger": "gunicorn.access", "message": "POST /api/v1/recipe-imports '
        'HTTP/1.1", "status": "429", "pid": 8}\n'
    )
    why = answers_not_ok(log)
    assert "503 GET /api/v1/jobs/j1: 2" in why
    assert "429 ?: 1" in why
    assert "200" not in why.splitlines()[0]
    assert why.splitlines()[1:] == [
        "2026-12-07 13:00:00,000 8 WARNING mealquest.errors: database busy past its timeout"
    ]
