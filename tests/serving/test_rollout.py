"""Rolling deploys and migrations under real gunicorn: migrate first, then roll out.

The next release's `flask db upgrade` leaves the database ahead of the code
still serving; that code's workers keep restarting (SIGHUP, `max_requests`,
a crash) until the rollout replaces them, and must go on serving. A
database behind the code, or with another history, is still refused before
gunicorn binds anything.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from mealquest.db import migrations
from mealquest.db.sqlite import migrate
from tests.support.ledger import add_migration_row, add_newer_migration
from tests.support.servers import APP, BIN, TIMEOUT, http, serving_env, wait_until

REPO = Path(__file__).resolve().parents[2]
WARNING = "has migrations this code does not know ({name}): serving it"


# Our log lines: "date time pid LEVEL logger: message".
OUR_LINE = re.compile(r"^\S+ \S+ (\d+) [A-Z]+ mealquest[.\w]*: ")


def pids_that_logged(log: str, text: str, name: str = "") -> set[int]:
    """The processes that logged a line of ours with `text` in it."""
    text = text.format(name=name)
    return {
        int(match[1])
        for line in log.splitlines()
        if text in line and (match := OUR_LINE.match(line))
    }


@pytest.mark.sqlite_only(
    "the next release's migration row is written into the SQLite file; PostgreSQL's case is "
    "test_postgresql_migrate.py's"
)
def test_a_database_migrated_by_the_next_release_is_served_with_a_warning(served, start_gunicorn):
    name = add_newer_migration(served.db_path)
    server = start_gunicorn(workers=2)

    answer = http("GET", f"{server.url}/api/v1/jobs", token=served.token)
    assert answer.status == 200, answer
    assert http("GET", f"{server.url}/healthz").status == 200
    log = server.log()
    warnings = [line for line in log.splitlines() if WARNING.format(name=name) in line]
    assert all(" WARNING mealquest.db.migrations: " in line for line in warnings), log
    # The master's preflight said it before gunicorn listened, and each worker as it started.
    assert log.index(WARNING.format(name=name)) < log.index("Listening at"), log
    assert set(server.worker_pids()) <= pids_that_logged(log, WARNING, name), log


@pytest.mark.sqlite_only(
    "the next release's migration row is written into the SQLite file; PostgreSQL's case is "
    "test_postgresql_migrate.py's"
)
def test_workers_restarted_after_the_next_release_migrated_keep_serving(served, start_gunicorn):
    server = start_gunicorn(workers=2)
    first = set(server.worker_pids())
    name = add_newer_migration(served.db_path)

    server.signal(signal.SIGHUP)

    def replaced() -> bool:
        assert server.popen.poll() is None, f"gunicorn stopped:\n{server.log()}"
        pids = set(server.worker_pids())
        return len(pids) == 2 and not pids & first

    wait_until(replaced, 30, "SIGHUP did not replace both workers")
    wait_until(
        lambda: set(server.worker_pids()) <= pids_that_logged(server.log(), WARNING, name),
        30,
        "the new workers did not warn about the newer migration",
    )
    wait_until(
        lambda: set(server.worker_pids()) <= pids_that_logged(server.log(), "job pool started"),
        30,
        "the new workers did not start their pools",
    )
    answer = http("GET", f"{server.url}/api/v1/jobs", token=served.token)
    assert answer.status == 200, answer


def start_refused(db_path: str) -> str:
    """gunicorn's output when it refuses to start on `db_path` (it must), with
    the tests' short lease and the timeout that fits it."""
    result = subprocess.run(
        [
            *(str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "--bind", "127.0.0.1:0"),
            *("--timeout", str(TIMEOUT), APP),
        ],
        cwd=REPO,
        env=serving_env(db_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (result.stderr + result.stdout).strip()
    assert result.returncode != 0, output
    assert "Listening at" not in output
    return output


def test_a_database_behind_the_code_is_still_refused(tmp_path):
    behind = str(tmp_path / "behind.sqlite3")
    migrate.upgrade(behind, target=2)
    pending = [m.path.name for m in migrations.discover(migrate.MIGRATIONS_DIR)][2:]

    output = start_refused(behind)

    assert output.splitlines() == [
        f"mealquest: refusing to start: the database {behind} is not migrated "
        f"({len(pending)} pending: {', '.join(pending)}); run `flask db upgrade`, "
        "then start gunicorn again"
    ]


@pytest.mark.parametrize("where", ["below-a-known-one", "while-a-known-one-is-pending"])
def test_a_database_with_another_history_is_refused(tmp_path, where):
    path = str(tmp_path / "other.sqlite3")
    known = migrations.discover(migrate.MIGRATIONS_DIR)
    if where == "below-a-known-one":
        # Numbered where no release of this code has a migration: another branch's.
        migrate.upgrade(path)
        add_migration_row(path, 0, "other_branch")
    else:
        migrate.upgrade(path, target=known[-2].version)
        add_migration_row(path, known[-1].version + 1, "next_release")

    output = start_refused(path)

    (line,) = output.splitlines()
    assert line.startswith(f"mealquest: refusing to start: the database {path} cannot be served")
    assert line.endswith("the database and the code have different migration histories")
