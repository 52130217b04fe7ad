"""WSGI entry point for gunicorn (`wsgi:app`); builds the app and starts nothing.

Flask's CLI imports this module first for every `flask` command, so it must not
open the database or start the job pool.
"""

from mealquest import create_app

app = create_app()
