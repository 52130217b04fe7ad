"""`flask jobs work` re-executes itself monkey-patched, as early as it can.

Handlers may do blocking standard-library I/O (sockets, DNS, `time.sleep`),
which is cooperative only in a monkey-patched process, and patching late,
with Flask, ssl and threading already imported, would leave unpatched locks
behind (a module-level `threading.Lock()` made before patching stays a real
OS lock, and a greenlet that waits on it blocks the whole process). So the
command runs again under `python -m mealquest.gevent_patching`, which patches
before anything else is imported, as gunicorn's gevent worker does before it
loads the app.

The command itself can re-execute only once Flask has built the app to find
it: a second app built for nothing, over a second of every start. The app
modules Flask's CLI loads (`wsgi.py`, `app.py`) call `restart_if_working`
first, which re-executes before the app is imported when the command line
is `flask ... jobs work`. Imports nothing of the service: it runs before it.
"""

from __future__ import annotations

import itertools
import os
import sys

# Set in the re-executed process (not MEALQUEST_*: that prefix is the app's
# configuration), so that it never re-executes again.
_REEXECUTED = "MQ_JOBS_WORK_REEXECUTED"


def _run_from_flask_cli() -> bool:
    """Whether this process is Flask's CLI (`flask`, or `python -m flask`)."""
    program = os.path.normpath(sys.argv[0]) if sys.argv else ""
    return os.path.basename(program) == "flask" or program.endswith(
        os.path.join("flask", "__main__.py")
    )


def restart_monkey_patched() -> None:
    """Re-execute this `flask` command monkey-patched, if it runs from Flask's
    CLI and is not patched yet (otherwise return); RuntimeError if the
    re-executed process finds itself unpatched."""
    from gevent import monkey

    if monkey.is_module_patched("socket") or not _run_from_flask_cli():
        return
    if os.environ.get(_REEXECUTED):
        raise RuntimeError("could not start the pool monkey-patched")
    os.environ[_REEXECUTED] = "1"
    launcher = [sys.executable, "-m", "mealquest.gevent_patching", "flask", *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, launcher)  # noqa: S606 - our own interpreter and arguments


def _asks_for_jobs_work(arguments: list[str]) -> bool:
    return ("jobs", "work") in itertools.pairwise(arguments)


def restart_if_working() -> None:
    """Re-execute now, before the app is imported, if the command line is
    `flask ... jobs work` (a word `jobs` followed by `work`: anything else
    that reads so is only run patched)."""
    if _asks_for_jobs_work(sys.argv[1:]):
        restart_monkey_patched()
