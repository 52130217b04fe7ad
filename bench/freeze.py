"""How long the process's greenlets freeze while another process holds the write lock.

Another process holds `BEGIN IMMEDIATE` for a while; meanwhile this process
runs its pool, enqueues jobs (store writes, which must wait for that lock)
and reads them back, and a ticker greenlet asking to wake every millisecond
records the longest gap between its ticks. A write waiting on the lock on the
hub thread would show the whole hold time as one gap: sqlite3 is a blocking C
library that gevent cannot patch.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
import time

from bench.common import REPO


def hold_lock_child(args: dict) -> dict:
    conn = sqlite3.connect(args["db"], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    sys.stdout.write("locked\n")
    sys.stdout.flush()
    time.sleep(args["seconds"])
    conn.execute("COMMIT")
    conn.close()
    return {"held_seconds": args["seconds"]}


def freeze_child(args: dict) -> dict:
    import gevent

    from bench.latency import _app
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs

    app = _app(args)
    jobs = get_jobs(app)
    pool = jobs.start_pool()
    ticks: list[float] = []
    stop = False

    def ticker() -> None:
        while not stop:
            gevent.sleep(0.001)
            ticks.append(time.perf_counter())

    def writer() -> None:
        while not stop:
            job_id = jobs.enqueue("noop", {}, household_id=args["household"])
            jobs.get(job_id)
            gevent.sleep(0.001)

    def reader() -> None:
        while not stop:
            jobs.list_jobs(limit=10)
            gevent.sleep(0.001)

    greenlets = [gevent.spawn(ticker), gevent.spawn(writer), gevent.spawn(reader)]
    gevent.sleep(0.3)
    holder = subprocess.Popen(
        [sys.executable, "-m", "bench.child", "hold_lock", json.dumps(args)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "locked":
        raise RuntimeError("the lock holder did not take the lock")
    locked_at = time.perf_counter()
    holder.wait()
    released_at = time.perf_counter()
    gevent.sleep(0.3)
    stop = True
    gevent.joinall(greenlets, timeout=10)
    pool.stop(5)
    get_store(app).close()

    def longest_gap(start: float, end: float) -> float:
        inside = [t for t in ticks if start <= t <= end]
        return max(b - a for a, b in itertools.pairwise(inside))

    return {
        "held_seconds": released_at - locked_at,
        "longest_gap_ms": 1000 * longest_gap(locked_at, released_at + 0.3),
        "longest_gap_unlocked_ms": 1000 * longest_gap(locked_at - 0.3, locked_at),
    }


CHILDREN = {"hold_lock": hold_lock_child, "freeze": freeze_child}
