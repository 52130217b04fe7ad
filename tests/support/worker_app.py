"""An app with the test kinds, for `flask --app tests.support.worker_app jobs work` processes."""

from mealquest.application import create_app
from mealquest.jobs.service import get_jobs
from tests.support.kinds import register_test_kinds

app = create_app()
register_test_kinds(get_jobs(app).registry)
