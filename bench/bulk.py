"""How long a bulk action's batches hold SQLite's write lock.

Builds the dashboard bench's table (`bench/dashboard.py`: a busy
deployment's jobs, 6 % of them failed) and runs three bulk actions through
`mealquest.operator_actions.bulk` as the dashboard does: a retry of every
failed job, a delete of one kind's finished jobs and a cancel of one
household's queued and running ones. Each batch is one write transaction;
its time is taken around the store's write (from the writer thread's
`BEGIN IMMEDIATE` to its commit, plus the hop to that thread: an upper
bound of the time the lock is held). Prints a Markdown table of the
batches' median, 95th percentile and longest, per action.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.dashboard import build_sqlite


def measure(database: dict[str, Any]) -> list[tuple[str, str, int, list[float]]]:
    from mealquest.application import create_app
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs
    from mealquest.model.jobs import Status
    from mealquest.model.operations import BulkAction, JobFilter
    from mealquest.operator_actions import bulk

    app = create_app({**database, "TESTING": True})
    store, jobs = get_store(app), get_jobs(app)
    # In this table only households 1 to 20 have queued jobs (each of one
    # kind): the cancel goes before the delete, which may take them.
    actions = [
        ("cancel, household=11", BulkAction.CANCEL, JobFilter(household_id=11)),
        ("retry, status=failed", BulkAction.RETRY, JobFilter(status=Status.FAILED)),
        ("delete, kind=nutrition", BulkAction.DELETE, JobFilter(kind="nutrition")),
    ]
    results = []
    write = store.write
    for name, action, job_filter in actions:
        times: list[float] = []

        def timed(fn: Any, *args: Any, times: list[float] = times, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = write(fn, *args, **kwargs)
            if hasattr(result, "picked"):  # a batch, not the audit entry
                times.append((time.perf_counter() - started) * 1000)
            return result

        seen = bulk.preview(store, action, job_filter)
        store.write = timed  # type: ignore[method-assign]
        try:
            done = bulk.run(
                store, jobs, action, job_filter, upto_seq=seen.upto_seq, operator=None, seconds=600
            )
        finally:
            del store.write
        assert done.complete, name
        counted = f"{'at least ' if seen.at_least else ''}{seen.total:,}"
        results.append((name, counted, done.acted, times))
    store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mq-bulk-bench-") as workdir:
        database = build_sqlite(Path(workdir), args.jobs)
        print(
            f"| action ({args.jobs:,} jobs, SQLite) | counted | done | batches "
            "| batch median ms | p95 ms | longest ms |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, counted, acted, times in measure(database):
            times.sort()
            p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
            print(
                f"| {name} | {counted} | {acted:,} | {len(times)} | "
                f"{statistics.median(times):.1f} | {p95:.1f} | {times[-1]:.1f} |"
            )


if __name__ == "__main__":
    main()
