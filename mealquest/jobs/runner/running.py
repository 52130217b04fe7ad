"""`Running`: what the pool knows of one job it runs, from its claim until its
greenlet is dead. The executor makes it; the heartbeat, the watchdog, the
completer and a stopping pool read and mark it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gevent.greenlet import Greenlet

from mealquest.jobs.context import JobContext
from mealquest.model.jobs import Job, Lease

# `Running.taken` of the jobs a stopping pool cut short.
STOPPING = "stopping"
# `Running.taken` of the jobs whose lease could not be renewed because the
# database was unavailable: stopped before the lease expired, and put back
# uncounted once the database answers (their process lived through it).
DATABASE_AWAY = "database unavailable"


@dataclass(eq=False)
class Running:
    """A job this process runs, from its claim until its greenlet is dead.

    Times are monotonic. `deadline` is when the kind's timeout ends the
    handler; `lease_deadline` when the lease expires as far as this process
    knows (the claim's or the last renewal's start plus the lease).
    """

    job: Job
    lease: Lease
    deadline: float
    lease_deadline: float
    # The W3C traceparent the job was enqueued under (tracing on).
    traceparent: str | None = None
    greenlet: Greenlet | None = None
    # The handler's context, once its attempt began (what it enqueued, and
    # whether one of its writes found the lease gone); dropped when the attempt
    # is over (`Executor._execute`), since it refers back to this entry.
    context: JobContext | None = None
    # The handler returned or raised; its outcome is being written.
    recording: bool = False
    # Why the pool took the job from its handler (stop, lost lease), and when:
    # the handler was killed and the pool, not the handler, records the job.
    taken: str | None = None
    taken_at: float = 0.0
    # The pool gave up on a handler that would not die: nothing renews,
    # records or waits for this job any more.
    abandoned: bool = False
    # A cancel reached the job (monotonic time; None: none did), and when the
    # handler, still running after the kill grace, was killed for it.
    cancelled_at: float | None = None
    cancel_killed_at: float | None = None

    @property
    def extra(self) -> dict[str, Any]:
        return {"job_id": self.job.id, "kind": self.job.kind, "attempt": self.job.attempt}

    @property
    def lease_found_lost(self) -> bool:
        """Whether a write of the handler's found the lease gone."""
        return self.context is not None and self.context.lease_found_lost

    def alive(self) -> bool:
        return self.greenlet is not None and not self.greenlet.dead
