"""The batches pages: a household's batches, and one batch's members,
progress and callback (read only: each member's own page acts on it)."""

from __future__ import annotations

from flask import render_template, request
from flask.typing import ResponseReturnValue

from mealquest.admin.guard import refused
from mealquest.admin.views import bp
from mealquest.ascii_numbers import whole
from mealquest.jobs.service import get_jobs
from mealquest.masking import mask
from mealquest.model.jobs import FINAL_STATUSES, Status

PAGE_SIZE = 50


@bp.get("/batches", endpoint="batches")
def listing() -> ResponseReturnValue:
    wanted = request.args.get("household", "")
    household_id = whole(wanted) if wanted else None
    if household_id is None:
        return refused(400, "Batches are listed by household: give its id.")
    store = get_jobs().store
    found = store.read(store.batches.household_batches, household_id, limit=PAGE_SIZE)
    return render_template(
        "admin/batches.html", batches=found, household_id=household_id, statuses=list(Status)
    )


@bp.get("/batches/<batch_id>", endpoint="batch")
def page(batch_id: str) -> ResponseReturnValue:
    jobs = get_jobs()
    found = jobs.batch(batch_id) if len(batch_id) <= 64 else None
    if found is None:
        return refused(404, "No such batch.")
    members = [jobs.get(member.job_id) for member in found.members]
    callback = jobs.get(found.callback_job_id) if found.callback_job_id else None
    final = sum(found.count(status) for status in FINAL_STATUSES)
    return render_template(
        "admin/batch.html",
        batch=found,
        # Errors masked as on a job's page: a stored error is safe, a URL in it
        # may still carry a token.
        members=[(job, mask(job.error) if job.error else "") for job in members if job],
        callback=callback,
        statuses=list(Status),
        final=final,
    )
