"""The bench app for gunicorn (`-c gunicorn.conf.py bench.wsgi:app`) and for
`flask --app bench.wsgi jobs work`; configured by `MEALQUEST_*` variables, starts nothing."""

from bench.app import create_bench_app

app = create_bench_app()
