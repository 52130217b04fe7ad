"""The Flask CLI on PostgreSQL: migrations, households, and one clear line for a
server that cannot be reached or a URL that cannot be used."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from mealquest.application import create_app
from mealquest.config import ConfigError
from mealquest.db.postgresql import migrate
from tests.support.postgres import fresh_database, require_postgres_url


@pytest.fixture
def runner():
    with fresh_database(require_postgres_url()) as url:
        yield create_app({"TESTING": True, "DATABASE_URL": url}).test_cli_runner()


def test_db_status_upgrade_and_households_on_postgresql(runner):
    known = [m.path.name for m in migrate.discover(migrate.MIGRATIONS_DIR)]
    pending = runner.invoke(args=["db", "status"])
    assert pending.exit_code == 1
    assert pending.output.splitlines() == [f"{name}  pending" for name in known]

    upgraded = runner.invoke(args=["db", "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    assert [f"applied {name}" for name in known] == upgraded.output.splitlines()[: len(known)]
    assert runner.invoke(args=["db", "upgrade"]).output.strip() == "database is up to date"
    assert runner.invoke(args=["db", "status"]).exit_code == 0

    created = runner.invoke(args=["households", "create", "The Smiths"])
    assert created.exit_code == 0, created.output
    issued = json.loads(created.output)
    listed = runner.invoke(args=["households", "list"])
    assert listed.output.strip() == f"{issued['household_id']}  The Smiths  tokens=1"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "status"], ["households", "list"]])
def test_an_unreachable_server_is_one_line_naming_the_key_and_no_password(command):
    url = f"postgresql://mealquest:hunter2secret@127.0.0.1:{closed_port()}/mealquest"
    app = create_app({"TESTING": True, "DATABASE_URL": url, "DB_BUSY_TIMEOUT_SECONDS": 1})
    result = app.test_cli_runner().invoke(args=command)
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert line.startswith("Error: MEALQUEST_DATABASE_URL: cannot use the database ")
    assert "hunter2secret" not in result.output


@pytest.mark.parametrize(
    "url",
    ["mysql://u:hunter2secret@h/db", "postgresql://u:hunter2secret@/db", "sqlite://relative"],
)
def test_a_url_the_service_cannot_use_is_one_line_naming_the_key_and_no_password(url):
    with pytest.raises(ConfigError) as refused:
        create_app({"DATABASE_URL": url})
    message = str(refused.value)
    assert message.startswith("MEALQUEST_DATABASE_URL: must ")
    assert "hunter2secret" not in message


@contextlib.contextmanager
def dark_host(how: str) -> Iterator[int]:
    """A loopback port that never answers PostgreSQL: `silent` accepts the
    connection and says nothing; `drops` has its accept queue full, so that
    the kernel drops every new SYN (the client waits, as for a host that is off)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        if how == "silent":
            listener.listen(16)
        else:
            listener.listen(0)
            for _ in range(3):
                filler = socket.socket()
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
                fillers.append(filler)
        yield port
    finally:
        for sock in [*fillers, listener]:
            sock.close()


def first_host_dark(url: str, port: int) -> str:
    """`url` with a dark host before its own, failing over to the read-write one."""
    parts = urlsplit(url)
    credentials, _, own_host = parts.netloc.rpartition("@")
    netloc = f"{credentials}@127.0.0.1:{port},{own_host}"
    return parts._replace(netloc=netloc, query="target_session_attrs=read-write").geturl()


@pytest.mark.parametrize("how", ["silent", "drops"])
def test_a_failover_url_whose_first_host_is_dark_reaches_the_second(runner, how):
    assert runner.invoke(args=["db", "upgrade"]).exit_code == 0
    url = runner.app.config["DATABASE_URL"]
    with dark_host(how) as port:
        app = create_app({"TESTING": True, "DATABASE_URL": first_host_dark(url, port)})
        created = app.test_cli_runner().invoke(args=["households", "create", "The Smiths"])
        assert created.exit_code == 0, created.output
        listed = app.test_cli_runner().invoke(args=["households", "list"])
        assert listed.exit_code == 0, listed.output
        assert "The Smiths" in listed.output
