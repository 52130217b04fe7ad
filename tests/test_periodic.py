"""Periodic kinds: one job per scheduled time across processes, catch-up within
the window (one job for the slots missed), nothing outside it, nothing lost to
a scheduler that fails mid-way; on a fake clock (`run_once(now)`), except the
one test that watches the pool's own scheduler role make and run a job."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import gevent
import pytest

from mealquest.clock import to_text, utc_now
from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs.errors import RegistrationError
from mealquest.jobs.registry import KindOptions, Registry
from mealquest.jobs.runner.scheduler import MAX_WAIT_SECONDS, Scheduler
from mealquest.jobs.service import get_jobs
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID
from tests.conftest import wait_for
from tests.support import sql
from tests.support.kinds import EmptySchema, ValueSchema

pytestmark = pytest.mark.both_databases

# The fake clock: a scheduler first looks at T0, before the 10:00 slot.
T0 = datetime(2026, 3, 2, 9, 58, 30, tzinfo=UTC)
TEN = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return TEN + timedelta(minutes=minutes, seconds=seconds)


def tick(payload, ctx):
    return {}


def periodic_app(make_app, cron="*/5 * * * *", **config):
    app = make_app(**config)
    get_jobs(app).registry.register(
        "tick", tick, payload=EmptySchema, result=EmptySchema, options=KindOptions(cron=cron)
    )
    return app


def scheduler_of(app) -> Scheduler:
    """A process's scheduler, as its pool builds it."""
    jobs = get_jobs(app)
    return Scheduler(
        jobs.store, jobs.registry, jobs.enqueue, catchup_seconds=jobs.settings.cron_catchup_seconds
    )


def tick_jobs(store):
    return sql.rows(
        store, "SELECT id, household_id, payload, status FROM jobs WHERE kind = 'tick' ORDER BY seq"
    )


def slots(store):
    return [
        (row["job_id"], row["slot_at"])
        for row in sql.rows(
            store, "SELECT job_id, slot_at FROM periodic_slots WHERE kind = 'tick' ORDER BY slot_at"
        )
    ]


def at_once(store, calls):
    """Run `calls` at the same moment, each on its own connection: native threads
    on PostgreSQL (whose driver blocks in this unpatched test process),
    greenlets on SQLite (each store writes in a native thread of its own)."""
    if store.name == "postgresql":
        barrier = threading.Barrier(len(calls))
        results: list = [None] * len(calls)

        def run(index, call):
            barrier.wait(30)
            results[index] = call()

        threads = [
            threading.Thread(target=run, args=(index, call)) for index, call in enumerate(calls)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return results
    greenlets = [gevent.spawn(call) for call in calls]
    gevent.joinall(greenlets, raise_error=True)
    return [greenlet.value for greenlet in greenlets]


# -- one job per slot -------------------------------------------------------------------------


def test_each_slot_makes_one_job_of_the_system_household(make_app):
    app = periodic_app(make_app)
    store = get_store(app)
    scheduler = scheduler_of(app)

    # First look: 09:55 was before anyone watched the kind, so it makes nothing.
    assert scheduler.run_once(T0) == []
    [made] = scheduler.run_once(at(0, 0))
    assert (made.kind, made.slot_at) == ("tick", TEN)
    assert scheduler.run_once(at(0, 20)) == []
    assert scheduler.run_once(at(4, 59.9)) == []
    [later] = scheduler.run_once(at(5, 1))
    assert later.slot_at == at(5)

    rows = tick_jobs(store)
    assert [row["id"] for row in rows] == [made.job_id, later.job_id]
    assert {row["household_id"] for row in rows} == {SYSTEM_HOUSEHOLD_ID}
    assert {row["payload"] for row in rows} == {"{}"}
    assert [job_id for job_id, _ in slots(store)] == [made.job_id, later.job_id]


def test_two_schedulers_racing_at_each_slot_make_one_job(make_app):
    # Two processes: two apps, each with its own connections to the one database.
    first, second = (
        periodic_app(make_app, cron="* * * * *"),
        periodic_app(make_app, cron="* * * * *"),
    )
    schedulers = [scheduler_of(first), scheduler_of(second)]
    store = get_store(first)
    at_once(store, [lambda s=s: s.run_once(T0) for s in schedulers])

    for minute in range(12):
        moment = at(minute, 1)
        made = at_once(store, [lambda s=s, m=moment: s.run_once(m) for s in schedulers])
        assert sum(len(jobs) for jobs in made) == 1, (minute, made)

    assert len(tick_jobs(store)) == 12
    assert len(slots(store)) == 12


def test_a_second_process_at_the_same_slot_makes_nothing(make_app):
    first = periodic_app(make_app)
    second = periodic_app(make_app)
    scheduler_of(first).run_once(T0)

    assert len(scheduler_of(first).run_once(at(0, 1))) == 1
    # A process that starts later (or restarts) within the same slot.
    assert scheduler_of(second).run_once(at(3)) == []
    assert len(tick_jobs(get_store(first))) == 1


# -- catch-up ---------------------------------------------------------------------------------


def test_downtime_across_slots_within_the_window_makes_one_job_for_the_latest(make_app):
    app = periodic_app(make_app, JOB_CRON_CATCHUP_SECONDS=600)
    scheduler_of(app).run_once(T0)

    # Every process is down across 10:00, 10:05 and 10:10; one comes back at 10:14.
    back = scheduler_of(app)
    [made] = back.run_once(at(14))
    assert made.slot_at == at(10)
    assert back.run_once(at(14, 30)) == []
    assert len(tick_jobs(get_store(app))) == 1


@pytest.mark.parametrize(
    ("back_at", "made"),
    [(at(10), 1), (at(10, 1), 0)],
    ids=["at-the-window's-end", "past-the-window"],
)
def test_a_slot_older_than_the_window_makes_no_job(make_app, back_at, made):
    app = periodic_app(make_app, cron="0 * * * *", JOB_CRON_CATCHUP_SECONDS=600)
    scheduler_of(app).run_once(T0)

    assert len(scheduler_of(app).run_once(back_at)) == made
    assert len(tick_jobs(get_store(app))) == made
    # The next slot is made as usual.
    assert len(scheduler_of(app).run_once(at(60, 2))) == 1


# -- failures ---------------------------------------------------------------------------------


def test_a_scheduler_that_fails_mid_way_leaves_nothing_and_the_slot_is_made_after(make_app, logs):
    app = periodic_app(make_app)
    store = get_store(app)
    scheduler = scheduler_of(app)
    scheduler.run_once(T0)
    # The job's insert fails after the slot's row went in (its household is
    # gone): the whole transaction must go, the slot's row with it.
    sql.execute(store, "DELETE FROM households WHERE id = ?", (SYSTEM_HOUSEHOLD_ID,))

    assert scheduler.run_once(at(0, 5)) == []
    assert "could not schedule periodic kind tick" in logs.text
    assert slots(store) == []
    assert tick_jobs(store) == []

    override = "OVERRIDING SYSTEM VALUE " if store.name == "postgresql" else ""
    sql.execute(
        store,
        f"INSERT INTO households (id, name, created_at) {override}VALUES (?, 'system', ?)",
        (SYSTEM_HOUSEHOLD_ID, to_text(utc_now())),
    )
    # Another process, still within the window, makes the slot: nothing was lost.
    [made] = scheduler_of(app).run_once(at(1))
    assert made.slot_at == TEN
    assert len(tick_jobs(store)) == 1


def test_the_pool_runs_the_scheduler_which_makes_and_runs_the_job(make_app):
    app = periodic_app(make_app, cron="* * * * *")
    store = get_store(app)
    jobs = get_jobs(app)
    # The kind has been watched for an hour, so the current minute's slot is due.
    scheduler_of(app).run_once(utc_now() - timedelta(hours=1))

    pool = jobs.start_pool()
    assert "scheduler" in pool.roles

    done = wait_for(
        lambda: [row for row in tick_jobs(store) if row["status"] == "succeeded"], timeout=30
    )
    assert {row["household_id"] for row in done} == {SYSTEM_HOUSEHOLD_ID}
    assert not pool.roles["scheduler"].dead


# -- the household's view ---------------------------------------------------------------------


def test_households_never_see_system_jobs(make_app):
    app = periodic_app(make_app)
    household = create_household(get_store(app), "The Smiths")
    scheduler = scheduler_of(app)
    scheduler.run_once(T0)
    [made] = scheduler.run_once(at(0, 1))
    client = app.test_client()
    auth = {"Authorization": f"Bearer {household.token}"}

    assert client.get("/api/v1/jobs", headers=auth).get_json()["jobs"] == []
    assert client.get(f"/api/v1/jobs/{made.job_id}", headers=auth).status_code == 404
    cli = app.test_cli_runner()
    refused = cli.invoke(args=["tokens", "create", str(SYSTEM_HOUSEHOLD_ID)])
    assert refused.exit_code == 1
    assert refused.output == "Error: the system household (periodic jobs) has no tokens\n"
    listed = cli.invoke(args=["households", "list"]).output.splitlines()
    assert listed == [f"{household.household_id}  The Smiths  tokens=1"]
    # The operator sees them.
    shown = cli.invoke(args=["jobs", "list", "--household", str(SYSTEM_HOUSEHOLD_ID)])
    assert made.job_id in shown.output


# -- registration and waking ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("61 * * * *", "Bad minute"),
        ("* * * *", "Wrong number of fields"),
        ("", "five-field cron expression"),
        ("0 0 30 2 *", "Bad day-of-month"),
    ],
)
def test_a_bad_cron_expression_is_refused_at_registration(cron, message):
    with pytest.raises(RegistrationError, match=message):
        KindOptions(cron=cron)


def test_a_cron_payload_the_schema_refuses_is_refused_at_registration():
    registry = Registry()
    with pytest.raises(RegistrationError, match="cron_payload does not fit"):
        registry.register(
            "nightly",
            tick,
            payload=ValueSchema,
            result=EmptySchema,
            options=KindOptions(cron="0 3 * * *"),
        )
    registry.register(
        "nightly",
        tick,
        payload=ValueSchema,
        result=EmptySchema,
        options=KindOptions(cron="0 3 * * *", cron_payload={"value": 7}),
    )
    assert [kind.name for kind in registry.periodic()] == ["nightly"]


def test_the_scheduler_wakes_at_the_next_slot_and_looks_at_least_every_minute(make_app):
    scheduler = scheduler_of(periodic_app(make_app))

    assert scheduler.seconds_until_next(at(4, 59.5)) == pytest.approx(0.5)
    assert scheduler.seconds_until_next(at(0, 30)) == MAX_WAIT_SECONDS
