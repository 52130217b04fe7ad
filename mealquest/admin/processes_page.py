"""The processes page: every live job pool of the deployment, from the
process registry (each pool's row, renewed at its heartbeat's rhythm), so an
operator sees which hosts run which kinds and how busy they are."""

from __future__ import annotations

from flask import render_template
from flask.typing import ResponseReturnValue

from mealquest.admin.views import bp
from mealquest.jobs.service.live import get_live


@bp.get("/processes", endpoint="processes")
def processes() -> ResponseReturnValue:
    return render_template("admin/processes.html", processes=get_live().standings.live_processes())
