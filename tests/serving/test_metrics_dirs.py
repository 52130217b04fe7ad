"""The masters' metrics directories (gunicorn.conf.py's `on_starting`): each
names the master that made it, a master removes the directories of masters
that ended without removing their own (SIGKILLed: `on_exit` never ran), and
keeps every other; a parent it cannot write is one line naming the setting."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.servers import Gunicorn, gunicorn_refusing, serving_env

pytestmark = pytest.mark.sqlite_only(
    "the metrics directory is the master's, made before any database"
)

OWNER = "master"


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def left_by(parent: Path, name: str, owner: str | None) -> Path:
    """A directory as a master leaves it: a worker's file, and its owner line."""
    directory = parent / f"mealquest-metrics-{name}"
    directory.mkdir()
    (directory / "counter_1234.db").write_bytes(b"\0" * 16)
    if owner is not None:
        (directory / OWNER).write_text(owner)
    return directory


def dead_pid() -> int:
    """A pid no process has now (one that ran and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_master_removes_the_directories_of_masters_that_did_not(served, tmp_path, processes):
    parent = tmp_path / "metrics"
    parent.mkdir()
    env = serving_env(served.database)
    env["MEALQUEST_METRICS_DIR_PARENT"] = str(parent)

    first = Gunicorn(tmp_path / "first.log", env, workers=1)
    processes.append(first)
    first.wait_ready()
    [abandoned] = parent.iterdir()
    host = socket.gethostname()
    assert (abandoned / OWNER).read_text() == f"{host} {boot_id()} {first.pid}\n"
    # The master and its worker at once, as a crash or the OOM killer does:
    # no hook runs, and the directory stays.
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert abandoned.exists()

    kept = [
        # Its master lives (this process stands for it).
        left_by(parent, "alive", f"{host} {boot_id()} {os.getpid()}\n"),
        # Another machine's (a shared parent): its pids are not this host's.
        left_by(parent, "elsewhere", f"another-host {boot_id()} {dead_pid()}\n"),
        # Made before masters named themselves, or by one still writing it.
        left_by(parent, "unnamed", None),
        left_by(parent, "garbled", "not an owner line\n"),
    ]
    gone = [
        left_by(parent, "reaped", f"{host} {boot_id()} {dead_pid()}\n"),
        # The host booted since: whatever its pid is now, that master is gone.
        left_by(parent, "earlier-boot", f"{host} 0000-earlier-boot {os.getpid()}\n"),
    ]

    second = Gunicorn(tmp_path / "second.log", env, workers=1)
    processes.append(second)
    second.wait_ready()
    for directory in [abandoned, *gone]:
        assert not directory.exists(), directory.name
    for directory in kept:
        assert directory.exists(), directory.name
    [own] = set(parent.iterdir()) - set(kept)
    assert (own / OWNER).read_text() == f"{host} {boot_id()} {second.pid}\n"
    names = ", ".join(sorted(directory.name for directory in [abandoned, *gone]))
    assert f"removed 3 metrics directories whose masters ended without removing them: {names}" in (
        second.log()
    )

    second.stop()
    assert not own.exists()
    assert sorted(parent.iterdir()) == sorted(kept)


def test_a_parent_that_cannot_be_written_is_one_line_naming_the_setting(served, tmp_path):
    parent = tmp_path / "missing"
    env = {**serving_env(served.database), "MEALQUEST_METRICS_DIR_PARENT": str(parent)}
    done = gunicorn_refusing(env, "--timeout", "5")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if "METRICS_DIR_PARENT" in line]
    assert line == (
        f"mealquest: MEALQUEST_METRICS_DIR_PARENT: cannot make the metrics directory in "
        f"{parent} (No such file or directory): set it to a directory this user can write"
    )
