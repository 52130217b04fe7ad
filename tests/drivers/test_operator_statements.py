"""The statements of the operators' round, each test on both databases (and
through PgBouncer): suspended households left out of claims, erasure's
deletions, the households' figures, the audit log, the job history the
charts read, and the bulk actions' batches."""

from __future__ import annotations

import math
import random
import uuid
from datetime import timedelta

import pytest

from mealquest.model.households import HouseholdErased, UnknownHousehold
from mealquest.model.jobs import Lease, NewJob, OnInterrupt, Status, Transition
from mealquest.model.operations import BulkAction, JobFilter
from mealquest.model.recipes import ParsedRecipe
from tests.drivers.conftest import claim, db_now, enqueue, get, other_household


def enqueue_at(store, household, *, priority=0, kind="succeed", key=None) -> str:
    job_id = uuid.uuid4().hex
    store.write(
        store.jobs.insert_job,
        NewJob(
            job_id=job_id,
            household_id=household,
            kind=kind,
            payload="{}",
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
            priority=priority,
            unique_key=key,
        ),
    )
    return job_id


def finish(store, job, to=Status.SUCCEEDED, error=None) -> None:
    change = Transition(Lease(job.id, job.lease_owner, job.attempt), to=to, error=error)
    assert store.write(store.jobs.transition, change)


def recipe(store, household, job_id) -> None:
    store.write(
        store.recipes.upsert_for_job,
        household_id=household,
        job_id=job_id,
        source_url="https://example.test/soup",
        parsed=ParsedRecipe(
            title="Soup",
            ingredients=["water"],
            instructions=["boil"],
            yields=None,
            total_time_minutes=None,
            image_url=None,
            author=None,
        ),
    )


def count(store, table, household) -> int:
    sql = f"SELECT count(*) AS n FROM {table} WHERE household_id = "
    sql += "%s" if store.name == "postgresql" else "?"
    return store.read(lambda conn: conn.execute(sql, (household,)).fetchone()["n"])


# -- suspended households -------------------------------------------------------------


def test_a_suspended_households_jobs_are_left_out_of_claims_until_it_is_resumed(store, household):
    other = other_household(store)
    first = enqueue(store, household)
    later = enqueue(store, other)

    assert store.write(store.households.suspend_household, household) is True
    assert store.write(store.households.suspend_household, household) is False

    assert [job.id for job in claim(store)] == [later]
    assert claim(store) == []
    assert get(store, first).status is Status.QUEUED

    assert store.write(store.households.resume_household, household) is True
    assert store.write(store.households.resume_household, household) is False
    assert [job.id for job in claim(store)] == [first]


def test_a_suspended_households_better_priority_does_not_hide_the_others_jobs(store, household):
    other = other_household(store)
    enqueue_at(store, household, priority=-5)
    theirs = enqueue_at(store, other, priority=0)
    store.write(store.households.suspend_household, household)

    assert [job.id for job in claim(store)] == [theirs]


def test_a_suspended_household_is_told_by_the_token_lookups(store, household):
    job_id = enqueue(store, household)
    store.write(store.households.suspend_household, household)

    found = store.read(store.households.household_for_token_digest, "a" * 64)
    assert (found.id, found.suspended) == (household, True)
    owner, job = store.read(store.jobs.get_job_with_token, job_id, "a" * 64)
    assert owner.suspended
    assert job.id == job_id
    listed = dict((h.id, h.suspended) for h, _ in store.read(store.households.list_households))
    assert listed[household] is True

    store.write(store.households.resume_household, household)
    assert not store.read(store.households.household_for_token_digest, "a" * 64).suspended


def test_suspending_an_unknown_or_erased_household_is_refused(store, household):
    with pytest.raises(UnknownHousehold):
        store.write(store.households.suspend_household, 987654)
    store.write(store.households.mark_erased, household, name="erased household")
    with pytest.raises(HouseholdErased):
        store.write(store.households.resume_household, household)
    with pytest.raises(HouseholdErased):
        store.write(store.households.insert_token, household_id=household, token_sha256="c" * 64)
    with pytest.raises(UnknownHousehold):
        store.write(store.households.mark_erased, 987654, name="erased household")


# -- erasure ----------------------------------------------------------------------


def test_erasures_deletions_take_only_that_households_rows_in_batches(store, household):
    other = other_household(store)
    keyed = enqueue_at(store, household, key="order-1")
    for _ in range(4):
        enqueue(store, household)
    [running] = claim(store, limit=1)
    assert running.household_id == household
    recipe(store, household, keyed)
    theirs = enqueue(store, other)
    recipe(store, other, theirs)

    store.write(store.households.mark_erased, household, name="erased household")
    state = store.read(store.households.get_household, household)
    assert state.name == "erased household"
    assert state.erased_at is not None
    assert state.suspended_at is not None
    assert store.read(store.jobs.running_job_ids, household) == [running.id]

    assert store.write(store.households.delete_tokens, household, limit=10) == 1
    assert store.write(store.jobs.delete_household_jobs, household, limit=3) == 3
    assert store.write(store.jobs.delete_household_jobs, household, limit=3) == 1
    assert store.write(store.jobs.delete_household_jobs, household, limit=3) == 0
    assert store.write(store.recipes.delete_household_recipes, household, limit=10) == 1
    # The running job is left to end (it was cancelled first, by the caller).
    assert count(store, "jobs", household) == 1
    assert store.read(store.households.erased_with_rows, limit=10) == [household]
    finish(store, running, Status.CANCELLED)
    assert store.write(store.jobs.delete_household_jobs, household, limit=3) == 1
    assert store.read(store.households.erased_with_rows, limit=10) == []

    assert count(store, "api_tokens", household) == 0
    assert count(store, "recipes", household) == 0
    assert count(store, "jobs", other) == count(store, "recipes", other) == 1
    assert count(store, "api_tokens", other) == 1


# -- households' figures ---------------------------------------------------------------


def test_household_figures_count_final_jobs_among_the_latest_ones(store, household):
    other = other_household(store)
    for _ in range(6):
        enqueue(store, household)
    for job in claim(store, limit=3):
        finish(store, job, Status.FAILED, error="bad")
    [job] = claim(store, limit=1)
    finish(store, job)
    [running] = claim(store, limit=1)
    enqueue(store, other)

    figures = store.read(store.households.household_figures, after_id=None, limit=10, recent=3)
    by_id = {f.household.id: f for f in figures}
    assert set(by_id) == {household, other}  # the system household is left out
    mine = by_id[household]
    # Queued and running exactly; the final ones of the latest 3 jobs (the
    # newest is queued, then running, then the succeeded one).
    assert mine.jobs == {"queued": 1, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}
    assert (mine.looked_at, mine.pending, mine.live_tokens) == (3, 2, 1)
    everything = store.read(store.households.household_figures, after_id=None, limit=10, recent=100)
    assert {f.household.id: f for f in everything}[household].jobs["failed"] == 3
    assert by_id[other].jobs["queued"] == 1
    assert by_id[other].looked_at == 1

    [only] = store.read(
        store.households.household_figures,
        after_id=None,
        limit=10,
        recent=10,
        household_id=other,
    )
    assert only.household.id == other
    after = store.read(store.households.household_figures, after_id=household, limit=10, recent=3)
    assert [f.household.id for f in after] == [other]
    finish(store, running)


# -- the audit log ------------------------------------------------------------------------


def test_audit_entries_are_listed_newest_first_counted_up_and_deleted_oldest_first(store):
    first = store.write(
        store.audit.insert_entry,
        operator_id=None,
        actor="command line (root)",
        action="suspend",
        target="household 3",
        count=1,
    )
    second = store.write(
        store.audit.insert_entry,
        operator_id=None,
        actor="command line (root)",
        action="bulk retry",
        target="status=failed",
        count=0,
    )
    store.write(store.audit.add_to_count, second, 100)
    store.write(store.audit.add_to_count, second, 7)

    entries = store.read(store.audit.list_entries, before_seq=None, limit=10)
    assert [(e.seq, e.action, e.count) for e in entries] == [
        (second, "bulk retry", 107),
        (first, "suspend", 1),
    ]
    assert len(entries[0].at) == len("2025-01-01T00:00:00.000000Z")
    assert [e.seq for e in store.read(store.audit.list_entries, before_seq=second, limit=10)] == [
        first
    ]

    assert store.write(store.audit.delete_entries, older_than_seconds=3600, limit=10) == 0
    later = db_now(store) + timedelta(hours=2)
    assert store.write(store.audit.delete_entries, older_than_seconds=3600, limit=1, now=later) == 1
    assert [e.seq for e in store.read(store.audit.list_entries, before_seq=None, limit=10)] == [
        second
    ]


# -- the job history ---------------------------------------------------------------------------


def history(store, width=1, periods=5):
    """The history read, checked to lie in its periods; totals by kind."""
    store.write(store.history.fold_history)
    found = store.read(store.history.history, width=width, periods=periods)
    totals: dict[str, dict[str, int]] = {}
    for row in found.rows:
        assert found.last_period - timedelta(minutes=width * (periods - 1)) <= row.period
        assert row.period <= found.last_period
        kind = totals.setdefault(
            row.kind, {"succeeded": 0, "failed": 0, "cancelled": 0, "started": 0}
        )
        for name in kind:
            kind[name] += getattr(row, name)
    return found, totals


def test_starts_and_ends_are_counted_by_kind_with_their_percentiles_buckets(store, household):
    for _ in range(3):
        enqueue(store, household)
    cancelled = enqueue(store, household, kind="other")
    jobs = claim(store, limit=3)
    finish(store, jobs[0])
    finish(store, jobs[1])
    finish(store, jobs[2], Status.FAILED, error="bad")
    store.write(store.jobs.cancel_job, cancelled)

    bounds = store.read(store.history.duration_bounds)
    assert len(bounds) == 48
    assert bounds[:3] == [0.0, 0.01, 0.014142136]
    for width in (1, 10):
        found, totals = history(store, width)
        assert found.width == width
        assert found.last_period.minute % width == 0
        assert totals == {
            "succeed": {"succeeded": 2, "failed": 1, "cancelled": 0, "started": 3},
            "other": {"succeeded": 0, "failed": 0, "cancelled": 1, "started": 0},
        }
        for row in found.rows:
            if row.kind == "other":  # never ran: no durations
                assert row.wait_p50 is row.run_p95 is None
            elif row.started:
                # These jobs waited and ran for well under a minute.
                assert 0 <= row.wait_p50 <= row.wait_p95 < 27


def test_a_retried_attempt_counts_its_run_but_no_outcome(store, household):
    enqueue(store, household)
    [job] = claim(store)
    change = Transition(Lease(job.id, job.lease_owner, job.attempt), to=Status.QUEUED)
    assert store.write(store.jobs.transition, change)

    found, totals = history(store)
    assert totals["succeed"] == {"succeeded": 0, "failed": 0, "cancelled": 0, "started": 1}
    assert [row.run_p50 is not None for row in found.rows] == [True]


def nearest_rank_bucket(histogram: dict[int, int], share: float) -> int | None:
    """The oracle: the smallest bucket holding the nearest-rank percentile."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = max(1, math.ceil(share * total)), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket
    raise AssertionError("unreachable")


def test_the_percentiles_buckets_are_the_nearest_rank_ones(store):
    chosen = random.Random(11)
    now = db_now(store)
    minute = now.replace(second=0, microsecond=0)
    period = minute if store.name == "postgresql" else minute.strftime("%Y-%m-%dT%H:%M")
    expected = {}
    rows = []
    for kind_index in range(30):
        kind = f"kind{kind_index}"
        waits = {b: chosen.randint(1, 20) for b in chosen.sample(range(48), chosen.randint(1, 6))}
        runs = {
            (series, b): chosen.randint(1, 20)
            for series in ("succeeded", "failed", "retried")
            for b in chosen.sample(range(48), chosen.randint(0, 3))
        }
        ran: dict[int, int] = {}
        for (_series, bucket), n in runs.items():
            ran[bucket] = ran.get(bucket, 0) + n
        expected[kind] = (
            nearest_rank_bucket(waits, 0.5),
            nearest_rank_bucket(waits, 0.95),
            nearest_rank_bucket(ran, 0.5),
            nearest_rank_bucket(ran, 0.95),
        )
        rows += [(1, period, kind, "wait", b, n) for b, n in waits.items()]
        rows += [(1, period, kind, series, b, n) for (series, b), n in runs.items()]
        rows.append((1, period, kind, "cancelled", -1, 1))
    marks = ", ".join(["%s" if store.name == "postgresql" else "?"] * 6)
    store.write(
        lambda tx: [
            tx.execute(
                f"INSERT INTO job_history (width, period, kind, series, bucket, count) "
                f"VALUES ({marks})",
                row,
            )
            for row in rows
        ]
    )

    found = store.read(store.history.history, width=1, periods=1, now=now)
    assert {
        row.kind: (row.wait_p50, row.wait_p95, row.run_p50, row.run_p95) for row in found.rows
    } == expected
    assert all(row.cancelled == 1 for row in found.rows)


def test_history_older_than_asked_is_deleted_in_batches(store, household):
    for _ in range(2):
        enqueue(store, household)
    for job in claim(store, limit=2):
        finish(store, job)
    store.write(store.history.fold_history)

    assert (
        store.write(store.history.delete_history, width=1, older_than_seconds=3600, limit=10) == 0
    )
    later = db_now(store) + timedelta(hours=2)
    deleted = store.write(
        store.history.delete_history, width=1, older_than_seconds=3600, limit=1, now=later
    )
    assert deleted == 1
    while store.write(
        store.history.delete_history, width=1, older_than_seconds=3600, limit=1, now=later
    ):
        pass
    _, minutes = history(store, width=1)
    _, tens = history(store, width=10)
    assert minutes == {}
    assert tens == {"succeed": {"succeeded": 2, "failed": 0, "cancelled": 0, "started": 2}}


# -- bulk actions --------------------------------------------------------------------------------


def run_bulk(store, action, status, job_filter, upto, limit=2):
    """Batch after batch, as the service runs them; the jobs acted on."""
    acted, after = [], 0
    while True:
        batch = store.write(
            store.operations.act_on_batch,
            action,
            status,
            job_filter,
            after_seq=after,
            upto_seq=upto,
            limit=limit,
        )
        acted += batch.acted
        after = batch.resume_after
        if batch.picked < limit:
            return acted


def test_a_bulk_retry_takes_the_failed_jobs_of_one_kind_up_to_the_counted_one(store, household):
    other = other_household(store)
    for owner, kind in ((household, "succeed"), (other, "succeed"), (household, "other")):
        for _ in range(3):
            enqueue(store, owner, kind=kind)
    for job in claim(store, kinds=("succeed", "other"), limit=9):
        finish(store, job, Status.FAILED, error="bad")
    upto = store.read(store.operations.newest_seq)
    newer = enqueue(store, household)
    [job] = claim(store, limit=1)
    assert job.id == newer
    finish(store, job, Status.FAILED, error="bad")

    wanted = JobFilter(status=Status.FAILED, kind="succeed")
    assert (
        store.read(
            store.operations.count_matching, Status.FAILED, wanted, upto_seq=upto, at_most=100
        )
        == 6
    )
    assert (
        store.read(store.operations.count_matching, Status.FAILED, wanted, upto_seq=upto, at_most=4)
        == 4
    )

    acted = run_bulk(store, BulkAction.RETRY, Status.FAILED, wanted, upto)

    assert len(acted) == 6
    assert {a.status for a in acted} == {Status.QUEUED}
    assert newer not in {a.id for a in acted}
    assert get(store, newer).status is Status.FAILED
    assert (
        store.read(
            store.operations.count_matching, Status.FAILED, wanted, upto_seq=upto, at_most=100
        )
        == 0
    )
    mine = JobFilter(kind="succeed", household_id=other)
    assert (
        store.read(store.operations.count_matching, Status.QUEUED, mine, upto_seq=upto, at_most=100)
        == 3
    )


def test_a_bulk_cancel_cancels_queued_jobs_and_asks_running_ones_once(store, household):
    for _ in range(5):
        enqueue(store, household)
    running = claim(store, limit=2)
    upto = store.read(store.operations.newest_seq)
    everything = JobFilter(household_id=household)

    queued = run_bulk(store, BulkAction.CANCEL, Status.QUEUED, everything, upto)
    told = run_bulk(store, BulkAction.CANCEL, Status.RUNNING, everything, upto)

    assert [a.status for a in queued] == [Status.CANCELLED] * 3
    assert {a.id for a in told} == {job.id for job in running}
    assert {a.status for a in told} == {Status.RUNNING}
    assert all(get(store, job.id).cancel_requested_at for job in running)
    # Told once: a second bulk cancel finds nothing more to do.
    assert run_bulk(store, BulkAction.CANCEL, Status.RUNNING, everything, upto) == []
    assert (
        store.read(
            store.operations.count_matching, Status.RUNNING, everything, upto_seq=upto, at_most=9
        )
        == 0
    )


def test_a_bulk_delete_never_takes_a_running_job_nor_another_households(store, household):
    other = other_household(store)
    for _ in range(4):
        enqueue(store, household)
    theirs = enqueue(store, other)
    jobs = claim(store, limit=10)
    for job in jobs[:3]:
        finish(store, job)
    upto = store.read(store.operations.newest_seq)

    with pytest.raises(ValueError, match="does not apply"):
        store.write(
            store.operations.act_on_batch,
            BulkAction.DELETE,
            Status.RUNNING,
            JobFilter(),
            after_seq=0,
            upto_seq=upto,
            limit=10,
        )
    mine = JobFilter(household_id=household)
    deleted = run_bulk(store, BulkAction.DELETE, Status.SUCCEEDED, mine, upto)

    assert len(deleted) == sum(1 for job in jobs[:3] if job.household_id == household)
    assert get(store, theirs) is not None
    assert all(get(store, job.id) is not None for job in jobs[3:])
