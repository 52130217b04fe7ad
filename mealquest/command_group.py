"""The CLI's command groups: every command but `flask db ...` and the servers
runs only on a database at this code's migrations.

A command of this code on an older database fails half way, on a missing
column, with a traceback; on a newer one it may write what the newer code
does not expect. So each command checks first, after its arguments are
parsed (`--help` needs no database), and a database at another migration
is one line naming both and `flask db upgrade`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from flask import current_app
from flask.cli import AppGroup, ScriptInfo

from mealquest.db import database_errors, migrations
from mealquest.extensions import get_store


def database_error(error: Exception) -> click.ClickException:
    """One line naming the setting that chose the database, and what went wrong."""
    key = "DATABASE_URL" if current_app.config.get("DATABASE_URL") else "DATABASE"
    where = get_store().describe()
    return click.ClickException(f"MEALQUEST_{key}: cannot use the database {where}: {error}")


class CurrentDatabaseCommand(click.Command):
    """A command that runs only on a database at this code's migrations."""

    def invoke(self, ctx: click.Context) -> Any:
        if not current_app:
            # As `with_appcontext` does for the command's body, which comes later.
            ctx.with_resource(ctx.ensure_object(ScriptInfo).load_app().app_context())
        try:
            migrations.require_this_version(get_store())
        except migrations.MigrationError as error:
            raise click.ClickException(str(error)) from None
        except database_errors() as error:
            raise database_error(error) from None
        return super().invoke(ctx)


class CommandGroup(AppGroup):
    """A group whose commands are `CurrentDatabaseCommand`s unless they say
    otherwise (`cls=click.Command` for a server)."""

    def command(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], click.Command]:
        kwargs.setdefault("cls", CurrentDatabaseCommand)
        return super().command(*args, **kwargs)
