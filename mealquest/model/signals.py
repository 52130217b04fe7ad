"""What a job that waits for its household is made of: its kept steps, its
wait, and the household's answer (a signal)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from mealquest.model.jobs import FINAL_STATUSES, Job, Status

# A step's or a signal's name: what a kind's author writes, and what a route's
# path carries. A wait's deadline is kept as the step `wait:<signal>`, a
# name no author's step can take.
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
NAME_RULE = "must be 1 to 64 lowercase letters, digits or underscores, starting with a letter"
_NAME = re.compile(NAME_PATTERN)
WAIT_STEP_PREFIX = "wait:"
# How long a wait lasts by default: a day.
DEFAULT_WAIT_SECONDS = 86_400.0


def is_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


@dataclass(frozen=True)
class WaitState:
    """What a job's run finds of one of its waits: the household's answer, if
    it came (its JSON), and whether the wait it began has timed out (None:
    it has not begun one)."""

    answer: str | None
    timed_out: bool | None


class Signaled(enum.StrEnum):
    """What a household's signal to a job did."""

    KEPT = "kept"
    """Stored for the job's wait: it has not reached the wait yet."""
    RESUMED = "resumed"
    """The job waited for it: it is due now."""
    REPEATED = "repeated"
    """The same request again (its `Idempotency-Key`): nothing changed."""
    NOT_WAITING = "not_waiting"
    """The job is final, waits for another signal, or has this one already."""
    NO_JOB = "no_job"
    """No such job (of that household)."""


@dataclass(frozen=True)
class SignalResult:
    """A signal's effect, and the job as it now is (None: no such job)."""

    signaled: Signaled
    job: Job | None


def refused(
    job: Job, name: str, kept: bool, kept_key: str | None, idempotency_key: str | None
) -> SignalResult | None:
    """The answer to a signal `name` that changes nothing, or None when it is
    to be kept: one the job has already (`kept`, under `kept_key`) is a repeat
    of the same request or refused; so is one for a final job or a job that
    waits for another signal. The rule every driver's `signal` applies."""
    if kept:
        repeated = idempotency_key is not None and kept_key == idempotency_key
        return SignalResult(Signaled.REPEATED if repeated else Signaled.NOT_WAITING, job)
    if job.status in FINAL_STATUSES or job.waiting_signal not in (None, name):
        return SignalResult(Signaled.NOT_WAITING, job)
    return None


def resumes(job: Job, name: str) -> bool:
    """Whether a kept signal `name` makes `job` due now: it waits for it."""
    return job.status is Status.QUEUED and job.waiting_signal == name


class WaitForHousehold(BaseException):
    """Raised by `ctx.wait_for` to end the attempt while the job waits for its
    household's answer: queued again, its attempt not spent, due at the
    wait's deadline (`seconds` from now), marked waiting for `name`, its
    result the `prompt` (JSON). A `BaseException`, as a kill is: a handler's
    `except Exception` must not swallow the wait and carry on without the
    answer."""

    def __init__(self, name: str, seconds: float, prompt: str) -> None:
        super().__init__(name)
        self.name = name
        self.seconds = seconds
        self.prompt = prompt
