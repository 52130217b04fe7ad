"""Real server processes for the serving tests: gunicorn, nginx, `flask jobs work`.

Each process is started in its own session (so its children share its
process group) on a free loopback port, and stopped by pid: SIGTERM to the
leader, then SIGKILL to the group, so no worker outlives a test. The test
process itself is not monkey-patched: waiting here blocks only the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPSConnection
from pathlib import Path
from typing import Any

from mealquest.config import DEFAULTS
from mealquest.db import open_store
from mealquest.db.driver import Store
from tests.support import sql, tls

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
APP = "tests.support.serving_app:app"

# Short runner times so that rescues happen within seconds. gunicorn kills a
# worker whose event loop is blocked after its `timeout` (GRACEFUL_TIMEOUT +
# 1 here, as gunicorn.conf.py requires), `flask jobs work` exits after
# BLOCKED_EXIT_SECONDS: the lease must exceed each plus a heartbeat.
GRACEFUL_TIMEOUT = 4
# The timeout of a gunicorn started with GRACEFUL_TIMEOUT.
TIMEOUT = GRACEFUL_TIMEOUT + 1
LEASE_SECONDS = 6.0
HEARTBEAT_SECONDS = 0.4
RESCUE_SECONDS = 0.3
POLL_SECONDS = 0.2
BLOCKED_EXIT_SECONDS = 5.0

FINAL = ("succeeded", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    condition: Callable[[], Any], timeout: float, message: str, interval: float = 0.05
) -> Any:
    """Poll `condition` until it returns something truthy; fail with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} (within {timeout}s)")
        time.sleep(interval)


# -- HTTP -------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes
    # Every header as sent, repeated ones (Set-Cookie) included.
    pairs: tuple[tuple[str, str], ...] = ()

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    json_body: Any = None,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Answer:
    """One request on a new connection (so it may land on any gunicorn worker);
    an https:// URL is checked against the test certificate (`tls`).

    The timeout is a deadline for a loaded machine (a request may wait for a
    worker gunicorn is still booting), not a measure of speed."""
    match = re.fullmatch(r"(https?)://([^/:]+):(\d+)(/.*)", url)
    assert match, url
    scheme, host, port, path = match.groups()
    all_headers = dict(headers or {})
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    if json_body is not None:
        body = json.dumps(json_body).encode()
        all_headers["Content-Type"] = "application/json"
    conn = (
        HTTPSConnection(host, int(port), timeout=timeout, context=tls.client_context())
        if scheme == "https"
        else HTTPConnection(host, int(port), timeout=timeout)
    )
    try:
        conn.request(method, path, body=body, headers=all_headers)
        response = conn.getresponse()
        pairs = tuple(response.getheaders())
        return Answer(response.status, dict(pairs), response.read(), pairs)
    finally:
        conn.close()


def enqueue(base_url: str, token: str, kind: str, payload: Mapping[str, Any]) -> str:
    answer = http(
        "POST",
        f"{base_url}/api/v1/test-jobs",
        token=token,
        json_body={"kind": kind, "payload": dict(payload)},
    )
    assert answer.status == 202, answer
    return answer.json["id"]


# -- the database, read by the test ---------------------------------------------------

JobRow = dict[str, Any]


def open_test_store(database: Mapping[str, Any]) -> Store:
    """A store on the served database (the `database` fixture's mapping), for
    the test process to read what the servers wrote and to set things up."""
    return open_store({**DEFAULTS, **database})


def jobs_by_id(store: Store) -> dict[str, JobRow]:
    return {row["id"]: row for row in sql.rows(store, "SELECT * FROM jobs")}


def job(store: Store, job_id: str) -> JobRow:
    [row] = sql.rows(store, "SELECT * FROM jobs WHERE id = ?", (job_id,))
    return row


def partial_pid(store: Store, job_id: str) -> int | None:
    """The pid a running job published (the serving kinds publish it first)."""
    row = job(store, job_id)
    if row["status"] != "running" or row["result"] is None:
        return None
    return json.loads(row["result"])["pid"]


def running_pids(store: Store, job_ids: list[str]) -> dict[str, int] | None:
    """Which process runs each job, once every one of them runs."""
    pids = {job_id: partial_pid(store, job_id) for job_id in job_ids}
    return pids if all(pids.values()) else None  # type: ignore[return-value]


def final_jobs(store: Store, job_ids: list[str]) -> dict[str, JobRow] | None:
    rows = jobs_by_id(store)
    if all(rows[job_id]["status"] in FINAL for job_id in job_ids):
        return {job_id: rows[job_id] for job_id in job_ids}
    return None


# -- processes ----------------------------------------------------------------------


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return []
    return [int(p) for p in text.split()]


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command (the state first), or
    None once the process is gone: a process reaped between the file's open
    and its read makes the read fail ESRCH (ProcessLookupError), as seen in CI."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # They follow the command's closing parenthesis; the command may hold spaces.
    return stat.rsplit(")", 1)[1].split()


def process_state(pid: int) -> str | None:
    """The process's state as /proc shows it (`R` running, `S` waiting, `Z` a
    zombie...); None once it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else fields[0]


def cpu_seconds(pid: int) -> float | None:
    """The CPU time the process has used (user and system), or None once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # utime and stime, the 14th and 15th fields of the line (11th and 12th here).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Not exited: a child its parent has not reaped yet is still listed, as a zombie."""
    return process_state(pid) not in (None, "Z", "X")


class Process:
    """A process started in its own session, its output in a file."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            args,
            cwd=REPO,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the leader and wait; then SIGKILL whatever is left of its group."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._log.close()


def serving_env(database: str | Mapping[str, Any], **config: Any) -> dict[str, str]:
    """The environment of a served process: ours, without any MEALQUEST_/GUNICORN_ of the
    caller, on `database` (an SQLite file, or the `database` fixture's mapping)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEALQUEST_", "GUNICORN_"))}
    if isinstance(database, str):
        database = {"DATABASE": database}
    env.update({f"MEALQUEST_{key}": str(value) for key, value in database.items()})
    env.update(
        {
            "MEALQUEST_JOB_LEASE_SECONDS": str(LEASE_SECONDS),
            "MEALQUEST_JOB_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            "MEALQUEST_JOB_RESCUE_SECONDS": str(RESCUE_SECONDS),
            "MEALQUEST_JOB_POLL_SECONDS": str(POLL_SECONDS),
            "MEALQUEST_JOB_BLOCKED_EXIT_SECONDS": str(BLOCKED_EXIT_SECONDS),
            # No hourly prune job appearing among a test's jobs (retention's
            # own tests turn it on).
            "MEALQUEST_JOB_RETENTION_DAYS": "0",
            # Every page a served test fetches is on one local server: a
            # deployment's limits per host would make its imports take turns
            # two at a time, 30 a minute (flow control's tests set their own).
            "MEALQUEST_RECIPE_FETCH_MAX_PER_HOST": "0",
            "MEALQUEST_RECIPE_FETCH_PER_HOST_PER_MINUTE": "0",
            "MEALQUEST_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update({f"MEALQUEST_{key}": json.dumps(value) for key, value in config.items()})
    return env


class Gunicorn(Process):
    """gunicorn with the real gunicorn.conf.py serving the test app; its
    `timeout` a second above the graceful timeout unless given (TIMEOUT with
    the default one)."""

    def __init__(
        self,
        log_path: Path,
        env: Mapping[str, str],
        *,
        workers: int = 2,
        graceful_timeout: int = GRACEFUL_TIMEOUT,
        timeout: int | None = None,
        extra_args: tuple[str, ...] = (),
        app: str | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.graceful_timeout = graceful_timeout
        args = [
            str(BIN / "gunicorn"),
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--graceful-timeout",
            str(graceful_timeout),
            "--timeout",
            str(graceful_timeout + 1 if timeout is None else timeout),
            *extra_args,
            app or APP,
        ]
        # The master's metrics directory in the test's own directory: a master
        # SIGKILLed (or stopped by this harness's SIGKILL) never runs its
        # `on_exit`, and left its directory in the system's temp dir.
        env = {"MEALQUEST_METRICS_DIR_PARENT": str(log_path.parent), **env}
        super().__init__(args, env, log_path)

    def worker_pids(self) -> list[int]:
        """The live workers: one SIGKILLed stays the master's child until it is reaped."""
        return [pid for pid in children(self.pid) if alive(pid)]

    def wait_ready(self, pools: bool = True, timeout: float = 60.0) -> None:
        """Until every worker has booted (and started its pool) and HTTP answers."""

        def ready() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"gunicorn exited early:\n{self.log()}")
            if len(self.worker_pids()) != self.workers:
                return False
            marker = "job pool started" if pools else "job pool not started"
            if self.log().count(marker) < self.workers:
                return False
            with contextlib.suppress(OSError):
                return http("GET", f"{self.url}/healthz", timeout=2).status == 200
            return False

        wait_until(ready, timeout, "gunicorn did not become ready")

    def stop(self, grace: float | None = None) -> None:
        super().stop(self.graceful_timeout + 5 if grace is None else grace)


def gunicorn_refusing(
    env: Mapping[str, str], *args: str, app: str | None = None
) -> subprocess.CompletedProcess[str]:
    """gunicorn with the real gunicorn.conf.py, for a start it must refuse:
    run to its exit (within a minute or two), its output kept."""
    return subprocess.run(
        [str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", *args, app or APP],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


class Nginx(Process):
    """nginx in the foreground, single process, with deploy/nginx.conf's server
    blocks (pointed at `upstream_port`, with the test certificate) inside a
    minimal main config of its own. `url` is its HTTPS side, `http_url` the
    plain HTTP one."""

    def __init__(self, workdir: Path, upstream_port: int) -> None:
        binary = nginx_binary()
        if binary is None:
            raise AssertionError(
                "nginx is not installed: `scripts/test` installs it from Debian's packages "
                "(apt-get install nginx-light); the nginx serving test needs it"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.http_port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        site = site_config(self.port, self.http_port, upstream_port, workdir / "access.log")
        (workdir / "site.conf").write_text(site)
        temp = "\n".join(
            f"    {name}_temp_path {workdir / name};"
            for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        (workdir / "nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\npid {workdir / 'nginx.pid'};\n"
            f"error_log {workdir / 'error.log'} info;\n"
            "events { worker_connections 256; }\n"
            f"http {{\n{temp}\n    include {workdir / 'site.conf'};\n}}\n"
        )
        args = [
            binary,
            "-p",
            str(workdir),
            "-c",
            str(workdir / "nginx.conf"),
            "-e",
            str(workdir / "error.log"),
        ]
        super().__init__(args, os.environ, workdir / "stdout.log")
        self.workdir = workdir

    def wait_ready(self, timeout: float = 30.0) -> None:
        def listening() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"nginx exited early:\n{self.log()}\n{(self.workdir / 'error.log').read_text()}"
                )
            for port in (self.port, self.http_port):
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) != 0:
                        return False
            return True

        wait_until(listening, timeout, "nginx did not start listening")


def site_config(port: int, http_port: int, upstream_port: int, access_log: Path) -> str:
    """deploy/nginx.conf with its listen ports, upstream, certificate and log
    paths replaced; nothing else."""
    text = (REPO / "deploy" / "nginx.conf").read_text()
    certificate = tls.certificate()
    replacements = [
        (r"listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;", 1),
        (r"listen 80;", f"listen 127.0.0.1:{http_port};", 1),
        (r"server 127\.0\.0\.1:8000;", f"server 127.0.0.1:{upstream_port};", 1),
        (r"ssl_certificate \S+;", f"ssl_certificate {certificate.cert};", 1),
        (r"ssl_certificate_key \S+;", f"ssl_certificate_key {certificate.key};", 1),
        # One access log per server block.
        (r"access_log \S+ mealquest;", f"access_log {access_log} mealquest;", 2),
    ]
    for pattern, replacement, expected in replacements:
        text, count = re.subn(pattern, replacement, text)
        assert count == expected, f"deploy/nginx.conf: expected {expected} `{pattern}`"
    return text


# -- a server that holds a connection until told -------------------------------------


class HeldServer:
    """Accepts one connection and answers it only when `release` is set, so a
    job's socket read stays pending for as long as the test needs."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(1)
        self.port = self._sock.getsockname()[1]
        self.connected = threading.Event()
        self.release = threading.Event()
        self.reply = b"x" * 1000
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self._sock.accept()
            with conn:
                conn.recv(100)
                self.connected.set()
                self.release.wait(60)
                conn.sendall(self.reply)

    def __enter__(self) -> HeldServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._sock.close()
        self._thread.join(5)


@contextlib.contextmanager
def started(process: Process) -> Iterator[Process]:
    try:
        yield process
    finally:
        process.stop()
