"""WSGI entry point for gunicorn (`wsgi:app`); builds the app and starts nothing.

Flask's CLI imports this module first for every `flask` command, so it must not
open the database or start the job pool; a bad setting ends the command with
one line naming it.
"""

from mealquest.serving.work_launch import restart_if_working

# `flask jobs work` re-executes monkey-patched before the app is built.
restart_if_working()

from mealquest.application import create_app_or_exit  # noqa: E402

app = create_app_or_exit()
