"""What an operator can do from the dashboard: retry, delete or cancel a job;
pause or resume a kind.

Each is one fenced write (it acts only on a job in a state that allows it),
logged with the operator's id and the job's id (or the kind), never its
payload, and recorded in the audit log with how many jobs it changed (0: refused).
"""

from __future__ import annotations

import enum
import logging

from mealquest import audit
from mealquest.extensions import get_store
from mealquest.jobs.errors import UnknownKind
from mealquest.jobs.service import flow, get_jobs
from mealquest.model.jobs import Status
from mealquest.model.operators import Operator

logger = logging.getLogger(__name__)


class Done(enum.Enum):
    """What an action did."""

    RETRIED = "queued again with a fresh attempt budget"
    DELETED = "deleted"
    CANCELLED = "cancelled"
    CANCELLING = "cancel requested: its handler is told and the job ends cancelled shortly"
    REFUSED = "not possible in the job's state now"
    PAUSED = flow.Change.PAUSED.value
    ALREADY_PAUSED = flow.Change.ALREADY_PAUSED.value
    RESUMED = flow.Change.RESUMED.value
    NOT_PAUSED = flow.Change.NOT_PAUSED.value
    UNKNOWN_KIND = "not a kind this release runs"


def _log(operator: Operator, action: str, job_id: str, done: Done) -> None:
    audit.record(get_store(), operator, action, f"job {job_id}", int(done is not Done.REFUSED))
    logger.info(
        "operator %d: %s the job: %s",
        operator.id,
        action,
        done.name.lower(),
        extra={"job_id": job_id, "operator_id": operator.id},
    )


def _log_kind(operator: Operator, action: str, kind: str, done: Done) -> None:
    logger.info(
        "operator %d: %s a kind: %s",
        operator.id,
        action,
        done.name.lower(),
        extra={"kind": kind, "operator_id": operator.id},
    )


def pause(operator: Operator, kind: str) -> Done:
    """Pause a kind in the whole deployment: its queued jobs wait, running ones finish."""
    try:
        change = flow.pause(get_store(), get_jobs().registry, kind, operator)
    except UnknownKind:
        done = Done.UNKNOWN_KIND
    else:
        done = Done[change.name]
    _log_kind(operator, "pause", kind, done)
    return done


def resume(operator: Operator, kind: str) -> Done:
    """Resume a paused kind: its queued jobs are claimed again."""
    done = Done[flow.resume(get_store(), kind, operator).name]
    _log_kind(operator, "resume", kind, done)
    return done


def retry(operator: Operator, job_id: str) -> Done:
    """A failed or cancelled job queued again, due now, its attempts counted afresh."""
    before = get_jobs().get(job_id)
    retryable = before is not None and before.status in (Status.FAILED, Status.CANCELLED)
    job = get_jobs().retry(job_id) if retryable else None
    done = Done.RETRIED if job is not None and job.status is Status.QUEUED else Done.REFUSED
    _log(operator, "retry", job_id, done)
    return done


def delete(operator: Operator, job_id: str) -> Done:
    """A job that is not running, deleted (its recipe, if any, is kept)."""
    store = get_store()
    done = Done.DELETED if store.write(store.operations.delete_job, job_id) else Done.REFUSED
    _log(operator, "delete", job_id, done)
    return done


def cancel(operator: Operator, job_id: str) -> Done:
    """Cancel a queued or running job, as `POST /api/v1/jobs/{id}/cancel` does."""
    done = cancel_job(job_id)
    _log(operator, "cancel", job_id, done)
    return done


def cancel_job(job_id: str) -> Done:
    """The dashboard's cancel: the job service's, for any household's job."""
    job = get_jobs().cancel(job_id)
    if job is None:
        return Done.REFUSED
    if job.status is Status.CANCELLED:
        return Done.CANCELLED
    if job.status is Status.RUNNING:
        return Done.CANCELLING
    return Done.REFUSED
