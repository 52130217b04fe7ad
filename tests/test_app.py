"""The app factory's configuration order, health, and the log line format.

Each value's checks are in tests/test_config.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest

from mealquest.application import create_app
from mealquest.config import DEFAULTS
from mealquest.db.sqlite import migrate
from mealquest.extensions import get_store
from mealquest.health import MAX_AGE_SECONDS, health_check
from mealquest.logs import ContextFormatter, JsonFormatter, configure_logging
from tests.support.processes import REPO
from tests.support.ticks import Ticks

pytestmark = pytest.mark.both_databases


@pytest.fixture
def restore_log_level():
    logger = logging.getLogger("mealquest")
    level = logger.level
    yield
    logger.setLevel(level)


def test_config_is_defaults_then_environment_then_the_test_mapping(
    monkeypatch, tmp_path, restore_log_level
):
    # The one test that configures through the environment: it tests exactly that.
    monkeypatch.setenv("MEALQUEST_JOB_WORKERS", "8")
    monkeypatch.setenv("MEALQUEST_JOB_LEASE_SECONDS", "45.5")
    monkeypatch.setenv("MEALQUEST_DB_SYNCHRONOUS", "FULL")
    monkeypatch.setenv("MEALQUEST_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("MEALQUEST_DATABASE", str(tmp_path / "from-env.sqlite3"))

    app = create_app({"JOB_LEASE_SECONDS": 20.0, "DATABASE": str(tmp_path / "from-test.sqlite3")})

    # Defaults where nothing else says otherwise.
    assert app.config["JOB_POLL_SECONDS"] == DEFAULTS["JOB_POLL_SECONDS"]
    assert app.config["MAX_CONTENT_LENGTH"] == DEFAULTS["MAX_CONTENT_LENGTH"]
    # The environment over the defaults, parsed as JSON where it is JSON.
    assert app.config["JOB_WORKERS"] == 8
    assert app.config["DB_SYNCHRONOUS"] == "FULL"
    assert app.config["LOG_LEVEL"] == "WARNING"
    assert logging.getLogger("mealquest").level == logging.WARNING
    # The test mapping over the environment.
    assert app.config["JOB_LEASE_SECONDS"] == 20.0
    assert app.config["DATABASE"] == str(tmp_path / "from-test.sqlite3")
    # The store is built from the final config.
    store = get_store(app)
    assert store.path == str(tmp_path / "from-test.sqlite3")
    assert store.synchronous == "FULL"


def test_the_environment_alone_configures_the_app(monkeypatch, tmp_path):
    monkeypatch.setenv("MEALQUEST_DATABASE", str(tmp_path / "from-env.sqlite3"))
    monkeypatch.setenv("MEALQUEST_DB_BUSY_TIMEOUT_SECONDS", "0.25")
    app = create_app()
    assert app.config["DATABASE"] == str(tmp_path / "from-env.sqlite3")
    assert get_store(app).busy_timeout_seconds == 0.25


def test_the_default_database_is_in_the_instance_folder(monkeypatch):
    monkeypatch.delenv("MEALQUEST_DATABASE", raising=False)
    app = create_app({"TESTING": True})
    assert app.config["DATABASE"] == os.path.join(app.instance_path, "mealquest.sqlite3")


def test_create_app_opens_nothing(tmp_path):
    path = tmp_path / "not-yet" / "mealquest.sqlite3"
    app = create_app({"TESTING": True, "DATABASE": str(path)})
    assert not path.parent.exists()
    get_store(app).close()
    assert not path.parent.exists()


@pytest.mark.sqlite_only("the modules a process imports; no database is opened")
def test_a_service_process_leaves_the_page_parsing_libraries_to_the_parser_processes(tmp_path):
    # Pages are parsed only in parser processes (`mealquest.recipes.parser_pool`),
    # which import recipe-scrapers themselves; in a web or job worker its
    # imports (bs4, extruct, rdflib, requests) only slowed every start.
    probe = (
        "import sys\n"
        "from gevent import monkey; monkey.patch_all()\n"
        "import wsgi\n"
        "from mealquest.jobs.service import get_jobs\n"
        "jobs = get_jobs(wsgi.app)\n"
        "assert 'recipe_import' in jobs.registry.names(), jobs.registry.names()\n"
        "heavy = ('recipe_scrapers', 'extruct', 'bs4', 'rdflib', 'w3lib')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    env = {**os.environ, "MEALQUEST_DATABASE": str(tmp_path / "never.sqlite3")}
    answer = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    assert answer.stdout.strip() == "[]"


# -- health -----------------------------------------------------------------------------------


def test_healthz_is_200_on_a_migrated_database(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


@pytest.mark.sqlite_only(
    "an SQLite file of the test's own; PostgreSQL's health: serving/test_two_hosts.py"
)
def test_healthz_is_503_on_a_database_behind_the_migrations(make_app, tmp_path):
    path = str(tmp_path / "behind.sqlite3")
    migrate.upgrade(path, target=2)
    app = make_app(DATABASE=path)
    client = app.test_client()
    health_check(app).clock = ticks = Ticks()
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"
    migrate.upgrade(path)
    ticks.advance(MAX_AGE_SECONDS)  # the next answer is from a check made now
    assert client.get("/healthz").status_code == 200


def test_healthz_checks_the_migrations_until_they_pass_then_not_again(make_app, db_path):
    """Unauthenticated, so cheap: the code's migrations do not change while a process runs."""
    client = make_app().test_client()
    assert client.get("/healthz").status_code == 200
    # The ledger edited behind the process's back: this process has checked already...
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE schema_migrations SET checksum = 'edited'")
    conn.commit()
    conn.close()
    assert client.get("/healthz").status_code == 200
    # ...while a process starting now checks, and refuses it.
    probe = (
        "import sys; from mealquest import create_app; "
        "app = create_app({'DATABASE': sys.argv[1]}); "
        "print(app.test_client().get('/healthz').status_code)"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe, db_path], capture_output=True, text=True, check=True
    )
    assert answer.stdout.strip() == "503"


@pytest.mark.sqlite_only(
    "an SQLite file of the test's own; PostgreSQL's health: serving/test_two_hosts.py"
)
def test_healthz_is_503_without_a_database(make_app, tmp_path):
    client = make_app(DATABASE=str(tmp_path / "missing" / "mealquest.sqlite3")).test_client()
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"


# -- logs -------------------------------------------------------------------------------------


def test_log_lines_carry_their_context(restore_log_level):
    record = logging.LogRecord("mealquest.jobs", logging.INFO, __file__, 1, "job done", (), None)
    record.job_id = "abc"
    record.kind = "succeed"
    record.attempt = 2
    line = ContextFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == "INFO mealquest.jobs: job done [job_id=abc kind=succeed attempt=2]"

    plain = logging.LogRecord("mealquest", logging.INFO, __file__, 1, "hello", (), None)
    assert ContextFormatter("%(message)s").format(plain) == "hello"


def test_log_line_times_are_logging_s_own_across_seconds():
    # Each formatter keeps the last second's text: records of one second,
    # of the next, and of an earlier one again must each get their own.
    text = ContextFormatter("%(asctime)s %(message)s")
    json_lines = JsonFormatter()
    stock = logging.Formatter("%(asctime)s %(message)s")
    base = 1_796_486_400.0  # a whole second
    for created in (base + 0.001, base + 0.999, base + 1.0, base + 1.5, base - 59.25, base + 0.5):
        record = logging.LogRecord("mealquest", logging.INFO, __file__, 1, "m", (), None)
        record.created = created
        record.msecs = int((created - int(created)) * 1000) + 0.0
        assert text.format(record) == stock.format(record)
        whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        expected = f"{whole}.{int(created % 1 * 1000):03d}Z"
        assert json.loads(json_lines.format(record))["time"] == expected


def test_logging_is_configured_once(restore_log_level):
    logger = logging.getLogger("mealquest")
    configure_logging("INFO")
    configure_logging("DEBUG")
    names = [handler.get_name() for handler in logger.handlers]
    assert names.count("mealquest-stderr") == 1
    assert logger.level == logging.DEBUG


def test_a_json_line_has_the_records_fields_and_its_requests_id(app):
    record = logging.LogRecord("mealquest.jobs", logging.ERROR, __file__, 1, "job %s", ("x",), None)
    record.job_id = "abc"
    record.kind = "succeed"
    record.attempt = 2
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    with app.test_request_context(headers={"X-Request-ID": "req-1"}):
        app.preprocess_request()
        line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "job x"
    assert (entry["level"], entry["logger"]) == ("ERROR", "mealquest.jobs")
    assert entry["pid"] == os.getpid()
    assert (entry["job_id"], entry["kind"], entry["attempt"]) == ("abc", "succeed", 2)
    assert entry["request_id"] == "req-1"
    assert "RuntimeError: boom" in entry["exception"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    outside = json.loads(JsonFormatter().format(record))
    assert "request_id" not in outside
