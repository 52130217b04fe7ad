"""The jobs service of one app: its kinds, enqueueing, reading, and the process's pool."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask

from mealquest import migrations
from mealquest.extensions import JOBS_KEY, get_store
from mealquest.jobs import quota
from mealquest.jobs.errors import PoolAlreadyStarted, TooManyJobs, UnknownKind
from mealquest.jobs.model import Job, Status
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner import Pool, PoolSettings
from mealquest.store import Store, Transaction

logger = logging.getLogger(__name__)


class _AtQuota(Exception):
    """Raised inside the enqueue's transaction to roll it back."""


def new_job_id() -> str:
    return uuid.uuid4().hex


class JobService:
    def __init__(
        self, store: Store, settings: PoolSettings, *, max_pending_per_household: int = 100
    ) -> None:
        self.store = store
        self.settings = settings
        # A household's quota: jobs it may have queued or running at once.
        self.max_pending_per_household = max_pending_per_household
        self.registry = Registry()
        self.pool: Pool | None = None

    def enqueue(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        *,
        household_id: int,
        tx: Transaction | None = None,
        within_quota: bool = True,
    ) -> str:
        """Validate `payload` for the kind and store a queued job; returns its id.

        With `tx`, the job joins that open transaction and commits (or not)
        with the caller's own writes; the pool is woken only after the commit.
        A bad payload raises marshmallow's ValidationError and stores nothing.
        A household at its quota raises `TooManyJobs` and stores nothing (with
        `tx`, the caller's transaction is then to be rolled back); `within_quota=False`
        is for the service's own jobs, which no household posted.
        """
        kind = self.registry.get(kind_name)
        if kind is None:
            raise UnknownKind(f"{UnknownKind.__doc__}: {kind_name}")
        payload_json = kind.canonical_payload(payload)
        job_id = new_job_id()

        def insert(tx: Transaction) -> None:
            if within_quota:
                self._check_quota(tx, household_id)
            self.store.jobs.insert_job(
                tx,
                job_id=job_id,
                household_id=household_id,
                kind=kind_name,
                payload=payload_json,
                max_attempts=kind.options.max_attempts,
                on_interrupt=kind.options.interrupt_policy,
            )
            tx.after_commit(self._wake_pool)

        try:
            if tx is None:
                self.store.write(insert)
            else:
                insert(tx)
        except _AtQuota:
            raise TooManyJobs(self.quota_retry_after(household_id)) from None
        return job_id

    def _check_quota(self, tx: Transaction, household_id: int, adding: int = 1) -> None:
        """Refuse (rolling the transaction back) jobs past the household's quota.

        Inside the transaction that inserts them, after the driver has made
        the count hold until it commits (see `count_pending`)."""
        allowed = self.max_pending_per_household
        pending = self.store.jobs.count_pending(tx, household_id, at_most=allowed)
        if pending + adding > allowed:
            raise _AtQuota

    def quota_retry_after(self, household_id: int) -> int:
        """Seconds after which a household at its quota may find a place free (an estimate)."""
        running, mean = self.store.read(self.store.jobs.household_load, household_id)
        return quota.retry_after(running, mean)

    def _wake_pool(self) -> None:
        if self.pool is not None:
            self.pool.wake()

    def get(self, job_id: str, *, household_id: int | None = None) -> Job | None:
        return self.store.read(self.store.jobs.get_job, job_id, household_id)

    def list_jobs(
        self,
        *,
        household_id: int | None = None,
        status: Status | None = None,
        kind: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        return self.store.read(
            lambda conn: self.store.jobs.list_jobs(
                conn,
                household_id=household_id,
                status=status,
                kind=kind,
                before_seq=before_seq,
                limit=limit,
            )
        )

    def start_pool(self, on_fatal: Callable[[str], None] | None = None) -> Pool:
        """Start this process's pool (once). Refuses a database behind the migrations.

        `on_fatal(reason)` is called (once) when the pool cannot go on, to have
        the process stopped gracefully and replaced.
        """
        if self.pool is not None:
            raise PoolAlreadyStarted(PoolAlreadyStarted.__doc__)
        migrations.require_migrated(self.store)
        pool = Pool(self.store, self.registry, self.settings, on_fatal=on_fatal)
        pool.start()
        self.pool = pool
        return pool


def init_app(app: Flask) -> JobService:
    service = JobService(
        get_store(app),
        PoolSettings.from_config(app.config),
        max_pending_per_household=app.config["JOB_MAX_PENDING_PER_HOUSEHOLD"],
    )
    app.extensions[JOBS_KEY] = service
    return service
