"""Recipe pages parsed (and shopping lists read) in processes of their own,
a few kept warm, each killed at its time limit.

A page can make parsing endless (see `mealquest.recipes.parser_process`),
and neither a `gevent.Timeout` nor anything else stops a native thread: a
parse in gevent's thread pool held its thread (and the DNS resolver, which
shares that pool) for as long as the page liked. Here a parse holds a
process instead, which is killed when the parse's time is up, the job is
cancelled or times out, or the pool stops (whatever exception ends the
waiting greenlet kills the process on its way out).

Waiting on a process never blocks the event loop, patched or not: its
pipes are read and written through gevent's non-blocking `os` calls, and
its exit is polled. A process is started with `os.posix_spawn`, a fresh
interpreter, and no Python runs between the fork and the exec: the right
call in a process with native threads, where a forked copy could wait
forever on a lock another thread held (gevent's `subprocess` forks in
Python, and reaps every child of the process through SIGCHLD, which in an
unpatched process takes other children's exit statuses from their
owners). It inherits no descriptor but its pipes and stderr (any other one
the service left inheritable is closed in it: a listening socket, a
database connection), none of the service's environment (no database URL,
no secret, no metrics directory), no ignored or blocked signal (SIGXCPU
must end it), and has a session of its own (a terminal's Ctrl-C is for the
service, which stops its jobs itself).

Starting a process costs an interpreter and the parsing libraries' imports
(about a second of CPU, measured by `python -m bench.parsing`); a parse on
a warm one costs the parse. So each process goes back to the pool after its
parse, up to `keep` of them; and while fewer than `keep` exist, one more is
started in the background whenever none is free (when one is taken, or
killed), so that the next parse finds a warm one: a household whose import
comes while other pages hold processes does not wait for a start. Every
parse has a process of its own, and none waits for another's parse.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import gevent
import gevent.os
from gevent import monkey

from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes.fetch import Page
from mealquest.recipes.parse import ParserFailed
from mealquest.recipes.parser_process import LENGTH, MAX_FRAME, frame, resident_size

logger = logging.getLogger(__name__)

# The system's waitpid, also in a monkey-patched process (gevent's gives the
# same answer for a child it does not watch, by calling this one).
_waitpid = monkey.get_original("os", "waitpid")
# Every signal the child's start resets to its default action.
_DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
# A parser process's address space beyond its size once the libraries are
# imported: a dense 4 MiB page (the fetch cap) took about 340 MB here.
MEMORY_HEADROOM = 512 * 1024 * 1024
# Time for a new process to import the parsing libraries (about a second of
# CPU, more on a loaded machine) before the pool gives up on it.
START_SECONDS = 60.0
_REAP_SECONDS = 5.0
# How often a parse's resident size is looked at: a dense page grows a
# parser by well under the headroom in this time.
_MEMORY_WATCH_SECONDS = 0.05
# How far past the wall-clock limit a parse's own CPU limit is by default:
# that limit counts whole seconds from what the process had used, so without
# a margin it could fall as little as nothing past the wall clock's, and a
# parent whose timer fired a moment late under load saw the backstop end the
# parse it was about to end itself.
_CPU_BACKSTOP_SECONDS = 1.0
_CHUNK = 1024 * 1024
_CHILD = "import sys; from mealquest.recipes.parser_process import main; main(sys.argv[1:])"
# `returncode` of a process that someone else reaped.
_UNKNOWN = -(2**31)


class PageUnreadable(Exception):
    """the page could not be read"""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        # Why, in words safe to log: a limit, or how the process ended.
        self.reason = reason


class ParserUnavailable(Exception):
    """no recipe parser process could be started"""


class _ProcessGone(Exception):
    """The process closed its pipes: it ended (or is ending)."""


class _TimeUp(Exception):
    """The parse's time limit passed."""


class ParserProcess:
    """One parser process and its two pipes, driven cooperatively."""

    def __init__(self, memory_headroom: int) -> None:
        to_child_read, to_child = (_above_stdio(fd) for fd in os.pipe())
        from_child, from_child_write = (_above_stdio(fd) for fd in os.pipe())
        try:
            self.pid: int = _spawn(
                [sys.executable, "-c", _CHILD, str(os.getpid()), str(memory_headroom)],
                stdin=to_child_read,
                stdout=from_child_write,
            )
        except BaseException:
            for fd in (to_child, from_child):
                os.close(fd)
            raise
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
        self.returncode: int | None = None
        # Set from the ready answer: the resident size past which the
        # process is killed while it parses (None: unknown, not watched).
        self.resident_limit: int | None = None
        self.past_memory_limit = False
        self._to_child = to_child
        self._from_child = from_child
        gevent.os.make_nonblocking(to_child)
        gevent.os.make_nonblocking(from_child)

    def wait_ready(self, seconds: float) -> None:
        """Until the process has imported the libraries; ParserUnavailable if it cannot."""
        try:
            with gevent.Timeout(seconds, _TimeUp):
                answer = self._read_answer()
        except (_TimeUp, _ProcessGone):
            answer = {}
        if answer.get("ready") is not True:
            self.kill()
            raise ParserUnavailable(f"{ParserUnavailable.__doc__} ({self.how_it_ended()})")
        limit = answer.get("resident_limit")
        self.resident_limit = limit if isinstance(limit, int) else None

    def exchange(self, header: dict[str, Any], body: bytes, seconds: float) -> dict[str, Any]:
        """Send a page and wait, at most `seconds`, for the answer; the process
        is killed if it grows past its resident limit meanwhile."""
        watch = None if self.resident_limit is None else gevent.spawn(self._watch_memory)
        try:
            with gevent.Timeout(seconds, _TimeUp):
                self._write(frame(json.dumps(header).encode()) + LENGTH.pack(len(body)))
                self._write(body)
                return self._read_answer()
        finally:
            if watch is not None:
                watch.kill(block=False)

    def _watch_memory(self) -> None:
        assert self.resident_limit is not None
        while self.poll() is None:
            resident = resident_size(self.pid)
            if resident is not None and resident > self.resident_limit:
                self.past_memory_limit = True
                self._signal(signal.SIGKILL)
                return
            gevent.sleep(_MEMORY_WATCH_SECONDS)

    def alive(self) -> bool:
        return self.poll() is None

    def poll(self) -> int | None:
        """The exit status (negative: the signal), once the process ended and
        is reaped; reaps it if it has ended."""
        if self.returncode is None:
            try:
                pid, status = _waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped by someone else (a SIGCHLD handler reaping every
                # child): it has ended, how is unknown.
                self.returncode = _UNKNOWN
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the process and reap it (cooperatively, within a bound)."""
        self._signal(signal.SIGKILL)
        self._close_pipes()
        self._reap()

    def close(self) -> None:
        """End a process that is not parsing: it exits when its stdin closes
        (killed if it has not within a bound)."""
        self._close_pipes()
        self._reap(kill_after=_REAP_SECONDS)

    def how_it_ended(self) -> str:
        """Words for the log: the limit that ended the process, or its status."""
        code = self.returncode
        if self.past_memory_limit:
            return "past its memory limit"
        if code is None:
            return "still running"
        if code == _UNKNOWN:
            return "ended"
        if code == -signal.SIGXCPU:
            return "past its CPU time limit"
        if code < 0:
            return f"ended by {signal.Signals(-code).name}"
        return f"exited with status {code}"

    def kill_now(self) -> None:
        """SIGKILL at once, without waiting (the service's process is ending:
        whatever is not reaped now, the system reaps after it)."""
        self._signal(signal.SIGKILL)
        self._close_pipes()
        self.poll()

    def _signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def _reap(self, kill_after: float | None = None) -> None:
        deadline = time.monotonic() + (kill_after if kill_after is not None else _REAP_SECONDS)
        delay = 0.001
        try:
            while self.poll() is None:
                if time.monotonic() > deadline:
                    if kill_after is not None:
                        kill_after = None
                        deadline = time.monotonic() + _REAP_SECONDS
                        self._signal(signal.SIGKILL)
                        continue
                    logger.error("recipe parser process %d did not end when killed", self.pid)
                    return
                gevent.sleep(delay)
                delay = min(delay * 2, 0.05)
        except BaseException:
            # Stopped while waiting (the job's greenlet killed again): the
            # process is signalled; reap it in the background.
            gevent.spawn(self._reap)
            raise

    def _close_pipes(self) -> None:
        for name in ("_to_child", "_from_child"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = gevent.os.nb_write(self._to_child, view[:_CHUNK])
            except OSError as error:
                if error.errno in (errno.EPIPE, errno.EBADF):
                    raise _ProcessGone() from None
                raise
            view = view[written:]

    def _read_exactly(self, size: int) -> bytes:
        chunks: list[bytes] = []
        left = size
        while left:
            try:
                chunk = gevent.os.nb_read(self._from_child, min(left, _CHUNK))
            except OSError as error:
                if error.errno == errno.EBADF:
                    raise _ProcessGone() from None
                raise
            if not chunk:
                raise _ProcessGone()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read_answer(self) -> dict[str, Any]:
        (length,) = LENGTH.unpack(self._read_exactly(LENGTH.size))
        if length > MAX_FRAME:
            raise _ProcessGone()
        answer = json.loads(self._read_exactly(length))
        if not isinstance(answer, dict):
            raise _ProcessGone()
        return answer


class ParserPool:
    """Parser processes for one service process: one per parse, `keep` kept warm."""

    def __init__(
        self,
        keep: int,
        *,
        memory_headroom: int = MEMORY_HEADROOM,
        start_seconds: float = START_SECONDS,
    ) -> None:
        self.keep = keep
        self.memory_headroom = memory_headroom
        self.start_seconds = start_seconds
        self.owner = os.getpid()
        self._idle: list[ParserProcess] = []
        self._busy: set[ParserProcess] = set()
        # The spare being started in the background, if one is.
        self._spare: gevent.Greenlet | None = None
        # Processes started so far (a figure for tests and benchmarks).
        self.started = 0

    def parse(
        self, page: Page, *, seconds: float, cpu_seconds: float | None = None
    ) -> ParsedRecipe | None:
        """The page's recipe, or None; at most `seconds` on the wall clock and
        `cpu_seconds` of CPU (by default a second more: the process's own
        limit is a backstop for a parent that cannot see to it). PageUnreadable
        past either, or if the process ends without an answer (its memory
        limit, a crash); ParserFailed if the parsing library raised."""
        header = {"task": "parse", "url": page.url, "content_type": page.content_type}
        answer = self._run(header, page.body, seconds=seconds, cpu_seconds=cpu_seconds)
        if "failed" in answer:
            raise ParserFailed(str(answer["failed"]))
        recipe = answer.get("recipe")
        return None if recipe is None else ParsedRecipe(**recipe)

    def merge(
        self,
        recipes: Sequence[tuple[str, Sequence[str]]],
        *,
        seconds: float,
        cpu_seconds: float | None = None,
    ) -> list[dict[str, Any]]:
        """The shopping list of `(title, ingredient lines)` of each recipe
        (`ingredients.merge`, as `Item.as_dict`s), read in a parser process
        within the same limits as a page's parse: PageUnreadable past them."""
        body = json.dumps([[title, list(lines)] for title, lines in recipes]).encode()
        answer = self._run({"task": "merge"}, body, seconds=seconds, cpu_seconds=cpu_seconds)
        items = answer.get("items")
        if not isinstance(items, list):
            raise PageUnreadable("its parser process gave no list")
        return items

    def _run(
        self, header: dict[str, Any], body: bytes, *, seconds: float, cpu_seconds: float | None
    ) -> dict[str, Any]:
        """The answer of a process of the pool to one task, within its limits."""
        process = self._take()
        if cpu_seconds is None:
            cpu_seconds = seconds + _CPU_BACKSTOP_SECONDS
        self._busy.add(process)
        try:
            answer = process.exchange({**header, "cpu_seconds": cpu_seconds}, body, seconds)
        except _TimeUp:
            self._kill(process, refill=True)
            raise PageUnreadable(f"past its time limit ({seconds:g} s)") from None
        except _ProcessGone:
            self._kill(process, refill=True)
            raise PageUnreadable(f"its parser process {process.how_it_ended()}") from None
        except BaseException:
            # Stopped from outside (a cancel, the job's timeout, the pool
            # stopping): no spare for it.
            self._kill(process, refill=False)
            raise
        self._busy.discard(process)
        self._give_back(process, retire=bool(answer.get("retire")))
        if "unreadable" in answer:
            raise PageUnreadable(f"past its {answer['unreadable']} limit")
        return answer

    def busy_pids(self) -> list[int]:
        """The processes parsing now."""
        return [process.pid for process in self._busy]

    def idle_pids(self) -> list[int]:
        return [process.pid for process in self._idle]

    def keep_at_most(self, keep: int) -> None:
        """Keep `keep` from now on; idle processes beyond it end (in the background)."""
        self.keep = keep
        extra, self._idle = self._idle[keep:], self._idle[:keep]
        for process in extra:
            gevent.spawn(process.close)

    @property
    def spare_starting(self) -> bool:
        """Whether a process is being started in the background."""
        return self._spare is not None and not self._spare.dead

    def stop(self) -> None:
        """Kill every process at once (the service's process is ending)."""
        if self.spare_starting:
            assert self._spare is not None
            self._spare.kill(block=False)
        for process in [*self._idle, *self._busy]:
            process.kill_now()
        self._idle.clear()

    def _take(self) -> ParserProcess:
        while True:
            while self._idle:
                process = self._idle.pop()
                if process.alive():
                    self._start_spare(taking=1)
                    return process
                process.kill()
            if not self.spare_starting:
                break
            # Started before this parse came, it is warm sooner than a new one.
            assert self._spare is not None
            self._spare.join()
        process = self._start()
        self._start_spare(taking=1)
        return process

    def _kill(self, process: ParserProcess, *, refill: bool) -> None:
        self._busy.discard(process)
        if refill:
            self._start_spare(taking=0)
        process.kill()

    def _start_spare(self, *, taking: int) -> None:
        """Start one more process in the background if none is free and fewer
        than `keep` exist (counting the `taking` just taken from the pool)."""
        if self._idle or self.spare_starting or len(self._busy) + taking >= self.keep:
            return
        self._spare = gevent.spawn(self._add_spare)

    def _add_spare(self) -> None:
        try:
            process = self._start()
        except ParserUnavailable:
            return  # logged; the next parse tries again
        self._give_back(process, retire=False)

    def _start(self) -> ParserProcess:
        self.started += 1
        try:
            process = ParserProcess(self.memory_headroom)
        except OSError as error:
            raise ParserUnavailable(f"{ParserUnavailable.__doc__} ({error.strerror})") from None
        try:
            process.wait_ready(self.start_seconds)
        except ParserUnavailable:
            logger.error(
                "recipe parser process %d did not start (%s)", process.pid, process.how_it_ended()
            )
            raise
        except BaseException:
            process.kill()
            raise
        return process

    def _give_back(self, process: ParserProcess, *, retire: bool) -> None:
        if retire or len(self._idle) >= self.keep:
            process.close()
        else:
            self._idle.append(process)


def _spawn(argv: list[str], *, stdin: int, stdout: int) -> int:
    """Start `argv` on these descriptors and this process's stderr (where a
    process that cannot start says why), in a session of its own, without
    anything else of this process's (see the module's docstring)."""
    try:
        stderr = _above_stdio(os.dup(2))
    except OSError:  # no stderr here: none there either
        stderr = _above_stdio(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
    # dup2 clears close-on-exec on the copy only: every descriptor here is
    # above 2, so each copy is a new one.
    actions: list[tuple[int, ...]] = [
        (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_descriptors() if fd > 2]
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            _child_environment(),
            file_actions=actions,
            setsid=True,
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    finally:
        os.close(stderr)


def _above_stdio(fd: int) -> int:
    """`fd`, or a close-on-exec copy of it numbered above 2 (a process whose
    stdin or stdout is closed gets such numbers from `pipe`)."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _inheritable_descriptors() -> list[int]:
    """This process's descriptors an exec would keep open (Python makes its own
    non-inheritable; one a library or a server made inheritable would not be)."""
    try:
        listed = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        listed = list(range(3, 256))
    inheritable = []
    for fd in listed:
        with contextlib.suppress(OSError):
            if os.get_inheritable(fd):
                inheritable.append(fd)
    return inheritable


_shared: ParserPool | None = None


def shared(keep: int | None = None) -> ParserPool:
    """This process's pool (made on first use here, never inherited across a
    fork: its processes are the parent's children), keeping at most `keep`
    (unchanged when None; 1 at first)."""
    global _shared
    if _shared is None or _shared.owner != os.getpid():
        _shared = ParserPool(1)
        atexit.register(_shared.stop)
    if keep is not None:
        _shared.keep_at_most(keep)
    return _shared


def _child_environment() -> dict[str, str]:
    """Only where to import from: the service's environment holds its database
    URL and secret key, which a process reading strangers' pages never needs."""
    paths = [os.path.abspath(path or os.curdir) for path in sys.path]
    return {"PYTHONPATH": os.pathsep.join(paths)}
