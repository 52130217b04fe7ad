"""`POST /api/v1/recipe-imports` part by part, in one process: where a request's time goes.

The HTTP figures (`bench.enqueue`) say what the route costs under gunicorn;
this says which of its parts costs what. The route runs whole, through
Flask's test client (no gunicorn, no socket), and each part is timed inside
those very calls: the functions the route calls for it are wrapped with a
clock, so a part is measured where the request runs it, not in a loop of
its own that would keep its code and data hot:

* authentication: `require_token` (the bearer token's digest, the one read
  that finds its household, the token's use noted at most once a minute);
* validation: the `Idempotency-Key` check, the body parsed as JSON and
  loaded by the route's schema;
* the write: the enqueue (the household's quota, the insert and its
  triggers, one transaction);
* the answer: the job read again with its place in line, as JSON;
* the rest: what is left of the whole (Flask's dispatch, the app's hooks,
  the response's making, the test client);
* the trivial route through the same client, in rounds interleaved with the
  route's: what serving any route costs here;
* the run of a job: CPU a job (every thread of the process) of the pool
  draining no-op jobs, as the worker that accepted them would.

Each figure is the median over the rounds of µs a request (the run, once,
after them: a service starts its pool once). The import kind keeps its
politeness limits, as in the HTTP figure, so the household's queue grows
and each answer's place in line is read behind the jobs already written.
"""

from __future__ import annotations

import functools
import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.common import fresh_database, median
from bench.web import _seed

# The same body the HTTP figure posts.
IMPORT_BODY = '{"url": "https://example.com/recipe"}'
PARTS = ("authentication", "validation", "write", "answer")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Clocks:
    """Seconds spent in each part since the last `reset`."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PARTS, 0.0)

    def reset(self) -> None:
        self.spent = dict.fromkeys(PARTS, 0.0)

    def timed(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[part] += time.perf_counter() - started

        return wrapper


@contextmanager
def _clocked(clocks: _Clocks) -> Iterator[None]:
    """The route's parts wrapped with `clocks`, where the route looks them up."""
    import flask

    from mealquest import api
    from mealquest.jobs.web import enqueue_route
    from mealquest.recipes import api as recipes_api

    with ExitStack() as stack:

        def wrap(owner: object, name: str, part: str) -> None:
            original = getattr(owner, name)
            setattr(owner, name, clocks.timed(part, original))
            stack.callback(setattr, owner, name, original)

        wrap(api, "require_token", "authentication")
        wrap(enqueue_route, "idempotency_key", "validation")
        wrap(flask.Request, "get_json", "validation")
        # The route's own schema object, which its view closes over.
        recipes_api._import_schema.load = clocks.timed(
            "validation", recipes_api._import_schema.load
        )
        stack.callback(delattr, recipes_api._import_schema, "load")
        wrap(enqueue_route, "enqueue", "write")
        wrap(enqueue_route, "answer", "answer")
        yield


def parts_child(args: dict) -> dict:
    """µs a request of each part, the rest, the trivial route and a job's run:
    the median of `rounds` rounds of `calls` requests each."""
    os.environ["MEALQUEST_BENCH_NOOP_IMPORTS"] = "1"
    from bench.app import counter, create_bench_app
    from mealquest.extensions import get_store
    from mealquest.jobs.enqueueing import JobRequest
    from mealquest.jobs.service import get_jobs

    workdir, calls, rounds = Path(args["workdir"]), args["calls"], args["rounds"]
    db, household = fresh_database(workdir, "enqueue-parts.sqlite3")
    token, _, _ = _seed(db, household)
    app = create_bench_app({"DATABASE": db, "DB_SYNCHRONOUS": args["synchronous"]})
    jobs, store = get_jobs(app), get_store(app)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    client = app.test_client()
    clocks = _Clocks()

    def route() -> dict[str, float]:
        clocks.reset()
        started = time.perf_counter()
        for _ in range(calls):
            answer = client.post("/api/v1/recipe-imports", headers=headers, data=IMPORT_BODY)
            if answer.status_code != 202:
                raise RuntimeError(f"the route answered {answer.status_code}: {answer.text}")
        whole = 1e6 * (time.perf_counter() - started) / calls
        parts = {part: 1e6 * seconds / calls for part, seconds in clocks.spent.items()}
        return {**parts, "rest": whole - sum(parts.values()), "route": whole}

    def trivial() -> float:
        started = time.perf_counter()
        for _ in range(calls):
            client.get("/bench/trivial")
        return 1e6 * (time.perf_counter() - started) / calls

    def run(count: int) -> float:
        """CPU µs a job of the pool draining `count` no-op jobs (once: a
        service starts its pool once, and the route is timed without it)."""
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

    samples: dict[str, list[float]] = {}
    with _clocked(clocks):
        # Warm up (imports, the store's connections and writer, the caches).
        route()
        trivial()
        for _ in range(rounds):
            for name, value in {**route(), "trivial": trivial()}.items():
                samples.setdefault(name, []).append(value)
    figures = {name: median(values) for name, values in samples.items()}
    figures["run"] = run(calls * rounds)
    store.close()
    return figures


CHILDREN = {
    "enqueue_parts": parts_child,
}
