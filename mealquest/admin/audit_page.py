"""The audit log page: every operator action, newest first."""

from __future__ import annotations

from flask import render_template, request, url_for
from flask.typing import ResponseReturnValue

from mealquest import audit
from mealquest.admin.guard import refused
from mealquest.admin.views import bp
from mealquest.ascii_numbers import whole
from mealquest.extensions import get_store

PAGE_SIZE = 50


@bp.get("/audit", endpoint="audit_log")
def audit_log() -> ResponseReturnValue:
    before = request.args.get("before", "")
    if before and not ((whole(before) or 0) > 0):
        return refused(400, "Before must be a positive whole number.")
    entries = audit.entries(
        get_store(), before_seq=int(before) if before else None, limit=PAGE_SIZE
    )
    older = None
    if len(entries) == PAGE_SIZE:
        older = url_for("admin.audit_log", before=entries[-1].seq)
    return render_template("admin/audit.html", entries=entries, older=older)
