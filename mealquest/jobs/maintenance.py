"""The rescuer: takes back running jobs whose lease expired, from any process.

A lease expires only if its process stopped renewing it (killed, frozen, or
cut off from the database), so the job is re-queued while attempts are
left and failed `interrupted by restart` otherwise. Time is a parameter, so
tests move past a lease instead of sleeping through it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from mealquest.clock import to_text
from mealquest.jobs import queries
from mealquest.store import Store

logger = logging.getLogger(__name__)


class Rescuer:
    def __init__(self, store: Store) -> None:
        self.store = store

    def run_once(self, now: datetime) -> queries.Recovered:
        recovered = self.store.write(queries.rescue_expired, now=to_text(now))
        for job_id in recovered.requeued:
            logger.warning("re-queued a job whose lease expired", extra={"job_id": job_id})
        for job_id in recovered.failed:
            logger.error(
                "failed a job whose lease expired: interrupted by restart",
                extra={"job_id": job_id},
            )
        return recovered
