"""What fair claiming costs, and what it buys.

* Claim rate with 1,000 households each holding queued jobs, against one
  household holding the same number: the fair claim walks households in
  turn through `household_queues`, so many households must cost it about
  what one does. Timed as the completer claims: one transaction that
  finishes the job the previous claim took and claims the next, through the
  store (so the running jobs stay as few as a pool's).
* The same loop with today's plain oldest-first statement on the same
  1,000-household table: the price of fairness per claim.
* The B-behind-A delay: one worker, household A queues many jobs, then
  household B one; B's wait for its job to start, in A's job run times (the
  real runner; oldest first, B would wait for all of A's).
* Limits per partition: the same loop with the jobs spread over 1,000
  partitions, claimed under a recipe import's limits (2 running, 30 starts
  a minute per partition), against the same claims without limits on the
  same table; and again with one partition at its limit holding a backlog
  ahead of every household's other jobs, which each claim passes over; and
  again with more households, each holding only jobs of that partition
  (held households, which claims pass over without reading their jobs).
"""

from __future__ import annotations

import random
import sqlite3
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import fresh_database
from bench.throughput import INSERT
from mealquest.clock import to_text
from mealquest.model.jobs import ClaimRequest, PartitionLimits, Rate, Transition

# What each partition may do in the partitioned figures: a recipe import's defaults.
LIMITS = PartitionLimits(max_running=2, rate=Rate(30, 60.0))
# The jobs of each household of `build_queue`'s `held`, all of the partition at its limit.
HELD_JOBS = 20
_INSERT_IN_PARTITION = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, run_at, "
    "created_at, updated_at, partition_key) VALUES (?, ?, 'noop', '{}', 'queued', 1, ?, ?, ?, ?)"
)

# The oldest-first claim the runner made before fair claiming, for comparison.
OLDEST_FIRST = (
    "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = :owner, "
    "lease_expires_at = :expires, started_at = :now, updated_at = :now "
    "WHERE seq IN (SELECT seq FROM jobs WHERE status = 'queued' AND run_at <= :now "
    "AND kind IN ('noop') ORDER BY run_at, seq LIMIT :limit) RETURNING id, attempt, lease_owner"
)


def build_queue(
    directory: Path,
    name: str,
    households: int,
    jobs: int,
    *,
    partitions: int = 0,
    backlog: int = 0,
    held: int = 0,
) -> str:
    """A migrated database whose `households` households hold `jobs` queued jobs
    between them, posted in turns (as households posting at once would).

    With `partitions`, each job is in one of that many partitions, drawn at
    random (seeded), so each household's jobs cross many partitions and each
    partition many households. With `backlog`, that many more jobs of one
    more partition come first (each household's oldest), and two more of it
    run (never to finish here): that partition is at its limit of 2. With
    `held`, that many more households hold `HELD_JOBS` jobs each of that
    partition and nothing else."""
    db, first = fresh_database(directory, name)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    ids = [first] + [
        conn.execute(
            "INSERT INTO households (name, created_at) VALUES (?, ?)",
            (f"bench {number}", "2024-01-01T00:00:00.000000Z"),
        ).lastrowid
        for number in range(1, households)
    ]
    now = to_text(datetime.now(UTC))
    if partitions:
        holding = [
            conn.execute(
                "INSERT INTO households (name, created_at) VALUES (?, ?)",
                (f"bench held {number}", "2024-01-01T00:00:00.000000Z"),
            ).lastrowid
            for number in range(held)
        ]
        _insert_partitioned(conn, ids, jobs, partitions, backlog, holding)
    else:
        conn.executemany(
            INSERT,
            (
                (uuid.uuid4().hex, ids[number % households], "noop", "{}", 1, now, now, now)
                for number in range(jobs)
            ),
        )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return db


def _insert_partitioned(
    conn: sqlite3.Connection,
    households: list[int],
    jobs: int,
    partitions: int,
    backlog: int,
    held: list[int],
) -> None:
    draw = random.Random(7)
    moment = datetime.now(UTC)
    # The backlog is older than every other job: each claim meets it first.
    old = to_text(moment - timedelta(seconds=1))
    now = to_text(moment)
    rows = [
        (uuid.uuid4().hex, households[number % len(households)], old, old, old, "hot")
        for number in range(backlog)
    ] + [
        (uuid.uuid4().hex, households[number % len(households)], now, now, now, f"p{part}")
        for number, part in enumerate(draw.randrange(partitions) for _ in range(jobs))
    ]
    rows += [
        (uuid.uuid4().hex, household, old, old, old, "hot")
        for household in held
        for _ in range(HELD_JOBS)
    ]
    conn.executemany(_INSERT_IN_PARTITION, rows)
    if backlog or held:
        for number in range(2):
            conn.execute(
                "INSERT INTO jobs (id, household_id, kind, payload, status, attempt, "
                "max_attempts, run_at, created_at, updated_at, started_at, lease_owner, "
                "lease_expires_at, partition_key) VALUES (?, ?, 'noop', '{}', 'running', 1, 1, "
                "?, ?, ?, ?, 'bench-hot', '9999-01-01T00:00:00.000000Z', 'hot')",
                (uuid.uuid4().hex, households[number], old, old, old, old),
            )


def fair_claim_child(args: dict) -> dict:
    """Claims per second, each in the transaction that finishes the previous one's job."""
    from mealquest.db.sqlite import jobs as queries
    from mealquest.db.sqlite.store import SqliteStore, SqliteTransaction
    from mealquest.model.jobs import Lease, Status

    store = SqliteStore(args["db"], synchronous=args["synchronous"])
    store.write(lambda tx: None)  # opens the writer connection and thread
    oldest_first = args["claim"] == "oldest_first"

    def cycle(tx: SqliteTransaction, previous: list[Any]) -> list[Any]:
        for lease in previous:
            queries.transition(tx, Transition(lease, to=Status.SUCCEEDED, result="{}"))
        if oldest_first:
            moment = datetime.now(UTC)
            rows = tx.execute(
                OLDEST_FIRST,
                {"owner": "bench", "expires": to_text(moment), "now": to_text(moment), "limit": 1},
            ).fetchall()
            return [Lease(row["id"], row["lease_owner"], row["attempt"]) for row in rows]
        claimed = queries.claim(tx, request)
        return [job.lease for job in claimed]

    request = ClaimRequest(
        owner="bench",
        lease_seconds=30.0,
        limit=1,
        kinds=("noop",),
        partitions={"noop": LIMITS} if args.get("limited") else {},
    )

    previous: list[Any] = []
    started = time.perf_counter()
    for _ in range(args["claims"]):
        previous = store.write(cycle, previous)
        assert len(previous) == 1
    elapsed = time.perf_counter() - started
    store.close()
    return {"claims_per_s": args["claims"] / elapsed}


def b_behind_a_child(args: dict) -> dict:
    """One worker; A queues `jobs` jobs of `run_seconds`; B queues one once A's first runs."""
    import gevent
    import gevent.event
    from marshmallow import Schema

    from bench.app import create_bench_app
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs

    class Empty(Schema):
        pass

    runs: dict[str, tuple[float, float]] = {}
    first_started = gevent.event.Event()

    def work(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        begun = time.monotonic()
        first_started.set()
        gevent.sleep(args["run_seconds"])
        runs[ctx.job_id] = (begun, time.monotonic())
        return {}

    app = create_bench_app(
        {"DATABASE": args["db"], "DB_SYNCHRONOUS": args["synchronous"], "JOB_WORKERS": 1}
    )
    jobs, store = get_jobs(app), get_store(app)
    jobs.registry.register("work", work, payload=Empty, result=Empty)
    b_household = store.write(
        lambda tx: (
            tx.execute(
                "INSERT INTO households (name, created_at) VALUES ('B', ?)",
                ("2024-01-01T00:00:00.000000Z",),
            ).lastrowid
        )
    )
    a_ids = [jobs.enqueue("work", {}, household_id=args["household"]) for _ in range(args["jobs"])]
    pool = jobs.start_pool()
    first_started.wait()
    enqueued = time.monotonic()
    b_id = jobs.enqueue("work", {}, household_id=b_household)
    while b_id not in runs:
        gevent.sleep(0.005)
    pool.stop(5)
    store.close()
    a_runs = [end - begun for begun, end in (runs[i] for i in a_ids if i in runs)]
    run_time = sum(a_runs) / len(a_runs)
    return {"delay_in_run_times": (runs[b_id][0] - enqueued) / run_time}


CHILDREN = {"fair_claim": fair_claim_child, "b_behind_a": b_behind_a_child}
