"""gunicorn's access log, written by the real gunicorn.conf.py: a client cannot forge its fields.

Every field taken from the request is in double quotes, with `"`, `\\` and
every character outside printable ASCII escaped (`\\"`, `\\\\`, `\\xHH`,
`\\uHHHH`), so a line reads back as exactly one request's fields, whatever
the client sent: no quote ends a field early, no newline starts a line.
"""

from __future__ import annotations

import codecs
import re
import socket
import uuid

import pytest

from tests.support.servers import wait_until

pytestmark = pytest.mark.sqlite_only(
    "gunicorn's access log lines are the same whatever the database"
)

QUOTED = r'"((?:[^"\\]|\\.)*)"'
# The whole line, field by field, as gunicorn.conf.py's access_log_format writes it.
LINE = re.compile(
    rf"{QUOTED} fwd={QUOTED} {QUOTED} (\d{{3}}) (\d+|-) (\d+)ms "
    rf"rid=([A-Za-z0-9._-]+) pid=<(\d+)> {QUOTED}"
)

FORGERIES = {
    "quote": b'x" rid=forged pid=<1> "',
    "backslash-quote": b'x\\" rid=forged pid=<1> "',
    "backslash-end": b"x\\",
    # Bytes past ASCII reach the app as latin-1: U+0085 is a line break to
    # Unicode-aware readers.
    "latin-1": b"caf\xe9 \xff\x85rid=forged\xa0",
    # Control characters: gunicorn refuses the request itself (400, no
    # access line); were it to let one through, it must come out escaped.
    "escape-sequences": b"\x1b[31mred\x1b[0m \x07\x0b\x7f",
    "bare-cr": b"a\rrid=forged",
}


def send(port: int, request: bytes) -> bytes:
    """One raw request (so its bytes are exactly the test's), and the answer's bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def unescaped(field: str) -> bytes:
    """A quoted field of the log read back: the bytes the client sent (as
    latin-1, as WSGI hands header bytes to the app)."""
    return codecs.decode(field.encode("ascii"), "unicode_escape").encode("latin-1")


def lines_of(log: str, request_id: str) -> list[str]:
    return [line for line in log.splitlines() if request_id in line]


CASES = [(header, name) for header in ("User-Agent", "X-Forwarded-For") for name in FORGERIES]


def test_forged_headers_and_request_lines_stay_inside_their_own_fields(served, start_gunicorn):
    server = start_gunicorn(workers=1)
    [worker] = server.worker_pids()
    sent = {}
    for header, name in CASES:
        request_id = uuid.uuid4().hex
        answer = send(
            server.port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"X-Request-ID: {request_id}\r\n{header}: ".encode()
            + FORGERIES[name]
            + b"\r\n\r\n",
        )
        sent[request_id] = (header, FORGERIES[name], b"/healthz", answer)
    target = b'/healthz?x=\\"%20rid=forged%20"'
    request_id = uuid.uuid4().hex
    answer = send(
        server.port,
        b"GET "
        + target
        + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"X-Request-ID: {request_id}\r\n\r\n".encode(),
    )
    sent[request_id] = (None, b"", target, answer)

    answered = {request_id for request_id, case in sent.items() if status_of(case[3]) != 400}
    wait_until(
        lambda: all(lines_of(server.log(), request_id) for request_id in answered),
        30,
        "a request has no access log line",
    )
    log = server.log()
    for request_id, (header, value, target, answer) in sent.items():
        lines = lines_of(log, request_id)
        if request_id not in answered and not lines:
            continue  # refused by gunicorn before the app: no access line
        [line] = lines
        assert line.isascii(), line
        assert line.isprintable(), line
        fields = LINE.fullmatch(line)
        assert fields, line
        address, forwarded, request_line, status, _, _, rid, pid, agent = fields.groups()
        assert (rid, int(pid)) == (request_id, worker)
        assert int(status) == status_of(answer)
        assert unescaped(request_line) == b"GET " + target + b" HTTP/1.1"
        assert address == "127.0.0.1"
        logged = {"User-Agent": agent, "X-Forwarded-For": forwarded}
        for name, field in logged.items():
            assert unescaped(field) == (value.strip() if name == header else b"-"), line
    # Nothing a client sent made a line of its own: every line holding a
    # forgery is one request's whole line.
    for line in log.splitlines():
        if "forged" in line:
            fields = LINE.fullmatch(line)
            assert fields, line
            assert fields.group(7) in sent, line
