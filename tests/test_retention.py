"""Retention: finished jobs (every final status of the model) older than the
cutoff go, a small batch per transaction; queued and running jobs and recipes
stay; pruning while the real runner runs jobs; the built-in `prune_jobs` kind
on its schedule; `flask jobs prune` and its bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import gevent
import pytest

from mealquest.application import create_app
from mealquest.clock import utc_now
from mealquest.config import DEFAULTS
from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs.registry import KindOptions
from mealquest.jobs.runner.scheduler import Scheduler
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.retention import PRUNE_CRON, PRUNE_KIND, prune
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID
from mealquest.model.jobs import FINAL_STATUSES, ClaimRequest, Status
from mealquest.model.recipes import ParsedRecipe
from tests.conftest import wait_for
from tests.support import sql
from tests.support.kinds import EmptySchema

pytestmark = pytest.mark.both_databases

CATCHUP = 3600.0


def stamp(store, moment: datetime):
    """A time as a raw statement on this store takes it."""
    return moment if store.name == "postgresql" else moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def finished_job(jobs, household_id, status: Status, days_ago: float) -> str:
    """A job that ended `status` `days_ago` days ago."""
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household_id)
    finished = utc_now() - timedelta(days=days_ago)
    sql.execute(
        jobs.store,
        "UPDATE jobs SET status = ?, attempt = 1, started_at = ?, finished_at = ?, "
        "error = ? WHERE id = ?",
        (
            str(status),
            stamp(jobs.store, finished),
            stamp(jobs.store, finished),
            "it failed" if status is Status.FAILED else None,
            job_id,
        ),
    )
    return job_id


def job_ids(store) -> set[str]:
    return {row["id"] for row in sql.rows(store, "SELECT id FROM jobs")}


def test_every_final_status_older_than_the_cutoff_goes_and_nothing_else(jobs, household):
    store = jobs.store
    hid = household.household_id
    old = [finished_job(jobs, hid, status, days_ago=20) for status in FINAL_STATUSES]
    recent = [finished_job(jobs, hid, status, days_ago=1) for status in FINAL_STATUSES]
    assert len(job_ids(store)) == len(old) + len(recent)
    # Queued and running jobs are never deleted, however old.
    queued = jobs.enqueue("succeed", {"value": 2}, household_id=hid)
    running = jobs.enqueue("succeed", {"value": 3}, household_id=hid)
    store.write(
        lambda tx: store.jobs.claim(
            tx, ClaimRequest(owner="o", lease_seconds=60, limit=1, kinds=["succeed"])
        )
    )
    long_ago = stamp(store, utc_now() - timedelta(days=90))
    sql.execute(store, "UPDATE jobs SET created_at = ?, run_at = ?", (long_ago, long_ago))
    assert {row["status"] for row in sql.rows(store, "SELECT status FROM jobs")} >= {
        "queued",
        "running",
    }

    pruned = prune(store, older_than_days=14, catchup_seconds=CATCHUP)

    assert pruned.jobs == len(FINAL_STATUSES)
    assert job_ids(store) == {*recent, queued, running}

    # A hundred days on, every finished job is old: the active ones still stay.
    later = prune(
        store, older_than_days=14, catchup_seconds=CATCHUP, now=utc_now() + timedelta(days=100)
    )
    assert later.jobs == len(recent)
    assert job_ids(store) == {queued, running}


def test_statuses_that_are_not_final_are_never_pruned():
    # The prune's statuses come from the model: whatever status is added
    # there as final is pruned, and the active ones never are.
    assert Status.QUEUED not in FINAL_STATUSES
    assert Status.RUNNING not in FINAL_STATUSES
    assert set(Status) - {Status.QUEUED, Status.RUNNING} == set(FINAL_STATUSES)


def test_recipes_outlive_their_pruned_jobs(jobs, household):
    store = jobs.store
    job_id = finished_job(jobs, household.household_id, Status.SUCCEEDED, days_ago=30)
    parsed = ParsedRecipe("Soup", ["water"], ["boil"], None, None, None, None)
    recipe = store.write(
        store.recipes.upsert_for_job,
        household_id=household.household_id,
        job_id=job_id,
        source_url="https://example.com/soup",
        parsed=parsed,
    )

    assert prune(store, older_than_days=14, catchup_seconds=CATCHUP).jobs == 1

    kept = store.read(store.recipes.get_recipe, recipe.id, household.household_id)
    assert kept is not None
    assert (kept.title, kept.job_id) == ("Soup", None)


def test_each_transaction_deletes_one_small_batch(jobs, household):
    store = jobs.store
    old = {finished_job(jobs, household.household_id, Status.SUCCEEDED, 30) for _ in range(11)}
    batches: list[int] = []

    def write(fn, *args, **kwargs):
        deleted = store.write(fn, *args, **kwargs)
        if fn is store.retention.delete_finished:
            batches.append(deleted)
        return deleted

    pruned = prune(store, older_than_days=14, catchup_seconds=CATCHUP, write=write, batch_size=3)

    assert pruned.jobs == 11
    assert batches == [3, 3, 3, 2]
    assert not old & job_ids(store)


def test_a_batch_deletes_at_most_its_size_however_the_database_plans_it(jobs, household):
    # PostgreSQL may run an IN subquery again for each row it scans (the
    # settings below leave it no other plan; statistics led it there once in
    # CI). The batch's subquery locks its rows: each run skipped those just
    # deleted and locked the next, and one statement deleted all 11.
    store = jobs.store
    for _ in range(11):
        finished_job(jobs, household.household_id, Status.SUCCEEDED, 30)

    def delete_one_batch(tx):
        if store.name == "postgresql":
            for setting in ("hashjoin", "mergejoin", "hashagg", "material", "sort"):
                tx.execute(f"SET LOCAL enable_{setting} = off")
        return store.retention.delete_finished(tx, older_than_seconds=14 * 86_400, limit=3)

    assert store.write(delete_one_batch) == 3
    assert store.write(delete_one_batch) == 3


def test_pruning_while_jobs_run_deletes_only_old_finished_ones(make_app, gates):
    app = make_app(JOB_WORKERS=3)
    jobs = get_jobs(app)
    store = jobs.store
    hid = create_household(store, "The Smiths").household_id
    old = {finished_job(jobs, hid, Status.SUCCEEDED, 30) for _ in range(20)}
    held = [
        jobs.enqueue("wait_for_gate", {"url": gates.url("hold")}, household_id=hid)
        for _ in range(5)
    ]
    jobs.start_pool()
    wait_for(lambda: gates.arrivals("hold") == 3)  # 3 running, 2 queued

    # Many batches, with the gate opened while they go: jobs finish, and the
    # queued ones are claimed and run, during the prune.
    pruning = gevent.spawn(prune, store, older_than_days=14, catchup_seconds=CATCHUP, batch_size=1)
    gevent.spawn(gates.open, "hold")
    pruned = pruning.get(timeout=60)

    assert pruned.jobs == 20
    wait_for(
        lambda: (
            [row["status"] for row in sql.rows(store, "SELECT status FROM jobs")]
            == ["succeeded"] * 5
        )
    )
    assert job_ids(store) == set(held)
    assert not old & job_ids(store)


def test_the_built_in_prune_kind_runs_on_its_schedule(make_app):
    assert DEFAULTS["JOB_RETENTION_DAYS"] == 14  # (the tests' own default is 0)
    app = make_app(JOB_RETENTION_DAYS=14)
    jobs = get_jobs(app)
    store = jobs.store
    hid = create_household(store, "The Smiths").household_id
    old = finished_job(jobs, hid, Status.FAILED, days_ago=15)
    recent = finished_job(jobs, hid, Status.SUCCEEDED, days_ago=13)
    kind = jobs.registry.get(PRUNE_KIND)
    assert kind.options.cron == PRUNE_CRON
    scheduler = Scheduler(store, jobs.registry, jobs.enqueue, catchup_seconds=CATCHUP)
    scheduler.run_once(datetime(2026, 3, 2, 10, 0, tzinfo=UTC))
    [made] = scheduler.run_once(datetime(2026, 3, 2, 10, 17, 5, tzinfo=UTC))
    assert made.kind == PRUNE_KIND

    jobs.start_pool()
    # (The pool's own scheduler may make the real clock's slot too: both run.)
    prunes = wait_for(lambda: finished_prunes(store))

    assert made.job_id in {row["id"] for row in prunes}
    assert {row["household_id"] for row in prunes} == {SYSTEM_HOUSEHOLD_ID}
    assert sum(jobs.get(row["id"]).result["deleted"] for row in prunes) == 1
    assert old not in job_ids(store)
    assert recent in job_ids(store)


def finished_prunes(store):
    """The prune jobs, once every one of them has succeeded."""
    rows = sql.rows(
        store, "SELECT id, household_id, status FROM jobs WHERE kind = ?", (PRUNE_KIND,)
    )
    return rows if rows and all(row["status"] == "succeeded" for row in rows) else None


def test_retention_off_schedules_no_prune_and_a_queued_prune_deletes_nothing(make_app):
    app = make_app(JOB_RETENTION_DAYS=0)
    jobs = get_jobs(app)
    store = jobs.store
    assert jobs.registry.get(PRUNE_KIND).options.cron is None
    assert PRUNE_KIND not in [kind.name for kind in jobs.registry.periodic()]
    hid = create_household(store, "The Smiths").household_id
    old = finished_job(jobs, hid, Status.SUCCEEDED, days_ago=400)
    # A prune queued while retention was on, run after it was turned off.
    queued = jobs.enqueue(PRUNE_KIND, {}, household_id=SYSTEM_HOUSEHOLD_ID)
    jobs.start_pool()

    wait_for(lambda: jobs.get(queued).status is Status.SUCCEEDED)
    assert jobs.get(queued).result == {"deleted": 0, "slots_deleted": 0}
    assert old in job_ids(store)


# -- flask jobs prune -------------------------------------------------------------------------


def test_flask_jobs_prune_deletes_old_finished_jobs_and_says_how_many(make_app):
    app = make_app(JOB_RETENTION_DAYS=14)
    jobs = get_jobs(app)
    hid = create_household(jobs.store, "The Smiths").household_id
    finished_job(jobs, hid, Status.SUCCEEDED, days_ago=20)
    finished_job(jobs, hid, Status.FAILED, days_ago=15)
    recent = finished_job(jobs, hid, Status.SUCCEEDED, days_ago=2)
    queued = jobs.enqueue("succeed", {"value": 1}, household_id=hid)
    cli = app.test_cli_runner()

    result = cli.invoke(args=["jobs", "prune"])
    assert result.exit_code == 0, result.output
    assert result.output == "deleted 2 finished jobs older than 14 days\n"
    assert job_ids(jobs.store) == {recent, queued}

    result = cli.invoke(args=["jobs", "prune", "--older-than", "1.5"])
    assert result.output == "deleted 1 finished jobs older than 1.5 days\n"
    result = cli.invoke(args=["jobs", "prune", "--older-than", "0"])
    assert result.output == "deleted 0 finished jobs older than 0 days\n"
    assert job_ids(jobs.store) == {queued}


def test_flask_jobs_prune_with_retention_off_deletes_nothing_unless_told(make_app):
    app = make_app(JOB_RETENTION_DAYS=0)
    jobs = get_jobs(app)
    hid = create_household(jobs.store, "The Smiths").household_id
    old = finished_job(jobs, hid, Status.SUCCEEDED, days_ago=400)
    cli = app.test_cli_runner()

    result = cli.invoke(args=["jobs", "prune"])
    assert result.exit_code == 0
    assert result.output == "retention is off (MEALQUEST_JOB_RETENTION_DAYS=0): deleted 0 jobs\n"
    assert old in job_ids(jobs.store)
    result = cli.invoke(args=["jobs", "prune", "--older-than", "30"])
    assert result.output == "deleted 1 finished jobs older than 30 days\n"


@pytest.mark.parametrize("bad", ["abc", "-1", "nan", "inf", "", "14 days", "1e999"])
def test_flask_jobs_prune_refuses_bad_days_in_one_line(app, jobs, household, bad):
    kept = finished_job(jobs, household.household_id, Status.SUCCEEDED, days_ago=400)

    result = app.test_cli_runner().invoke(args=["jobs", "prune", "--older-than", bad])

    assert result.exit_code == 1
    assert result.output == (
        f"Error: --older-than: must be a number of days, 0 or more (got {bad!r})\n"
    )
    assert kept in job_ids(jobs.store)


def test_old_periodic_slots_go_and_those_a_scheduler_could_still_consider_stay(make_app):
    app = make_app()
    jobs = get_jobs(app)
    store = jobs.store
    jobs.registry.register(
        "tick",
        lambda payload, ctx: {},
        payload=EmptySchema,
        result=EmptySchema,
        options=KindOptions(cron="* * * * *"),
    )
    scheduler = Scheduler(store, jobs.registry, jobs.enqueue, catchup_seconds=CATCHUP)
    long_ago = datetime(2026, 3, 2, 10, 0, 30, tzinfo=UTC)
    scheduler.run_once(long_ago)
    assert ticks(scheduler.run_once(long_ago + timedelta(minutes=1))) == 1
    recently = utc_now() - timedelta(minutes=2)
    assert ticks(scheduler.run_once(recently)) == 1

    # Even with every finished job going, a slot inside the catch-up window stays...
    pruned = prune(store, older_than_days=0, catchup_seconds=CATCHUP)
    assert pruned.slots == 1
    assert len(sql.rows(store, "SELECT kind FROM periodic_slots WHERE kind = 'tick'")) == 1
    # ...so no scheduler makes its job again.
    assert ticks(scheduler.run_once(recently)) == 0


def ticks(made) -> int:
    return sum(1 for job in made if job.kind == "tick")


def test_flask_jobs_prune_on_a_database_not_migrated_is_one_line(tmp_path):
    app = create_app({"TESTING": True, "DATABASE": str(tmp_path / "none.sqlite3")})

    result = app.test_cli_runner().invoke(args=["jobs", "prune"])

    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "run `flask db upgrade`" in result.output
    get_store(app).close()
