"""An app with the test kinds, for `flask --app tests.support.worker_app jobs work` processes."""

from mealquest.serving.work_launch import restart_if_working

# `flask jobs work` re-executes monkey-patched before the app is built.
restart_if_working()

from mealquest.application import create_app  # noqa: E402
from mealquest.jobs.service import get_jobs  # noqa: E402
from tests.support.kinds import register_test_kinds  # noqa: E402

app = create_app()
register_test_kinds(get_jobs(app).registry)
