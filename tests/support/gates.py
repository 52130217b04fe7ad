"""Gates: pages the test's HTTP server holds until the test opens them.

A job that must stay running for as long as a test needs passes a gate: it
asks for the gate's page and gets its answer only once the test opens it. The
page is served over real TCP on loopback, so the hold works across processes
(`flask jobs work`, gunicorn workers) as well as in the tests' own pool, and
it lasts exactly as long as the test says, however slowly anything starts:
no sleep has to outlast anything.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from gevent import socket as gsocket

from tests.support.pages import PageServer, Reply

_OPEN = b"open"


class Gates:
    """Named gates on one loopback server. Each counts the requests that
    arrived (a job waiting there, or one that passed after it opened)."""

    def __init__(self) -> None:
        self._pages = PageServer().start()
        self._opened: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def url(self, name: str) -> str:
        """The URL a job passes this gate by (the gate is made, closed, on first use)."""
        with self._lock:
            if name not in self._opened:
                opened = threading.Event()
                self._opened[name] = opened
                self._pages.add(_path(name), Reply(body=_OPEN, stall_after=0, stall=opened))
        return self._pages.url(_path(name))

    def arrivals(self, name: str) -> int:
        """How many requests reached the gate so far, held or let through."""
        return self._pages.hits[_path(name)]

    def open(self, name: str) -> None:
        """Let every held request through, and every later one at once."""
        self.url(name)
        self._opened[name].set()

    def close(self) -> None:
        """Open every gate and stop the server, so no held thread outlives the test."""
        for opened in self._opened.values():
            opened.set()
        self._pages.stop()


def _path(name: str) -> str:
    return f"/gates/{name}"


def pass_gate(url: str, timeout: float = 600.0) -> None:
    """Wait until the gate at `url` opens.

    gevent's own socket, so the wait is cooperative in a monkey-patched worker
    and in the unpatched tests' process alike, and a gevent timeout or kill
    stops it. `timeout` only bounds a gate a test forgot to open.
    """
    parts = urlsplit(url)
    if not (parts.hostname and parts.port):
        raise ValueError(f"not a gate's URL: {url}")
    with gsocket.create_connection((parts.hostname, parts.port), timeout=timeout) as conn:
        conn.sendall(f"GET {parts.path} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    status = answer.split(b"\r\n", 1)[0]
    if not (status.split(b" ")[1:2] == [b"200"] and answer.endswith(_OPEN)):
        raise RuntimeError(f"the gate at {url} answered {status!r}")
