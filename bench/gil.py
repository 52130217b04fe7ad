"""The GIL: how much of the writer thread's work survives a busy hub, and the hub's of it.

`python -m bench.gil [--seconds S] [--jobs N] [--intervals 0.005,0.0005]`

The store writes in a native thread so that the hub never waits on SQLite.
That thread releases the GIL inside each SQLite call, but must take it back
after every call, to bind the next statement's parameters and build the
rows it returns. While the hub runs Python, each of those waits lasts until
the hub gives the GIL up: at its next blocking call, or when the
interpreter's switch interval (`sys.getswitchinterval()`, 5 ms unless set)
forces it to.

This measures that on a migrated database holding N queued no-op jobs:

* the completer's transaction, run back to back for S seconds in a native
  thread: `BEGIN IMMEDIATE`, the successes of the 4 jobs claimed last time
  (the driver's `transition_many`), the next 4 (`claim`), `COMMIT`, on a
  connection opened with the store's pragmas;
* pure Python in the main thread for S seconds (a loop of small dict and
  string work: the interpreter, not a C call that releases the GIL);

first each alone (in the main thread), then both at once, for each switch
interval. A pair that overlapped fully would keep 100 % of both (2.00
cores); a pair that took turns keeps about 1.00 between them. Absolute
rates say something about this run only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import fresh_database
from mealquest.db.sqlite import jobs
from mealquest.db.sqlite.connection import connect
from mealquest.db.sqlite.store import SqliteTransaction
from mealquest.model.jobs import ClaimRequest, Job, Status, Transition

INTERVALS = (0.005, 0.0005, 0.0001)
_BATCH = 4
_OWNER = "bench-gil"


def build(directory: Path, count: int) -> str:
    """A migrated database holding `count` queued no-op jobs of one household."""
    db, household = fresh_database(directory, "gil.sqlite3")
    conn = connect(db, synchronous="NORMAL", busy_timeout_ms=5000)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?1) "
        "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, "
        "run_at, created_at, updated_at) "
        "SELECT printf('%032x', x), ?2, 'noop', '{}', 'queued', 1, t, t, t "
        "FROM (SELECT x, '2026-01-01T00:00:00.000000Z' AS t FROM n)",
        (count, household),
    )
    conn.execute("COMMIT")
    conn.close()
    return db


class CompleterLoop:
    """The completer's transaction, back to back in a native thread, on one connection."""

    def __init__(self, db: str) -> None:
        self._conn = connect(db, synchronous="NORMAL", busy_timeout_ms=5000)
        self._tx = SqliteTransaction(self._conn)
        self._claimed: list[Job] = []

    def __call__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            recorded = jobs.transition_many(
                self._tx,
                [Transition(job.lease, to=Status.SUCCEEDED, result="{}") for job in self._claimed],
            )
            if not all(recorded):
                raise RuntimeError("a claimed job was no longer leased")
            self._claimed = jobs.claim(
                self._tx,
                ClaimRequest(owner=_OWNER, lease_seconds=3600, limit=_BATCH, kinds=["noop"]),
            )
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        if len(self._claimed) < _BATCH:
            raise RuntimeError("the queue ran out: give more --jobs")

    def close(self) -> None:
        self._conn.close()


def python_work() -> None:
    """About what the hub does for a job, in kind: small dicts, strings, calls."""
    for index in range(50):
        record = {"job_id": f"{index:032x}", "kind": "noop", "attempt": 1}
        " ".join(f"{key}={value}" for key, value in record.items())


# How many times a work ran, or what it raised (which stops every other).
Count = list[int | BaseException]


def _repeat(work: Callable[[], None], stop: threading.Event, counts: Count) -> None:
    done = 0
    try:
        while not stop.is_set():
            work()
            done += 1
    except BaseException as error:
        stop.set()
        counts.append(error)
    else:
        counts.append(done)


def rates(seconds: float, *works: Callable[[], None]) -> list[float]:
    """Each `works` item run back to back in a thread of its own for `seconds`
    (the first in this thread): how many times a second each ran."""
    stop = threading.Event()
    counts: list[Count] = [[] for _ in works]
    threads = [
        threading.Thread(target=_repeat, args=(work, stop, count))
        for work, count in zip(works[1:], counts[1:], strict=True)
    ]
    timer = threading.Timer(seconds, stop.set)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    timer.start()
    _repeat(works[0], stop, counts[0])
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    timer.cancel()
    per_second = []
    for (done,) in counts:
        if isinstance(done, BaseException):
            raise done
        per_second.append(done / elapsed)
    return per_second


def run(seconds: float, count: int, intervals: tuple[float, ...]) -> list[dict[str, float]]:
    original = sys.getswitchinterval()
    with tempfile.TemporaryDirectory(prefix="mq-bench-gil-") as work:
        db = build(Path(work), count)
        writer = CompleterLoop(db)
        results = []
        try:
            # Warmed up first: the first seconds of a run read high or low
            # as the CPU's clock settles.
            rates(seconds / 2, python_work, writer)
            for interval in intervals:
                sys.setswitchinterval(interval)
                (python_alone,) = rates(seconds, python_work)
                (writes_alone,) = rates(seconds, writer)
                python_both, writes_both = rates(seconds, python_work, writer)
                results.append(
                    {
                        "interval_ms": interval * 1000,
                        "writes_alone": writes_alone,
                        "writes_kept": writes_both / writes_alone,
                        "python_kept": python_both / python_alone,
                    }
                )
        finally:
            writer.close()
            sys.setswitchinterval(original)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--intervals", default=",".join(map(str, INTERVALS)))
    args = parser.parse_args()
    intervals = tuple(float(interval) for interval in args.intervals.split(","))
    results = run(args.seconds, args.jobs, intervals)
    print("| switch interval | transactions/s alone | writer kept | Python kept | cores used |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['interval_ms']:g} ms | {r['writes_alone']:,.0f} | {r['writes_kept']:.0%} "
            f"| {r['python_kept']:.0%} | {r['writes_kept'] + r['python_kept']:.2f} |"
        )


if __name__ == "__main__":
    main()
