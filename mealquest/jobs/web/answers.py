"""The job object as households see it: the row's fields, its version, and,
while it is queued, where it stands (`queue`). Every route that answers with
a job builds it here, so that each carries the same object."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mealquest.jobs.service.live import get_live
from mealquest.jobs.web.schemas import dump_job
from mealquest.model.jobs import Job


def job_answer(job: Job) -> dict[str, Any]:
    return dump_job(job, get_live().standings.queue(job))


def job_dumper(jobs: Sequence[Job]) -> Callable[[Job], dict[str, Any]]:
    """What writes each of `jobs` out as its object, the standings of the
    queued ones read together beforehand (for a page cut as it is dumped)."""
    queues = get_live().standings.queues(jobs)
    return lambda job: dump_job(job, queues.get(job.id))
