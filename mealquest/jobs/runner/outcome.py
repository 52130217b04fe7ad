"""How an attempt ended: the state change its worker writes, and what a failure may say.

An `Outcome` is decided by the runner from what the handler did (returned a
result, raised a `Failure`, timed out, ...) and written by it, fenced on
the attempt's lease. A `Failure`'s message is stored for the household to
read, so it is bounded (`mealquest.masking.bounded_failure_message`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mealquest.db.driver import JobStatements, Transaction
from mealquest.jobs import enqueueing
from mealquest.model.jobs import Attempt, Lease, NewJob, Status, Transition


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: the state change its worker writes, fenced on the lease."""

    to: Status
    attempt: Attempt = Attempt.SPEND
    result: str | None = None
    error: str | None = None
    delay_seconds: float | None = None
    # A snooze (`Snooze`): queued again with the attempt refunded, counted on the job.
    snoozed: bool = False
    # Jobs the handler enqueued (`JobContext.enqueue`): inserted only with a
    # success, in the same transaction, and only if the fence matched.
    follow_ups: tuple[NewJob, ...] = ()
    # Why an attempt retried ended so, for the operators' story of the job
    # (its log), never stored on the row: a queued job shows no error.
    reason: str | None = None
    # A wait for the household (`ctx.wait_for`): the signal's name and the
    # prompt (JSON), marked on the job once it is back in the queue.
    waiting: tuple[str, str] | None = None

    def transition(self, lease: Lease) -> Transition:
        """The fenced state change this outcome writes for `lease`."""
        return Transition(
            lease,
            to=self.to,
            attempt=self.attempt,
            result=self.result,
            error=self.error,
            delay_seconds=self.delay_seconds,
            snoozed=self.snoozed,
        )

    def write_after(self, jobs: JobStatements, tx: Transaction, lease: Lease) -> None:
        """Once the fenced write matched: insert a success's follow-ups, or
        mark a wait's job waiting for its household."""
        if self.waiting is not None:
            jobs.mark_waiting(tx, lease.job_id, *self.waiting)
        if self.to is Status.SUCCEEDED:
            for job in self.follow_ups:
                # A follow-up whose key another job holds is that job: the
                # success must not fail over it.
                enqueueing.insert(tx, jobs, job, on_reused_key="keep")

    def write(self, jobs: JobStatements, tx: Transaction, lease: Lease) -> bool:
        """This outcome alone, through `jobs` (the driver's job statements):
        whether the fence matched; the follow-ups are written only then."""
        matched = jobs.transition(tx, self.transition(lease))
        if matched:
            self.write_after(jobs, tx, lease)
        return matched


CANCELLED = Outcome(Status.CANCELLED)
# A handler stopped because the database stayed away until its lease was
# about to expire: its process lived, so the job goes back to its place in
# the queue with the attempt refunded and no interruption counted (those
# count a job that may kill its process).
PUT_BACK_AFTER_OUTAGE = Outcome(
    Status.QUEUED, Attempt.REFUND, reason="the database was unavailable past its lease"
)


def failed(error: str) -> Outcome:
    return Outcome(Status.FAILED, error=error)


def snoozed(seconds: float) -> Outcome:
    return Outcome(Status.QUEUED, Attempt.REFUND, delay_seconds=seconds, snoozed=True)
