"""gunicorn settings for MealQuest (see the README's deployment section).

This file is read by the master (and again on SIGHUP). It imports nothing of
ours and opens nothing at module level: a connection or a module-level lock
made before fork would be shared by, or stay unpatched in, every worker. The
worker hooks import `mealquest.serving.worker` inside their bodies, in the
worker, once the gevent worker has monkey-patched; the master's preflight
runs `mealquest.serving.preflight` in a child process. No `preload_app`, for
the same reason.

Any setting can be overridden with GUNICORN_CMD_ARGS or command-line flags.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from gunicorn.glogging import Logger, SafeAtoms
from gunicorn.workers import ggevent

if TYPE_CHECKING:  # for the hooks' hints only; nothing is imported at run time
    from gunicorn.arbiter import Arbiter
    from gunicorn.workers.base import Worker

# The app gunicorn loads in each worker when no APP_MODULE is given.
wsgi_app = "wsgi:app"


class GeventWorker(ggevent.GeventWorker):
    """gunicorn's gevent worker, its monkey-patching with gevent's plugin
    lookups read once (`mealquest.gevent_patching`: 0.5 s of each worker's
    start). The import is in the worker, before it patches; the module
    imports nothing but the standard library and gevent."""

    def patch(self) -> None:
        from mealquest.gevent_patching import entry_points_read_once

        with entry_points_read_once():
            super().patch()


# gevent workers: one process serves many requests and runs the job pool's greenlets.
worker_class = GeventWorker
# Where to listen; behind nginx, keep it on loopback (or a unix socket: "unix:/run/...").
bind = os.environ.get("MEALQUEST_BIND", "127.0.0.1:8000")
# Worker processes; each runs its own job pool. 2 fits a small machine.
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# Requests (connections) one gevent worker serves at once.
worker_connections = 1000
# Seconds a worker may go without telling the master it is alive before it is
# killed. A gevent worker tells it every second unless its hub is blocked (the
# store never blocks it; a handler that does is named in the log by the hub
# monitor). It must exceed graceful_timeout: a worker past its main loop,
# draining its pool in worker_exit, no longer tells it. And it must stay below
# MEALQUEST_JOB_LEASE_SECONDS minus a heartbeat (60 - 20 by default), so that
# a worker whose hub is blocked is killed before its jobs' leases expire and
# no other process starts a job it still runs: the preflight refuses to start
# otherwise (and refuses 0, which never kills), unless the workers run no jobs
# (MEALQUEST_JOB_POOL_IN_WEB=false).
timeout = 30
# Seconds a stopping worker (SIGTERM, SIGHUP, max_requests) has to finish its
# requests and jobs before the master SIGKILLs it; the pool gets this minus a
# second, then records the jobs it had to stop. systemd's TimeoutStopSec must
# be longer.
graceful_timeout = 25
# Seconds an idle keep-alive connection is held open for its next request.
keepalive = 2
# Recycle a worker after this many requests (0: never), spread by the jitter
# so that workers do not all restart together. Off by default; safe either way:
# a recycled worker drains its jobs like a SIGTERMed one.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "0"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "0"))
# gunicorn 25.1+ opens a control socket under the home directory by default.
# Off unless a path is given (it lets its owner reload and stop the server).
if os.environ.get("GUNICORN_CONTROL_SOCKET"):
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]
    control_socket_mode = 0o600
else:
    control_socket_disable = True
# The longest request line gunicorn reads (its maximum): above the app's own
# MEALQUEST_MAX_URI_LENGTH, so a long URI gets the app's JSON 414, not
# gunicorn's plain one.
limit_request_line = 8190
# Access log to stdout (the journal under systemd). Each line carries the
# request id (nginx's $request_id, echoed by the app, or one the app made),
# the address nginx saw the client at, and the worker's pid. Every field a
# client can write (its address as the proxy reported it, X-Forwarded-For,
# the request line, User-Agent) is in double quotes and escaped by
# `EscapingLogger` below, so that no client can end a field early or start a
# line of its own.
accesslog = "-"
access_log_format = (
    '"%(h)s" fwd="%({x-forwarded-for}i)s" "%(r)s" %(s)s %(B)s %(M)sms '
    'rid=%({x-request-id}o)s pid=%(p)s "%(a)s"'
)


class EscapedAtoms(SafeAtoms):
    """gunicorn's access log fields with every text escaped as a Python
    literal is (`\\`, `\\"`, `\\xHH`, `\\uHHHH` for all but printable
    ASCII). gunicorn's own wrapper escapes only the quote, so a value ending
    in a backslash, or one holding U+0085 (a line break to Unicode-aware
    readers), could still forge fields or lines."""

    def __init__(self, atoms: dict[str, Any]) -> None:
        dict.__init__(
            self,
            {
                key: _escaped(value) if isinstance(value, str) else value
                for key, value in atoms.items()
            },
        )


def _escaped(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return text.encode("unicode_escape").decode("ascii").replace('"', '\\"')


class EscapingLogger(Logger):
    """gunicorn's logger, writing access lines with `EscapedAtoms`. Defined
    here, not in our package: the master builds its logger before any hook
    runs, and must import nothing of ours."""

    atoms_wrapper_class = EscapedAtoms


def _utc(created: float) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{whole}.{int(created % 1 * 1000):03d}Z"


class _JsonLines(logging.Formatter):
    """gunicorn's own lines as one JSON object each, with the fields the
    service's JSON lines have (`mealquest.logs.JsonFormatter`, which this file
    cannot import: the master imports nothing of ours)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class JsonLogger(Logger):
    """gunicorn's logger with `MEALQUEST_LOG_FORMAT=json`: its own lines and
    each access line one JSON object. `json.dumps` escapes every character a
    client could use to end a field or a line."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(_JsonLines())

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if not self.access_log_enabled:
            return
        atoms = self.atoms(resp, req, environ, request_time)
        entry = {
            "time": _utc(time.time()),
            "level": "INFO",
            "logger": "gunicorn.access",
            "message": atoms["r"],
            "pid": os.getpid(),
            "remote": atoms["h"],
            "forwarded_for": atoms.get("{x-forwarded-for}i"),
            "status": atoms["s"],
            "bytes": atoms["B"],
            "duration_ms": atoms["M"],
            "request_id": atoms.get("{x-request-id}o"),
            "user_agent": atoms["a"],
        }
        try:
            self.access_log.info("%s", json.dumps(entry, default=str))
        except Exception:
            self.exception("could not write an access line")


# The same format as the service's own lines (`MEALQUEST_LOG_FORMAT`).
logger_class = (
    JsonLogger
    # Read as the app reads it: JSON text (`json` or `"json"`).
    if os.environ.get("MEALQUEST_LOG_FORMAT", "text").strip().strip('"').lower() == "json"
    else EscapingLogger
)
# gunicorn's own log lines (and ours) go to stderr.
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")


def nworkers_changed(server: Arbiter, new_value: int, old_value: int | None) -> None:
    # Why this hook: with old_value None it is the earliest hook gunicorn runs,
    # once, while the master is being built, before it logs, binds or forks
    # anything. So a bad MEALQUEST_ setting or a database behind the code's
    # migrations stops the start with our one line as the first one printed
    # (a database ahead of the code is served, with a warning). Later
    # worker-count changes pass here with a number and are ignored; workers
    # check again as they start. The check runs in a child process so that
    # the master never imports the app or opens the database. It is given
    # `timeout`: a worker that runs jobs must be killed before their leases
    # can expire.
    if old_value is not None:
        return
    check = (
        "import sys; from mealquest.serving.preflight import check_start; "
        "sys.exit(check_start(sys.argv[1], sys.argv[2]))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # The check counts nothing: keep it out of the metrics directory.
    env.pop(METRICS_DIR_VARIABLE, None)
    status = subprocess.run(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-c", check, server.app.app_uri, str(server.cfg.timeout)],
        cwd=server.cfg.chdir,
        env=env,
        check=False,
    ).returncode
    if status != 0:
        sys.exit(status)
    _refuse_an_address_in_use(server)


def _refuse_an_address_in_use(server: Arbiter) -> None:
    """One line naming the setting when the address to bind is taken: gunicorn
    itself says "Connection in use" five times, retrying, and exits with no
    hint. Not for sockets handed over (a USR2 upgrade's, systemd's), which
    are in use by design, nor for a Unix socket."""
    if os.environ.get("GUNICORN_FD") or os.environ.get("LISTEN_FDS"):
        return
    for address in server.cfg.address:
        if not isinstance(address, tuple):
            continue
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As gunicorn binds: a port left in TIME_WAIT is free to it.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address[:2])
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
                host = f"[{address[0]}]" if family == socket.AF_INET6 else address[0]
                print(
                    f"mealquest: MEALQUEST_BIND: {host}:{address[1]} is in use (another "
                    "server listens there): stop it, or set MEALQUEST_BIND (or gunicorn's "
                    "--bind) to a free address, e.g. MEALQUEST_BIND=127.0.0.1:8001",
                    file=sys.stderr,
                )
                sys.exit(1)


# prometheus_client's multiprocess mode: every worker writes its counters and
# histograms to files in this directory, and a scrape of any worker sums them
# all. prometheus_client picks its storage when first imported, so the
# variable must be in the environment before a worker imports the app.
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


METRICS_DIR_PREFIX = "mealquest-metrics-"
# In each metrics directory, the master that made it: its host, the kernel's
# boot and its pid, one line.
METRICS_OWNER_FILE = "master"


def on_starting(server: Arbiter) -> None:
    # Why this hook: it runs once in the master, before any worker is forked
    # (and not again on SIGHUP, whose new workers keep counting in the same
    # directory). Each master start gets a fresh, empty directory of its own:
    # files left by an earlier run would add its counts to this one's, and a
    # new master of a USR2 upgrade must not wipe the old master's live files.
    # Its parent is MEALQUEST_METRICS_DIR_PARENT, or the system's temp dir.
    parent = os.environ.get("MEALQUEST_METRICS_DIR_PARENT") or tempfile.gettempdir()
    try:
        removed = remove_abandoned_metrics_dirs(parent)
        directory = tempfile.mkdtemp(prefix=METRICS_DIR_PREFIX, dir=parent)
        with open(os.path.join(directory, METRICS_OWNER_FILE), "w", encoding="utf-8") as owner:
            owner.write(_this_master())
    except OSError as error:
        print(
            f"mealquest: MEALQUEST_METRICS_DIR_PARENT: cannot make the metrics directory "
            f"in {parent} ({error.strerror or error}): set it to a directory this user can write",
            file=sys.stderr,
        )
        sys.exit(1)
    if removed:
        server.log.info(
            "removed %d metrics directories whose masters ended without removing them: %s",
            len(removed),
            ", ".join(removed),
        )
    os.environ[METRICS_DIR_VARIABLE] = directory


def remove_abandoned_metrics_dirs(parent: str) -> list[str]:
    """Remove the metrics directories in `parent` whose masters are gone; their names.

    A master that never ran `on_exit` (SIGKILLed, crashed, its machine
    stopped) left its directory, with a file per worker that ever ran, and a
    restart loop would leave one each time. A directory is judged by the
    master its owner file names: gone once that process no longer exists on
    this host in this boot, or the host booted since. A directory without
    that file (made before masters wrote it, or by a master still writing
    it), another host's (a parent shared between machines or containers,
    whose pids are not ours to look up), or one whose pid is alive (a reused
    pid too: kept until that process ends) is kept."""
    removed = []
    host, boot = socket.gethostname(), _boot_id()
    with os.scandir(parent) as entries:
        for entry in entries:
            if entry.name.startswith(METRICS_DIR_PREFIX) and _abandoned(entry.path, host, boot):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
    return sorted(removed)


def _this_master() -> str:
    return f"{socket.gethostname()} {_boot_id()} {os.getpid()}\n"


def _boot_id() -> str:
    """This boot of the kernel ("-" where it cannot be read)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            return boot.read().strip() or "-"
    except OSError:
        return "-"


def _abandoned(directory: str, host: str, boot: str) -> bool:
    """Whether the master `directory`'s owner file names is gone (this host and boot given)."""
    try:
        with open(os.path.join(directory, METRICS_OWNER_FILE), encoding="utf-8") as owner:
            its_host, its_boot, pid = owner.read().split()
        master = int(pid)
    except (OSError, ValueError):
        return False
    if master <= 0:  # kill() would signal a process group
        return False
    if its_host != host:
        return False
    if its_boot != boot:
        return True
    try:
        os.kill(master, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's: not ours
        return False
    return False


def child_exit(server: Arbiter, worker: Worker) -> None:
    # Why this hook: it runs in the master after any worker is reaped,
    # SIGKILLed ones included. prometheus_client's bookkeeping for a dead
    # process (its live gauges' files); its counters stay counted. Imported
    # here, in the master, only once a worker has died: workers forked later
    # inherit the module, which is safe because the one lock it makes at
    # import is never held across a greenlet switch (it guards a write to a
    # memory-mapped file), and the storage it picked is the multiprocess one.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Arbiter) -> None:
    # Why this hook: the master is ending; the directory it made goes with it.
    directory = os.environ.get(METRICS_DIR_VARIABLE)
    if directory and os.path.basename(directory).startswith(METRICS_DIR_PREFIX):
        shutil.rmtree(directory, ignore_errors=True)


def post_worker_init(worker: Worker) -> None:
    # Why this hook, and not post_fork: gunicorn calls post_fork before the
    # gevent worker monkey-patches, re-initialises the hub and loads the app;
    # code imported there keeps unpatched locks and sockets (a module-level
    # `threading.Lock()` stayed a real OS lock and deadlocked the worker until
    # gunicorn killed it). post_worker_init runs in the worker after all three,
    # just before it serves, so the pool's greenlets, the store's threadpool
    # and every socket a job opens are gevent's. It also refuses a database
    # behind the migrations (the worker exits with gunicorn's boot-error
    # status, which stops the master) and serves one ahead of them with a
    # warning. A pool that cannot go on makes its worker stop serving, drain
    # and be replaced, as on SIGTERM.
    from mealquest.serving.worker import start_worker

    start_worker(worker)


def worker_int(worker: Worker) -> None:
    # Why this hook: it runs in the worker on SIGINT/SIGQUIT (quick shutdown),
    # just before it exits: running jobs are stopped and recorded at once
    # rather than left to their leases.
    from mealquest.serving.worker import interrupt_worker

    interrupt_worker(worker)


def worker_exit(server: Arbiter, worker: Worker) -> None:
    # Why this hook: it runs in the worker on every Python-level exit (SIGTERM,
    # SIGHUP's replacement, max_requests, quick shutdown, a dead master), never
    # on SIGKILL (leases and the rescuer cover that). The pool's drain begins
    # as soon as the worker stops serving; this waits for it, within the
    # graceful timeout, so jobs it had to stop are recorded (re-queued, or
    # failed "interrupted by restart") before the process ends. gunicorn also
    # calls this hook in the master for a worker that vanished: nothing to do
    # there.
    if worker.pid != os.getpid():
        return
    from mealquest.serving.worker import stop_worker

    stop_worker(worker)
