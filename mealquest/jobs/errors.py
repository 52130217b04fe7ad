"""The job runner's own exceptions; each docstring is its message."""

from __future__ import annotations


class JobsError(Exception):
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
        super().__init__(self.__doc__.splitlines()[0] if self.__doc__ else "too many jobs")
        self.retry_after = retry_after


class PoolAlreadyStarted(JobsError):
    """The pool has already been started."""


class LeaseLost(BaseException):
    """This worker no longer holds the job's lease; the job is someone else's now.

    A BaseException, like gevent's Timeout and GreenletExit, so that a handler's
    `except Exception` cannot swallow it and write on.
    """


class PoolStopping(BaseException):
    """The pool is stopping and did not wait for this job any longer."""


class JobCancelled(BaseException):
    """The job was cancelled and its handler did not stop within the grace.

    A BaseException, like LeaseLost, so that a handler's `except Exception`
    cannot swallow it.
    """
