"""`POST /api/v1/recipe-imports` part by part, in one process: where a request's time goes.

The HTTP figures (`bench.enqueue`) say what the route costs under gunicorn;
this says which of its parts costs what. Each part is the project's own
code, called as the route calls it, in a request context pushed once per
timed loop:

* authentication: `require_token` (the bearer token's digest, the one read
  that finds its household, the token's use noted at most once a minute);
* validation: the `Idempotency-Key` check and the body parsed and loaded by
  the route's schema;
* the write: `JobService.insert` (the household's quota, the insert and its
  triggers, one transaction);
* the answer: the job read again with its place in line, as JSON;
* the whole route through Flask's test client (no gunicorn, no socket),
  and the trivial route likewise: what Flask's dispatch, the hooks and the
  JSON answer add is the whole less the parts;
* the run of a job: CPU a job (every thread of the process) of the pool
  draining no-op jobs, as the worker that accepted them would.

Rounds interleave the parts; each figure is the median of the rounds' µs a
call (the run, once, after them: a service starts its pool once). The
import kind keeps its politeness limits, as in the HTTP figure, so the
household's queue grows and each answer's place in line is read behind the
jobs already written.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import fresh_database, median
from bench.web import _seed

# The same body the HTTP figure posts.
IMPORT_BODY = '{"url": "https://example.com/recipe"}'


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _per_call_us(call: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return 1e6 * (time.perf_counter() - started) / calls


def parts_child(args: dict) -> dict:
    """µs a call of each part (`PARTS`), the median of `rounds` interleaved rounds."""
    os.environ["MEALQUEST_BENCH_NOOP_IMPORTS"] = "1"
    from flask import g

    from bench.app import counter, create_bench_app
    from mealquest.auth import require_token
    from mealquest.extensions import get_store
    from mealquest.jobs.enqueueing import JobRequest
    from mealquest.jobs.service import get_jobs
    from mealquest.jobs.web.enqueue_route import answer, idempotency_key
    from mealquest.model.households import Household
    from mealquest.recipes.kind import KIND
    from mealquest.recipes.schemas import RecipeImportSchema

    workdir, calls, rounds = Path(args["workdir"]), args["calls"], args["rounds"]
    db, household = fresh_database(workdir, "enqueue-parts.sqlite3")
    token, _, _ = _seed(db, household)
    app = create_bench_app({"DATABASE": db, "DB_SYNCHRONOUS": args["synchronous"]})
    jobs, store = get_jobs(app), get_store(app)
    schema = RecipeImportSchema()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    url = "/api/v1/recipe-imports"
    client = app.test_client()
    me = Household(id=household, name="bench")
    payload: dict[str, Any] = schema.load(json.loads(IMPORT_BODY))
    last = jobs.insert(KIND, payload, household_id=household)

    def in_request(part: Callable[[], object]) -> float:
        with app.test_request_context(url, method="POST", headers=headers, data=IMPORT_BODY):
            g.flask_httpauth_user = me
            return _per_call_us(part, calls)

    def validate() -> object:
        idempotency_key()
        return schema.load(json.loads(IMPORT_BODY))

    def write() -> object:
        nonlocal last
        last = jobs.insert(KIND, payload, household_id=household)
        return last

    def post() -> object:
        return client.post(url, headers=headers, data=IMPORT_BODY)

    def run(count: int) -> float:
        """CPU µs a job of the pool draining `count` no-op jobs (once: a
        service starts its pool once, and the parts are timed without it)."""
        counter.expect(count)
        jobs.enqueue_many([JobRequest("noop", {}, household) for _ in range(count)])
        before = _cpu_seconds()
        pool = jobs.start_pool()
        try:
            if not counter.done.wait(120):
                raise RuntimeError("the pool did not run the jobs")
            return 1e6 * (_cpu_seconds() - before) / count
        finally:
            pool.stop(5)

    timed: dict[str, Callable[[], float]] = {
        "authentication": lambda: in_request(require_token),
        "validation": lambda: in_request(validate),
        "write": lambda: in_request(write),
        "answer": lambda: in_request(lambda: answer(last)),
        "route": lambda: _per_call_us(post, calls),
        "trivial": lambda: _per_call_us(lambda: client.get("/bench/trivial"), calls),
    }
    # Warm up (imports, the store's connections and writer, the read cache).
    for measure in timed.values():
        measure()
    samples: dict[str, list[float]] = {part: [] for part in timed}
    for _ in range(rounds):
        for part, measure in timed.items():
            samples[part].append(measure())
    figures = {part: median(values) for part, values in samples.items()}
    figures["run"] = run(calls * rounds)
    store.close()
    return figures


CHILDREN = {
    "enqueue_parts": parts_child,
}
