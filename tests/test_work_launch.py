"""`flask jobs work` re-executes monkey-patched before its app is built.

The command can re-execute itself only once Flask has built the app to find
it; the app modules Flask's CLI loads re-execute first, so the app is built
once, in the patched process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mealquest.serving.work_launch import _asks_for_jobs_work
from tests.support.processes import REPO, Process, process_group, wait_working

pytestmark = pytest.mark.sqlite_only("a process's start on an SQLite file of its own")

# An app module shaped as `wsgi.py`, which also notes each run of its body.
_PROBE_APP = """
from mealquest.serving.work_launch import restart_if_working

restart_if_working()

import os, sys
from gevent import monkey
with open(os.environ["PROBE_NOTES"], "a") as notes:
    notes.write(f"{os.getpid()} {monkey.is_module_patched('socket')}\\n")

from mealquest.application import create_app_or_exit

app = create_app_or_exit()
"""


@pytest.mark.parametrize(
    ("arguments", "asks"),
    [
        (["jobs", "work"], True),
        (["--app", "wsgi", "jobs", "work"], True),
        (["-e", ".env", "jobs", "work", "--help"], True),
        (["jobs", "list"], False),
        (["db", "upgrade"], False),
        (["work", "jobs"], False),
        ([], False),
    ],
)
def test_the_command_line_asks_for_a_pool_only_as_jobs_work(arguments, asks):
    assert _asks_for_jobs_work(arguments) is asks


def test_flask_jobs_work_builds_its_app_once_in_the_patched_process(tmp_path):
    (tmp_path / "probe_app.py").write_text(_PROBE_APP)
    notes = tmp_path / "notes"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "MEALQUEST_DATABASE": str(tmp_path / "work.sqlite3"),
        "PROBE_NOTES": str(notes),
    }
    flask = [sys.executable, "-m", "flask", "--app", "probe_app"]
    migrated = subprocess.run([*flask, "db", "upgrade"], env=env, capture_output=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    assert notes.read_text().split()[1] == "False"  # another command: not patched
    notes.unlink()

    with process_group() as processes:
        worker = Process([*flask, "jobs", "work"], env)
        processes.append(worker)
        wait_working(worker)
        assert "(monkey-patched)" in worker.output()
        # One run of the app module's body: in the patched process (the same
        # process, re-executed), none before it.
        assert notes.read_text().splitlines() == [f"{worker.pid} True"]
        assert worker.stop() == 0
