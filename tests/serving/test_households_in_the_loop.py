"""A job that asks its household, through real gunicorn on both databases:
a week's recipes imported and its shopping list confirmed over HTTP; every
process stopped while a job waits loses nothing; a process killed between
a step and the wait runs the step no second time."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.support.pages import WEEK, PageServer, week_page
from tests.support.servers import enqueue, http, job, wait_until

pytestmark = pytest.mark.both_databases

DEADLINE = 60.0
FETCHING = {"ALLOW_PRIVATE_URLS": True, "JOB_WORKERS": 8}


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    for index, title in enumerate(WEEK):
        server.page(f"/week/{index}", week_page(title))
    yield server
    server.stop()


def asked(server, token: str, job_id: str) -> dict:
    """The job as its household reads it, once it waits for their answer."""

    def waiting() -> dict | None:
        answer = http("GET", f"{server.url}/api/v1/jobs/{job_id}", token=token)
        queue = answer.json.get("queue") or {}
        return answer.json if queue.get("waiting_for") == "household" else None

    return wait_until(waiting, DEADLINE, "the job never waited for its household")


def ended(server, token: str, job_id: str) -> dict:
    def final() -> dict | None:
        answer = http("GET", f"{server.url}/api/v1/jobs/{job_id}", token=token).json
        return answer if answer["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(final, DEADLINE, "the job never ended")


def steps_run(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("step ")]


def test_a_week_imported_and_its_list_confirmed_over_http(served, start_gunicorn, pages):
    server = start_gunicorn(workers=2, config=FETCHING)
    urls = [pages.url(f"/week/{index}") for index in range(len(WEEK))]
    batch = http(
        "POST",
        f"{server.url}/api/v1/recipe-imports/batch",
        token=served.token,
        json_body={"urls": urls, "shopping_list": True, "confirm": True},
    )
    assert batch.status == 202, batch
    list_id = batch.json["shopping_list_job_id"]

    merged = asked(server, served.token, list_id)
    assert merged["queue"]["signal"] == "confirm"
    assert merged["result"]["confirmed"] is False
    assert merged["result"]["recipes"] == len(WEEK)

    answer = http(
        "POST",
        f"{server.url}/api/v1/jobs/{list_id}/signals/confirm",
        token=served.token,
        json_body={"remove": ["burger buns"], "add": ["napkins"]},
        headers={"Idempotency-Key": "confirm-1"},
    )
    assert answer.status == 202, answer
    done = ended(server, served.token, list_id)
    assert done["status"] == "succeeded", done
    assert done["result"]["confirmed"] is True
    rows = [item["text"] for item in done["result"]["items"]]
    assert "4 burger buns" not in rows
    assert "napkins" in rows
    # The same request again answers as it did; another answer is refused.
    again = http(
        "POST",
        f"{server.url}/api/v1/jobs/{list_id}/signals/confirm",
        token=served.token,
        json_body={"remove": ["burger buns"], "add": ["napkins"]},
        headers={"Idempotency-Key": "confirm-1"},
    )
    assert again.status == 202
    late = http(
        "POST",
        f"{server.url}/api/v1/jobs/{list_id}/signals/confirm",
        token=served.token,
        json_body={},
    )
    assert (late.status, late.json["error"]["code"]) == (409, "not_waiting")


def test_every_process_killed_while_a_job_waits_loses_nothing(served, start_gunicorn, tmp_path):
    log = tmp_path / "steps.log"
    first = start_gunicorn(workers=2)
    job_id = enqueue(first.url, served.token, "ask_household", {"log": str(log)})
    asked(first, served.token, job_id)

    # The whole server, master and workers, at once: nothing stops gracefully.
    for pid in [*first.worker_pids(), first.pid]:
        os.kill(pid, signal.SIGKILL)
    first.popen.wait(timeout=DEADLINE)
    row = job(served.store, job_id)
    assert (row["status"], row["waiting_signal"], row["lease_owner"]) == ("queued", "answer", None)

    second = start_gunicorn(workers=2)
    answer = http(
        "POST",
        f"{second.url}/api/v1/jobs/{job_id}/signals/answer",
        token=served.token,
        json_body={"count": 9},
    )
    assert answer.status == 202, answer
    done = ended(second, served.token, job_id)
    assert (done["status"], done["result"]) == ("succeeded", {"answer": 9, "prepared": 1})
    assert len(steps_run(log)) == 1


def test_a_process_killed_between_a_step_and_the_wait_runs_the_step_once(
    served, start_gunicorn, gates, tmp_path
):
    log = tmp_path / "steps.log"
    server = start_gunicorn(workers=2)
    job_id = enqueue(
        server.url, served.token, "ask_household", {"log": str(log), "gate": gates.url("wait")}
    )
    # Its step has run; it holds at the gate, before its wait.
    wait_until(lambda: gates.arrivals("wait") == 1, DEADLINE, "the job never reached the gate")
    [line] = steps_run(log)
    killed = int(line.split()[1])
    os.kill(killed, signal.SIGKILL)
    gates.open("wait")

    # Its lease expires, a rescuer puts it back, and it runs again: past the
    # kept step, to its wait.
    asked(server, served.token, job_id)
    assert len(steps_run(log)) == 1
    answer = http(
        "POST",
        f"{server.url}/api/v1/jobs/{job_id}/signals/answer",
        token=served.token,
        json_body={"count": 5},
    )
    assert answer.status == 202, answer
    done = ended(server, served.token, job_id)
    assert (done["status"], done["result"]) == ("succeeded", {"answer": 5, "prepared": 1})
    assert steps_run(log) == [line]
