"""The systemd units shipped in deploy/systemd/: valid to systemd itself
(`systemd-analyze verify`, their paths pointed at this checkout), and holding
the values the deployment guide and gunicorn.conf.py promise: a stop that outlasts the
graceful one, SIGTERM to the main process only, a reload by SIGHUP, the
commands the deployment guide names."""

from __future__ import annotations

import os
import runpy
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from mealquest.config import DEFAULTS

REPO = Path(__file__).resolve().parents[1]
UNITS = REPO / "deploy" / "systemd"
WEB = UNITS / "mealquest.service"
WORKER = UNITS / "mealquest-worker@.service"
# Where the units expect the release (the deployment guide's layout).
APP_DIR = "/srv/mealquest/app"


def parse(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections, each key with its values in order (systemd
    allows a key more than once, e.g. Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: a key outside any section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    [value] = unit[section][key]
    return value


def seconds(value: str) -> float:
    """A systemd time span as these units write it: plain seconds or `Ns`."""
    return float(value.removesuffix("s"))


def test_the_web_unit_stops_after_gunicorns_graceful_timeout_and_reloads_by_sighup():
    unit = parse(WEB)
    gunicorn = runpy.run_path(str(REPO / "gunicorn.conf.py"))
    assert (
        one(unit, "Service", "ExecStart")
        == f"{APP_DIR}/.venv/bin/gunicorn -c gunicorn.conf.py wsgi:app"
    )
    assert one(unit, "Service", "WorkingDirectory") == APP_DIR
    # SIGTERM to the master only: it drains its workers itself.
    assert one(unit, "Service", "KillMode") == "mixed"
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > gunicorn["graceful_timeout"]
    assert one(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(unit, "Service", "Restart") == "on-failure"
    assert "MEALQUEST_PROXY_FIX_HOPS=1" in unit["Service"]["Environment"]
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_the_worker_unit_outlasts_a_stopping_pool_and_shares_the_web_units_environment():
    unit, web = parse(WORKER), parse(WEB)
    assert one(unit, "Service", "ExecStart") == f"{APP_DIR}/.venv/bin/flask jobs work"
    # A SIGTERMed pool lets its jobs run for the stop timeout, then gives the
    # ones it stops the kill grace to die before it records them.
    stopping = DEFAULTS["JOB_STOP_TIMEOUT_SECONDS"] + DEFAULTS["JOB_KILL_GRACE_SECONDS"]
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > stopping
    assert one(unit, "Service", "KillMode") == "mixed"
    assert one(unit, "Service", "Restart") == "on-failure"
    for key in ("User", "Group", "WorkingDirectory", "EnvironmentFile"):
        assert unit["Service"][key] == web["Service"][key], key
    database = [e for e in web["Service"]["Environment"] if e.startswith("MEALQUEST_DATABASE")]
    assert set(database) <= set(unit["Service"]["Environment"])


def test_the_deployment_guide_points_at_the_shipped_units():
    guide = (REPO / "docs" / "operations" / "deployment.md").read_text()
    for unit in (WEB, WORKER):
        assert f"deploy/systemd/{unit.name}" in guide


def test_systemd_accepts_the_units(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        message = "systemd-analyze is missing: `scripts/test` installs Debian's systemd package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # The release's paths pointed at this checkout, whose .venv has the programs:
    # systemd checks that each command exists.
    for unit in (WEB, WORKER):
        (tmp_path / unit.name).write_text(unit.read_text().replace(APP_DIR, str(REPO)))
    names = [WEB.name, WORKER.name.replace("@.", "@1.")]
    done = subprocess.run(
        [analyze, "verify", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Unknown keys and bad values are only warned about: any output is a fault.
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), shlex.join(names)
