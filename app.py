"""Entry point for the Flask CLI (`flask --app app ...`); builds the app and nothing else."""

from mealquest.application import create_app_or_exit

app = create_app_or_exit()
