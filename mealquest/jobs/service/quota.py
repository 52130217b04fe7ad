"""The per-household quota: how many jobs a household may have queued or running.

A household at its quota is refused a new job (HTTP 429 `too_many_jobs`)
and told when to try again: about when one of its jobs will have finished,
judged from its running jobs and its recent run times. The check and the
insert are one transaction, made exact by the driver (`count_pending`).
"""

from __future__ import annotations

import math

# Without a finished job to judge by, a job is taken to run this long.
DEFAULT_RUN_SECONDS = 10.0
# Retry-After stays within these bounds, in seconds.
MIN_RETRY_AFTER = 1
MAX_RETRY_AFTER = 3600


def retry_after(running: int, mean_run_seconds: float | None) -> int:
    """Seconds until a place frees, about: a run time shared by the jobs running
    side by side (one of R running jobs ends, on average, R times sooner than
    one alone). With nothing running, the queued jobs wait for a worker first:
    a whole run time."""
    seconds = DEFAULT_RUN_SECONDS if mean_run_seconds is None else mean_run_seconds
    estimate = math.ceil(seconds / max(running, 1))
    return max(MIN_RETRY_AFTER, min(MAX_RETRY_AFTER, estimate))
