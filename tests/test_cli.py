"""The administration CLI: `flask db`, `flask households`, `flask tokens`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import click
import pytest

from mealquest import audit
from mealquest.db import migrations
from mealquest.db.sqlite import migrate
from tests.support import sql
from tests.support.ledger import add_newer_migration


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


pytestmark = pytest.mark.both_databases


@pytest.fixture
def fresh_app(make_app, tmp_path):
    """An app on a database file that no migration has touched yet."""
    return make_app(DATABASE=str(tmp_path / "fresh" / "mealquest.sqlite3"))


# -- db ---------------------------------------------------------------------------------------


@pytest.mark.sqlite_only(
    "the commands on an SQLite file of the test's own; on PostgreSQL: test_postgresql_cli.py"
)
def test_db_status_and_upgrade_on_a_fresh_database(fresh_app):
    runner = fresh_app.test_cli_runner()
    names = [m.path.name for m in migrations.discover(migrate.MIGRATIONS_DIR)]

    status = runner.invoke(args=["db", "status"])
    assert status.exit_code == 1
    for name in names:
        assert f"{name}  pending" in status.output
    # Looking does not create the file (nor fail because its folder is missing).
    assert not Path(fresh_app.config["DATABASE"]).parent.exists()

    upgrade = runner.invoke(args=["db", "upgrade"])
    assert upgrade.exit_code == 0, upgrade.output
    for name in names:
        assert f"applied {name}" in upgrade.output
    assert f"{len(names)} migration(s) applied" in upgrade.output

    status = runner.invoke(args=["db", "status"])
    assert status.exit_code == 0, status.output
    assert "pending" not in status.output
    assert all(f"{name}  applied 20" in status.output for name in names)

    again = runner.invoke(args=["db", "upgrade"])
    assert again.exit_code == 0
    assert again.output.strip() == "database is up to date"


@pytest.mark.sqlite_only(
    "the commands on an SQLite file of the test's own; on PostgreSQL: test_postgresql_cli.py"
)
def test_db_status_exits_1_while_a_migration_is_pending(fresh_app):
    migrate.upgrade(fresh_app.config["DATABASE"], target=2)
    runner = fresh_app.test_cli_runner()
    status = runner.invoke(args=["db", "status"])
    assert status.exit_code == 1
    assert "0001_init.sql  applied" in status.output
    assert "0003_jobs_status.sql  pending" in status.output


def test_a_changed_applied_migration_is_refused_by_status_and_upgrade(runner, db_path):
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 2")
    finally:
        conn.close()

    for command in (["db", "status"], ["db", "upgrade"]):
        result = runner.invoke(args=command)
        assert result.exit_code == 1
        assert "Error: migration 0002_jobs.sql was changed after it was applied" in result.output
        assert "Traceback" not in result.output


# -- households ------------------------------------------------------------------------------


def test_households_create_prints_a_working_token(runner, client):
    result = runner.invoke(args=["households", "create", "  The Browns  "])
    assert result.exit_code == 0, result.output
    created = json.loads(result.output)
    assert set(created) == {"household_id", "token_id", "token"}
    assert isinstance(created["household_id"], int)

    response = client.get("/api/v1/jobs", headers=bearer(created["token"]))
    assert response.status_code == 200

    listed = runner.invoke(args=["households", "list"])
    assert listed.exit_code == 0
    assert f"{created['household_id']}  The Browns  tokens=1" in listed.output

    # The token's id is what revoking it takes.
    revoked = runner.invoke(args=["tokens", "revoke", str(created["token_id"])])
    assert revoked.exit_code == 0, revoked.output
    assert client.get("/api/v1/jobs", headers=bearer(created["token"])).status_code == 401


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "1 to 200 characters"),
        ("   ", "1 to 200 characters"),
        ("x" * 201, "1 to 200 characters"),
        ("The Smiths\n2  Forged  tokens=9", "no control characters"),
        ("bidi\u202eevil", "no control characters"),
        # Bytes of the command line that are not UTF-8 arrive as lone surrogates.
        ("Smiths\udcff", "no control characters and no bytes that are not UTF-8"),
    ],
    ids=["empty", "blank", "too-long", "newline", "bidi-override", "not-utf-8"],
)
def test_households_create_refuses_a_bad_name(runner, store, name, message):
    result = runner.invoke(args=["households", "create", name])
    assert result.exit_code == 1
    assert f"Error: a household name has {message}" in result.output
    assert sql.scalar(store, "SELECT count(*) FROM households WHERE id <> 0") == 0


def test_households_list_counts_live_tokens(runner, household, other_household):
    runner.invoke(args=["tokens", "create", str(household.household_id)])
    runner.invoke(args=["tokens", "revoke", str(other_household.token_id)])
    result = runner.invoke(args=["households", "list"])
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        f"{household.household_id}  The Smiths  tokens=2",
        f"{other_household.household_id}  The Joneses  tokens=0",
    ]


def test_households_list_of_no_households_prints_nothing(runner):
    result = runner.invoke(args=["households", "list"])
    assert result.exit_code == 0
    assert result.output == ""


# -- tokens ----------------------------------------------------------------------------------


def test_tokens_create_makes_another_working_token(runner, client, household):
    result = runner.invoke(args=["tokens", "create", str(household.household_id)])
    assert result.exit_code == 0, result.output
    created = json.loads(result.output)
    assert created["household_id"] == household.household_id
    assert created["token_id"] != household.token_id
    assert created["token"] != household.token
    assert client.get("/api/v1/jobs", headers=bearer(created["token"])).status_code == 200
    assert client.get("/api/v1/jobs", headers=bearer(household.token)).status_code == 200


def test_tokens_list_shows_each_token_with_its_last_use_and_never_a_secret(
    runner, client, household
):
    made = runner.invoke(
        args=["tokens", "create", str(household.household_id), "--name", "kitchen tablet"]
    )
    assert made.exit_code == 0, made.output
    tablet = json.loads(made.output)

    before = runner.invoke(args=["tokens", "list", str(household.household_id)])
    assert before.exit_code == 0, before.output
    lines = before.output.splitlines()
    assert [line.split()[0] for line in lines] == [
        str(household.token_id),
        str(tablet["token_id"]),
    ]
    assert "name=kitchen tablet" in lines[1]
    assert all("last_used=never" in line for line in lines)

    assert client.get("/api/v1/jobs", headers=bearer(tablet["token"])).status_code == 200
    runner.invoke(args=["tokens", "revoke", str(household.token_id)])
    after = runner.invoke(args=["tokens", "list", str(household.household_id)]).output
    first, second = after.splitlines()
    assert "last_used=never" in first
    assert "revoked=" in first
    assert "last_used=20" in second
    assert "revoked=" not in second
    for token in (household.token, tablet["token"]):
        assert token not in before.output + after
        assert token.removeprefix("mq_")[:12] not in before.output + after


def test_tokens_list_refuses_an_unknown_household(runner):
    result = runner.invoke(args=["tokens", "list", "999"])
    assert result.exit_code == 1
    assert "Error: No household has that id." in result.output


def test_tokens_create_refuses_an_unknown_household(runner, store):
    result = runner.invoke(args=["tokens", "create", "999"])
    assert result.exit_code == 1
    assert "Error: No household has that id." in result.output
    assert sql.scalar(store, "SELECT count(*) FROM api_tokens") == 0


def test_tokens_create_refuses_a_non_numeric_id(runner):
    result = runner.invoke(args=["tokens", "create", "smiths"])
    assert result.exit_code == 2
    assert "is not a valid integer" in result.output


def test_tokens_revoke_stops_the_token_at_once(runner, client, household):
    headers = bearer(household.token)
    assert client.get("/api/v1/jobs", headers=headers).status_code == 200

    result = runner.invoke(args=["tokens", "revoke", str(household.token_id)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"token {household.token_id} revoked"
    assert client.get("/api/v1/jobs", headers=headers).status_code == 401

    twice = runner.invoke(args=["tokens", "revoke", str(household.token_id)])
    assert twice.exit_code == 1
    assert "Error: No token has that id, or it is already revoked." in twice.output

    unknown = runner.invoke(args=["tokens", "revoke", "999"])
    assert unknown.exit_code == 1
    assert "Error: No token has that id, or it is already revoked." in unknown.output


@pytest.mark.sqlite_only(
    "the commands on an SQLite file of the test's own; on PostgreSQL: test_postgresql_cli.py"
)
@pytest.mark.parametrize(
    "command",
    [
        ["households", "create", "The Browns"],
        ["households", "list"],
        ["tokens", "create", "1"],
        ["tokens", "revoke", "1"],
    ],
    ids=["households-create", "households-list", "tokens-create", "tokens-revoke"],
)
def test_household_commands_on_a_database_behind_the_migrations_say_what_to_run(fresh_app, command):
    runner = fresh_app.test_cli_runner()
    missing = runner.invoke(args=command)
    assert missing.exit_code == 1
    assert "flask db upgrade" in missing.output
    assert "Traceback" not in missing.output

    migrate.upgrade(fresh_app.config["DATABASE"], target=1)
    behind = runner.invoke(args=command)
    assert behind.exit_code == 1
    assert "flask db upgrade" in behind.output


@pytest.mark.sqlite_only(
    "the commands on an SQLite file of the test's own; on PostgreSQL: test_postgresql_cli.py"
)
def test_db_commands_on_a_file_that_is_not_a_database_fail_clearly(make_app, tmp_path):
    path = tmp_path / "not-a-database.sqlite3"
    path.write_bytes(b"this is not an SQLite file, just some text that is long enough" * 20)
    runner = make_app(DATABASE=str(path)).test_cli_runner()
    for command in (["db", "status"], ["db", "upgrade"], ["households", "list"]):
        result = runner.invoke(args=command)
        assert result.exit_code == 1, command
        assert f"Error: MEALQUEST_DATABASE: cannot use the database {path}" in result.output
        assert "not a database" in result.output


# -- a database ahead of the code (a newer release migrated it) ------------------------------


def test_commands_serve_a_database_ahead_of_the_code(runner, db_path, household):
    name = add_newer_migration(db_path)

    status = runner.invoke(args=["db", "status"])
    assert status.exit_code == 0, status.output
    assert f"{name}.sql  applied, not known to this code (a newer release's)" in status.output
    assert "pending" not in status.output

    upgrade = runner.invoke(args=["db", "upgrade"])
    assert upgrade.exit_code == 0, upgrade.output
    assert upgrade.output.splitlines()[0] == "database is up to date"
    assert name in upgrade.output

    # Other commands are refused (see below); a server serves it.


def _every_command(app) -> list[list[str]]:
    """Every command but `flask db ...` and `flask jobs work`, with made-up
    arguments (the database check comes before they are used)."""
    commands = []
    for group_name, group in app.cli.commands.items():
        assert isinstance(group, click.Group)
        for name, command in group.commands.items():
            if group_name == "db" or (group_name, name) == ("jobs", "work"):
                continue
            args = [group_name, name]
            for param in command.params:
                if param.required and isinstance(param, click.Option):
                    args += [param.opts[0], "1"]
                elif param.required:
                    args.append("1")
            commands.append(args)
    return commands


@pytest.mark.sqlite_only(
    "the commands on an SQLite file of the test's own; on PostgreSQL: test_postgresql_cli.py"
)
@pytest.mark.parametrize("at", ["behind", "ahead"])
def test_every_command_on_a_database_at_another_migration_says_both_in_one_line(fresh_app, at):
    app, path = fresh_app, fresh_app.config["DATABASE"]
    newest = max(m.version for m in migrations.discover(migrate.MIGRATIONS_DIR))
    if at == "behind":
        migrate.upgrade(path, target=2)
        expected = f"is at migration 0002, behind this code's {newest:04d}"
    else:
        migrate.upgrade(path)
        add_newer_migration(path)
        expected = f"is at migration {newest + 1:04d}, ahead of this code's {newest:04d}"
    commands = _every_command(app)
    assert len(commands) >= 15
    runner = app.test_cli_runner()
    for command in commands:
        result = runner.invoke(args=command)
        assert result.exit_code == 1, (command, result.output)
        assert not result.exception or isinstance(result.exception, SystemExit), command
        [line] = result.output.splitlines()
        assert expected in line, command
        assert "flask db upgrade" in line, command


def test_every_operator_action_from_the_command_line_is_audited(runner, store, jobs):
    def run(*args):
        result = runner.invoke(args=list(args))
        assert result.exit_code == 0, (args, result.output)
        return result.output

    created = json.loads(run("households", "create", "The Joneses"))
    household_id = created["household_id"]
    token = json.loads(run("tokens", "create", str(household_id)))
    run("tokens", "revoke", str(token["token_id"]))
    operator_id = json.loads(run("operators", "create", "Grace"))["operator_id"]
    run("operators", "revoke", str(operator_id))
    run("jobs", "pause", "succeed")
    run("jobs", "pause", "succeed")
    run("jobs", "resume", "succeed")
    job_id = json.loads(
        run("jobs", "enqueue", "succeed", '{"value": 1}', "--household", str(household_id))
    )["id"]
    run("jobs", "cancel", job_id)
    run("jobs", "prune", "--older-than", "0")

    entries = [(e.action, e.target, e.count) for e in reversed(audit.entries(store))]
    assert entries == [
        ("create", f"household {household_id}", 1),
        ("create", f"token {token['token_id']} of household {household_id}", 1),
        ("revoke", f"token {token['token_id']}", 1),
        ("create", f"operator {operator_id}", 1),
        ("revoke", f"operator {operator_id}", 1),
        ("pause", "kind succeed", 1),
        ("pause", "kind succeed", 0),
        ("resume", "kind succeed", 1),
        ("enqueue", f"job {job_id} (succeed) of household {household_id}", 1),
        ("cancel", f"job {job_id}", 1),
        ("prune", "finished jobs older than 0 days", 1),
    ]
    assert all(e.actor.startswith("command line (") for e in audit.entries(store))
