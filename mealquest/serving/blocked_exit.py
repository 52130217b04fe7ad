"""Ends a `flask jobs work` process whose event loop stays blocked.

gunicorn's master kills a web worker whose event loop has not said it lives
for `timeout` seconds. Nothing did that for a process that runs jobs alone:
a handler that blocks the loop (a CPU loop that never yields, a C call
gevent cannot make cooperative) stopped the process's heartbeats while the
process lived on, its jobs' leases expired, and another process rescued
them and ran them again beside the handlers still running here. This is
that process's own master: a greenlet stamps the time every tick, and a
native thread, which a blocked loop cannot stop, ends the process once the
stamp has been left unrenewed past the limit. The configuration refuses a
lease that does not exceed the limit plus a heartbeat, so the process is
gone before any lease of its can expire.

The end is `os._exit`: nothing at the Python level can run while the loop
is blocked (a graceful stop needs the loop; logging takes locks that are
gevent's in a patched process). The one line it leaves is written to stderr
by `os.write`.

A process that did not run at all for a while (SIGSTOP, a paused machine, a
starved host) also finds an old stamp when it resumes, though its loop was
only stopped with everything else: see `BlockedLoop`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import termios
import time

import gevent
from gevent.greenlet import Greenlet
from gevent.monkey import get_original

_start_native_thread = get_original("_thread", "start_new_thread")
_native_lock = get_original("_thread", "allocate_lock")

# A failure, so that a supervisor (systemd's Restart=on-failure) starts a new process.
EXIT_STATUS = 1
# The thread reads the stamp this many times per limit, and at least this often.
_READINGS_PER_LIMIT = 20
_LONGEST_TICK_SECONDS = 0.25
# A gap between two of the thread's own readings longer than this (or than
# two ticks) means the thread did not run either: it counts only this much.
_ON_TIME_SECONDS = 0.5
# How long the line on stderr may take (a pipe nobody reads) before the exit
# goes ahead without it.
_WRITE_SECONDS = 1.0
# fcntl's F_GETPIPE_SZ (Linux 2.6.35+), which Python 3.11's fcntl names only on some builds.
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class BlockedLoop:
    """What the watching thread concludes from its readings, given as times
    (so a test can give them): when the loop has been blocked past the limit.

    The loop's blocked time is counted only across gaps between this thread's
    readings that came on time: a longer gap means the thread did not run
    either, so the whole process was stopped or starved, not its loop
    blocked, and such a gap counts only as long as an on-time one. And a
    block is the verdict only when two readings in a row, each on time, find
    the same stamp past the limit.
    """

    def __init__(self, limit_seconds: float, tick_seconds: float) -> None:
        self.limit_seconds = limit_seconds
        self.on_time_seconds = max(2 * tick_seconds, _ON_TIME_SECONDS)
        self._last_reading: float | None = None
        self._stamp: float | None = None
        self._blocked = 0.0
        self._past_limit = False

    def read(self, now: float, stamp: float) -> float | None:
        """One reading at `now` of the loop's last stamp: how long the loop has
        been blocked, once that is past the limit and confirmed; else None."""
        gap = 0.0 if self._last_reading is None else now - self._last_reading
        self._last_reading = now
        if stamp != self._stamp:
            # Stamped since the last reading (or the first one): blocked since then.
            self._stamp = stamp
            self._blocked = min(max(now - stamp, 0.0), self.on_time_seconds)
        else:
            self._blocked += min(gap, self.on_time_seconds)
        past_limit = gap <= self.on_time_seconds and self._blocked > self.limit_seconds
        confirmed = past_limit and self._past_limit
        self._past_limit = past_limit
        return self._blocked if confirmed else None


class BlockedLoopExit:
    """Exits the process once its event loop has been blocked past `limit_seconds`.

    `start` from the thread whose hub runs the pool; `stop` before the
    process ends normally (interpreter shutdown stamps nothing).
    """

    def __init__(self, limit_seconds: float) -> None:
        self.limit_seconds = limit_seconds
        self.tick_seconds = min(limit_seconds / _READINGS_PER_LIMIT, _LONGEST_TICK_SECONDS)
        # Written by the greenlet, read by the thread: one float, swapped whole.
        self._stamp = time.monotonic()
        self._stopped = False
        self._greenlet: Greenlet | None = None
        # The thread waits a tick on this lock, held until `stop` releases it:
        # a timed lock wait, not `time.sleep`, which fails (EINVAL) in a
        # process whose wall clock libfaketime moves.
        self._stop_requested = _native_lock()
        self._stop_requested.acquire()

    def start(self) -> None:
        self._stamp = time.monotonic()
        self._greenlet = gevent.spawn(self._stamp_every_tick)
        _start_native_thread(self._watch, ())

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop_requested.release()
        if self._greenlet is not None:
            self._greenlet.kill(block=False)

    def _stamp_every_tick(self) -> None:
        # A timer, as the heartbeat is: while this runs, the heartbeat can too.
        while True:
            self._stamp = time.monotonic()
            gevent.sleep(self.tick_seconds)

    def _watch(self) -> None:
        # The native thread: no gevent call and no logging here. A process
        # that has lost this guard could run a job twice: it ends too.
        try:
            self._watch_until_stopped()
        except BaseException as error:
            _exit_now(
                f"mealquest: the watch of this process's event loop failed ({error!r}): "
                "exiting, since a blocked loop could no longer end it\n"
            )

    def _watch_until_stopped(self) -> None:
        loop = BlockedLoop(self.limit_seconds, self.tick_seconds)
        while not self._stop_requested.acquire(timeout=self.tick_seconds):
            blocked = loop.read(time.monotonic(), self._stamp)
            if blocked is not None and not self._stopped:
                _exit_now(
                    f"mealquest: the event loop of this process (pid {os.getpid()}) has been "
                    f"blocked for {blocked:.1f}s, past MEALQUEST_JOB_BLOCKED_EXIT_SECONDS "
                    f"({self.limit_seconds:g}): exiting at once, before its jobs' leases can "
                    "expire\n"
                )


def _exit_now(line: str) -> None:
    """Write `line` to stderr, then end the process without cleanup. Where
    stderr takes it at once (a file, a pipe with room), it is written here;
    else from a thread of its own, given a moment, so that a full pipe cannot
    hold the exit. (Always from a thread, the line was lost once in CI: on a
    loaded machine, with the blocked loop holding the GIL, the thread did not
    get to run within the moment.)"""
    data = line.encode()
    if _takes_at_once(2, len(data)):
        with contextlib.suppress(OSError):
            os.write(2, data)
        os._exit(EXIT_STATUS)
    written = _native_lock()
    written.acquire()

    def write() -> None:
        try:
            os.write(2, data)
        except OSError:
            pass
        finally:
            written.release()

    _start_native_thread(write, ())
    written.acquire(timeout=_WRITE_SECONDS)
    os._exit(EXIT_STATUS)


def _takes_at_once(fd: int, size: int) -> bool:
    """Whether a write of `size` bytes to `fd` cannot block: a regular file,
    or a pipe with that much room (Linux: its size less what is unread)."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            return True
        if not stat.S_ISFIFO(mode):
            return False
        capacity = fcntl.fcntl(fd, _F_GETPIPE_SZ)
        unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return False
    return capacity - unread >= size
