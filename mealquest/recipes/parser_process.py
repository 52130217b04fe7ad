"""What runs in a recipe parser process: parse pages (or read a shopping
list's ingredient lines) sent on stdin, answer on stdout.

Parsing a page is CPU work that a page can make endless (Python's
`html.parser`, which recipe-scrapers uses, is quadratic on a run of
unclosed tags), and that neither a greenlet nor a native thread can be
stopped in; reading ingredient lines is CPU work too (a model per line,
whose cost a stranger's line can raise a hundredfold), which in gevent's
thread pool held the threads that the DNS resolver shares. A process can
be stopped: this one is started by
`mealquest.recipes.parser_pool` with a fresh interpreter (never a fork of
a service process: it holds nothing of the service's, no connection, no
listening socket, no lock another thread held), and its parent kills it
when a parse runs past its time. Within, it limits itself too, so that it
ends even if its parent cannot see to it:

* its memory: its parent kills it once its resident size passes its size
  once the parsing libraries are imported plus `memory_headroom` (the
  ready answer says where that is); its address space is capped too, at
  twice that headroom, only as a backstop where the parent cannot watch.
  The parent's watch is the limit because an allocation that fails at the
  cap can leave CPython's exception unwinding retrying a small allocation
  forever (3.11's eval loop does: a parse seen spinning at 100% CPU for
  minutes here), so a limit that makes allocations fail is never relied on;
* the CPU time of each parse (RLIMIT_CPU, raised before each one by the
  CPU it has used so far: SIGXCPU ends it);
* it dies with its parent (Linux's parent-death signal) and exits when its
  stdin closes;
* it runs `NICENESS` steps below its parent's CPU priority: the pages of
  the machine's parses burn CPU that the service's own processes (their
  event loops, the heartbeats that keep every job's lease) and the
  database must win first. Measured through real gunicorn on two cores,
  eight pages parsing at the service's priority delayed the heartbeats past
  a 2 s lease on PostgreSQL and their jobs were taken back;
* no core files, and nothing on stderr once it is ready (a traceback could
  quote the page's address).

Frames, both ways: a 4-byte big-endian length, then that many bytes. A
request is two frames, a JSON header (`task`, `cpu_seconds`, and for a page
`url` and `content_type`) and a body; an answer is one JSON frame. A page
(task `parse`, the body the page's bytes) is answered
`{"recipe": {...} or null}` or `{"failed": "<error type>"}` (the parsing
library raised); a list (task `merge`, the body the JSON
`[[title, [line, ...]], ...]`) is answered `{"items": [...]}`
(`ingredients.Item.as_dict`). Either may be answered
`{"unreadable": "memory"}`, with `"retire": true` when
the process ends after it (it grew past `RETIRE_GROWTH`, or ran out of
memory). The first answer, once the libraries are imported, is
`{"ready": true, "resident_limit": <bytes>}` (null where the resident size
cannot be read).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import resource
import signal
import struct
import sys
from collections.abc import Callable
from typing import Any

from mealquest.recipes.fetch import Page
from mealquest.recipes.parse import ParserFailed, parse_page, parsing_library

LENGTH = struct.Struct(">I")
# An answer is a recipe cut to the stored sizes: well below this.
MAX_FRAME = 64 * 1024 * 1024
# A process whose peak memory grew this much past its start ends after its
# answer, rather than keep a large heap while it waits for the next page.
RETIRE_GROWTH = 128 * 1024 * 1024
_PR_SET_PDEATHSIG = 1
# Weighs a parse at a tenth of a service process when both want the CPU.
NICENESS = 10
# Fields of /proc/PID/statm, in pages.
_STATM_SIZE = 0
_STATM_RESIDENT = 1
# The largest CPU limit set (a year): a setting past it is no limit anyway.
_MAX_CPU_SECONDS = 365 * 24 * 3600


def read_frame(fd: int) -> bytes | None:
    """The next frame from `fd` (blocking), or None at end of file."""
    header = _read_exactly(fd, LENGTH.size)
    if header is None:
        return None
    (length,) = LENGTH.unpack(header)
    if length > MAX_FRAME:
        raise ValueError("frame too long")
    body = _read_exactly(fd, length)
    if body is None:
        raise EOFError("stream ended inside a frame")
    return body


def frame(data: bytes) -> bytes:
    return LENGTH.pack(len(data)) + data


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, 1024 * 1024))
        if not chunk:
            if left == size:
                return None
            raise EOFError("stream ended inside a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _answer(fd: int, answer: dict[str, Any]) -> None:
    _write(fd, frame(json.dumps(answer).encode()))


def _die_with(parent: int) -> None:
    """Be killed when the parent dies (Linux), and end now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _address_space() -> int | None:
    """This process's virtual size in bytes (Linux), or None where unknown."""
    return statm_bytes(os.getpid(), _STATM_SIZE)


def resident_size(pid: int) -> int | None:
    """A process's resident size in bytes (Linux), or None where unknown."""
    return statm_bytes(pid, _STATM_RESIDENT)


def statm_bytes(pid: int, field: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            pages = int(statm.read().split()[field])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def _limit_cpu(seconds: float) -> None:
    """Let the next parse use `seconds` more of CPU (whole seconds: the limit's unit)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used + min(seconds, _MAX_CPU_SECONDS))
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _peak_rss() -> int:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _parse(header: dict[str, Any], body: bytes) -> dict[str, Any]:
    page = Page(url=header["url"], content_type=header["content_type"], body=body)
    try:
        parsed = parse_page(page)
    except ParserFailed as error:
        return {"failed": str(error)}
    return {"recipe": None if parsed is None else dataclasses.asdict(parsed)}


def _merge(_header: dict[str, Any], body: bytes) -> dict[str, Any]:
    # Imported at the first list, not at the start: most processes only
    # ever parse pages, and the model costs 50 MB.
    from mealquest.recipes import ingredients

    recipes = [(str(title), [str(line) for line in lines]) for title, lines in json.loads(body)]
    return {"items": [item.as_dict() for item in ingredients.merge(recipes)]}


TASKS: dict[str, Callable[[dict[str, Any], bytes], dict[str, Any]]] = {
    "parse": _parse,
    "merge": _merge,
}


def serve(parent: int, memory_headroom: int) -> None:
    """Answer requests on stdin until it closes (or a limit ends the process)."""
    _die_with(parent)
    # Before the sizes below are read: a process's resident size once the
    # library is loaded is where its memory limit starts.
    parsing_library()
    os.nice(NICENESS)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = _address_space()
    if size is not None:
        limit = size + 2 * memory_headroom
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    started_rss = _peak_rss()
    resident = resident_size(os.getpid())
    stdin, stdout = 0, 1
    resident_limit = None if resident is None else resident + memory_headroom
    _answer(stdout, {"ready": True, "resident_limit": resident_limit})
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    while True:
        header_frame = read_frame(stdin)
        if header_frame is None:
            return
        header = json.loads(header_frame)
        body = read_frame(stdin)
        if body is None:
            return
        _limit_cpu(float(header["cpu_seconds"]))
        try:
            answer = TASKS[header.get("task", "parse")](header, body)
        except MemoryError:
            answer = {"unreadable": "memory", "retire": True}
        del body
        if _peak_rss() - started_rss > RETIRE_GROWTH:
            answer["retire"] = True
        _answer(stdout, answer)
        if answer.get("retire"):
            return


def main(argv: list[str]) -> None:
    """`python -c '…main(sys.argv[1:])' PARENT_PID MEMORY_HEADROOM`, as the pool starts it."""
    parent, memory_headroom = (int(arg) for arg in argv)
    serve(parent, memory_headroom)
