"""Administration commands: `flask db ...`, `flask households ...`, `flask tokens ...`,
`flask operators ...`.

Each command is a thin wrapper around a plain function of its module.
"""

from __future__ import annotations

import json

import click
from flask import Flask
from flask.cli import AppGroup

from mealquest import households, operators
from mealquest.command_group import CommandGroup, database_error
from mealquest.db import database_errors, migrations
from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from mealquest.model.households import HouseholdError
from mealquest.model.operators import OperatorError
from mealquest.operator_actions import erasure, suspension

db_cli = AppGroup("db", help="Database migrations.")
households_cli = CommandGroup("households", help="Households.")
tokens_cli = CommandGroup("tokens", help="API tokens of households.")
operators_cli = CommandGroup("operators", help="Operators: who may use /metrics and the dashboard.")


def _fail(error: Exception) -> click.ClickException:
    return click.ClickException(str(error))


def _migrated_store() -> Store:
    """The app's store, once the database is known to be migrated (or ahead of
    the code: a newer release migrated it; a warning says so)."""
    store = get_store()
    try:
        migrations.require_migrated(store)
    except migrations.MigrationError as error:
        raise _fail(error) from None
    except database_errors() as error:
        raise database_error(error) from None
    return store


def _echo_unknown(ledger: migrations.Ledger) -> None:
    for name in ledger.unknown:
        click.echo(f"{name}.sql  applied, not known to this code (a newer release's)")


@db_cli.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration."""
    try:
        applied = get_store().upgrade()
    except migrations.MigrationError as error:
        raise _fail(error) from None
    except database_errors() as error:
        raise database_error(error) from None
    for migration in applied:
        click.echo(f"applied {migration.path.name}")
    click.echo("database is up to date" if not applied else f"{len(applied)} migration(s) applied")
    try:
        ledger = get_store().migration_status()
    except database_errors():
        return  # nothing more to say than what was applied
    _echo_unknown(ledger)


@db_cli.command("status")
def db_status() -> None:
    """List applied and pending migrations; exits 1 while any is pending."""
    try:
        ledger = get_store().migration_status()
    except migrations.MigrationError as error:
        raise _fail(error) from None
    except database_errors() as error:
        raise database_error(error) from None
    for state in ledger.states:
        when = f"applied {state.applied_at}" if state.applied else "pending"
        click.echo(f"{state.migration.path.name}  {when}")
    _echo_unknown(ledger)
    if ledger.pending:
        raise click.exceptions.Exit(1)


@households_cli.command("create")
@click.argument("name")
def households_create(name: str) -> None:
    """Create a household; prints its id, its first token (shown only this
    once) and the token's id (what `flask tokens revoke` takes)."""
    try:
        issued = households.create_household(_migrated_store(), name)
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    click.echo(
        json.dumps(
            {
                "household_id": issued.household_id,
                "token_id": issued.token_id,
                "token": issued.token,
            }
        )
    )


@households_cli.command("list")
def households_list() -> None:
    """Households with their number of live tokens."""
    try:
        listed = households.list_households(_migrated_store())
    except StoreError as error:
        raise _fail(error) from None
    for household, tokens in listed:
        state = "  suspended" if household.suspended else ""
        click.echo(f"{household.id}  {household.name}  tokens={tokens}{state}")


@households_cli.command("suspend")
@click.argument("household_id", type=int)
def households_suspend(household_id: int) -> None:
    """Suspend a household: its requests are refused (403 household_suspended)
    and its queued jobs wait until it is resumed; running ones finish."""
    try:
        changed = suspension.suspend(_migrated_store(), household_id, None)
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    click.echo(f"household {household_id} {'suspended' if changed else 'was already suspended'}")


@households_cli.command("resume")
@click.argument("household_id", type=int)
def households_resume(household_id: int) -> None:
    """Lift a household's suspension."""
    try:
        changed = suspension.resume(_migrated_store(), household_id, None)
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    click.echo(f"household {household_id} {'resumed' if changed else 'was not suspended'}")


def _default_erase_wait() -> float:
    """Long enough for a cancelled job of a process that died to be rescued:
    a lease, then a rescue."""
    settings = get_jobs().settings
    return settings.lease_seconds + settings.rescue_seconds


@households_cli.command("erase")
@click.argument("household_id", type=int)
@click.option("--yes", is_flag=True, help="Really erase: there is no undo.")
@click.option(
    "--wait",
    "wait_seconds",
    type=click.FloatRange(0, 3600),
    default=None,
    help="Seconds to wait for its running jobs to end once cancelled "
    "(default: a lease and a rescue interval).",
)
def households_erase(household_id: int, yes: bool, wait_seconds: float | None) -> None:
    """Erase a household for good: its running jobs cancelled, then its tokens,
    jobs (with their idempotency keys) and recipes deleted in batches; only its
    id stays. Prints what was deleted, as JSON."""
    if not yes:
        raise click.ClickException(
            f"erasing household {household_id} deletes its tokens, jobs and recipes for good: "
            "add --yes to do it"
        )
    store = _migrated_store()
    try:
        done = erasure.erase(
            store,
            get_jobs(),
            household_id,
            None,
            wait_seconds=_default_erase_wait() if wait_seconds is None else wait_seconds,
        )
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    click.echo(json.dumps(done.__dict__))
    if done.still_running:
        click.echo(
            f"{done.still_running} jobs were still running: they end cancelled, and the hourly "
            "prune job (or erasing again) deletes them",
            err=True,
        )
    if not done.forgotten:
        click.echo(
            "a reader kept the database's WAL file from being cleared: erase again once "
            "it is quieter to leave no copy of the deleted rows in it",
            err=True,
        )


@tokens_cli.command("create")
@click.argument("household_id", type=int)
@click.option("--name", help="what its holder calls it (at most 100 characters)")
def tokens_create(household_id: int, name: str | None) -> None:
    """Make another token for a household (shown only this once)."""
    try:
        issued = households.create_token(_migrated_store(), household_id, name=name)
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    click.echo(
        json.dumps(
            {
                "household_id": issued.household_id,
                "token_id": issued.token_id,
                "token": issued.token,
            }
        )
    )


@tokens_cli.command("list")
@click.argument("household_id", type=int)
def tokens_list(household_id: int) -> None:
    """A household's tokens: id, name, created, last used (to the minute), and
    when revoked. Never a token itself: only its digest is stored."""
    try:
        tokens = households.list_tokens(_migrated_store(), household_id)
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    for token in tokens:
        revoked = f"  revoked={token.revoked_at}" if token.revoked_at else ""
        click.echo(
            f"{token.id}  name={token.name or '-'}  created={token.created_at}  "
            f"last_used={token.last_used_at or 'never'}{revoked}"
        )


@tokens_cli.command("revoke")
@click.argument("token_id", type=int)
def tokens_revoke(token_id: int) -> None:
    """Revoke a token: requests with it are refused from now on."""
    try:
        households.revoke_token(_migrated_store(), token_id)
    except (HouseholdError, StoreError) as error:
        raise _fail(error) from None
    click.echo(f"token {token_id} revoked")


@operators_cli.command("create")
@click.argument("name")
def operators_create(name: str) -> None:
    """Create an operator; prints its id and token (shown only this once)."""
    try:
        issued = operators.create_operator(_migrated_store(), name)
    except (OperatorError, StoreError) as error:
        raise _fail(error) from None
    click.echo(json.dumps({"operator_id": issued.operator_id, "token": issued.token}))


@operators_cli.command("list")
def operators_list() -> None:
    """Operators, live and revoked."""
    try:
        listed = operators.list_operators(_migrated_store())
    except StoreError as error:
        raise _fail(error) from None
    for operator in listed:
        state = f"revoked {operator.revoked_at}" if operator.revoked_at else "live"
        click.echo(f"{operator.id}  {operator.name}  created {operator.created_at}  {state}")


@operators_cli.command("revoke")
@click.argument("operator_id", type=int)
def operators_revoke(operator_id: int) -> None:
    """Revoke an operator: its token and its dashboard sessions stop working at once."""
    try:
        operators.revoke_operator(_migrated_store(), operator_id)
    except (OperatorError, StoreError) as error:
        raise _fail(error) from None
    click.echo(f"operator {operator_id} revoked")


def init_app(app: Flask) -> None:
    for group in (db_cli, households_cli, tokens_cli, operators_cli):
        app.cli.add_command(group)
