"""The pool's timings, read once from the app's configuration.

Their defaults are the settings table's (`mealquest.config.table`), so a
pool built without a configuration runs as a default deployment does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mealquest.config.table import DEFAULTS, HEARTBEATS_PER_LEASE, RESCUES_PER_LEASE

_LEASE_SECONDS: float = DEFAULTS["JOB_LEASE_SECONDS"]


@dataclass(frozen=True)
class PoolSettings:
    """How one process's pool runs.

    `kill_grace_seconds` is how long a handler stopped by its timeout, a lost
    lease or a stopping pool has to die before the pool calls it hung: the
    job is then recorded without waiting for it and the process restarts.
    `max_blocking_seconds` is how long a handler may hold the event loop
    before the hub monitor names it in the log (0: no monitor).
    """

    workers: int = DEFAULTS["JOB_WORKERS"]
    poll_seconds: float = DEFAULTS["JOB_POLL_SECONDS"]
    change_check_seconds: float = DEFAULTS["JOB_CHANGE_CHECK_SECONDS"]
    lease_seconds: float = _LEASE_SECONDS
    heartbeat_seconds: float = _LEASE_SECONDS / HEARTBEATS_PER_LEASE
    rescue_seconds: float = _LEASE_SECONDS / RESCUES_PER_LEASE
    kill_grace_seconds: float = DEFAULTS["JOB_KILL_GRACE_SECONDS"]
    unhandled_report_seconds: float = DEFAULTS["JOB_UNHANDLED_REPORT_SECONDS"]
    max_blocking_seconds: float = DEFAULTS["JOB_MAX_BLOCKING_SECONDS"]
    # How old a periodic kind's scheduled time may be and still make its job
    # when a scheduler first looks after it (processes down across it).
    cron_catchup_seconds: float = DEFAULTS["JOB_CRON_CATCHUP_SECONDS"]
    # How many times a job may be snoozed; the next snooze fails it.
    max_snoozes: int = DEFAULTS["JOB_MAX_SNOOZES"]
    # Each attempt a span (`mealquest.tracing`); off, attempts read no trace.
    tracing: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("a pool needs at least 1 worker")
        intervals = (
            self.poll_seconds,
            self.change_check_seconds,
            self.lease_seconds,
            self.heartbeat_seconds,
            self.rescue_seconds,
            self.kill_grace_seconds,
            self.unhandled_report_seconds,
        )
        if min(intervals) <= 0:
            raise ValueError("pool intervals and the lease must be positive")
        if self.cron_catchup_seconds <= 0:
            raise ValueError("cron_catchup_seconds must be positive")
        if self.max_snoozes < 0:
            raise ValueError("max_snoozes must be 0 or more")
        if self.max_blocking_seconds < 0:
            raise ValueError("max_blocking_seconds must be 0 (off) or positive")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("heartbeats must come more often than the lease lasts")

    @property
    def watchdog_seconds(self) -> float:
        """How often the watchdog looks at running handlers: often enough to act
        on a hung handler or a failing lease before its lease can expire."""
        return min(self.kill_grace_seconds, self.lease_seconds - self.heartbeat_seconds) / 2

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PoolSettings:
        return cls(
            workers=int(config["JOB_WORKERS"]),
            poll_seconds=float(config["JOB_POLL_SECONDS"]),
            change_check_seconds=float(config["JOB_CHANGE_CHECK_SECONDS"]),
            lease_seconds=float(config["JOB_LEASE_SECONDS"]),
            heartbeat_seconds=float(config["JOB_HEARTBEAT_SECONDS"]),
            rescue_seconds=float(config["JOB_RESCUE_SECONDS"]),
            kill_grace_seconds=float(config["JOB_KILL_GRACE_SECONDS"]),
            unhandled_report_seconds=float(config["JOB_UNHANDLED_REPORT_SECONDS"]),
            max_blocking_seconds=float(config["JOB_MAX_BLOCKING_SECONDS"]),
            cron_catchup_seconds=float(config["JOB_CRON_CATCHUP_SECONDS"]),
            max_snoozes=int(config["JOB_MAX_SNOOZES"]),
            tracing=bool(config.get("TRACING", False)),
        )
