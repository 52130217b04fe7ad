"""The job API a kind's author uses, in one place.

    from mealquest.jobs import Failure, JobContext, KindOptions, register

A kind is a handler and the marshmallow schemas of its payload and result,
registered with the app (`register`) before its pool starts; a route or a
command stores its jobs (`enqueue`, `enqueue_many` with `JobRequest`s,
`enqueue_batch` for jobs watched as one, with a job to run once they end). The
handler reads its job through `JobContext` and ends it with a return value,
a `Failure` a household may read, or a `Snooze`. The modules below this
package are the service's own; nothing of theirs is needed to write a kind.
"""

from mealquest.jobs.authoring import enqueue, enqueue_batch, enqueue_many, register
from mealquest.jobs.context import JobContext
from mealquest.jobs.enqueueing import JobRequest
from mealquest.jobs.errors import RegistrationError, TooManyJobs, UnknownKind
from mealquest.jobs.options import EnqueueOptions, FollowUpOptions
from mealquest.jobs.registry import Backoff, KindOptions
from mealquest.model.jobs import Failure, OnInterrupt, Snooze

__all__ = [
    "Backoff",
    "EnqueueOptions",
    "Failure",
    "FollowUpOptions",
    "JobContext",
    "JobRequest",
    "KindOptions",
    "OnInterrupt",
    "RegistrationError",
    "Snooze",
    "TooManyJobs",
    "UnknownKind",
    "enqueue",
    "enqueue_batch",
    "enqueue_many",
    "register",
]
