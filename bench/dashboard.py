"""Dashboard pages' latency with 1,000,000 jobs in the table:
`python -m bench.dashboard [--jobs N] [--rounds N] [--postgres URL]`.

Builds a table of jobs as a busy deployment holds them (most succeeded, some
failed, a backlog queued and a few running, over 1,000 households, 4 kinds,
finished over two weeks), the charts' history of two days as such a
deployment writes it (every kind, every minute and ten minutes, waits and
runs spread over several duration buckets) and 10,000 audit entries, signs
an operator in and times each dashboard page through the app (Flask's test
client: the app's own time, no network), with the queue figures read afresh
for every request (`cold`: the worst case, as when the 1.5 s cache has just
expired) and from the cache. Prints a Markdown table of the median and the
95th percentile per page; the target is a median under 100 ms with
1,000,000 jobs.
"""

from __future__ import annotations

import argparse
import random
import re
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TARGET_MS = 100.0
KINDS = ("recipe_import", "meal_plan", "shopping_list", "nutrition")
HOUSEHOLDS = 1000

# Statuses by the row number modulo 1,000: 2 % queued (half of them due), 0.2 %
# running, 6 % failed, the rest succeeded.
_SQLITE_FILL = """
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < :rows),
r AS (
    SELECT x,
        CASE WHEN x % 1000 < 20 THEN 'queued' WHEN x % 1000 < 22 THEN 'running'
            WHEN x % 1000 < 82 THEN 'failed' ELSE 'succeeded' END AS status,
        strftime('%Y-%m-%dT%H:%M:%f000Z', 'now',
            '-' || ((:rows - x) * 1209600 / :rows) || ' seconds') AS at
    FROM n
)
INSERT INTO jobs (id, household_id, kind, payload, status, result, error, attempt,
    max_attempts, run_at, lease_owner, lease_expires_at, created_at, updated_at,
    started_at, finished_at)
SELECT printf('%032x', x), 1 + x % :households,
    CASE x % 4 WHEN 0 THEN 'recipe_import' WHEN 1 THEN 'meal_plan'
        WHEN 2 THEN 'shopping_list' ELSE 'nutrition' END,
    '{"url": "https://recipes.example/soup?token=secret' || x || '"}',
    status,
    CASE WHEN status = 'succeeded' THEN '{"recipe_id": "r"}' END,
    CASE WHEN status = 'failed' THEN 'the page could not be fetched (HTTP 404)' END,
    CASE WHEN status = 'queued' THEN 0 ELSE 1 END, 3,
    CASE WHEN status = 'queued' AND x % 2 = 0
        THEN strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '+1 day') ELSE at END,
    CASE WHEN status = 'running' THEN 'bench-owner' END,
    CASE WHEN status = 'running' THEN strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '+1 hour') END,
    at, at,
    CASE WHEN status <> 'queued' THEN at END,
    CASE WHEN status IN ('succeeded', 'failed') THEN at END
FROM r
"""

_POSTGRES_FILL = """
INSERT INTO jobs (id, household_id, kind, payload, status, result, error, attempt,
    max_attempts, run_at, lease_owner, lease_expires_at, created_at, updated_at,
    started_at, finished_at)
SELECT lpad(to_hex(x), 32, '0'), 1 + x %% %(households)s,
    (ARRAY['recipe_import', 'meal_plan', 'shopping_list', 'nutrition'])[1 + x %% 4],
    '{"url": "https://recipes.example/soup?token=secret' || x || '"}',
    s.status,
    CASE WHEN s.status = 'succeeded' THEN '{"recipe_id": "r"}' END,
    CASE WHEN s.status = 'failed' THEN 'the page could not be fetched (HTTP 404)' END,
    CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END, 3,
    t.at + CASE WHEN s.status = 'queued' AND x %% 2 = 0 THEN interval '1 day' ELSE interval '0' END,
    CASE WHEN s.status = 'running' THEN 'bench-owner' END,
    CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END,
    t.at, t.at,
    CASE WHEN s.status <> 'queued' THEN t.at END,
    CASE WHEN s.status IN ('succeeded', 'failed') THEN t.at END
FROM generate_series(1, %(rows)s) AS x,
LATERAL (SELECT CASE WHEN x %% 1000 < 20 THEN 'queued' WHEN x %% 1000 < 22 THEN 'running'
    WHEN x %% 1000 < 82 THEN 'failed' ELSE 'succeeded' END AS status) AS s,
LATERAL (SELECT now() - (%(rows)s - x) * interval '14 days' / %(rows)s AS at) AS t
"""


# Each series of a kind's history rows in a period: its first duration bucket
# and how many buckets it spreads over (waits of 20 ms to a second or so, runs
# of half a second to ten, failures quicker), as a busy deployment's are.
_SERIES = (("wait", 4, 6), ("succeeded", 12, 6), ("failed", 10, 3), ("retried", 9, 2))
_AUDIT_ENTRIES = 10_000


def history_rows(now: datetime) -> list[tuple[Any, ...]]:
    """(width, period start, kind, series, bucket, count) for two hours of minutes
    and two days of ten minutes, up to the period `now` is in."""
    chosen = random.Random(7)
    rows = []
    for width, periods in ((1, 120), (10, 288)):
        last = now.replace(second=0, microsecond=0)
        last -= timedelta(minutes=last.minute % width)
        for index in range(periods):
            start = last - timedelta(minutes=width * index)
            for kind in KINDS:
                for series, first, spread in _SERIES:
                    for bucket in range(first, first + spread):
                        rows.append(
                            (width, start, kind, series, bucket, chosen.randint(1, 9) * width)
                        )
                rows.append((width, start, kind, "cancelled", -1, chosen.randint(0, 2) * width + 1))
    return rows


def _households_sql(count: int) -> str:
    return f"WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < {count}) "


def build_sqlite(directory: Path, rows: int) -> dict[str, Any]:
    from mealquest.db.sqlite import migrate

    path = str(directory / "dashboard.sqlite3")
    migrate.upgrade(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        _households_sql(HOUSEHOLDS) + "INSERT INTO households (name, created_at) "
        "SELECT 'household ' || x, '2024-01-01T00:00:00.000000Z' FROM n"
    )
    conn.execute(_SQLITE_FILL, {"rows": rows, "households": HOUSEHOLDS})
    conn.executemany(
        "INSERT INTO job_history (width, period, kind, series, bucket, count) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            (w, p.strftime("%Y-%m-%dT%H:%M"), *rest)
            for w, p, *rest in history_rows(datetime.now(UTC))
        ],
    )
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
        "INSERT INTO audit_log (at, actor, action, target, count) "
        "SELECT strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', '-' || x || ' minutes'), 'Ada', "
        "'retry', 'job ' || printf('%032x', x), 1 FROM n",
        (_AUDIT_ENTRIES,),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return {"DATABASE": path}


def build_postgres(url: str, rows: int) -> dict[str, Any]:
    from tests.support.postgres import fresh_database

    context = fresh_database(url, migrated=True)
    database_url = context.__enter__()
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO households (name, created_at) "
            "SELECT 'household ' || x, now() FROM generate_series(1, %s) AS x",
            (HOUSEHOLDS,),
        )
        conn.execute(_POSTGRES_FILL, {"rows": rows, "households": HOUSEHOLDS})
        now = conn.execute("SELECT now() AS now").fetchone()[0]
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO job_history (width, period, kind, series, bucket, count) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                history_rows(now),
            )
        conn.execute(
            "INSERT INTO audit_log (at, actor, action, target, count) "
            "SELECT now() - x * interval '1 minute', 'Ada', 'retry', "
            "'job ' || lpad(to_hex(x), 32, '0'), 1 FROM generate_series(1, %s) AS x",
            (_AUDIT_ENTRIES,),
        )
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE job_history")
    return {"DATABASE_URL": database_url, "_context": context}


def measure(database: dict[str, Any], rounds: int) -> list[tuple[str, float, float]]:
    from mealquest.admin.views import CHARTS_KEY
    from mealquest.application import create_app
    from mealquest.extensions import get_store
    from mealquest.metrics.view import cached_figures
    from mealquest.operators import create_operator

    config = {k: v for k, v in database.items() if not k.startswith("_")}
    app = create_app(
        {**config, "TESTING": True, "DASHBOARD": True, "SECRET_KEY": "bench-" + "k" * 32}
    )
    store = get_store(app)
    operator = create_operator(store, "bench")
    client = app.test_client()
    form = client.get("/admin/sign-in").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
    client.post("/admin/sign-in", data={"token": operator.token, "csrf_token": csrf})
    listing = client.get("/admin/jobs?status=failed").get_data(as_text=True)
    job_id = re.search(r'href="/admin/jobs/([0-9a-f]{32})"', listing).group(1)
    deep = store.read(lambda conn: conn.execute("SELECT max(seq) / 2 AS s FROM jobs").fetchone())
    middle = deep["s"] if isinstance(deep, dict) else deep[0]
    figures = cached_figures(app)

    def cold() -> None:
        figures.forget()

    def first() -> None:
        # A process's first page: figures and charts read whole (later pages
        # read only the charts' periods that can still change).
        figures.forget()
        app.extensions.pop(CHARTS_KEY, None)

    pages = [
        ("overview (figures read afresh)", "/admin/", cold),
        ("overview (figures cached)", "/admin/", None),
        ("overview, a process's first (charts read whole)", "/admin/", first),
        ("overview, the last day's charts", "/admin/?range=day", None),
        ("overview, the last day's charts read whole", "/admin/?range=day", first),
        ("jobs, newest", "/admin/jobs", None),
        ("jobs, status=failed", "/admin/jobs?status=failed", None),
        ("jobs, status=queued&kind=meal_plan", "/admin/jobs?status=queued&kind=meal_plan", None),
        ("jobs, kind=nutrition", "/admin/jobs?kind=nutrition", None),
        ("jobs, household=500", "/admin/jobs?household=500", None),
        ("jobs, a page half way down", f"/admin/jobs?before={middle}", None),
        ("a job's page", f"/admin/jobs/{job_id}", None),
        ("households", "/admin/households", None),
        ("households, a page half way down", "/admin/households?after=500", None),
        ("audit log", "/admin/audit", None),
        (
            "bulk retry, status=failed: its count",
            "/admin/jobs/bulk?action=retry&status=failed",
            None,
        ),
        (
            "bulk delete, kind=nutrition: its counts",
            "/admin/jobs/bulk?action=delete&kind=nutrition",
            None,
        ),
        (
            "bulk cancel, household=500: its counts",
            "/admin/jobs/bulk?action=cancel&household=500",
            None,
        ),
        ("GET /metrics (figures read afresh)", "/metrics", cold),
    ]
    results = []
    headers = {"Authorization": f"Bearer {operator.token}"}
    for name, path, before in pages:
        times = []
        for _ in range(rounds + 1):
            if before is not None:
                before()
            started = time.perf_counter()
            answer = client.get(path, headers=headers if path == "/metrics" else None)
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 200, (path, answer.status_code)
        times = times[1:]  # the first request warms the connection and caches
        times.sort()
        p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
        results.append((name, statistics.median(times), p95))
    store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--postgres", metavar="URL", help="also measure on this server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mq-dashboard-bench-") as workdir:
        runs = [("SQLite", lambda: build_sqlite(Path(workdir), args.jobs))]
        if args.postgres:
            runs.append(("PostgreSQL", lambda: build_postgres(args.postgres, args.jobs)))
        print(f"| database | page ({args.jobs:,} jobs) | median ms | p95 ms | target |")
        print("|---|---|---|---|---|")
        for label, build in runs:
            started = time.perf_counter()
            database = build()
            built = time.perf_counter() - started
            for name, median, p95 in measure(database, args.rounds):
                met = "met" if median < TARGET_MS else "NOT met"
                print(
                    f"| {label} | {name} | {median:.1f} | {p95:.1f} | < {TARGET_MS:g} ms: {met} |"
                )
            print(f"<!-- {label}: table built in {built:.0f} s -->")
            if "_context" in database:
                database["_context"].__exit__(None, None, None)


if __name__ == "__main__":
    main()
