"""The jobs waiting for a household's answer (`ctx.wait_for`): every
household's, or one's, soonest to time out first, with the signal each
waits for; the job's own page shows what it asked (its result) and
acts on it."""

from __future__ import annotations

from flask import render_template, request
from flask.typing import ResponseReturnValue

from mealquest.admin.guard import refused
from mealquest.admin.views import bp
from mealquest.ascii_numbers import whole
from mealquest.jobs.service import get_jobs

PAGE_SIZE = 100


@bp.get("/waiting-for-households", endpoint="household_waits")
def listing() -> ResponseReturnValue:
    wanted = request.args.get("household", "")
    household_id = whole(wanted) if wanted else None
    if wanted and household_id is None:
        return refused(400, "A household is named by its id.")
    store = get_jobs().store
    waiting = store.read(store.signals.waiting_jobs, household_id=household_id, limit=PAGE_SIZE)
    total, _ = store.read(store.signals.waiting_summary)
    return render_template(
        "admin/household_waits.html", jobs=waiting, household_id=household_id, total=total
    )
