"""The benchmark suite in its quick form, so it cannot rot.

It asserts that the suite ran and produced every figure as a number, never
how fast anything was: durations on a shared machine are noise, and the
figures that matter are ratios read from a full run (bench/README.md).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import web
from bench.__main__ import FIGURES
from bench.common import FULL, QUICK, fresh_database
from mealquest.application import create_app
from mealquest.config.table import DEFAULTS
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs, retention

REPO = Path(__file__).resolve().parents[1]


def _run_module(*argv: str, timeout: float = 240) -> str:
    """`python -m` the bench or one of its own measurements; its standard output."""
    completed = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-6000:]
    return completed.stdout


def test_the_bench_sizes_the_pool_as_the_service_does():
    # A figure of another pool size would measure a pool no one runs.
    assert FULL.workers == QUICK.workers == DEFAULTS["JOB_WORKERS"]


# Above the run's own bound (540 s): the suite's 120 s default ended it
# whenever a loaded machine took longer.
@pytest.mark.timeout(600)
def test_the_quick_benchmark_produces_every_figure(tmp_path):
    results_path = tmp_path / "bench.json"
    output = _run_module("bench", "--quick", "--json", str(results_path), timeout=540)
    results = json.loads(results_path.read_text())
    # Written after each section too; this one is the whole run's.
    assert results["complete"] is True
    assert results["mode"] == "quick"
    assert [row["figure"] for row in results["figures"]] == list(FIGURES)
    for row in results["figures"]:
        assert isinstance(row["value"], int | float), row
        assert math.isfinite(row["value"]), row
        if row["baseline"] is not None:
            assert isinstance(row["baseline"], int | float), row
            assert row["baseline"] > 0, row
        assert row["met"] in (True, False, None), row
    # The printed table carries every figure too.
    for name in FIGURES:
        assert f"| {name} |" in output
    # Beside a PostgreSQL drain ratio, both sides' CPU a job (the test's
    # server runs on this machine, where `/proc` shows its processes).
    by_name = {row["figure"]: row for row in results["figures"]}
    # The enqueue route's parts were each timed inside it: none is missing,
    # and together they are less than the whole.
    parts = [
        by_name[f"http_enqueue_part_{part}"]
        for part in ("authentication", "validation", "write", "answer")
    ]
    assert all(row["value"] > 0 for row in parts), parts
    assert sum(row["value"] for row in parts) < parts[0]["baseline"]
    # Beside each SQLite ratio against a peer, both sides' CPU a job.
    for name in ("drain_vs_huey", "cycle_vs_huey", "drain_vs_minimal", "cycle_vs_minimal"):
        assert "CPU per job of the" in by_name[name]["baseline_what"], name
    assert "CPU per enqueue" in by_name["enqueue_vs_huey"]["baseline_what"]
    if "pg_drain_vs_raw" in by_name:
        assert "CPU a job of the drain" in by_name["pg_drain_vs_raw"]["baseline_what"]


@pytest.mark.timeout(300)
def test_the_gil_measurement_runs_and_prints_a_row_per_switch_interval():
    output = _run_module(
        "bench.gil", "--seconds", "0.2", "--jobs", "20000", "--intervals", "0.005,0.0005"
    )
    rows = [line for line in output.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| 5 ms", "| 0.5 ms"]
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("| ").split(" | ")]
        assert int(cells[1].replace(",", "")) > 0
        assert cells[2].endswith("%")
        assert cells[3].endswith("%")
        assert float(cells[4]) > 0


@pytest.mark.timeout(300)
def test_the_parsing_measurement_runs_and_prints_a_row_per_page_and_way():
    output = _run_module("bench.parsing", "--rounds", "1", "--size", "20000")
    rows = [line for line in output.splitlines() if line.startswith("| ")][1:]
    ways = [[cell.strip() for cell in row.strip("| ").split(" | ")][1] for row in rows]
    assert ways == ["in_process", "warm", "cold"] * 2
    for row in rows:
        cells = [cell.strip() for cell in row.strip("| ").split(" | ")]
        assert float(cells[2].removesuffix(" ms")) > 0
        assert float(cells[4].removesuffix("x")) > 0


@pytest.mark.timeout(300)
def test_the_queue_table_probe_runs_and_prints_a_row_per_layout():
    output = _run_module("bench.queue_table", "--jobs", "100", "--rounds", "1")
    rows = [line for line in output.splitlines() if line.startswith("| ")][1:]
    cells = [[cell.strip() for cell in row.strip("| ").split(" | ")] for row in rows]
    assert [row[0] for row in cells] == ["today", "queue", "queue_and_row"]
    for row in cells:
        # Each figure: "median (lowest to highest)", a number of bytes or µs.
        medians = [float(cell.split(" (")[0].replace(",", "")) for cell in row[1:]]
        assert len(medians) == 6
        enqueue_wal, enqueue_cpu, drain_wal, drain_cpu, drain_wall, all_wal = medians
        assert min(enqueue_wal, drain_wal, drain_wall, all_wal) > 0, row
        # The server's CPU is counted in clock ticks (10 ms): a hundred jobs
        # may take less than one.
        assert min(enqueue_cpu, drain_cpu) >= 0, row


@pytest.mark.sqlite_only("the HTTP figures' served database is an SQLite file")
def test_the_http_figures_jobs_outlive_the_hourly_prune(tmp_path):
    # The routes they load read these jobs for the whole run, in workers
    # whose pools run `prune_jobs` at minute 17 of every hour: a job it
    # deleted made every later answer a 404, and the figure failed.
    db, household = fresh_database(tmp_path)
    _token, finished, running = web._seed(db, household)
    app = create_app({"DATABASE": db})
    pruned = retention.prune(
        get_store(app),
        older_than_days=DEFAULTS["JOB_RETENTION_DAYS"],
        catchup_seconds=DEFAULTS["JOB_CRON_CATCHUP_SECONDS"],
    )
    assert pruned.jobs == 0
    jobs = get_jobs(app)
    assert jobs.get(finished) is not None
    assert jobs.get(running) is not None
    get_store(app).close()
