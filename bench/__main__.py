"""Run the whole suite: `python -m bench [--quick] [--json PATH]`.

Every figure is measured alongside its baseline in the same run, interleaved
where it is repeated, because the machines are shared and noisy: only the
ratios compare across runs. Prints a Markdown table and writes it as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from bench import claims, enqueue, fairness, memory, pg, pg_throughput, throughput, web
from bench.common import FULL, QUICK, REPO, Sizes, copy_database, fresh_database, median, run_child
from bench.loadgen import wrk_available

SYNCHRONOUS = "NORMAL"  # the service's default (MEALQUEST_DB_SYNCHRONOUS)

# Every figure the suite produces on SQLite, in table order.
SQLITE_FIGURES = (
    "drain_vs_raw",
    "cycle_vs_raw",
    "drain_vs_huey",
    "cycle_vs_huey",
    "drain_vs_minimal",
    "cycle_vs_minimal",
    "drain_cpu_per_job",
    "drain_cpu_vs_huey",
    "enqueue_vs_huey",
    "drain_with_dependencies_vs_plain",
    "drain_traced_vs_plain",
    "two_processes",
    "latency_local_p50",
    "latency_local_p99",
    "latency_remote_p50",
    "latency_remote_p99",
    "http_job_rps",
    "http_job_p99",
    "http_changing_job_rps",
    "http_changing_job_p99",
    "http_enqueue_vs_trivial",
    "http_enqueue_p99",
    "http_enqueue_in_worker_vs_trivial",
    "http_enqueue_part_authentication",
    "http_enqueue_part_validation",
    "http_enqueue_part_write",
    "http_enqueue_part_answer",
    "http_enqueue_part_rest",
    "http_enqueue_part_trivial",
    "http_enqueue_part_run",
    "wal_pages_per_enqueue",
    "freeze_longest_gap",
    "claim_rate_store",
    "claim_rate_statement",
    "fair_claim_households",
    "fair_claim_vs_oldest_first",
    "fair_b_behind_a",
    "partition_claim_vs_unlimited",
    "partition_claim_past_a_backlog",
    "partition_claim_past_held_households",
    "rss_growth",
)
PG_FIGURES = (
    "pg_drain_vs_raw",
    "pg_cycle_vs_raw",
    "pg_drain_vs_procrastinate",
    "pg_drain_vs_pgqueuer",
    "pg_drain_vs_pgqueuer_default",
    "pg_drain_vs_awa",
    "pg_drain_backlog",
    "pg_two_processes",
    "pg_two_processes_one_household",
    "pg_wal_bytes_per_job",
    "pg_write_transactions_per_job",
    "pg_dead_tuples_per_job",
)
# Every figure the quick run produces; the smoke test checks them all. It
# measures PostgreSQL only on the test command's server: a quick run starts none.
FIGURES = SQLITE_FIGURES + (PG_FIGURES if pg.test_server_url() else ())


def figure(
    name,
    value,
    unit,
    baseline,
    baseline_unit,
    baseline_what,
    target,
    met=None,
    ratio=True,
    rounds=None,
):
    """One row: `value` divided by `baseline` (when `ratio`), and whether the target is met.

    With `rounds`, the (ours, baseline) of each interleaved round: the ratio
    is then the median of the rounds' ratios, paired as they ran, with the
    lowest and highest beside it (`ratio_low`, `ratio_high`), so that a
    target is never judged on a margin inside the rounds' spread."""
    row = {
        "figure": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_unit": baseline_unit,
        "baseline_what": baseline_what,
        "ratio": (value / baseline) if ratio and baseline else None,
        "ratio_low": None,
        "ratio_high": None,
        "target": target,
        "met": met,
    }
    paired = [ours / theirs for ours, theirs in rounds or () if ours is not None and theirs]
    if ratio and paired:
        row["ratio"], row["ratio_low"], row["ratio_high"] = median(paired), min(paired), max(paired)
    return row


def _at_least(value: float | None, bound: float) -> bool:
    return value is not None and value >= bound


def judge_at_least(row: dict, bound: float) -> None:
    """Whether the row's ratio meets `bound`, and whether every round's did."""
    row["met"] = _at_least(row["ratio"], bound)
    if row.get("ratio_low") is not None:
        row["met_every_round"] = row["ratio_low"] >= bound


def measure_throughput(sizes: Sizes, workdir: Path, log: Path) -> list[dict]:
    runs: dict[str, list[dict]] = {
        "raw": [],
        "runner": [],
        "batched": [],
        "traced": [],
        "huey": [],
        "minimal": [],
    }
    for repeat in range(sizes.repeats):
        for name, child in (
            ("raw", "throughput_raw"),
            ("runner", "throughput_runner"),
            ("batched", "throughput_runner_batched"),
            ("traced", "throughput_runner_traced"),
            ("huey", "huey"),
            ("minimal", "throughput_minimal"),
        ):
            if name in ("huey", "minimal"):
                db, household = str(workdir / f"{name}-{repeat}.sqlite3"), 0
            else:
                db, household = fresh_database(workdir, f"{name}-{repeat}.sqlite3")
            args = {
                "db": db,
                "household": household,
                "jobs": sizes.jobs,
                "workers": sizes.workers,
                "synchronous": SYNCHRONOUS,
                "log": str(log),
            }
            runs[name].append(run_child(child, args))

    def rates(name: str, key: str) -> list[float]:
        """Each round's jobs/s, in the order the rounds ran."""
        values = []
        for run in runs[name]:
            seconds = run["drain_seconds"]
            if key == "cycle":
                seconds += run["enqueue_seconds"]
            values.append(sizes.jobs / seconds)
        return values

    def rate(name: str, key: str) -> float:
        return median(rates(name, key))

    def paired(name: str, key: str, against: str = "runner") -> list[tuple[float, float]]:
        """(ours, its) jobs/s of each interleaved round."""
        return list(zip(rates(against, key), rates(name, key), strict=True))

    def per_job_us(seconds: Callable[[dict], float]) -> float:
        """The median over our runner's rounds of `seconds(run)` per job, in µs."""
        return median([1e6 * seconds(run) / sizes.jobs for run in runs["runner"]])

    hub_us = per_job_us(lambda run: run["hub_cpu_seconds"])
    writer_us = per_job_us(lambda run: run["other_threads_cpu_seconds"])

    def cpu_us(name: str) -> float:
        """The median CPU per job of a drain (every thread of its process), in µs:
        it moves far less than wall time on a busy machine."""
        return median([1e6 * run["drain_cpu_seconds"] / sizes.jobs for run in runs[name]])

    def enqueue_rate(name: str) -> float:
        return median([sizes.jobs / run["enqueue_seconds"] for run in runs[name]])

    def enqueue_cpu_us(name: str) -> float:
        """The median CPU per single enqueue (every thread of the process), in µs."""
        return median([1e6 * run["enqueue_cpu_seconds"] / sizes.jobs for run in runs[name]])

    def cycle_cpu_us(name: str) -> float:
        """The median CPU per job of an enqueue and its drain, in µs."""
        return median(
            [
                1e6 * (run["enqueue_cpu_seconds"] + run["drain_cpu_seconds"]) / sizes.jobs
                for run in runs[name]
            ]
        )

    cpu = {name: cpu_us(name) for name in runs}
    cycle_cpu = {name: cycle_cpu_us(name) for name in runs}

    def beside(name: str, what: str, part: str = "drain") -> str:
        """`what`, with ours and `name`'s CPU per job of the drain or the cycle."""
        used = cpu if part == "drain" else cycle_cpu
        ours, its = used["runner"], used[name]
        return f"{what} (CPU per job of the {part}: ours {ours:.0f} µs, its {its:.0f} µs)"

    drain, cycle = rate("runner", "drain"), rate("runner", "cycle")
    raw_drain, raw_cycle = rate("raw", "drain"), rate("raw", "cycle")
    huey_drain, huey_cycle = rate("huey", "drain"), rate("huey", "cycle")
    minimal_drain, minimal_cycle = rate("minimal", "drain"), rate("minimal", "cycle")
    minimal = "raw loop on a minimal queue table"
    raw = beside("raw", "raw sqlite3 loop")
    huey = beside("huey", "SqliteHuey")
    rows = [
        figure(
            "drain_vs_raw",
            drain,
            "jobs/s",
            raw_drain,
            "jobs/s",
            raw,
            "≥ 0.5x",
            rounds=paired("raw", "drain"),
        ),
        figure(
            "cycle_vs_raw",
            cycle,
            "jobs/s",
            raw_cycle,
            "jobs/s",
            beside("raw", "raw sqlite3 loop", "cycle"),
            "≥ 0.5x",
            rounds=paired("raw", "cycle"),
        ),
        figure(
            "drain_vs_huey",
            drain,
            "jobs/s",
            huey_drain,
            "jobs/s",
            huey,
            "≥ 1.5x",
            rounds=paired("huey", "drain"),
        ),
        figure(
            "cycle_vs_huey",
            cycle,
            "jobs/s",
            huey_cycle,
            "jobs/s",
            beside("huey", "SqliteHuey", "cycle"),
            "≥ 1.0x",
            rounds=paired("huey", "cycle"),
        ),
        figure(
            "drain_vs_minimal",
            drain,
            "jobs/s",
            minimal_drain,
            "jobs/s",
            beside("minimal", minimal),
            "≥ 0.5x",
            rounds=paired("minimal", "drain"),
        ),
        figure(
            "cycle_vs_minimal",
            cycle,
            "jobs/s",
            minimal_cycle,
            "jobs/s",
            beside("minimal", minimal, "cycle"),
            "report",
            rounds=paired("minimal", "cycle"),
        ),
        figure(
            "drain_cpu_per_job",
            per_job_us(lambda run: run["hub_cpu_seconds"] + run["other_threads_cpu_seconds"]),
            "µs",
            per_job_us(lambda run: run["drain_seconds"]),
            "µs",
            f"the drain's wall time per job (CPU, medians: the hub {hub_us:.0f} µs, "
            f"the other threads, the store's writer, {writer_us:.0f} µs)",
            "report",
        ),
    ]
    for row, bound in zip(rows, (0.5, 0.5, 1.5, 1.0, 0.5, None, None), strict=True):
        if bound is not None:
            judge_at_least(row, bound)
    cpu_row = figure(
        "drain_cpu_vs_huey",
        cpu["runner"],
        "µs",
        cpu["huey"],
        "µs",
        "SqliteHuey's CPU per job of its drain, every thread of its process",
        "≤ 1.0x",
    )
    cpu_row["met"] = cpu_row["ratio"] is not None and cpu_row["ratio"] <= 1.0
    rows.append(cpu_row)
    rows.append(
        figure(
            "enqueue_vs_huey",
            enqueue_rate("runner"),
            "jobs/s",
            enqueue_rate("huey"),
            "jobs/s",
            f"SqliteHuey's {sizes.jobs:,} single enqueues, one after another (CPU per "
            f"enqueue: ours {enqueue_cpu_us('runner'):.0f} µs, "
            f"its {enqueue_cpu_us('huey'):.0f} µs)",
            "report",
        )
    )
    dependencies = figure(
        "drain_with_dependencies_vs_plain",
        rate("batched", "drain"),
        "jobs/s",
        drain,
        "jobs/s",
        "the same drain without batches (here batches of nine and a callback that waits for "
        f"them; CPU per job of the drain: here {cpu['batched']:.0f} µs, without "
        f"{cpu['runner']:.0f} µs)",
        "≥ 0.9x",
        rounds=paired("runner", "drain", against="batched"),
    )
    judge_at_least(dependencies, 0.9)
    rows.append(dependencies)
    rows.append(
        figure(
            "drain_traced_vs_plain",
            rate("traced", "drain"),
            "jobs/s",
            drain,
            "jobs/s",
            "the same drain untraced (here each enqueue under a span, each attempt a span "
            f"handed to the SDK's batch processor; CPU per job of the drain: here "
            f"{cpu['traced']:.0f} µs, untraced {cpu['runner']:.0f} µs)",
            "report",
            rounds=paired("runner", "drain", against="traced"),
        )
    )
    return rows


def measure_processes(sizes: Sizes, workdir: Path) -> list[dict]:
    one, two = [], []
    for _ in range(sizes.repeats):
        one.append(throughput.drain_by_processes(workdir, 1, sizes.jobs, sizes.workers))
        two.append(throughput.drain_by_processes(workdir, 2, sizes.jobs, sizes.workers))
    return [
        figure(
            "two_processes",
            sizes.jobs / median(two),
            "jobs/s",
            sizes.jobs / median(one),
            "jobs/s",
            "one worker process",
            "report",
            rounds=[
                (sizes.jobs / ours, sizes.jobs / theirs)
                for ours, theirs in zip(two, one, strict=True)
            ],
        )
    ]


def measure_latency(sizes: Sizes, workdir: Path, log: Path) -> list[dict]:
    results = {}
    for name in ("latency_local", "latency_remote"):
        db, household = fresh_database(workdir, f"{name}.sqlite3")
        args = {
            "db": db,
            "household": household,
            "samples": sizes.latency_samples,
            "workers": sizes.workers,
            "synchronous": SYNCHRONOUS,
            "log": str(log),
        }
        results[name] = run_child(name, args)
    local, remote = results["latency_local"], results["latency_remote"]
    return [
        figure(
            "latency_local_p50",
            local["p50_ms"],
            "ms",
            None,
            "",
            "",
            "≤ 1 ms",
            met=local["p50_ms"] <= 1,
            ratio=False,
        ),
        figure(
            "latency_local_p99",
            local["p99_ms"],
            "ms",
            None,
            "",
            "",
            "≤ 5 ms",
            met=local["p99_ms"] <= 5,
            ratio=False,
        ),
        figure("latency_remote_p50", remote["p50_ms"], "ms", None, "", "", "report", ratio=False),
        figure(
            "latency_remote_p99",
            remote["p99_ms"],
            "ms",
            None,
            "",
            "",
            "≤ 25 ms",
            met=remote["p99_ms"] <= 25,
            ratio=False,
        ),
    ]


def measure_http(sizes: Sizes, workdir: Path, generator: str) -> list[dict]:
    runs = web.serve_and_load(
        workdir, sizes.http_seconds, sizes.http_connections, sizes.http_rounds, generator
    )

    def each(name: str, key: str) -> list[float]:
        return [run[key] for run in runs[name]]

    def median_of(name: str, key: str) -> float:
        return median(each(name, key))

    def paired(name: str, key: str) -> list[tuple[float, float]]:
        return list(zip(each(name, key), each("trivial", key), strict=True))

    what = f"trivial JSON route, same gunicorn ({runs['job'][0]['generator']})"
    unchanged = "one finished job, re-read: the read cache's best case"
    changing = f"a running job changed every {web.CHANGE_SECONDS * 1000:.0f} ms: mostly read again"
    rps = figure(
        "http_job_rps",
        median_of("job", "requests_per_s"),
        "req/s",
        median_of("trivial", "requests_per_s"),
        "req/s",
        f"{what}; {unchanged}",
        "≥ 0.9x",
        rounds=paired("job", "requests_per_s"),
    )
    judge_at_least(rps, 0.9)
    p99 = figure(
        "http_job_p99",
        median_of("job", "p99_ms"),
        "ms",
        median_of("trivial", "p99_ms"),
        "ms",
        f"{what}; {unchanged}",
        "report",
        rounds=paired("job", "p99_ms"),
    )
    changing_rps = figure(
        "http_changing_job_rps",
        median_of("changing", "requests_per_s"),
        "req/s",
        median_of("trivial", "requests_per_s"),
        "req/s",
        f"{what}; {changing}",
        "report",
        rounds=paired("changing", "requests_per_s"),
    )
    changing_p99 = figure(
        "http_changing_job_p99",
        median_of("changing", "p99_ms"),
        "ms",
        median_of("trivial", "p99_ms"),
        "ms",
        f"{what}; {changing}",
        "report",
        rounds=paired("changing", "p99_ms"),
    )
    return [rps, p99, changing_rps, changing_p99]


def measure_enqueue(sizes: Sizes, workdir: Path, log: Path, generator: str) -> list[dict]:
    rows = []
    for name, elsewhere, where in (
        ("http_enqueue_vs_trivial", True, "its jobs run by a `flask jobs work` process"),
        ("http_enqueue_in_worker_vs_trivial", False, "its jobs run by the same workers"),
    ):
        http, trivial = enqueue.serve_and_enqueue(
            workdir,
            sizes.http_seconds,
            sizes.http_connections,
            sizes.http_rounds,
            generator,
            SYNCHRONOUS,
            jobs_elsewhere=elsewhere,
        )
        what = f"trivial JSON route, same gunicorn ({http['generator']}); {where}"
        rps = figure(
            name,
            http["requests_per_s"],
            "req/s",
            trivial["requests_per_s"],
            "req/s",
            what,
            "≥ 0.5x" if elsewhere else "report",
            rounds=list(zip(http["rounds"], trivial["rounds"], strict=True)),
        )
        if elsewhere:
            judge_at_least(rps, 0.5)
            p99 = figure(
                "http_enqueue_p99", http["p99_ms"], "ms", trivial["p99_ms"], "ms", what, "report"
            )
            rows += [rps, p99]
        else:
            rows.append(rps)
    rows += measure_enqueue_parts(sizes, workdir, log)
    wal = run_child("enqueue_wal", {"workdir": str(workdir), "jobs": sizes.wal_jobs})
    pages = figure(
        "wal_pages_per_enqueue",
        wal["with_triggers"],
        "pages",
        wal["without_triggers"],
        "pages",
        "the same enqueues with the triggers on jobs dropped",
        "report",
    )
    return [*rows, pages]


# The parts of `POST /api/v1/recipe-imports` (`bench.enqueue_parts`), each
# timed inside the whole route's calls in one process: the ratio is its share.
_ENQUEUE_PARTS = (
    ("http_enqueue_part_authentication", "authentication", "the bearer token's check"),
    ("http_enqueue_part_validation", "validation", "the key, the body parsed and loaded"),
    ("http_enqueue_part_write", "write", "the quota and the insert, one transaction"),
    ("http_enqueue_part_answer", "answer", "the job read again with its place in line"),
    (
        "http_enqueue_part_rest",
        "rest",
        "the rest: Flask's dispatch, the app's hooks, the response, the test client",
    ),
    ("http_enqueue_part_trivial", "trivial", "the trivial route through the same test client"),
    ("http_enqueue_part_run", "run", "the run of a job: CPU a job of the pool draining no-ops"),
)


def measure_enqueue_parts(sizes: Sizes, workdir: Path, log: Path) -> list[dict]:
    parts = run_child(
        "enqueue_parts",
        {
            "workdir": str(workdir),
            "calls": sizes.enqueue_part_calls,
            "rounds": sizes.repeats,
            "synchronous": SYNCHRONOUS,
            "log": str(log),
        },
    )
    what = "the whole route in one process (Flask's test client, no gunicorn): the part's share"
    return [
        figure(name, parts[part], "µs", parts["route"], "µs", f"{what}; {detail}", "report")
        for name, part, detail in _ENQUEUE_PARTS
    ]


def measure_freeze(sizes: Sizes, workdir: Path, log: Path) -> list[dict]:
    db, household = fresh_database(workdir, "freeze.sqlite3")
    result = run_child(
        "freeze",
        {
            "db": db,
            "household": household,
            "seconds": sizes.lock_seconds,
            "workers": sizes.workers,
            "synchronous": SYNCHRONOUS,
            "log": str(log),
        },
    )
    return [
        figure(
            "freeze_longest_gap",
            result["longest_gap_ms"],
            "ms",
            result["longest_gap_unlocked_ms"],
            "ms",
            f"longest gap just before the {result['held_seconds']:.1f} s lock",
            "≤ 50 ms",
            met=result["longest_gap_ms"] <= 50,
            ratio=False,
        )
    ]


def measure_claims(sizes: Sizes, workdir: Path, log: Path) -> list[dict]:
    big = claims.build_big_table(workdir, sizes.big_table_rows)
    empty, _ = fresh_database(workdir, "empty.sqlite3")
    household = 1  # fresh_database's only household
    runs: dict[str, list[dict]] = {"empty": [], "big": []}
    for repeat in range(sizes.repeats):
        for name, source in (("empty", empty), ("big", big)):
            db = copy_database(source, workdir / f"claims-{name}-{repeat}.sqlite3")
            args = {
                "db": db,
                "household": household,
                "claims": sizes.claims,
                "synchronous": SYNCHRONOUS,
                "log": str(log),
            }
            runs[name].append(run_child("claim_rate", args))
            Path(db).unlink()
    rows = []
    what = "empty table"
    for key, name in (
        ("store_claims_per_s", "claim_rate_store"),
        ("statement_claims_per_s", "claim_rate_statement"),
    ):
        big_rate = median([r[key] for r in runs["big"]])
        empty_rate = median([r[key] for r in runs["empty"]])
        row = figure(
            name,
            big_rate,
            "claims/s",
            empty_rate,
            "claims/s",
            what,
            "≥ 0.9x",
            rounds=[(b[key], e[key]) for b, e in zip(runs["big"], runs["empty"], strict=True)],
        )
        judge_at_least(row, 0.9)
        rows.append(row)
    return rows


# Households holding the fair claim's queued jobs between them.
FAIR_HOUSEHOLDS = 1_000
# How long each of household A's jobs runs in the B-behind-A delay.
FAIR_RUN_SECONDS = 0.02
# Partitions the partitioned figures spread the fair claim's jobs over, and
# the jobs of the one at its limit that every claim passes over.
FAIR_PARTITIONS = 1_000
FAIR_BACKLOG = 2_000
# Households whose every job is of the partition at its limit.
FAIR_HELD = 1_000


def measure_fairness(sizes: Sizes, workdir: Path, log: Path) -> list[dict]:
    many = fairness.build_queue(workdir, "many.sqlite3", FAIR_HOUSEHOLDS, sizes.fair_jobs)
    one = fairness.build_queue(workdir, "one.sqlite3", 1, sizes.fair_jobs)
    spread = fairness.build_queue(
        workdir, "spread.sqlite3", FAIR_HOUSEHOLDS, sizes.fair_jobs, partitions=FAIR_PARTITIONS
    )
    backlog = fairness.build_queue(
        workdir,
        "backlog.sqlite3",
        FAIR_HOUSEHOLDS,
        sizes.fair_jobs,
        partitions=FAIR_PARTITIONS,
        backlog=FAIR_BACKLOG,
    )
    held = fairness.build_queue(
        workdir,
        "held.sqlite3",
        FAIR_HOUSEHOLDS,
        sizes.fair_jobs,
        partitions=FAIR_PARTITIONS,
        held=FAIR_HELD,
    )
    runs: dict[str, list[float]] = {
        name: []
        for name in (
            "many",
            "one",
            "oldest_first",
            "spread",
            "spread_unlimited",
            "backlog",
            "backlog_unlimited",
            "held",
        )
    }
    for repeat in range(sizes.repeats):
        for name, source, claim, limited in (
            ("many", many, "fair", False),
            ("one", one, "fair", False),
            ("oldest_first", many, "oldest_first", False),
            ("spread", spread, "fair", True),
            ("spread_unlimited", spread, "fair", False),
            ("backlog", backlog, "fair", True),
            ("backlog_unlimited", backlog, "fair", False),
            ("held", held, "fair", True),
        ):
            db = copy_database(source, workdir / f"fair-{name}-{repeat}.sqlite3")
            args = {
                "db": db,
                "claims": sizes.claims,
                "claim": claim,
                "limited": limited,
                "synchronous": SYNCHRONOUS,
                "log": str(log),
            }
            runs[name].append(run_child("fair_claim", args)["claims_per_s"])
            Path(db).unlink()
    many_rate, one_rate = median(runs["many"]), median(runs["one"])

    def paired(ours: str, theirs: str) -> list[tuple[float, float]]:
        return list(zip(runs[ours], runs[theirs], strict=True))

    households = figure(
        "fair_claim_households",
        many_rate,
        "claims/s",
        one_rate,
        "claims/s",
        f"the same jobs held by 1 household, not {FAIR_HOUSEHOLDS:,}",
        "≥ 0.8x",
        rounds=paired("many", "one"),
    )
    judge_at_least(households, 0.8)
    price = figure(
        "fair_claim_vs_oldest_first",
        many_rate,
        "claims/s",
        median(runs["oldest_first"]),
        "claims/s",
        "the plain oldest-first claim, same table",
        "measured",
        rounds=paired("many", "oldest_first"),
    )
    partitioned = figure(
        "partition_claim_vs_unlimited",
        median(runs["spread"]),
        "claims/s",
        median(runs["spread_unlimited"]),
        "claims/s",
        f"the same claims without limits, same table ({FAIR_PARTITIONS:,} partitions)",
        "≥ 0.8x",
        rounds=paired("spread", "spread_unlimited"),
    )
    judge_at_least(partitioned, 0.8)
    past_backlog = figure(
        "partition_claim_past_a_backlog",
        median(runs["backlog"]),
        "claims/s",
        median(runs["backlog_unlimited"]),
        "claims/s",
        f"the same claims without limits, same table (which take the {FAIR_BACKLOG:,} "
        "jobs of the partition at its limit instead)",
        "report",
        rounds=paired("backlog", "backlog_unlimited"),
    )
    past_held = figure(
        "partition_claim_past_held_households",
        median(runs["held"]),
        "claims/s",
        median(runs["spread"]),
        "claims/s",
        f"the same limited claims without the {FAIR_HELD:,} more households that each hold "
        f"only {fairness.HELD_JOBS} jobs of the partition at its limit",
        "report",
        rounds=paired("held", "spread"),
    )
    delays = []
    for repeat in range(sizes.repeats):
        db, household = fresh_database(workdir, f"fair-delay-{repeat}.sqlite3")
        args = {
            "db": db,
            "household": household,
            "jobs": sizes.fair_a_jobs,
            "run_seconds": FAIR_RUN_SECONDS,
            "synchronous": SYNCHRONOUS,
            "log": str(log),
        }
        delays.append(run_child("b_behind_a", args)["delay_in_run_times"])
    delay = median(delays)
    behind = figure(
        "fair_b_behind_a",
        delay,
        "run times",
        sizes.fair_a_jobs,
        "run times",
        f"oldest first: behind all {sizes.fair_a_jobs} of A's jobs",
        "≤ 2 run times",
        met=delay <= 2,
        ratio=False,
    )
    return [households, price, behind, partitioned, past_backlog, past_held]


def measure_memory(sizes: Sizes, workdir: Path) -> list[dict]:
    result = memory.worker_rss(workdir, sizes.memory_small, sizes.memory_large, sizes.workers)
    growth = result["rss_large_mb"] - result["rss_small_mb"]
    return [
        figure(
            "rss_growth",
            growth,
            "MB",
            result["rss_small_mb"],
            "MB",
            f"RSS after {sizes.memory_small:,} jobs (after {sizes.memory_large:,}: "
            f"{result['rss_large_mb']:.1f} MB)",
            "≤ 5 MB",
            met=growth <= 5,
            ratio=False,
        )
    ]


def _peers_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("procrastinate", "pgqueuer"))


def _awa_installed() -> bool:
    """awa-pg ships a compiled engine for a few platforms only: a reported
    baseline where its wheel installs, left out elsewhere."""
    return importlib.util.find_spec("awa") is not None


# Households posting the jobs two processes drain: each claim locks the
# households it takes from, so one household's jobs are claimed by one
# process at a time (its turn order kept exact), and scaling out is measured
# with several households, as a deployment has them; one household is shown too.
PG_HOUSEHOLDS = 20


def _make_awa_schema(url: str) -> None:
    """awa's schema, as its client migrates an empty database, in a child (awa's
    runs are unpatched); each awa run then gets a clone."""
    run_child("pg_awa_schema", {"url": url})


def measure_postgres(sizes: Sizes, workdir: Path, log: Path, *, quick: bool) -> list[dict]:
    """The runner on PostgreSQL against a raw psycopg loop, procrastinate and pgqueuer,
    and two worker processes against one: every run on a database of its own, one server."""
    peer = _peers_installed()
    if not peer and not quick:
        raise RuntimeError("procrastinate or pgqueuer is not installed: pip install -e '.[bench]'")
    n, workers = sizes.pg_jobs, sizes.workers
    runs: dict[str, list[dict]] = {
        "raw": [],
        "runner": [],
        "procrastinate": [],
        "pgqueuer": [],
        "pgqueuer_default": [],
        "awa": [],
        # Ours again, with sizes.pg_backlog_jobs queued: a claim's cost must
        # not grow with the backlog.
        "backlog": [],
    }
    # Seconds to drain by 1 and 2 processes, by how many households posted.
    processes: dict[tuple[int, int], list[float]] = {
        (count, households): [] for count in (1, 2) for households in (PG_HOUSEHOLDS, 1)
    }
    # (run, child, migrated database, pgqueuer's batch: as many jobs as our pool
    # runs at once, and its default).
    children = [
        ("raw", "pg_raw", True, None),
        ("runner", "pg_runner", True, None),
        ("backlog", "pg_runner", True, None),
    ]
    if peer:
        children += [
            ("procrastinate", "pg_procrastinate", False, None),
            ("pgqueuer", "pg_pgqueuer", False, workers),
            ("pgqueuer_default", "pg_pgqueuer", False, None),
        ]
    if _awa_installed():
        children.append(("awa", "pg_awa", False, None))
    with pg.server(workdir) as server, pg.databases(server) as databases:
        version = pg.server_version(server)
        for _ in range(sizes.repeats):
            for name, child, migrated, batch in children:
                schema = ("awa", _make_awa_schema) if name == "awa" else None
                with databases.new(migrated=migrated, peer_schema=schema) as (url, household):
                    args = {
                        "url": url,
                        "household": household,
                        "jobs": sizes.pg_backlog_jobs if name == "backlog" else n,
                        "workers": workers,
                        "batch": batch,
                        "log": str(log),
                    }
                    run = run_child(child, args)
                    # The child counted its WAL and transactions from its first
                    # enqueue to its drain's end; dead tuples as the cycle left
                    # them (autovacuum may have run meanwhile).
                    run["written"]["dead_tuples"] = pg.dead_tuples(url) / n
                    runs[name].append(run)
            for (count, households), seconds in processes.items():
                with databases.new() as (url, household):
                    seconds.append(
                        pg_throughput.drain_by_processes(
                            url,
                            household,
                            workdir,
                            count,
                            sizes.pg_process_jobs,
                            workers,
                            households,
                        )
                    )

    def rates(name: str, key: str) -> list[float]:
        """Each round's jobs/s, in the order the rounds ran."""
        values = []
        for run in runs[name]:
            seconds = (
                run["drain_seconds"]
                if key == "drain"
                else run["enqueue_seconds"] + run["drain_seconds"]
            )
            values.append((sizes.pg_backlog_jobs if name == "backlog" else n) / seconds)
        return values

    def rate(name: str, key: str) -> float | None:
        return median(rates(name, key)) if runs[name] else None

    def paired(name: str, key: str = "drain") -> list[tuple[float, float]]:
        """(ours, its) jobs/s of each interleaved round (none for a peer not run)."""
        if not runs[name]:
            return []
        return list(zip(rates("runner", key), rates(name, key), strict=True))

    def by_processes(households: int) -> list[tuple[float, float]]:
        """(two processes, one) jobs/s of each round."""
        two, one = processes[2, households], processes[1, households]
        m = sizes.pg_process_jobs
        return [(m / ours, m / theirs) for ours, theirs in zip(two, one, strict=True)]

    def cpu_us(name: str, key: str) -> float | None:
        """The median over a system's rounds of its drain's CPU a job (`key`: its
        process's, or the server's), in µs; None where it was not read."""
        values = [run.get(key) for run in runs[name]]
        if not values or any(value is None for value in values):
            return None
        return median([1e6 * value / n for value in values])

    def cpu_of(name: str) -> str | None:
        process, server = cpu_us(name, "drain_cpu_seconds"), cpu_us(name, "server_cpu_seconds")
        if process is None or server is None:
            return None
        return f"{process:.0f} + {server:.0f} µs"

    def beside_pg(name: str, what: str) -> str:
        """`what`, and each side's CPU a job of the drain, its process's plus the
        server's: where the time goes, read far steadier than wall time."""
        ours, its = cpu_of("runner"), cpu_of(name)
        if ours is None or its is None:
            return what
        cpu = f"CPU a job of the drain, the process's + the server's: ours {ours}, its {its}"
        return f"{what} ({cpu})"

    drain, cycle = rate("runner", "drain"), rate("runner", "cycle")
    raw = beside_pg("raw", "raw psycopg loop, same server")
    missing = "not installed (pip install -e '.[bench]')"
    peer_what = (
        beside_pg("procrastinate", "procrastinate's worker, same server")
        if peer
        else f"procrastinate {missing}"
    )
    default_batch = runs["pgqueuer_default"][0]["batch"] if runs["pgqueuer_default"] else None

    def pgqueuer_what(name: str, batch: int | None) -> str:
        if not peer:
            return f"pgqueuer {missing}"
        return beside_pg(
            name,
            f"pgqueuer's QueueManager (drain mode, {batch} jobs per batch), same server",
        )

    rows = [
        figure(
            "pg_drain_vs_raw",
            drain,
            "jobs/s",
            rate("raw", "drain"),
            "jobs/s",
            raw,
            "≥ 0.5x",
            rounds=paired("raw"),
        ),
        figure(
            "pg_cycle_vs_raw",
            cycle,
            "jobs/s",
            rate("raw", "cycle"),
            "jobs/s",
            raw,
            "≥ 0.5x",
            rounds=paired("raw", "cycle"),
        ),
        figure(
            "pg_drain_vs_procrastinate",
            drain,
            "jobs/s",
            rate("procrastinate", "drain"),
            "jobs/s",
            peer_what,
            "≥ 5.0x",
            rounds=paired("procrastinate"),
        ),
        figure(
            "pg_drain_vs_pgqueuer",
            drain,
            "jobs/s",
            rate("pgqueuer", "drain"),
            "jobs/s",
            pgqueuer_what("pgqueuer", workers),
            "≥ 0.8x",
            rounds=paired("pgqueuer"),
        ),
        figure(
            "pg_drain_vs_pgqueuer_default",
            drain,
            "jobs/s",
            rate("pgqueuer_default", "drain"),
            "jobs/s",
            pgqueuer_what("pgqueuer_default", default_batch),
            "≥ 1.0x",
            rounds=paired("pgqueuer_default"),
        ),
        figure(
            "pg_drain_vs_awa",
            drain,
            "jobs/s",
            rate("awa", "drain"),
            "jobs/s",
            beside_pg("awa", "awa's async workers (awa-pg, a Rust engine), same server")
            if runs["awa"]
            else "awa-pg not installed (pip install -e '.[bench]')",
            "report",
            rounds=paired("awa"),
        ),
        figure(
            "pg_drain_backlog",
            rate("backlog", "drain"),
            "jobs/s",
            drain,
            "jobs/s",
            f"our drain of {n:,} jobs, same rounds (here {sizes.pg_backlog_jobs:,} queued)",
            "≥ 0.9x",
            rounds=list(zip(rates("backlog", "drain"), rates("runner", "drain"), strict=True)),
        ),
        figure(
            "pg_two_processes",
            sizes.pg_process_jobs / median(processes[2, PG_HOUSEHOLDS]),
            "jobs/s",
            sizes.pg_process_jobs / median(processes[1, PG_HOUSEHOLDS]),
            "jobs/s",
            f"one worker process, same server ({PG_HOUSEHOLDS} households posting)",
            "≥ 1.6x",
            rounds=by_processes(PG_HOUSEHOLDS),
        ),
        figure(
            "pg_two_processes_one_household",
            sizes.pg_process_jobs / median(processes[2, 1]),
            "jobs/s",
            sizes.pg_process_jobs / median(processes[1, 1]),
            "jobs/s",
            "one worker process, same server (one household posting)",
            "report",
            rounds=by_processes(1),
        ),
    ]
    for row, bound in zip(rows, (0.5, 0.5, 5.0, 0.8, 1.0, None, 0.9, 1.6, None), strict=True):
        if bound is not None and row["baseline"] is not None:
            judge_at_least(row, bound)
        elif bound is not None:
            row["met"] = None
    rows += _written_rows(runs)
    rows[0]["postgresql"] = version
    return rows


# What each PostgreSQL run wrote per job, against the peer that wrote least.
PG_WRITTEN = (
    ("pg_wal_bytes_per_job", "wal_bytes", "bytes"),
    ("pg_write_transactions_per_job", "write_transactions", "transactions"),
    ("pg_dead_tuples_per_job", "dead_tuples", "tuples"),
)
_PEERS = ("procrastinate", "pgqueuer", "pgqueuer_default", "awa")
# The peers that enqueue as ours does, one job a transaction: what is
# written per job counts the enqueue, and pgqueuer's one bulk insert of
# every job would make a baseline no single-job enqueue can meet.
_ENQUEUE_ONE_BY_ONE = ("procrastinate", "awa")


def _written_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Ours per job against the lowest of the peers that enqueue one job a
    transaction, as ours does, every peer named beside it (target for WAL
    bytes: at most that peer's; the rest reported), with each round's ratio
    to that peer's round. A peer that leaves no dead tuple (it deletes
    nothing, or vacuum came) is no ratio's baseline: there the raw loop is."""
    rows = []
    for figure_name, key, unit in PG_WRITTEN:

        def each_round(name: str, key: str = key) -> list[float]:
            return [run["written"][key] for run in runs[name]]

        peers = {name: median(each_round(name)) for name in _PEERS if runs[name]}
        each = ", ".join(f"{name} {value:,.1f}" for name, value in peers.items())
        alike = {
            name: value
            for name, value in peers.items()
            if name in _ENQUEUE_ONE_BY_ONE and value > 0
        }
        if alike:
            lowest = min(alike, key=alike.__getitem__)
            what = (
                f"the lowest of the peers enqueueing one job a transaction, {lowest} (each: {each})"
            )
        else:
            lowest = "raw"
            what = f"the raw loop's (the peers: {each or 'none installed'})"
        row = figure(
            figure_name,
            median(each_round("runner")),
            unit,
            median(each_round(lowest)),
            unit,
            what,
            "≤ 1.0x" if key == "wal_bytes" and alike else "report",
            rounds=list(zip(each_round("runner"), each_round(lowest), strict=True)),
        )
        if key == "wal_bytes" and alike and row["ratio"] is not None:
            row["met"] = row["ratio"] <= 1.0
            if row["ratio_high"] is not None:
                row["met_every_round"] = row["ratio_high"] <= 1.0
        rows.append(row)
    return rows


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit in ("ms", "MB", "pages", "transactions", "tuples"):
        return f"{value:.2f} {unit}"
    return f"{value:,.0f} {unit}"


def table(figures: list[dict]) -> str:
    lines = [
        "| figure | value | baseline (same run) | ratio (lowest to highest round) | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in figures:
        baseline = _number(row["baseline"], row["baseline_unit"])
        if row["baseline_what"]:
            baseline = f"{baseline}: {row['baseline_what']}" if row["baseline"] is not None else ""
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "—"
        if row.get("ratio_low") is not None:
            ratio += f" ({row['ratio_low']:.2f} to {row['ratio_high']:.2f})"
        met = {True: "met", False: "**not met**", None: "(report)"}[row["met"]]
        if row["met"] and row.get("met_every_round") is False:
            met = "met by the median, not in every round"
        value = _number(row["value"], row["unit"])
        lines.append(
            f"| {row['figure']} | {value} | {baseline} | {ratio} | {row['target']} | {met} |"
        )
    return "\n".join(lines)


SECTIONS = (
    "throughput",
    "processes",
    "latency",
    "http",
    "enqueue",
    "freeze",
    "claims",
    "fairness",
    "memory",
    "postgres",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument(
        "--loadgen",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="HTTP load generator (auto: wrk if installed)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--readme", action="store_true", help="put the table in bench/README.md (full runs)"
    )
    options = parser.parse_args(argv)
    sizes = QUICK if options.quick else FULL
    generator = options.loadgen
    if generator == "auto":
        generator = "wrk" if wrk_available() else "python"
    stamp = time.strftime("%Y%m%dT%H%M%S")
    json_path = options.json or REPO / "bench" / "results" / f"bench-{stamp}.json"
    workdir = Path(tempfile.mkdtemp(prefix="mealquest-bench-"))
    log = workdir / "children.log"
    sections = options.only or SECTIONS
    if options.quick and not options.only and not pg.test_server_url():
        sections = tuple(s for s in SECTIONS if s != "postgres")
    started = time.monotonic()
    figures: list[dict] = []

    def save(complete: bool) -> dict:
        """Write the figures measured so far: a section that fails late (a
        server, a peer) then costs only its own figures."""
        postgresql = next((row["postgresql"] for row in figures if "postgresql" in row), None)
        results = {
            "mode": "quick" if options.quick else "full",
            "started": stamp,
            "seconds": time.monotonic() - started,
            "complete": complete,
            "sizes": asdict(sizes),
            "synchronous": SYNCHRONOUS,
            "http_generator": generator,
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "sqlite": sqlite3.sqlite_version,
                "postgresql": postgresql,
            },
            "figures": figures,
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2) + "\n")
        return results

    try:
        for section in sections:
            section_started = time.monotonic()
            if section == "throughput":
                figures += measure_throughput(sizes, workdir, log)
            elif section == "processes":
                figures += measure_processes(sizes, workdir)
            elif section == "latency":
                figures += measure_latency(sizes, workdir, log)
            elif section == "http":
                figures += measure_http(sizes, workdir, generator)
            elif section == "enqueue":
                figures += measure_enqueue(sizes, workdir, log, generator)
            elif section == "freeze":
                figures += measure_freeze(sizes, workdir, log)
            elif section == "claims":
                figures += measure_claims(sizes, workdir, log)
            elif section == "fairness":
                figures += measure_fairness(sizes, workdir, log)
            elif section == "memory":
                figures += measure_memory(sizes, workdir)
            elif section == "postgres":
                figures += measure_postgres(sizes, workdir, log, quick=options.quick)
            print(f"{section}: {time.monotonic() - section_started:.1f} s", file=sys.stderr)
            save(complete=False)
    finally:
        if options.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    results = save(complete=True)
    postgresql = results["machine"]["postgresql"]
    summary = (
        f"{results['mode']} run of {stamp}, {results['seconds']:.0f} s, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, synchronous={SYNCHRONOUS}, "
        f"HTTP load by {generator}"
    )
    if postgresql:
        summary += f", PostgreSQL {postgresql} (fsync off)"
    print(table(figures))
    print(f"\n{summary}; JSON: {json_path}")
    if options.readme:
        update_readme(table(figures), summary, partial=bool(options.only))
    return 0


README = REPO / "bench" / "README.md"
_START, _END = "<!-- table:start -->", "<!-- table:end -->"


def update_readme(rows: str, summary: str, *, partial: bool) -> None:
    """Put a run's rows in the table between the markers of bench/README.md.

    A full run replaces the table. A partial one (`--only`) replaces the rows
    of the figures it measured and adds those it is the first to measure, so
    one section can be re-run alone; its summary line is kept beside the full
    run's, naming the figures it gave.
    """
    content = README.read_text()
    head, rest = content.split(_START, 1)
    old, tail = rest.split(_END, 1)
    if not partial:
        text = f"{rows}\n\n{summary}."
    else:
        new = {line.split("|")[1].strip(): line for line in rows.splitlines()[2:]}
        lines = old.strip().splitlines()
        table = [line for line in lines if line.startswith("|")]
        notes = [line for line in lines if line and not line.startswith("|")]
        merged = []
        for line in table:
            name = line.split("|")[1].strip()
            merged.append(new.pop(name, line))
        merged += new.values()
        names = ", ".join(line.split("|")[1].strip() for line in rows.splitlines()[2:])
        notes = [line for line in notes if not line.endswith(f"({names}).")]
        notes.append(f"{summary} ({names}).")
        text = "\n".join(merged) + "\n\n" + "\n\n".join(notes)
    README.write_text(f"{head}{_START}\n{text}\n{_END}{tail}")


if __name__ == "__main__":
    sys.exit(main())
