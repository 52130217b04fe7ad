"""The serving tests' app (`tests.support.serving_app`) with the `give_up` kind,
for gunicorn and `flask jobs work` processes."""

from mealquest.jobs.service import get_jobs
from tests.support.give_up import register_give_up
from tests.support.serving_app import app

register_give_up(get_jobs(app))

__all__ = ["app"]
