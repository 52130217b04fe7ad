"""Real OS processes for tests: started with a clean environment, their output
collected by a reader thread, and always stopped by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import gevent

REPO = Path(__file__).resolve().parents[2]


class Process:
    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            args,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        """What the process printed; once it has exited, all of it. The reader
        thread may still be draining the pipe when `poll()` first sees the exit
        (5 exits in 100 here, idle): a loaded machine then lost the last lines,
        such as the log line of why the process ended."""
        if self.popen.poll() is not None:
            self._reader.join(timeout=10)
        return "\n".join(self.lines)

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signum)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then SIGKILL the whole session if it does not exit in time
        (a deadline for a loaded machine: a stop that works returns at once)."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.wait()

    def kill(self) -> None:
        if self.popen.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)


@contextmanager
def process_group() -> Iterator[list[Process]]:
    """Collects processes and kills whatever is still running at the end."""
    processes: list[Process] = []
    try:
        yield processes
    finally:
        for process in processes:
            process.signal(signal.SIGCONT)
            process.kill()
            process.popen.wait()


# Printed by `flask jobs work` once its SIGTERM handler is installed. "job pool
# started" comes earlier: a SIGTERM between the two kills the process outright.
WORKING = "Ctrl-C stops"


def wait_working(process: Process, timeout: float = 60.0) -> None:
    """Until `process` runs its pool and a SIGTERM would stop it gracefully.

    The deadline allows for a slow start on a loaded machine (an import and
    a re-exec under gevent's launcher); it never slows a start that works.
    """
    deadline = time.monotonic() + timeout
    while WORKING not in process.output():
        if process.popen.poll() is not None:
            raise AssertionError(f"worker exited early:\n{process.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker not working within {timeout}s:\n{process.output()}")
        gevent.sleep(0.02)


def database_env(database: Mapping[str, Any]) -> dict[str, str]:
    """The MEALQUEST_* variables that point a process at `database` (the
    `database` fixture's mapping: a PostgreSQL URL or an SQLite file)."""
    return {f"MEALQUEST_{key}": str(value) for key, value in database.items()}


def flask_jobs_work(database: Mapping[str, Any], **config: object) -> Process:
    """A `flask jobs work` process with the test kinds, on `database`, configured
    by MEALQUEST_* variables."""
    env = database_env(database)
    # No hourly prune job (at minute 17) among a test's jobs, as in the tests'
    # own apps: a test running across that minute counted one job too many.
    env["MEALQUEST_JOB_RETENTION_DAYS"] = "0"
    env.update({f"MEALQUEST_{key}": str(value) for key, value in config.items()})
    flask = [sys.executable, "-m", "flask", "--app", "tests.support.worker_app", "jobs", "work"]
    return Process(flask, env)
