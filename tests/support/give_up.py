"""`give_up`: a job kind whose handler makes its pool give up, as the pool does
itself when a part of it dies or a handler will not die: the pool logs it and
calls the `on_fatal` its owner gave `start_pool`."""

from __future__ import annotations

from typing import Any

from mealquest.jobs.context import JobContext
from mealquest.jobs.service import JobService
from mealquest.model.jobs import Failure
from tests.support.kinds import EmptySchema

REASON = "a give_up job asked its process to stop"


def register_give_up(service: JobService) -> None:
    def give_up(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        if service.pool is None:
            raise Failure("no pool runs this job")
        service.pool.fatal(REASON)
        return {}

    service.registry.register("give_up", give_up, payload=EmptySchema, result=EmptySchema)
