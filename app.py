"""Entry point for the Flask CLI (`flask --app app ...`); builds the app and nothing else."""

from mealquest import create_app

app = create_app()
