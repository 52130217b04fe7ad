"""gunicorn's master, before it binds or forks: refuse a start that cannot serve.

`gunicorn.conf.py` runs `check_start` in a child process from its first
hook, so that the master itself never imports the app or opens the
database, and a refusal is the first line gunicorn's output shows.
"""

from __future__ import annotations

import sys

from gunicorn.util import import_app

from mealquest.config import ConfigError, check_gunicorn_timeout
from mealquest.db import database_errors, migrations
from mealquest.extensions import get_store
from mealquest.serving import flask_app


def check_start(app_uri: str, timeout: str) -> int:
    """Exit status for gunicorn's start: 0 if the app's configuration is good,
    also with gunicorn's `timeout` (seconds, as gunicorn.conf.py passes it),
    and its database migrated (or ahead of the code: served with a warning),
    else 1 after printing one line that says what is wrong and what to run."""
    try:
        app = flask_app(import_app(app_uri))
        check_gunicorn_timeout(app.config, float(timeout))
    except ConfigError as error:
        return _refuse(str(error))
    store = get_store(app)
    path = store.describe()
    key = "MEALQUEST_DATABASE_URL" if app.config.get("DATABASE_URL") else "MEALQUEST_DATABASE"
    try:
        migrations.require_migrated(store)
    except migrations.DatabaseNotMigrated as error:
        return _refuse(f"refusing to start: {error}, then start gunicorn again")
    except migrations.MigrationError as error:
        return _refuse(f"refusing to start: the database {path} cannot be served: {error}")
    except database_errors() as error:
        return _refuse(f"refusing to start: {key}: the database {path} cannot be read: {error}")
    finally:
        store.close()
    return 0


def _refuse(line: str) -> int:
    print(f"mealquest: {line}", file=sys.stderr)
    return 1
