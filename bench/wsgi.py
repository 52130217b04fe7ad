"""The bench app for gunicorn (`-c gunicorn.conf.py bench.wsgi:app`) and for
`flask --app bench.wsgi jobs work`; configured by `MEALQUEST_*` variables, starts nothing."""

from mealquest.serving.work_launch import restart_if_working

# `flask jobs work` re-executes monkey-patched before the app is built.
restart_if_working()

from bench.app import create_bench_app  # noqa: E402

app = create_bench_app()
