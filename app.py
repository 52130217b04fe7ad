"""Entry point for the Flask CLI (`flask --app app ...`); builds the app and nothing else."""

from mealquest.serving.work_launch import restart_if_working

# `flask jobs work` re-executes monkey-patched before the app is built.
restart_if_working()

from mealquest.application import create_app_or_exit  # noqa: E402

app = create_app_or_exit()
