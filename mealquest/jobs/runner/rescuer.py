"""The rescuer: takes back running jobs whose lease expired, in any process."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from mealquest.db.driver import Store
from mealquest.jobs.runner import metrics
from mealquest.model.jobs import Lease, Recovered

logger = logging.getLogger(__name__)


class Rescuer:
    """Takes back running jobs whose lease expired: a lease expires only if its
    process stopped renewing it (killed, frozen, or cut off from the database).
    Each is interrupted: re-queued with its attempt refunded or failed
    `interrupted by restart`, as its `on_interrupt` says."""

    def __init__(self, store: Store, keep: Callable[[], list[Lease]] = list) -> None:
        self.store = store
        # This process's own live handlers are never rescued from under them.
        self.keep = keep

    def run_once(self, now: datetime | None = None) -> Recovered:
        """`now` moves the database's clock (tests); None is the database's own."""
        recovered = self.store.write(self.store.jobs.rescue_expired, keep=self.keep(), now=now)
        metrics.rescued(self.store, recovered)
        for job_id in recovered.requeued:
            logger.warning("re-queued a job whose lease expired", extra={"job_id": job_id})
        for job_id in recovered.failed:
            logger.error(
                "failed a job whose lease expired: interrupted by restart",
                extra={"job_id": job_id},
            )
        for job_id in recovered.cancelled:
            logger.info("cancelled a job whose lease expired", extra={"job_id": job_id})
        return recovered
