"""gunicorn's master, before it binds or forks: refuse a start that cannot serve.

`gunicorn.conf.py` runs `check_database` in a child process from its first
hook, so that the master itself never imports the app or opens the
database, and a refusal is the first line gunicorn's output shows.
"""

from __future__ import annotations

import os
import sys

from gunicorn.util import import_app

from mealquest import migrations
from mealquest.config_check import ConfigError
from mealquest.serving import flask_app


def check_database(app_uri: str) -> int:
    """Exit status for gunicorn's start: 0 if the app's configuration is good
    and its database fully migrated, else 1 after printing one line that says
    what is wrong and what to run.

    Run by the master in a child process (see gunicorn.conf.py), so the
    master itself never imports the app or opens the database.
    """
    try:
        app = flask_app(import_app(app_uri))
    except ConfigError as error:
        print(f"mealquest: {error}", file=sys.stderr)
        return 1
    path = app.config["DATABASE"]
    refusal = "mealquest: refusing to start: the database"
    if not os.path.exists(path):
        print(f"{refusal} {path} does not exist; run `flask db upgrade` first", file=sys.stderr)
        return 1
    try:
        pending = [s.migration.path.name for s in migrations.status(path) if not s.applied]
    except migrations.MigrationError as error:
        print(f"{refusal} {path} cannot be used: {error}", file=sys.stderr)
        return 1
    if pending:
        print(
            f"{refusal} {path} is not migrated ({len(pending)} pending: {', '.join(pending)}); "
            "run `flask db upgrade`, then start gunicorn again",
            file=sys.stderr,
        )
        return 1
    return 0
