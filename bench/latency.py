"""Latency from enqueue to handler start, with the enqueue in this process or another one.

A `stamp` job carries `time.monotonic()` taken just before `enqueue` was
called; its handler records how long ago that was. CLOCK_MONOTONIC is one
clock for the whole machine, so a stamp from another process compares too.
Jobs are sent one at a time with a pause between them, so each finds an idle
pool: the case the wake-up paths (the in-process event, `PRAGMA
data_version`) exist for.
"""

from __future__ import annotations

import random
import sys
import time

from bench.common import REPO, percentile


def _app(args: dict):
    from bench.app import create_bench_app

    return create_bench_app(
        {
            "DATABASE": args["db"],
            "DB_SYNCHRONOUS": args["synchronous"],
            "JOB_WORKERS": args["workers"],
        }
    )


def _summary(delays: list[float]) -> dict:
    return {
        "samples": len(delays),
        "p50_ms": 1000 * percentile(delays, 0.50),
        "p99_ms": 1000 * percentile(delays, 0.99),
        "max_ms": 1000 * max(delays),
    }


def local_child(args: dict) -> dict:
    import gevent

    from bench.app import counter
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs
    from mealquest.serving import collector

    app = _app(args)
    jobs = get_jobs(app)
    pool = jobs.start_pool()
    # As the service's worker processes are set once started.
    collector.settle()
    gevent.sleep(0.05)
    delays: list[float] = []
    for _ in range(args["samples"]):
        counter.expect(1)
        jobs.enqueue("stamp", {"enqueued": time.monotonic()}, household_id=args["household"])
        if not counter.done.wait(5):
            raise RuntimeError("a stamp job did not start within 5 s")
        delays += counter.delays
        gevent.sleep(random.uniform(0.002, 0.006))  # its completion lands; the pool idles
    pool.stop(5)
    get_store(app).close()
    return _summary(delays)


def enqueue_stamps_child(args: dict) -> dict:
    """The other process: enqueues `stamp` jobs through the app, with no pool of its own."""
    import gevent

    from mealquest.jobs.service import get_jobs

    jobs = get_jobs(_app(args))
    for _ in range(args["samples"]):
        jobs.enqueue("stamp", {"enqueued": time.monotonic()}, household_id=args["household"])
        gevent.sleep(random.uniform(0.01, 0.03))
    return {"sent": args["samples"]}


def remote_child(args: dict) -> dict:
    import json
    import subprocess

    import gevent

    from bench.app import counter
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs

    app = _app(args)
    pool = get_jobs(app).start_pool()
    counter.expect(args["samples"])
    sender = subprocess.Popen(
        [sys.executable, "-m", "bench.child", "enqueue_stamps", json.dumps(args)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        if not counter.done.wait(60 + args["samples"] * 0.1):
            raise RuntimeError(f"only {counter.count} of {args['samples']} stamp jobs started")
    finally:
        if sender.poll() is None:
            sender.terminate()
        sender.wait()
    gevent.sleep(0.05)
    pool.stop(5)
    get_store(app).close()
    return _summary(counter.delays)


CHILDREN = {
    "latency_local": local_child,
    "latency_remote": remote_child,
    "enqueue_stamps": enqueue_stamps_child,
}
