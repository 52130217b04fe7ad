"""The job runner's own exceptions; each docstring is its message."""

from __future__ import annotations

from mealquest.documented import DocumentedError, DocumentedInterrupt


class JobsError(DocumentedError):
    """The job runner refused an operation."""


class RegistrationError(JobsError):
    """A job kind could not be registered."""


class UnknownKind(JobsError):
    """No handler is registered for that job kind."""


class IdempotencyKeyReused(JobsError):
    """That idempotency key was already used for another request."""


class TooManyJobs(JobsError):
    """The household has as many jobs queued or running as it may; try again later.

    `retry_after` is the service's estimate, in whole seconds, of when one of
    them will have finished.
    """

    def __init__(self, retry_after: int) -> None:
        super().__init__()
        self.retry_after = retry_after


class UnknownSignal(JobsError):
    """The job's kind takes no signal of that name."""


class ResultTooLarge(JobsError):
    """The job's result is larger than a job may store."""


class PoolAlreadyStarted(JobsError):
    """The pool has already been started."""


class LeaseLost(DocumentedInterrupt):
    """This worker no longer holds the job's lease; the job is someone else's now."""


class PoolStopping(DocumentedInterrupt):
    """The pool is stopping and did not wait for this job any longer."""


class JobCancelled(DocumentedInterrupt):
    """The job was cancelled and its handler did not stop within the grace."""


class ProcessHoldsTooMany(JobsError):
    """This process holds as many streams and long polls as it may; try again shortly.

    `retry_after` is in whole seconds.
    """

    def __init__(self, retry_after: int) -> None:
        super().__init__()
        self.retry_after = retry_after


class TooManyStreams(JobsError):
    """The household has as many event streams and long polls held as it may; try again later.

    `retry_after` is when, in whole seconds, its oldest will have ended.
    """

    def __init__(self, retry_after: int) -> None:
        super().__init__()
        self.retry_after = retry_after
