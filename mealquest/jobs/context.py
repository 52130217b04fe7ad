"""What a handler gets besides its payload: who it is, and writes fenced on its lease.

The API every job kind's author uses. The runner makes one `JobContext` per
attempt and reads back what the handler did with it (its follow-up jobs,
whether one of its writes found the lease gone).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from marshmallow import Schema

from mealquest.db.driver import Store, Transaction
from mealquest.jobs.errors import LeaseLost, ResultTooLarge
from mealquest.jobs.job_log import JobLog
from mealquest.jobs.options import FollowUpOptions
from mealquest.model.batches import BatchOutcome
from mealquest.model.jobs import MAX_RESULT_BYTES, Job, Lease, NewJob
from mealquest.model.signals import (
    DEFAULT_WAIT_SECONDS,
    NAME_RULE,
    WaitForHousehold,
    is_name,
)

T = TypeVar("T")
P = ParamSpec("P")

# Validates a follow-up job of the household (`enqueueing.prepare` over the
# process's registry): `prepare(kind, payload, household_id=..., ...)`.
Prepare = Callable[..., NewJob]


def _cannot_enqueue(*args: Any, **kwargs: Any) -> NewJob:
    raise RuntimeError("this context cannot enqueue")


class JobContext:
    """What a handler gets besides its payload: who it is, and fenced writes.

    :ivar job_id: the job's id (32 hex digits)
    :ivar household_id: the household whose job it is
    :ivar kind: the job's kind
    :ivar attempt: this attempt's number, 1 for the first
    :ivar max_attempts: the attempts the kind allows
    :ivar snoozes: how many times the job was snoozed before this run
    :ivar log: the handler's own log lines (`ctx.log.info(...)`), kept with
        this attempt and shown to operators, never to the household
    :ivar store: the database; a handler writes its own rows through its
        statements inside `ctx.write`
    """

    def __init__(
        self,
        store: Store,
        job: Job,
        lease: Lease,
        *,
        encode_partial: Callable[[Any], str],
        prepare: Prepare = _cannot_enqueue,
        is_cancelled: Callable[[], bool] = lambda: False,
        signal_schema: Callable[[str], Schema | None] = lambda name: None,
    ) -> None:
        self.job_id = job.id
        self.household_id = job.household_id
        self.kind = job.kind
        self.attempt = job.attempt
        self.max_attempts = job.max_attempts
        # How many times the job was snoozed before this run (`Snooze`).
        self.snoozes = job.snoozes
        # The handler's own log lines, kept with this attempt (see `JobLog`).
        self.log = JobLog(job.attempt)
        # The database: handlers write their domain rows through its SQL
        # (`ctx.store.recipes`, ...) inside `ctx.write`.
        self.store = store
        # Jobs the handler enqueued, written with its success (`enqueue`).
        self.follow_ups: list[NewJob] = []
        # A write of the handler's found the lease gone.
        self.lease_found_lost = False
        # The handler published a partial result past the bound: whatever it
        # does next, its job fails.
        self.result_too_large = False
        self._lease = lease
        self._encode_partial = encode_partial
        self._prepare = prepare
        self._is_cancelled = is_cancelled
        self._signal_schema = signal_schema

    @property
    def claim(self) -> str:
        """The claim this attempt runs under (its lease's owner): another run of
        the same job, even of the same attempt number, has another, so a
        system the handler writes to can tell two runs apart."""
        return self._lease.owner

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while it ran. A cooperative handler
        checks it between steps and returns (or raises) as soon as it is True:
        the job ends cancelled whatever the handler does then. One that does
        not stop is killed after the pool's kill grace."""
        return self._is_cancelled()

    def enqueue(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        **options: Unpack[FollowUpOptions],
    ) -> str:
        """Enqueue a follow-up job for this job's household, fenced on this job's lease.

        Validated now (ValidationError or UnknownKind here, as from
        `JobService.enqueue`), written later: the follow-up is inserted in
        the transaction that records this attempt's success, and only if that
        fenced write matches. So if the attempt fails, is retried, times out,
        is cancelled or interrupted, or its lease was lost to another process,
        no follow-up of it exists, and a retried attempt enqueues its own. A
        `unique_key` another job of the household holds makes no new job (and
        does not fail the success): the id returned, the one the follow-up
        will have, then names no job. Follow-ups are the handler's own
        chaining, not a household's request: the household's quota does not
        refuse them (a handler that fans out bounds its own fan-out).
        """
        job = self._prepare(kind_name, payload, household_id=self.household_id, **options)
        self.follow_ups.append(job)
        return job.job_id

    def batch(self) -> BatchOutcome | None:
        """When this job is a batch's callback: the batch's members' ids by
        outcome (every member is final by the time it runs); else None."""
        return self.store.read(self.store.batches.batch_outcome, self.job_id)

    def publish(self, partial: Any) -> None:
        """Store a partial result (typed by the kind's partial schema); GET shows
        it at once. One larger than `MAX_RESULT_BYTES` as JSON raises
        `ResultTooLarge`, stores nothing, and fails the job as `internal error`
        (a handler's bug: its result has no bound)."""
        encoded = self._encode_partial(partial)
        if len(encoded.encode()) > MAX_RESULT_BYTES:
            self.result_too_large = True
            raise ResultTooLarge()
        published = self.store.write(self.store.jobs.publish, self._lease, result=encoded)
        if not published:
            self.lease_found_lost = True
            raise LeaseLost()

    def write(
        self, fn: Callable[Concatenate[Transaction, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run `fn(tx, ...)` in a write transaction that commits only while this
        worker still holds the job's lease, so a rescued job's old worker cannot
        write domain rows behind the new one.

        `fn` runs where the store runs its writes (on SQLite, its native writer
        thread): SQL only, no gevent calls, no I/O, nothing slow (every other
        write of the process waits).
        """

        def fenced(tx: Transaction) -> T:
            if not self.store.jobs.owns(tx, self._lease):
                # Marked here, not where it arrives: a LeaseLost that `fn`
                # raises on its own is the handler's failure.
                self.lease_found_lost = True
                raise LeaseLost()
            return fn(tx, *args, **kwargs)

        return self.store.write(fenced)

    def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, run once per job: its JSON result is kept (fenced on
        this attempt's lease), and a later attempt, or the run that resumes
        the job after a wait, gets the kept result without running `fn`
        again. `name` names the step within the job (1 to 64 lowercase
        letters, digits or underscores); the result must be JSON (as
        `json.dumps` takes it), at most `MAX_RESULT_BYTES` as JSON, and is
        returned as JSON reads back (a tuple as a list). A step that raises
        keeps nothing: the next run runs it again."""
        if not is_name(name):
            raise ValueError(f"step {name!r}: its name {NAME_RULE}")
        kept = self.store.read(self.store.signals.kept_step, self.job_id, name)
        if kept is not None:
            return json.loads(kept)
        encoded = json.dumps(fn(*args), separators=(",", ":"))
        if len(encoded.encode()) > MAX_RESULT_BYTES:
            self.result_too_large = True
            raise ResultTooLarge()
        if not self.store.write(self.store.signals.keep_step, self._lease, name, encoded):
            self.lease_found_lost = True
            raise LeaseLost()
        # Another run of the job may have kept it first: the kept one is the step's.
        kept = self.store.read(self.store.signals.kept_step, self.job_id, name)
        return json.loads(kept if kept is not None else encoded)

    def wait_for(
        self, name: str, *, timeout_seconds: float = DEFAULT_WAIT_SECONDS, prompt: Any = None
    ) -> Any:
        """The household's answer to the signal `name` (declared by the kind's
        `KindOptions(signals=...)`), loaded by its schema, once it has come;
        None once the wait has timed out.

        Until then this ends the attempt, without spending it: the job goes
        back to the queue waiting for its household (`queue.waiting_for`
        "household", `queue.signal` the name), holding no slot and no lease,
        its result the `prompt` (JSON: what the household is asked). Their
        answer (`POST /api/v1/jobs/{id}/signals/{name}`) makes it due; so
        does `timeout_seconds` after the wait began. Either way the job runs
        again from the start: what it did before the wait belongs in
        `ctx.step`s, which do not run twice. An answer that came before the
        job reached its wait is kept for it, and returned at once."""
        schema = self._signal_schema(name)
        if schema is None:
            raise ValueError(f"the kind declares no signal {name!r} (KindOptions.signals)")
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        state = self.store.read(self.store.signals.wait_state, self.job_id, name)
        if state.answer is not None:
            return schema.load(json.loads(state.answer))
        if state.timed_out:
            return None
        encoded = json.dumps(prompt, separators=(",", ":"))
        if len(encoded.encode()) > MAX_RESULT_BYTES:
            self.result_too_large = True
            raise ResultTooLarge()
        left = self.store.write(
            self.store.signals.begin_wait, self._lease, name, float(timeout_seconds)
        )
        if left is None:
            self.lease_found_lost = True
            raise LeaseLost()
        raise WaitForHousehold(name, left, encoded)
