"""A gunicorn worker SIGKILLed right at each state change of a job loses nothing.

The worker kills itself at the chosen point (the test app's `crash` kind and
its enqueue route), so the point is exact. A trigger installed in the test
database (SQLite or PostgreSQL) records every status change, which is how
"no job ends in two final states" is checked rather than inferred from the
last state alone.
"""

from __future__ import annotations

import json
from http.client import RemoteDisconnected

import pytest

from tests.support import transitions
from tests.support.servers import final_jobs, http, jobs_by_id, wait_until

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

# Where the worker dies: right after the enqueue commits (in the route),
# after the claim, after a partial result is published, after the handler's
# work but before its success is written, and right after it is written.
POINTS = ("enqueued", "claimed", "published", "returning", "finished")
# Generous for a loaded machine (a respawn imports the app): never waited out by a pass.
DEADLINE = 60.0


def kills(server) -> int:
    return server.log().count("was sent SIGKILL")


@pytest.fixture
def audited(served):
    transitions.install(served.store, served.database)
    return served


def test_a_worker_killed_at_each_state_change_loses_no_job(audited, start_gunicorn, tmp_path):
    served = audited
    server = start_gunicorn(workers=2)
    log = str(tmp_path / "runs.log")

    def tagged() -> dict[str, str]:
        return {
            json.loads(row["payload"])["tag"]: job_id
            for job_id, row in jobs_by_id(served.store).items()
        }

    for number, point in enumerate(POINTS, start=1):
        # One crash at a time, each job finished before the next, so that each
        # worker dies exactly where named and kills no other job's attempt.
        payload = {"at": "never" if point == "enqueued" else point, "log": log, "tag": point}
        try:
            answer = http(
                "POST",
                f"{server.url}/api/v1/test-jobs",
                token=served.token,
                json_body={
                    "kind": "crash",
                    "payload": payload,
                    "crash_after_enqueue": point == "enqueued",
                },
                timeout=30,
            )
            assert point != "enqueued", "the worker should have died before answering"
            assert answer.status == 202, answer
        except (RemoteDisconnected, ConnectionResetError):
            # The worker died before answering: at `enqueued` it must; at a
            # point of the run it may, when its own pool claims the job before
            # the answer is written. Either way the job is stored (below).
            pass
        wait_until(lambda n=number: kills(server) >= n, DEADLINE, f"no worker died at {point}")
        job_id = tagged()[point]  # none lost, the unanswered enqueue included
        wait_until(lambda j=job_id: final_jobs(served.store, [j]), DEADLINE, f"{point}: not final")

    ids = tagged()
    assert sorted(ids) == sorted(POINTS)
    # Let the last respawned worker finish booting: a SIGTERM that reaches a
    # worker before gunicorn installs its handlers is lost, and the stop after
    # the test would then wait out the graceful timeout.
    wait_until(
        lambda: server.log().count("job pool started") == 2 + len(POINTS), DEADLINE, "no respawn"
    )
    rows = final_jobs(served.store, list(ids.values()))
    assert rows is not None
    assert kills(server) == len(POINTS)
    history = transitions.history(served.store)
    for point, job_id in ids.items():
        row = rows[job_id]
        assert row["status"] == "succeeded", (point, dict(row))
        states = history[job_id]
        finals = [new for _, new, _ in states if new in ("succeeded", "failed")]
        assert finals == ["succeeded"], (point, states)  # one final state, never left
        assert states[-1][1] == "succeeded", (point, states)
        assert all(old not in ("succeeded", "failed") for old, _, _ in states), (point, states)

    runs = [line.split() for line in (tmp_path / "runs.log").read_text().splitlines()]
    runs_of = {point: [r for r in runs if r[0] == "run" and r[1] == ids[point]] for point in ids}
    # Killed before the success was written: the rescuer re-queued it, its
    # attempt refunded (the process died, not the job), and it ran again.
    for point in ("claimed", "published", "returning"):
        assert (rows[ids[point]]["attempt"], rows[ids[point]]["interruptions"]) == (1, 0), point
        assert [r[2] for r in runs_of[point]] == ["1", "1"], point
    # Enqueued, or killed after its success was written: ran exactly once.
    for point in ("enqueued", "finished"):
        assert rows[ids[point]]["attempt"] == 1, point
        assert len(runs_of[point]) == 1, point
