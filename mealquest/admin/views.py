"""The dashboard's pages and forms (the blueprint `admin`, under `/admin`).

Pages are plain server-rendered HTML; `static/refresh.js` re-fetches the
page and swaps its `#live` part in, so figures and a job's status change
without a reload (a checkbox pauses it): a job's page at each event of the
job's stream (`job_stream`), the other pages every few seconds. Everything a
page shows of a job's values (payload, result, error) is masked: URLs in
them may carry tokens in their queries.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from flask import (
    Blueprint,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError

from mealquest import audit
from mealquest.admin import actions, job_story
from mealquest.admin.charts import lay_out
from mealquest.admin.guard import (
    SESSION_ID_KEY,
    csrf_refused,
    current_operator,
    refused,
    require_operator,
    security_headers,
    sign_in,
    sign_out,
)
from mealquest.admin.job_stream import job_stream
from mealquest.admin.waiting import why_waiting
from mealquest.ascii_numbers import whole
from mealquest.extensions import get_store
from mealquest.job_history import ChartsReader, Range
from mealquest.jobs.service import flow, get_jobs
from mealquest.jobs.service.live import get_live
from mealquest.masking import mask
from mealquest.metrics.view import cached_figures
from mealquest.model.jobs import FINAL_STATUSES, Job, Status
from mealquest.model.operations import BulkAction
from mealquest.operators import operator_for_token

logger = logging.getLogger(__name__)

bp = Blueprint(
    "admin",
    __name__,
    url_prefix="/admin",
    template_folder="templates",
    static_folder="static",
)
bp.before_request(require_operator)
bp.after_request(security_headers)
bp.register_error_handler(CSRFError, csrf_refused)

PAGE_SIZE = 50
CHARTS_KEY = "mealquest.admin.charts"
# Fields a job's page shows apart, or not at all (decoded result flags).
_SHOWN_APART = {"payload", "result", "error", "result_undecodable"}
_MAX_KIND_LENGTH = 200


@bp.route("/sign-in", methods=["GET", "POST"], endpoint="sign_in")
def sign_in_form() -> ResponseReturnValue:
    if request.method == "POST":
        token = request.form.get("token", "").strip()
        operator = operator_for_token(get_store(), token) if token else None
        if operator is None:
            logger.warning("dashboard sign-in refused (not a live operator token)")
            return render_template("admin/sign_in.html", failed=True), 401
        sign_in(operator)
        audit.record(get_store(), operator, "sign-in", "dashboard")
        logger.info("operator %d signed in to the dashboard", operator.id)
        return redirect(url_for("admin.overview"), code=303)
    return render_template("admin/sign_in.html", failed=False)


@bp.post("/sign-out", endpoint="sign_out")
def sign_out_form() -> ResponseReturnValue:
    audit.record(get_store(), current_operator(), "sign-out", "dashboard")
    sign_out()
    return redirect(url_for("admin.sign_in"), code=303)


@bp.get("/")
def overview() -> ResponseReturnValue:
    figures = cached_figures().get()
    handled = set(get_jobs().registry.names())
    unhandled = {
        kind: count
        for (kind, status), count in sorted(figures.counts.items())
        if status == Status.QUEUED and kind not in handled and count
    }
    # Read now, not with the cached figures: a pause shows on the page it
    # redirects to.
    paused = {entry.kind: entry for entry in flow.paused(get_store())}
    chart_range = Range.DAY if request.args.get("range") == Range.DAY else Range.HOUR
    return render_template(
        "admin/overview.html",
        figures=figures,
        statuses=[str(status) for status in Status],
        by_status=figures.by_status(),
        oldest=figures.oldest(),
        unhandled=unhandled,
        paused=paused,
        kinds=sorted(handled | set(paused)),
        processes=get_live().standings.live_processes(),
        chart_range=str(chart_range),
        ranges=[str(name) for name in Range],
        kind_charts=lay_out(charts_reader().read(chart_range)),
    )


@bp.post("/kinds/pause")
def pause_kind() -> ResponseReturnValue:
    kind = request.form.get("kind", "")
    if kind not in get_jobs().registry.names():
        return refused(400, "No such kind.")
    return _kind_acted(kind, actions.pause(current_operator(), kind))


@bp.post("/kinds/resume")
def resume_kind() -> ResponseReturnValue:
    kind = request.form.get("kind", "")
    known = set(get_jobs().registry.names()) | {e.kind for e in flow.paused(get_store())}
    if kind not in known:
        return refused(400, "No such kind.")
    return _kind_acted(kind, actions.resume(current_operator(), kind))


def _kind_acted(kind: str, done: actions.Done) -> ResponseReturnValue:
    flash(f"{kind}: {done.value}.")
    return redirect(url_for("admin.overview"), code=303)


@bp.get("/jobs")
def jobs() -> ResponseReturnValue:
    filters, problem = filters_of(request.args)
    listed: list[Job] = []
    if problem is None:
        listed = get_jobs().list_jobs(**filters, limit=PAGE_SIZE)
    older = None
    if len(listed) == PAGE_SIZE:
        older = url_for("admin.jobs", **query_of(request.args, before=listed[-1].seq))
    return render_template(
        "admin/jobs.html",
        jobs=[_row(job) for job in listed],
        statuses=[str(status) for status in Status],
        kinds=cached_figures().get().kinds(),
        args=request.args,
        problem=problem,
        older=older,
        newest=url_for("admin.jobs", **query_of(request.args, before=None)),
        bulk_actions=[str(action) for action in BulkAction],
        filter_query=query_of(request.args),
    ), (400 if problem else 200)


@bp.get("/jobs/<job_id>")
def job(job_id: str) -> ResponseReturnValue:
    found = get_jobs().get(job_id) if len(job_id) <= 64 else None
    if found is None:
        return refused(404, "No such job.")
    fields = [
        (field.name, getattr(found, field.name))
        for field in dataclasses.fields(found)
        if field.name not in _SHOWN_APART
    ]
    return render_template(
        "admin/job.html",
        job=found,
        # Every value masked, not only the job's own: an idempotency key is
        # the household's to choose, and may be an address.
        fields=[(name, mask(str(value)) if value is not None else "") for name, value in fields],
        payload=_pretty(mask(_decoded(found.payload))),
        result=_pretty(mask(found.result)) if found.result is not None else None,
        error=mask(found.error) if found.error else None,
        story=job_story.story(get_store(), found, get_jobs().log_lines(found.id)),
        waiting=why_waiting(get_store(), get_jobs().registry, found),
        trace_id=get_jobs().trace_id(found.id),
        retryable=found.status in ("failed", "cancelled"),
        cancellable=found.status in (Status.QUEUED, Status.RUNNING),
        deletable=found.status != Status.RUNNING,
        # A job still to end is followed through its stream; an ended one
        # changes only by an operator's hand, and is refreshed every few seconds.
        following=found.status not in FINAL_STATUSES,
    )


@bp.get("/jobs/<job_id>/events")
def job_events(job_id: str) -> ResponseReturnValue:
    """The job's event stream, which its page follows (see `job_stream`)."""
    found = get_jobs().get(job_id) if len(job_id) <= 64 else None
    if found is None:
        return refused(404, "No such job.")
    # The guard let the request through: the cookie holds a live session's id.
    answer = job_stream(found, session[SESSION_ID_KEY])
    if answer is None:
        return refused(503, "The service is restarting; try again.")
    return answer


@bp.post("/jobs/<job_id>/retry")
def retry(job_id: str) -> ResponseReturnValue:
    return _acted(job_id, actions.retry(current_operator(), job_id))


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str) -> ResponseReturnValue:
    return _acted(job_id, actions.cancel(current_operator(), job_id))


@bp.post("/jobs/<job_id>/delete")
def delete(job_id: str) -> ResponseReturnValue:
    done = actions.delete(current_operator(), job_id)
    if done is actions.Done.DELETED:
        flash(f"Job {job_id} deleted.")
        return redirect(url_for("admin.jobs"), code=303)
    return _acted(job_id, done)


def _acted(job_id: str, done: actions.Done) -> ResponseReturnValue:
    flash(f"{done.value[0].upper()}{done.value[1:]}.")
    return redirect(url_for("admin.job", job_id=job_id), code=303)


# -- helpers --------------------------------------------------------------------


def charts_reader() -> ChartsReader:
    """This process's charts (they keep the periods that can no longer change)."""
    app = current_app
    reader = app.extensions.get(CHARTS_KEY)
    if reader is None:
        reader = app.extensions[CHARTS_KEY] = ChartsReader(get_store())
    assert isinstance(reader, ChartsReader)
    return reader


def filters_of(args: Any) -> tuple[dict[str, Any], str | None]:
    """The list's filters from the query, or why they cannot be used."""
    filters: dict[str, Any] = {}
    status = args.get("status", "")
    if status:
        if status not in {str(s) for s in Status}:
            return {}, "Unknown status."
        filters["status"] = Status(status)
    kind = args.get("kind", "")
    if kind:
        if len(kind) > _MAX_KIND_LENGTH:
            return {}, "That kind is too long."
        filters["kind"] = kind
    for name, key in (("household", "household_id"), ("before", "before_seq")):
        value = args.get(name, "")
        if value:
            if not (whole(value) or 0) > 0:
                return {}, f"{name.capitalize()} must be a positive whole number."
            filters[key] = int(value)
    return filters, None


def query_of(args: Any, **changes: Any) -> dict[str, Any]:
    query = {key: args.get(key) for key in ("status", "kind", "household") if args.get(key)}
    query.update({key: value for key, value in changes.items() if value is not None})
    return query


def _row(found: Job) -> dict[str, Any]:
    return {
        "id": found.id,
        "kind": found.kind,
        "status": str(found.status),
        "household_id": found.household_id,
        "attempt": f"{found.attempt}/{found.max_attempts}",
        "created_at": found.created_at,
        "finished_at": found.finished_at or "",
        "error": mask(found.error) if found.error else "",
    }


def _decoded(payload: str) -> Any:
    """The payload as JSON values (so its URLs are found whole), or as stored."""
    try:
        return json.loads(payload)
    except ValueError:
        return payload


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
