"""The jobs list's bulk actions: a confirmation page that counts what the
action would take, and the action itself (`mealquest.operator_actions.bulk`)."""

from __future__ import annotations

from typing import Any

from flask import flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from mealquest.admin.guard import current_operator, refused
from mealquest.admin.views import bp, filters_of, query_of
from mealquest.ascii_numbers import whole
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from mealquest.model.operations import BulkAction, JobFilter
from mealquest.operator_actions import bulk

_VERBS = {
    BulkAction.RETRY: "queued again",
    BulkAction.CANCEL: "cancelled",
    BulkAction.DELETE: "deleted",
}
_DONE = {
    BulkAction.RETRY: "Queued again",
    BulkAction.CANCEL: "Cancelled (running ones told to stop)",
    BulkAction.DELETE: "Deleted",
}


def _request(values: Any) -> tuple[BulkAction, JobFilter] | str:
    """The action and filter a request names, or why it cannot be used."""
    action = values.get("action", "")
    if action not in {str(a) for a in BulkAction}:
        return "Unknown action."
    filters, problem = filters_of(values)
    if problem is not None:
        return problem
    job_filter = JobFilter(
        status=filters.get("status"),
        kind=filters.get("kind"),
        household_id=filters.get("household_id"),
    )
    if not bulk.statuses_of(BulkAction(action), job_filter):
        return f"No {job_filter.status} job can be {action}-ed: pick another status."
    return BulkAction(action), job_filter


@bp.get("/jobs/bulk", endpoint="bulk")
def confirm() -> ResponseReturnValue:
    asked = _request(request.args)
    if isinstance(asked, str):
        return refused(400, asked)
    action, job_filter = asked
    found = bulk.preview(get_store(), action, job_filter)
    return render_template(
        "admin/bulk.html",
        preview=found,
        action=str(action),
        verb=_VERBS[action],
        described=bulk.describe(job_filter),
        query=query_of(request.args),
        max_counted=bulk.MAX_COUNTED,
    )


@bp.post("/jobs/bulk", endpoint="bulk_run")
def run() -> ResponseReturnValue:
    asked = _request(request.form)
    if isinstance(asked, str):
        return refused(400, asked)
    action, job_filter = asked
    upto = request.form.get("upto", "")
    if whole(upto) is None:
        return refused(400, "The confirmation is not valid; start again from the jobs list.")
    done = bulk.run(
        get_store(),
        get_jobs(),
        action,
        job_filter,
        upto_seq=int(upto),
        operator=current_operator(),
    )
    message = f"{_DONE[action]}: {done.acted} job{'s' if done.acted != 1 else ''}."
    if not done.complete:
        message += " It stopped when its time was up; more may match: run it again."
    flash(message)
    return redirect(url_for("admin.jobs", **query_of(request.form)), code=303)
