"""`flask jobs list | show | pause | resume`, and how `flask jobs work` ends when
its pool cannot go on (its other runs are in tests/test_multiprocess.py)."""

from __future__ import annotations

import json
import sys

import pytest

from mealquest.model.jobs import Status
from tests.conftest import wait_for
from tests.support import sql
from tests.support.give_up import REASON, register_give_up
from tests.support.processes import Process, process_group

pytestmark = pytest.mark.both_databases


def test_jobs_list_and_show(runner, jobs, household, other_household):
    mine = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    theirs = jobs.enqueue(
        "fail_with_failure", {"message": "nope"}, household_id=other_household.household_id
    )
    jobs.start_pool()
    wait_for(lambda: jobs.get(theirs).status == Status.FAILED)
    wait_for(lambda: jobs.get(mine).status == Status.SUCCEEDED)

    listed = runner.invoke(args=["jobs", "list"])
    assert listed.exit_code == 0
    lines = listed.output.splitlines()
    assert [line.split()[0] for line in lines] == [theirs, mine]
    assert "error=nope" in lines[0]

    failed = runner.invoke(args=["jobs", "list", "--status", "failed"])
    assert [line.split()[0] for line in failed.output.splitlines()] == [theirs]
    by_household = runner.invoke(args=["jobs", "list", "--household", str(household.household_id)])
    assert [line.split()[0] for line in by_household.output.splitlines()] == [mine]

    shown = runner.invoke(args=["jobs", "show", mine])
    assert shown.exit_code == 0
    row = json.loads(shown.output)
    assert (row["id"], row["status"], row["result"], row["attempt"]) == (
        mine,
        "succeeded",
        {"value": 1},
        1,
    )


def test_jobs_pause_and_resume_a_kind_for_every_claim(runner, jobs, store, household):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)

    paused = runner.invoke(args=["jobs", "pause", "succeed"])
    again = runner.invoke(args=["jobs", "pause", "succeed"])

    assert paused.exit_code == 0, paused.output
    assert paused.output.startswith("succeed: paused: no process claims its jobs")
    assert (again.exit_code, again.output) == (0, "succeed: already paused\n")
    rows = sql.rows(store, "SELECT kind, operator_id FROM paused_kinds")
    assert rows == [{"kind": "succeed", "operator_id": None}]  # from the CLI
    # A claim took a later job of the household, and left the paused one.
    jobs.start_pool()
    other = jobs.enqueue("sleep", {"seconds": 0.0}, household_id=household.household_id)
    wait_for(lambda: jobs.get(other).status == Status.SUCCEEDED)
    assert jobs.get(job_id).status == Status.QUEUED

    resumed = runner.invoke(args=["jobs", "resume", "succeed"])
    assert resumed.output.startswith("succeed: resumed")
    wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    not_paused = runner.invoke(args=["jobs", "resume", "succeed"])
    assert (not_paused.exit_code, not_paused.output) == (0, "succeed: not paused\n")


def test_jobs_pause_refuses_a_kind_no_handler_registers_in_one_line(runner, store):
    refused = runner.invoke(args=["jobs", "pause", "no_such_kind"])

    assert refused.exit_code == 1
    assert refused.output.strip().splitlines() == [
        "Error: No handler is registered for that job kind: no_such_kind"
    ]
    assert sql.rows(store, "SELECT kind FROM paused_kinds") == []


def test_jobs_show_unknown_and_bad_status(runner):
    missing = runner.invoke(args=["jobs", "show", "0" * 32])
    assert missing.exit_code != 0
    assert "no job" in missing.output
    bad = runner.invoke(args=["jobs", "list", "--status", "done"])
    assert bad.exit_code != 0


def test_jobs_show_masks_the_secrets_of_urls_in_the_payload_and_result(
    runner, jobs, store, household
):
    job_id = jobs.enqueue(
        "recipe_import",
        {"url": "https://x.example/r?token=SECRET"},
        household_id=household.household_id,
    )
    # A result as a handler could write it, quoting an address with its credentials.
    result = {"seen": ["https://u:SECRET2@x.example/r?sig=SECRET3#SECRET4"]}
    sql.execute(store, "UPDATE jobs SET result = ? WHERE id = ?", (json.dumps(result), job_id))

    shown = runner.invoke(args=["jobs", "show", job_id])
    assert shown.exit_code == 0, shown.output
    assert "SECRET" not in shown.output
    row = json.loads(shown.output)
    assert row["payload"] == {"url": "https://x.example/r?token=***"}
    assert row["result"] == {"seen": ["https://***@x.example/r?sig=***#***"]}


def test_jobs_list_and_show_mask_the_secrets_of_urls_in_errors(runner, jobs, household, logs):
    # A quote is a character a URL may hold: the token after it is masked too.
    url = "https://x.example/r?x=1'&token=SECRET"
    job_id = jobs.enqueue(
        "fail_with_failure",
        {"message": f"could not read {url} (user https://u:SECRET2@x.example/)"},
        household_id=household.household_id,
    )
    jobs.start_pool()
    wait_for(lambda: jobs.get(job_id).status == Status.FAILED)

    listed = runner.invoke(args=["jobs", "list"])
    assert listed.exit_code == 0, listed.output
    assert "SECRET" not in listed.output
    assert (
        "error=could not read https://x.example/r?x=***&token=*** (user https://***@x.example/)"
        in (listed.output)
    )
    shown = runner.invoke(args=["jobs", "show", job_id])
    assert shown.exit_code == 0, shown.output
    assert "SECRET" not in shown.output
    assert json.loads(shown.output)["payload"]["message"] == (
        "could not read https://x.example/r?x=***&token=*** (user https://***@x.example/)"
    )
    # The runner's line about the failure is masked the same way.
    assert "SECRET" not in logs.text
    assert any("https://x.example/r?x=***&token=***" in r.getMessage() for r in logs.records)


def test_flask_jobs_work_drains_and_exits_1_when_its_pool_cannot_go_on(jobs, db_path, household):
    register_give_up(jobs)
    job_id = jobs.enqueue("give_up", {}, household_id=household.household_id)
    flask = [sys.executable, "-m", "flask", "--app", "tests.support.give_up_app", "jobs", "work"]
    with process_group() as processes:
        worker = Process(flask, {"MEALQUEST_DATABASE": db_path})
        processes.append(worker)
        assert worker.popen.wait(timeout=60) == 1
        wait_for(lambda: "stopped:" in worker.output() and "Error:" in worker.output())
    output = worker.output()
    assert f"Error: the job pool could not go on ({REASON}); stopped" in output
    assert "stopping: waiting for running jobs" in output
    assert jobs.get(job_id).status == Status.SUCCEEDED
