"""WSGI entry point for gunicorn (`wsgi:app`); builds the app and starts nothing.

Flask's CLI imports this module first for every `flask` command, so it must not
open the database or start the job pool; a bad setting ends the command with
one line naming it.
"""

from mealquest.application import create_app_or_exit

app = create_app_or_exit()
