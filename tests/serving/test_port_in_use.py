"""gunicorn started on an address another server listens on: one line that
names the setting, and status 1 (gunicorn alone said "Connection in use"
five times, retrying, and exited with no hint)."""

from __future__ import annotations

import socket

import pytest

from tests.support.servers import gunicorn_refusing, serving_env

pytestmark = pytest.mark.sqlite_only("the address is checked before any database is opened")


def test_an_address_in_use_is_one_line_naming_the_setting(served):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**serving_env(served.database), "MEALQUEST_BIND": f"127.0.0.1:{port}"}
        # The timeout the served tests' short leases need (as `Gunicorn` passes it).
        done = gunicorn_refusing(env, "--timeout", "5")
    assert done.returncode == 1
    assert "Connection in use" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if "in use" in line]
    assert line == (
        f"mealquest: MEALQUEST_BIND: 127.0.0.1:{port} is in use (another server listens "
        "there): stop it, or set MEALQUEST_BIND (or gunicorn's --bind) to a free address, "
        "e.g. MEALQUEST_BIND=127.0.0.1:8001"
    )
