"""The households page: each household's jobs by status and quota use, and
suspending, resuming and erasing one (`mealquest.operator_actions`)."""

from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from mealquest import households
from mealquest.admin.guard import current_operator, refused
from mealquest.admin.views import bp
from mealquest.ascii_numbers import whole
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from mealquest.model.households import HouseholdError
from mealquest.operator_actions import erasure, suspension

PAGE_SIZE = 50
# How long an erasure from the page waits for the household's running jobs
# to end (a request must end; the prune job deletes what they leave).
ERASE_WAIT_SECONDS = 10.0


@bp.get("/households", endpoint="households")
def listing() -> ResponseReturnValue:
    after = request.args.get("after", "")
    wanted = request.args.get("household", "")
    if (after and whole(after) is None) or (wanted and whole(wanted) is None):
        return refused(400, "A household id is a whole number.")
    found = households.household_figures(
        get_store(),
        after_id=whole(after) if after else None,
        limit=PAGE_SIZE,
        household_id=whole(wanted) if wanted else None,
    )
    older = None
    if len(found) == PAGE_SIZE and not wanted:
        older = url_for("admin.households", after=found[-1].household.id)
    return render_template(
        "admin/households.html",
        households=found,
        quota=get_jobs().max_pending_per_household,
        recent=households.RECENT_JOBS_COUNTED,
        more=older,
        wanted=wanted,
    )


def _acted(message: str) -> ResponseReturnValue:
    flash(message)
    return redirect(request.referrer or url_for("admin.households"), code=303)


@bp.post("/households/<int:household_id>/suspend", endpoint="suspend_household")
def suspend(household_id: int) -> ResponseReturnValue:
    try:
        changed = suspension.suspend(get_store(), household_id, current_operator())
    except HouseholdError as error:
        return refused(409, str(error))
    return _acted(
        f"Household {household_id} suspended: its requests are refused and its jobs wait."
        if changed
        else f"Household {household_id} was already suspended."
    )


@bp.post("/households/<int:household_id>/resume", endpoint="resume_household")
def resume(household_id: int) -> ResponseReturnValue:
    try:
        changed = suspension.resume(get_store(), household_id, current_operator())
    except HouseholdError as error:
        return refused(409, str(error))
    return _acted(
        f"Household {household_id} resumed."
        if changed
        else f"Household {household_id} was not suspended."
    )


@bp.get("/households/<int:household_id>/erase", endpoint="erase_household")
def confirm_erase(household_id: int) -> ResponseReturnValue:
    found = households.household_figures(get_store(), household_id=household_id)
    if not found:
        return refused(404, "No such household.")
    return render_template("admin/erase.html", figures=found[0])


@bp.post("/households/<int:household_id>/erase", endpoint="erase_household_run")
def erase(household_id: int) -> ResponseReturnValue:
    if request.form.get("confirm", "").strip() != str(household_id):
        flash("Type the household's id to confirm the erasure.")
        return redirect(url_for("admin.erase_household", household_id=household_id), code=303)
    try:
        done = erasure.erase(
            get_store(),
            get_jobs(),
            household_id,
            current_operator(),
            wait_seconds=ERASE_WAIT_SECONDS,
        )
    except HouseholdError as error:
        return refused(409, str(error))
    message = (
        f"Household {household_id} erased: {done.tokens} tokens, {done.jobs} jobs and "
        f"{done.recipes} recipes deleted."
    )
    if done.still_running:
        message += (
            f" {done.still_running} of its jobs are still running: they end cancelled "
            "shortly, and the hourly prune deletes them (or erase it again)."
        )
    flash(message)
    return redirect(url_for("admin.households", household=household_id), code=303)
