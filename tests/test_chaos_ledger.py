"""The chaos test's verdict (`tests.support.chaos_ledger`) on ledgers made by
hand: a second run is explained only by a lease provably lost, never by a
kill that came before the earlier run or after the later one, and never
under one claim; runs of a job no client saw answered are counted."""

from __future__ import annotations

from pathlib import Path

from tests.support.chaos_ledger import (
    LEASE_LOST,
    RESCUED,
    Run,
    completed,
    fenced_writes,
    judge,
    read,
    rescued_claims,
)
from tests.support.chaos_table import render
from tests.support.shared_lines import record

JOB = "a" * 32


def ledger(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "ledger"
    path.write_bytes(b"".join(record(line) for line in lines))
    return path


def test_runs_are_read_with_their_start_and_end(tmp_path):
    path = ledger(
        tmp_path,
        f"start {JOB} 10 claim-1 100.0",
        f"start {JOB} 20 claim-2 105.0",
        f"end {JOB} 20 claim-2 105.5",
    )
    runs = read(path)
    assert runs[JOB] == [
        Run(JOB, 10, "claim-1", 100.0, None),  # cut short: no end
        Run(JOB, 20, "claim-2", 105.0, 105.5),
    ]
    assert completed(runs) == {JOB}


def twice(first_claim: str = "claim-1", second_claim: str = "claim-2") -> dict[str, list[Run]]:
    return {JOB: [Run(JOB, 10, first_claim, 100.0), Run(JOB, 20, second_claim, 105.0, 105.1)]}


def test_a_run_again_after_its_process_was_killed_is_explained():
    verdict = judge(twice(), answered={JOB}, kills={10: 101.0}, fenced=set())
    assert (verdict.twice_killed, verdict.unexplained) == ({JOB}, {})


def test_two_runs_under_one_claim_are_never_explained():
    runs = twice("claim-1", "claim-1")
    verdict = judge(runs, answered={JOB}, kills={10: 101.0}, fenced={(JOB, 10)})
    assert verdict.unexplained == {JOB: runs[JOB]}
    assert not verdict.twice_killed
    assert not verdict.twice_fenced


def test_a_kill_after_the_later_run_started_explains_nothing():
    # The process was killed, but only once the job already ran again.
    verdict = judge(twice(), answered={JOB}, kills={10: 106.0}, fenced=set())
    assert JOB in verdict.unexplained
    # Nor does a kill before the earlier run began (an earlier life of the pid).
    verdict = judge(twice(), answered={JOB}, kills={10: 99.0}, fenced=set())
    assert JOB in verdict.unexplained


def test_a_refused_fenced_write_of_the_earlier_run_explains_it():
    verdict = judge(twice(), answered={JOB}, kills={}, fenced={(JOB, 10)})
    assert (verdict.twice_fenced, verdict.unexplained) == ({JOB}, {})
    # Another process's refusal is not the earlier run's.
    verdict = judge(twice(), answered={JOB}, kills={}, fenced={(JOB, 20)})
    assert JOB in verdict.unexplained


def test_a_rescue_of_the_earlier_runs_claim_explains_it():
    # Its process outlived the rescue but was killed before its write could
    # be refused: the rescue of that claim's lease is the proof.
    verdict = judge(
        twice(), answered={JOB}, kills={10: 106.0}, fenced=set(), rescued={(JOB, "claim-1")}
    )
    assert (verdict.twice_fenced, verdict.unexplained) == ({JOB}, {})
    # A rescue of another claim of the job (the later one's) is not the earlier run's.
    verdict = judge(twice(), answered={JOB}, kills={}, fenced=set(), rescued={(JOB, "claim-2")})
    assert JOB in verdict.unexplained


def test_rescues_are_read_from_the_text_log_with_their_claim():
    log = (
        f"2026-12-06 09:28:16,355 15661 WARNING mealquest.jobs.runner.rescuer: "
        f"{RESCUED} [job_id={JOB} claim=744814be81adfda2283aada5a6773df7.19]\n"
        f"2026-12-06 09:28:16,356 15661 WARNING mealquest.jobs.runner.rescuer: "
        f"{RESCUED} [job_id={'b' * 32}]\n"
    )
    assert rescued_claims([log]) == {(JOB, "744814be81adfda2283aada5a6773df7.19")}


def test_runs_of_a_job_no_client_saw_answered_are_counted():
    verdict = judge(twice(), answered=set(), kills={10: 101.0}, fenced=set())
    assert list(verdict.unanswered) == [JOB]


def test_refused_writes_are_read_from_the_text_log_with_their_pid():
    log = (
        f"2026-12-06 06:28:54,470 4242 WARNING mealquest.jobs.runner.completer: "
        f"{LEASE_LOST} [job_id={JOB} kind=ledger_run attempt=1]\n"
        f"2026-12-06 06:28:54,471 4242 INFO mealquest.jobs.runner.executor: job succeeded "
        f"[job_id={'b' * 32} kind=ledger_run attempt=1]\n"
    )
    assert fenced_writes([log]) == {(JOB, 4242)}


def test_the_published_table_is_rendered_from_the_rows_the_test_wrote():
    row = {
        "database": "pgbouncer",
        "faults": {"PgBouncer killed and started again": 20},
        "longest recovery (s)": {"PgBouncer killed and started again": 2.6},
        "jobs answered": 4716,
        "lost": 0,
        "run twice, lease lost with a killed process": 72,
        "run twice, lease expired while the database was away": 0,
        "run twice, unexplained": 0,
        "runs of jobs never answered": 0,
        "answers": {"200": 124, "202": 4592},
        "requests without an answer (retried)": 3035,
        "seconds": 242,
    }
    text = render([row], "scripts/chaos --long", 0, when="2026-12-06 08:00 UTC", on="a machine")
    assert text.startswith(
        "Written by `scripts/chaos --long` on 2026-12-06 08:00 UTC, on a machine; the test "
        "passed (PostgreSQL through PgBouncer 242 s)."
    )
    assert (
        "| PostgreSQL through PgBouncer | 4,716 | 0 | 72 | 0 | 0 | 0 | 3,035 | 200: 124, " in text
    )
    assert "| PgBouncer killed and started again | 20, back in 2.6 s |" in text
    failed = render([row], "scripts/chaos", 1, when="now", on="here")
    assert "the test **failed** (pytest's status 1)" in failed
