"""Configuration checks: every bad value is one line naming its `MEALQUEST_` variable,
raised before anything starts; the job intervals follow the lease unless set."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mealquest import application
from mealquest.application import create_app
from mealquest.config import SETTINGS, ConfigError, unknown_variables
from mealquest.config.table import markdown_table
from mealquest.db.sqlite import migrate
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from tests.support.servers import APP, gunicorn_refusing, serving_env

REPO = Path(__file__).resolve().parents[1]


def build(tmp_path, **config):
    app = create_app({"TESTING": True, "DATABASE": str(tmp_path / "x.sqlite3"), **config})
    get_store(app).close()
    return app


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("JOB_LEASE_SECONDS", "abc", 'must be a positive number (got "abc")'),
        ("JOB_LEASE_SECONDS", 0, "must be a positive number (got 0)"),
        ("JOB_LEASE_SECONDS", True, "must be a positive number (got true)"),
        ("JOB_POLL_SECONDS", -1, "must be a positive number (got -1)"),
        ("JOB_CHANGE_CHECK_SECONDS", None, "must be a positive number (got null)"),
        ("DB_BUSY_TIMEOUT_SECONDS", [], "must be a positive number (got [])"),
        ("RECIPE_FETCH_TIMEOUT_SECONDS", "20s", 'must be a positive number (got "20s")'),
        ("RECIPE_PARSE_SECONDS", 0, "must be a positive number (got 0)"),
        ("JOB_HEARTBEAT_SECONDS", 0, "must be a positive number (got 0)"),
        ("JOB_RESCUE_SECONDS", "often", 'must be a positive number (got "often")'),
        ("JOB_STOP_TIMEOUT_SECONDS", -0.5, "must be a number, 0 or more (got -0.5)"),
        ("JOB_WORKERS", 0, "must be a whole number, 1 or more (got 0)"),
        ("JOB_WORKERS", 2.5, "must be a whole number, 1 or more (got 2.5)"),
        ("PROXY_FIX_HOPS", -1, "must be a whole number, 0 or more (got -1)"),
        ("MAX_CONTENT_LENGTH", "64k", 'must be a whole number, 1 or more (got "64k")'),
        ("RECIPE_FETCH_MAX_REDIRECTS", -2, "must be a whole number, 0 or more (got -2)"),
        (
            "DB_SYNCHRONOUS",
            "SOMETIMES",
            'must be one of OFF, NORMAL, FULL, EXTRA (got "SOMETIMES")',
        ),
        (
            "LOG_LEVEL",
            "LOUD",
            'must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (got "LOUD")',
        ),
        ("JOB_POOL_IN_WEB", "maybe", 'must be true or false (got "maybe")'),
        ("ALLOW_PRIVATE_URLS", 2, "must be true or false (got 2)"),
        (
            "RECIPE_FETCH_ALLOWED_NETWORKS",
            ["10.1.2.0/24", "intranet"],
            'must be a list of networks, e.g. ["10.1.2.0/24"] (got ["10.1.2.0/24", "intranet"])',
        ),
        ("DATABASE", 5, "must be a file path (got 5)"),
        ("JOB_CRON_CATCHUP_SECONDS", 0, "must be a positive number (got 0)"),
        ("JOB_CRON_CATCHUP_SECONDS", "1h", 'must be a positive number (got "1h")'),
        ("JOB_RETENTION_DAYS", -1, "must be a whole number, 0 or more (got -1)"),
        ("JOB_RETENTION_DAYS", 1.5, "must be a whole number, 0 or more (got 1.5)"),
        ("JOB_RETENTION_DAYS", "two weeks", 'must be a whole number, 0 or more (got "two weeks")'),
        (
            "JOB_HEARTBEAT_SECONDS",
            60,
            "must be below MEALQUEST_JOB_LEASE_SECONDS (60), or unset to renew every third "
            "of the lease (got 60)",
        ),
        ("PG_POOLER", "session", 'must be one of none, transaction (got "session")'),
        ("PG_LISTEN", "sometimes", 'must be true or false (got "sometimes")'),
        ("PG_DEAD_SOCKET_SECONDS", 2, "must be a whole number, 3 or more (got 2)"),
        ("PG_DEAD_SOCKET_SECONDS", "15s", 'must be a whole number, 3 or more (got "15s")'),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable(tmp_path, key, value, message):
    with pytest.raises(ConfigError) as raised:
        create_app({"TESTING": True, "DATABASE": str(tmp_path / "x.sqlite3"), key: value})
    assert str(raised.value) == f"MEALQUEST_{key}: {message}"


def test_every_default_passes_its_rule(tmp_path):
    build(tmp_path)


def test_the_settings_reference_is_the_table_and_names_every_setting():
    # The table is the one place a setting's default and doc live; the docs'
    # settings page is generated from it at each build (docs/hooks.py).
    docs = Path(__file__).parent.parent / "docs"
    page = (docs / "reference" / "settings.md").read_text(encoding="utf-8")
    hooks = _docs_hooks(docs / "hooks.py")
    rendered = hooks.on_page_markdown(page)
    assert markdown_table() in rendered
    documented = set(re.findall(r"`MEALQUEST_([A-Z0-9_]+)`", rendered))
    assert {setting.key for setting in SETTINGS} <= documented


def _docs_hooks(path: Path):
    spec = importlib.util.spec_from_file_location("docs_hooks", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_values_are_normalised_for_the_code_that_reads_them(tmp_path):
    app = build(
        tmp_path,
        DB_SYNCHRONOUS="full",
        LOG_LEVEL="warning",
        JOB_POOL_IN_WEB="no",
        ALLOW_PRIVATE_URLS=1,
        JOB_WORKERS=8.0,
        JOB_LEASE_SECONDS=20,
    )
    config = app.config
    assert (config["DB_SYNCHRONOUS"], config["LOG_LEVEL"]) == ("FULL", "WARNING")
    assert (config["JOB_POOL_IN_WEB"], config["ALLOW_PRIVATE_URLS"]) == (False, True)
    assert config["JOB_WORKERS"] == 8
    assert isinstance(config["JOB_WORKERS"], int)
    assert config["JOB_LEASE_SECONDS"] == 20.0
    assert isinstance(config["JOB_LEASE_SECONDS"], float)


def test_the_heartbeat_and_rescue_follow_the_lease_unless_set(tmp_path):
    settings = get_jobs(build(tmp_path, JOB_LEASE_SECONDS=45)).settings
    assert (settings.lease_seconds, settings.heartbeat_seconds, settings.rescue_seconds) == (
        45.0,
        15.0,
        22.5,
    )
    defaults = get_jobs(build(tmp_path)).settings
    assert (defaults.lease_seconds, defaults.heartbeat_seconds, defaults.rescue_seconds) == (
        60.0,
        20.0,
        30.0,
    )
    chosen = get_jobs(
        build(tmp_path, JOB_LEASE_SECONDS=45, JOB_HEARTBEAT_SECONDS=1, JOB_RESCUE_SECONDS=5)
    ).settings
    assert (chosen.heartbeat_seconds, chosen.rescue_seconds) == (1.0, 5.0)


def test_the_blocked_loop_exit_follows_the_hub_monitor_unless_set(tmp_path):
    assert build(tmp_path).config["JOB_BLOCKED_EXIT_SECONDS"] == 10.0
    assert build(tmp_path, JOB_MAX_BLOCKING_SECONDS=0.5).config["JOB_BLOCKED_EXIT_SECONDS"] == 5.0
    # The monitor off: ten times its default.
    assert build(tmp_path, JOB_MAX_BLOCKING_SECONDS=0).config["JOB_BLOCKED_EXIT_SECONDS"] == 10.0
    chosen = build(tmp_path, JOB_BLOCKED_EXIT_SECONDS=3, JOB_LEASE_SECONDS=6)
    assert chosen.config["JOB_BLOCKED_EXIT_SECONDS"] == 3.0


@pytest.mark.parametrize(
    ("config", "limit", "heartbeat", "lease"),
    [
        # A third of the lease renews it: 15 is not above 10 + 5.
        ({"JOB_LEASE_SECONDS": 15}, "10", "5", "15"),
        ({"JOB_LEASE_SECONDS": 6, "JOB_MAX_BLOCKING_SECONDS": 0.5}, "5", "2", "6"),
        (
            {"JOB_LEASE_SECONDS": 2, "JOB_HEARTBEAT_SECONDS": 0.5, "JOB_BLOCKED_EXIT_SECONDS": 1.5},
            "1.5",
            "0.5",
            "2",
        ),
    ],
)
def test_a_lease_a_blocked_process_could_outlive_is_one_line_naming_it(
    tmp_path, config, limit, heartbeat, lease
):
    """A process exits once its loop has been blocked past the limit; its
    lease, renewed up to a heartbeat before the block began, must outlast that."""
    with pytest.raises(ConfigError) as raised:
        build(tmp_path, **config)
    assert str(raised.value) == (
        f"MEALQUEST_JOB_LEASE_SECONDS: must exceed MEALQUEST_JOB_BLOCKED_EXIT_SECONDS ({limit}) "
        f"plus MEALQUEST_JOB_HEARTBEAT_SECONDS ({heartbeat}), so that a process whose event "
        f"loop is blocked exits before its jobs' leases expire (got {lease})"
    )


def test_listen_follows_the_pooler_unless_set(tmp_path):
    assert build(tmp_path).config["PG_LISTEN"] is True
    bounced = build(tmp_path, PG_POOLER="Transaction").config
    assert (bounced["PG_POOLER"], bounced["PG_LISTEN"]) == ("transaction", False)
    assert build(tmp_path, PG_POOLER="none", PG_LISTEN=False).config["PG_LISTEN"] is False


def test_listen_through_a_transaction_pooler_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as raised:
        build(tmp_path, PG_POOLER="transaction", PG_LISTEN=True)
    assert str(raised.value) == (
        "MEALQUEST_PG_LISTEN: must be off (or unset) with MEALQUEST_PG_POOLER=transaction: "
        "a transaction pooler cannot hold a LISTEN"
    )


# -- the real commands, as an operator runs them ---------------------------------------------


def flask(tmp_path, *args: str, **config: object) -> subprocess.CompletedProcess[str]:
    """`flask ARGS` from the repository root (Flask finds `wsgi.py`), configured
    only by the `MEALQUEST_*` variables given."""
    env = serving_env(str(tmp_path / "mealquest.sqlite3"))
    for key in (
        "JOB_LEASE_SECONDS",
        "JOB_HEARTBEAT_SECONDS",
        "JOB_RESCUE_SECONDS",
        "JOB_BLOCKED_EXIT_SECONDS",
    ):
        del env[f"MEALQUEST_{key}"]
    env.update({f"MEALQUEST_{key}": str(value) for key, value in config.items()})
    return subprocess.run(
        [sys.executable, "-m", "flask", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_flask_db_upgrade_works_with_only_the_lease_set(tmp_path):
    result = flask(tmp_path, "db", "upgrade", JOB_LEASE_SECONDS=45)
    assert result.returncode == 0, result.stderr
    assert "migration(s) applied" in result.stdout
    migrate.require_current(str(tmp_path / "mealquest.sqlite3"))


@pytest.mark.parametrize(
    "command", [("db", "upgrade"), ("jobs", "work"), ("households", "list")], ids=" ".join
)
def test_a_flask_command_with_a_bad_value_prints_one_line_and_exits_non_zero(tmp_path, command):
    result = flask(tmp_path, *command, JOB_LEASE_SECONDS="abc")
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        'mealquest: MEALQUEST_JOB_LEASE_SECONDS: must be a positive number (got "abc")'
    ]
    assert result.stdout == ""
    assert not (tmp_path / "mealquest.sqlite3").exists()


def test_flask_jobs_work_with_a_lease_a_blocked_process_could_outlive_prints_one_line(tmp_path):
    result = flask(tmp_path, "jobs", "work", JOB_LEASE_SECONDS=15)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "mealquest: MEALQUEST_JOB_LEASE_SECONDS: must exceed MEALQUEST_JOB_BLOCKED_EXIT_SECONDS "
        "(10) plus MEALQUEST_JOB_HEARTBEAT_SECONDS (5), so that a process whose event loop is "
        "blocked exits before its jobs' leases expire (got 15)"
    ]


def gunicorn_output(tmp_path, *args: str, **config: object) -> tuple[int, list[str]]:
    """gunicorn's status and output lines, started on a migrated database (so
    that only the configuration can stop it) with `args` and `config`."""
    database = str(tmp_path / "mealquest.sqlite3")
    migrate.upgrade(database)
    result = gunicorn_refusing(serving_env(database, **config), "--bind", "127.0.0.1:0", *args)
    return result.returncode, (result.stdout + result.stderr).splitlines()


def test_gunicorn_refuses_a_lease_its_timeout_could_outlast_with_one_line(tmp_path):
    """gunicorn kills a worker whose loop is blocked only after `timeout`
    (30 s in gunicorn.conf.py); a lease renewed a heartbeat before the block
    must outlast that, or another process runs the job beside it."""
    status, lines = gunicorn_output(
        tmp_path, JOB_LEASE_SECONDS=30, JOB_HEARTBEAT_SECONDS=5, JOB_BLOCKED_EXIT_SECONDS=5
    )
    assert status != 0
    assert lines == [
        "mealquest: MEALQUEST_JOB_LEASE_SECONDS: must exceed gunicorn's timeout (30) plus "
        "MEALQUEST_JOB_HEARTBEAT_SECONDS (5), so that gunicorn kills a worker whose event loop "
        "is blocked before its jobs' leases expire (got 30)"
    ]


def test_gunicorn_refuses_no_timeout_while_its_workers_run_jobs(tmp_path):
    status, lines = gunicorn_output(tmp_path, "--timeout", "0")
    assert status != 0
    assert lines == [
        "mealquest: gunicorn's timeout is 0, which never kills a worker whose event loop is "
        "blocked: its jobs' leases would expire while it lives; set one (gunicorn.conf.py), "
        "or run the jobs in `flask jobs work` processes (MEALQUEST_JOB_POOL_IN_WEB=false)"
    ]


@pytest.mark.parametrize("app", ["wsgi:app", APP], ids=["wsgi", "an-app-module-of-its-own"])
def test_gunicorn_with_a_bad_value_prints_one_line_and_exits_non_zero(tmp_path, app):
    """Whether the app module turns the error into an exit itself (wsgi.py)
    or lets `create_app`'s ConfigError out, the master's preflight prints
    the one line before gunicorn logs or binds anything."""
    env = serving_env(str(tmp_path / "mealquest.sqlite3"), PROXY_FIX_HOPS=-1)
    result = gunicorn_refusing(env, "--bind", "127.0.0.1:0", app=app)
    assert result.returncode != 0
    assert (result.stdout + result.stderr).splitlines() == [
        "mealquest: MEALQUEST_PROXY_FIX_HOPS: must be a whole number, 0 or more (got -1)"
    ]


def test_a_mistyped_variable_is_named_once_with_the_nearest_setting(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MEALQUEST_JOB_WORKER", "4")
    monkeypatch.setenv("MEALQUEST_BIND", "127.0.0.1:9000")  # gunicorn's, not the app's
    monkeypatch.setenv("MEALQUEST_TEST_ANYTHING", "1")  # the suite's own
    assert unknown_variables(os.environ) == [
        "MEALQUEST_JOB_WORKER is no setting of this service and is ignored; "
        "did you mean MEALQUEST_JOB_WORKERS?"
    ]
    monkeypatch.setattr(application, "_warned", set())  # as in a new process
    logger = logging.getLogger("mealquest")
    logger.addHandler(caplog.handler)
    try:
        for _ in range(2):
            create_app({"TESTING": True, "DATABASE": str(tmp_path / "x.sqlite3")})
    finally:
        logger.removeHandler(caplog.handler)
    warned = [r.getMessage() for r in caplog.records if "MEALQUEST_JOB_WORKER " in r.getMessage()]
    assert len(warned) == 1  # once a process, however many apps it makes
