"""The drivers' statements, function by function, each test on both databases.

Each test gets a fresh migrated database. Times are the database's: the
tests read its clock (`store.periodic.current_time`) and pass `now` only
where a statement lets a test stand at another moment (a rescue past a
lease, a claim in the future).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from mealquest.model.batches import NewBatch
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID, UnknownHousehold, UnknownToken
from mealquest.model.jobs import (
    MAX_INTERRUPTIONS,
    MESSAGE_INTERRUPTED,
    Attempt,
    HeldLease,
    Lease,
    OnInterrupt,
    Recovered,
    Status,
    Transition,
)
from mealquest.model.recipes import ParsedRecipe
from tests.drivers.conftest import (
    LEASE,
    claim,
    db_now,
    enqueue,
    get,
    other_household,
    set_run_at,
)

# -- enqueue and read -------------------------------------------------------------------------


def test_an_inserted_job_is_queued_due_now_with_times_as_fixed_width_utc_text(store, household):
    job_id = enqueue(store, household, max_attempts=3, on_interrupt=OnInterrupt.REQUEUE)

    job = get(store, job_id)
    assert job.status is Status.QUEUED
    assert (job.attempt, job.max_attempts, job.interruptions) == (0, 3, 0)
    assert job.on_interrupt is OnInterrupt.REQUEUE
    assert job.household_id == household
    assert job.run_at == job.created_at == job.updated_at
    assert len(job.created_at) == len("2025-01-01T00:00:00.000000Z")
    assert job.created_at.endswith("Z")
    assert job.started_at is job.finished_at is job.lease_owner is None


def test_get_job_is_scoped_to_the_household(store, household):
    other = other_household(store)
    job_id = enqueue(store, household)

    assert store.read(store.jobs.get_job, job_id, household).id == job_id
    assert store.read(store.jobs.get_job, job_id, other) is None
    assert store.read(store.jobs.get_job, "no-such-job") is None


def test_list_jobs_newest_first_filtered_and_paged(store, household):
    other = other_household(store)
    first, second, third = (enqueue(store, household) for _ in range(3))
    enqueue(store, other)
    enqueue(store, household, kind="fail_with_failure")
    claim(store, limit=1)  # `first` runs

    mine = store.read(store.jobs.list_jobs, household_id=household, kind="succeed")
    assert [job.id for job in mine] == [third, second, first]
    page = store.read(store.jobs.list_jobs, household_id=household, kind="succeed", limit=2)
    rest = store.read(
        store.jobs.list_jobs, household_id=household, kind="succeed", before_seq=page[-1].seq
    )
    assert [job.id for job in page + rest] == [third, second, first]
    running = store.read(store.jobs.list_jobs, household_id=household, status=Status.RUNNING)
    assert [job.id for job in running] == [first]
    assert len(store.read(store.jobs.list_jobs)) == 5


# -- claim ------------------------------------------------------------------------------------


def test_claim_takes_due_jobs_oldest_first_by_run_at_then_insertion(store, household):
    a, b, c, d = (enqueue(store, household) for _ in range(4))
    set_run_at(store, c, -60)  # due earliest
    set_run_at(store, d, 3600)  # not due

    claimed = claim(store, limit=10)

    assert [job.id for job in claimed] == [c, a, b]
    assert all(job.status is Status.RUNNING and job.attempt == 1 for job in claimed)
    assert all(job.lease_owner == "worker-1" for job in claimed)
    assert get(store, d).status is Status.QUEUED


def test_claim_honours_the_limit_and_the_kinds(store, household):
    a, b = enqueue(store, household), enqueue(store, household)
    other = enqueue(store, household, kind="sleep")

    assert [job.id for job in claim(store, limit=1)] == [a]
    assert claim(store, kinds=("nothing-here",)) == []
    assert claim(store, kinds=()) == []
    assert claim(store, limit=0) == []
    assert [job.id for job in claim(store, kinds=("succeed", "sleep"))] == [b, other]


def test_a_claim_takes_households_in_turn_a_quarter_of_its_batch_each(store, household):
    """It takes as few households as fill its batch, counting on up to a
    quarter of it from each, so a claim made at the same moment by another
    process finds households of its own (tests/drivers/test_postgresql.py)."""
    every = [household, *(other_household(store, f"H{n}", "bcdef"[n]) for n in range(5))]
    for owner in every:
        for _ in range(3):
            enqueue(store, owner)

    taken = Counter(job.household_id for job in claim(store, limit=8))

    # Households in turn (the first queued first), two jobs each.
    assert taken == {owner: 2 for owner in every[:4]}
    # Served, they wait behind the two not served yet.
    assert Counter(job.household_id for job in claim(store, limit=2)) == {
        owner: 1 for owner in every[4:]
    }


def test_a_claim_takes_as_many_households_as_its_batch_needs_where_they_have_few_jobs(
    store, household
):
    few, many = other_household(store, "Few", "b"), other_household(store, "Many", "c")
    enqueue(store, household)
    for _ in range(2):
        enqueue(store, few)
    for _ in range(9):
        enqueue(store, many)

    taken = Counter(job.household_id for job in claim(store, limit=8))

    # A share is two: one job, two and two fall short of eight, so all three
    # households are taken, and their jobs one at a time in turn.
    assert taken == {household: 1, few: 2, many: 5}


def test_claim_with_a_moment_in_the_future_takes_jobs_not_yet_due(store, household):
    later = enqueue(store, household)
    set_run_at(store, later, 3600)
    assert claim(store) == []

    [job] = claim(store, now=db_now(store) + timedelta(hours=2))

    assert job.id == later


# -- fenced writes ----------------------------------------------------------------------------


def claimed_job(store, household, **options):
    job_id = enqueue(store, household, **options)
    [job] = [job for job in claim(store, kinds=("succeed",)) if job.id == job_id]
    return job


def test_publish_and_owns_hold_only_for_the_current_lease(store, household):
    job = claimed_job(store, household)
    stale = [
        Lease(job.id, "someone-else", job.attempt),
        Lease(job.id, job.lease_owner, job.attempt + 1),
    ]

    assert store.write(store.jobs.publish, job.lease, result='{"step": 1}')
    assert store.write(store.jobs.owns, job.lease)
    for lease in stale:
        assert not store.write(store.jobs.publish, lease, result='{"step": "stale"}')
        assert not store.write(store.jobs.owns, lease)
    assert get(store, job.id).result == {"step": 1}


def test_a_stale_lease_changes_nothing(store, household):
    job = claimed_job(store, household)
    stale = Lease(job.id, "someone-else", job.attempt)
    before = get(store, job.id)

    assert not store.write(
        store.jobs.transition, Transition(stale, to=Status.SUCCEEDED, result="{}")
    )
    assert not store.write(store.jobs.transition, Transition(stale, to=Status.FAILED, error="boom"))
    assert not store.write(
        store.jobs.transition, Transition(stale, to=Status.QUEUED, attempt=Attempt.REFUND)
    )
    assert store.write(store.jobs.renew_leases, [stale], lease_seconds=LEASE) == set()
    assert store.write(store.jobs.interrupt, [stale]) == Recovered()

    assert get(store, job.id) == before


def test_transition_to_succeeded_stores_the_result_and_clears_the_lease(store, household):
    job = claimed_job(store, household)

    assert store.write(
        store.jobs.transition, Transition(job.lease, to=Status.SUCCEEDED, result='{"ok": true}')
    )

    done = get(store, job.id)
    assert done.status is Status.SUCCEEDED
    assert done.result == {"ok": True}
    assert done.finished_at is not None
    assert done.error is None
    assert done.lease_owner is done.lease_expires_at is None
    # Final: the same lease can write nothing more.
    assert not store.write(
        store.jobs.transition, Transition(job.lease, to=Status.FAILED, error="late")
    )


def test_transition_to_failed_stores_the_error(store, household):
    job = claimed_job(store, household)

    assert store.write(
        store.jobs.transition, Transition(job.lease, to=Status.FAILED, error="no recipe found")
    )

    done = get(store, job.id)
    assert (done.status, done.error, done.attempt) == (Status.FAILED, "no recipe found", 1)
    assert done.finished_at is not None


def test_a_retry_spends_the_attempt_and_waits_its_delay(store, household):
    job = claimed_job(store, household, max_attempts=3)
    store.write(store.jobs.publish, job.lease, result='{"partial": true}')

    assert store.write(
        store.jobs.transition, Transition(job.lease, to=Status.QUEUED, delay_seconds=600)
    )

    retried = get(store, job.id)
    assert retried.status is Status.QUEUED
    assert retried.attempt == 1
    assert retried.result is None
    assert retried.lease_owner is None
    assert retried.run_at > job.run_at
    assert claim(store) == []
    [again] = claim(store, now=db_now(store) + timedelta(seconds=601))
    assert again.attempt == 2


def test_a_retry_without_delay_keeps_its_place(store, household):
    job = claimed_job(store, household, max_attempts=3)

    assert store.write(store.jobs.transition, Transition(job.lease, to=Status.QUEUED))

    assert get(store, job.id).run_at == job.run_at


def test_a_refund_puts_the_job_back_as_if_it_never_started(store, household):
    job = claimed_job(store, household)

    assert store.write(
        store.jobs.transition, Transition(job.lease, to=Status.QUEUED, attempt=Attempt.REFUND)
    )

    back = get(store, job.id)
    assert (back.status, back.attempt, back.run_at) == (Status.QUEUED, 0, job.run_at)
    assert [again.attempt for again in claim(store)] == [1]


def test_a_refund_only_goes_back_to_the_queue(store, household):
    job = claimed_job(store, household)
    for status in (Status.SUCCEEDED, Status.FAILED):
        with pytest.raises(ValueError, match="no transition"):
            store.write(
                store.jobs.transition, Transition(job.lease, to=status, attempt=Attempt.REFUND)
            )
    with pytest.raises(ValueError, match="no transition"):
        store.write(store.jobs.transition, Transition(job.lease, to=Status.RUNNING))
    assert get(store, job.id).status is Status.RUNNING


def test_renew_extends_only_the_leases_still_held(store, household):
    job = claimed_job(store, household)
    other = claimed_job(store, household)
    store.write(store.jobs.transition, Transition(other.lease, to=Status.SUCCEEDED, result="{}"))

    renewed = store.write(store.jobs.renew_leases, [job.lease, other.lease], lease_seconds=600)

    assert renewed == {(job.id, job.attempt)}
    assert get(store, job.id).lease_expires_at > job.lease_expires_at
    assert store.write(store.jobs.renew_leases, [], lease_seconds=600) == set()


# -- interruptions ----------------------------------------------------------------------------


def test_a_requeue_job_comes_back_refunded_until_its_third_interruption(store, household):
    job_id = enqueue(store, household, max_attempts=2, on_interrupt=OnInterrupt.REQUEUE)
    for interruption in range(1, MAX_INTERRUPTIONS + 1):
        [job] = claim(store)
        assert job.attempt == 1  # every interrupted attempt was refunded
        recovered = store.write(store.jobs.interrupt, [job.lease])
        after = get(store, job_id)
        assert after.interruptions == interruption
        if interruption < MAX_INTERRUPTIONS:
            assert recovered == Recovered(requeued=(job_id,))
            assert (after.status, after.attempt, after.run_at) == (
                Status.QUEUED,
                0,
                job.run_at,
            )
    assert recovered == Recovered(failed=(job_id,))
    assert (after.status, after.error) == (Status.FAILED, MESSAGE_INTERRUPTED)


def test_an_attempt_that_ends_resets_the_interruptions_in_a_row(store, household):
    job_id = enqueue(store, household, max_attempts=3, on_interrupt=OnInterrupt.REQUEUE)
    [job] = claim(store)
    store.write(store.jobs.interrupt, [job.lease])
    [job] = claim(store)
    store.write(store.jobs.transition, Transition(job.lease, to=Status.QUEUED))  # a retry, spent

    assert get(store, job_id).interruptions == 0


def test_a_fail_job_fails_at_its_first_interruption(store, household):
    job = claimed_job(store, household, on_interrupt=OnInterrupt.FAIL)
    store.write(store.jobs.publish, job.lease, result='{"partial": 1}')

    assert store.write(store.jobs.interrupt, [job.lease]) == Recovered(failed=(job.id,))

    failed = get(store, job.id)
    assert (failed.status, failed.error, failed.attempt) == (
        Status.FAILED,
        MESSAGE_INTERRUPTED,
        1,
    )
    assert failed.result == {"partial": 1}  # what it had published stays


def test_running_leases_are_read_as_the_database_holds_them(store, household):
    job = claimed_job(store, household)
    other = claimed_job(store, household)
    enqueue(store, household)  # queued: no lease

    held = store.read(store.jobs.running_leases)

    assert {entry.lease for entry in held} == {job.lease, other.lease}
    mine = next(entry for entry in held if entry.lease == job.lease)
    assert mine.expires_at == job.lease_expires_at
    store.write(store.jobs.renew_leases, [job.lease], lease_seconds=600)
    renewed = next(e for e in store.read(store.jobs.running_leases) if e.lease == job.lease)
    assert renewed.expires_at > mine.expires_at


def test_rescue_takes_back_expired_leases_still_as_they_were_read(store, household):
    requeue = claimed_job(store, household, max_attempts=2, on_interrupt=OnInterrupt.REQUEUE)
    fail = claimed_job(store, household, on_interrupt=OnInterrupt.FAIL)
    renewed = claimed_job(store, household, on_interrupt=OnInterrupt.FAIL)
    held = store.read(store.jobs.running_leases)

    # Leases are still live now: nothing to rescue.
    assert store.write(store.jobs.rescue_unrenewed, held) == Recovered()
    assert store.write(store.jobs.rescue_unrenewed, []) == Recovered()

    # Renewed since it was read: its owner lives, whatever the clock says.
    store.write(store.jobs.renew_leases, [renewed.lease], lease_seconds=LEASE)
    past_the_leases = db_now(store) + timedelta(seconds=LEASE * 3)
    recovered = store.write(store.jobs.rescue_unrenewed, held, now=past_the_leases)

    assert recovered == Recovered(requeued=(requeue.id,), failed=(fail.id,))
    assert get(store, requeue.id).status is Status.QUEUED
    assert get(store, fail.id).error == MESSAGE_INTERRUPTED
    assert get(store, renewed.id).status is Status.RUNNING
    # A lease of another attempt of the job is another lease.
    [again] = [e for e in store.read(store.jobs.running_leases) if e.lease.job_id == renewed.id]
    stale = HeldLease(Lease(renewed.id, renewed.lease_owner, renewed.attempt + 1), again.expires_at)
    assert store.write(store.jobs.rescue_unrenewed, [stale], now=past_the_leases) == Recovered()
    assert store.write(store.jobs.rescue_unrenewed, [again], now=past_the_leases) == Recovered(
        failed=(renewed.id,)
    )


# -- polling reads ----------------------------------------------------------------------------


def test_has_due_job_sees_only_due_queued_jobs_of_the_kinds(store, household):
    assert not store.read(store.jobs.has_due_job, ["succeed"])
    job_id = enqueue(store, household)
    set_run_at(store, job_id, 3600)
    assert not store.read(store.jobs.has_due_job, ["succeed"])
    set_run_at(store, job_id, -1)
    assert store.read(store.jobs.has_due_job, ["succeed"])
    assert not store.read(store.jobs.has_due_job, ["sleep"])
    assert not store.read(store.jobs.has_due_job, [])


def test_queued_of_other_kinds_counts_what_this_process_cannot_run(store, household):
    enqueue(store, household, kind="new_kind")
    enqueue(store, household, kind="new_kind")
    enqueue(store, household, kind="another")
    enqueue(store, household)

    assert store.read(store.jobs.queued_of_other_kinds, ["succeed"]) == {
        "another": 1,
        "new_kind": 2,
    }
    assert store.read(store.jobs.queued_of_other_kinds, []) == {
        "another": 1,
        "new_kind": 2,
        "succeed": 1,
    }


# -- households -------------------------------------------------------------------------------


def test_households_and_their_live_tokens(store):
    smiths, first_token = store.write(
        store.households.create_household, name="Smiths", token_sha256="a" * 64
    )
    second_token = store.write(
        store.households.insert_token, household_id=smiths, token_sha256="b" * 64
    )
    joneses, _ = store.write(
        store.households.create_household, name="Joneses", token_sha256="c" * 64
    )

    store.write(store.households.revoke_token, first_token)

    listed = store.read(store.households.list_households)
    assert [(h.id, h.name, tokens) for h, tokens in listed] == [
        (SYSTEM_HOUSEHOLD_ID, "system", 0),  # the migrations' own
        (smiths, "Smiths", 1),
        (joneses, "Joneses", 1),
    ]
    assert store.read(store.households.household_for_token_digest, "a" * 64) is None
    assert store.read(store.households.household_for_token_digest, "b" * 64).id == smiths
    assert second_token != first_token
    with pytest.raises(UnknownToken):
        store.write(store.households.revoke_token, first_token)


def test_tokens_are_listed_with_their_names_and_last_use(store):
    smiths, first = store.write(
        store.households.create_household, name="Smiths", token_sha256="a" * 64
    )
    tablet = store.write(
        store.households.insert_token,
        household_id=smiths,
        token_sha256="b" * 64,
        name="kitchen tablet",
    )
    store.write(store.households.record_token_use, "b" * 64)
    store.write(store.households.revoke_token, first)
    # A revoked token's use is not recorded (a request with it was refused).
    store.write(store.households.record_token_use, "a" * 64)

    listed = store.read(store.households.list_tokens, smiths)

    assert [(t.id, t.name) for t in listed] == [(first, None), (tablet, "kitchen tablet")]
    assert listed[0].last_used_at is None
    assert listed[0].revoked_at is not None
    assert listed[1].last_used_at is not None
    assert listed[1].revoked_at is None
    assert listed[1].last_used_at >= listed[1].created_at
    assert store.read(store.households.list_tokens, 999) == []


def test_a_token_for_an_unknown_household_is_refused_leaving_the_transaction_usable(store):
    def attempt(tx):
        with pytest.raises(UnknownHousehold):
            store.households.insert_token(tx, household_id=999, token_sha256="d" * 64)
        return store.households.insert_household(tx, name="Still fine")

    store.write(attempt)

    assert [h.name for h, _ in store.read(store.households.list_households)] == [
        "system",
        "Still fine",
    ]


# -- recipes ----------------------------------------------------------------------------------


def parsed(title="Soup"):
    return ParsedRecipe(
        title=title,
        ingredients=["water", "salt"],
        instructions=["boil"],
        yields="2 servings",
        total_time_minutes=10,
        image_url=None,
        author=None,
    )


def test_a_recipe_is_upserted_per_job(store, household):
    job_id = enqueue(store, household, kind="recipe_import")
    first = store.write(
        store.recipes.upsert_for_job,
        household_id=household,
        job_id=job_id,
        source_url="https://example.test/soup",
        parsed=parsed(),
    )
    again = store.write(
        store.recipes.upsert_for_job,
        household_id=household,
        job_id=job_id,
        source_url="https://example.test/soup",
        parsed=parsed("Better soup"),
    )

    assert again.id == first.id
    assert again.seq == first.seq
    assert again.title == "Better soup"
    assert again.ingredients == ["water", "salt"]
    assert store.read(store.recipes.get_recipe, first.id, household) == again


def test_recipes_are_scoped_to_the_household_and_listed_newest_first(store, household):
    other = other_household(store)
    made = [
        store.write(
            store.recipes.upsert_for_job,
            household_id=household,
            job_id=enqueue(store, household, kind="recipe_import"),
            source_url="https://example.test/",
            parsed=parsed(f"Dish {index}"),
        )
        for index in range(3)
    ]

    assert store.read(store.recipes.get_recipe, made[0].id, other) is None
    page = store.read(store.recipes.list_recipes, household_id=household, before_seq=None, limit=2)
    rest = store.read(
        store.recipes.list_recipes, household_id=household, before_seq=page[-1].seq, limit=2
    )
    assert [r.title for r in page + rest] == ["Dish 2", "Dish 1", "Dish 0"]
    assert (
        store.read(store.recipes.list_recipes, household_id=other, before_seq=None, limit=5) == []
    )


# -- batches -------------------------------------------------------------------------------------


def test_a_batch_is_found_from_its_members_and_read_in_their_order(store, household):
    first, second, callback = (enqueue(store, household) for _ in range(3))
    batch = NewBatch("b" * 32, household, (first, second), callback)
    store.write(store.batches.insert_batch, batch)

    assert store.read(store.batches.batch_of_member, first) == batch.batch_id
    assert store.read(store.batches.batch_of_member, second) == batch.batch_id
    assert store.read(store.batches.batch_of_member, callback) is None  # no member
    assert store.read(store.batches.batch_of_member, "no-such-job") is None
    assert store.read(store.batches.batch_job_ids, batch.batch_id) == [first, second]
    read = store.read(store.batches.get_batch, batch.batch_id, household)
    assert [member.job_id for member in read.members] == [first, second]
    assert read.callback_job_id == callback
    assert store.read(store.batches.get_batch, batch.batch_id, other_household(store)) is None
