"""The bench's load generators fail a figure whose connections failed.

A load run against a server that resets its connections must not print a
rate: requests that got no answer would make the route look fast. Both
generators are run against a real loopback listener that accepts each
connection and closes it at once, unread (the peer sees a reset or an
empty answer).
"""

from __future__ import annotations

import shutil
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from bench.loadgen import LoadError, run_load


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
