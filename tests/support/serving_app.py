"""The WSGI app the serving tests run under real gunicorn (`tests.support.serving_app:app`).

It is the real app from `create_app()` (configured by `MEALQUEST_*` in the
environment, as in production) plus what the tests need to drive it over
HTTP: the test job kinds, a few kinds that report which process ran them or
kill it at a chosen state change, a test-only route that enqueues any test
kind for the authenticated household, and an `X-Worker-Pid` header.
"""

# ruff: noqa: E402 - the imports after the re-execution below
from __future__ import annotations

from mealquest.serving.work_launch import restart_if_working

# `flask jobs work` re-executes monkey-patched before the app is built.
restart_if_working()

import logging
import os
import signal
import socket
from typing import Any

from flask import Blueprint, Response, request
from marshmallow import Schema, fields, validate

from mealquest.application import create_app
from mealquest.auth import token_auth
from mealquest.jobs.context import JobContext
from mealquest.jobs.registry import KindOptions, Registry
from mealquest.jobs.service import get_jobs
from mealquest.jobs.web import enqueue_route as jobs_http
from tests.support import shared_lines
from tests.support.gates import pass_gate
from tests.support.kinds import FAST_RETRY, EmptySchema, register_test_kinds

WORKER_PID_HEADER = "X-Worker-Pid"
CRASH_POINTS = ("never", "claimed", "published", "returning", "finished")


class PidSchema(Schema):
    pid = fields.Integer(required=True, strict=True)
    received = fields.Integer(load_default=None)


class PidGateSchema(Schema):
    url = fields.String(required=True)
    log = fields.String(load_default=None)


class SocketIOSchema(Schema):
    port = fields.Integer(required=True, strict=True)


class CrashSchema(Schema):
    at = fields.String(required=True, validate=validate.OneOf(CRASH_POINTS))
    log = fields.String(required=True)
    tag = fields.String(load_default="")


def _log_run(path: str | None, *words: object) -> None:
    """One line per event in a file shared by processes (`shared_lines`)."""
    if not path:
        return
    shared_lines.append(path, " ".join(str(w) for w in words))


def _kill_this_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def pid(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"pid": os.getpid()}


def pid_gate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Publishes which process runs it, then waits until the test opens the
    gate at `url` (tests.support.gates) and reports. The start is logged first:
    a test that saw the pid may count on the start line being there."""
    _log_run(payload["log"], "start", ctx.job_id, ctx.attempt, os.getpid())
    ctx.publish({"pid": os.getpid()})
    pass_gate(payload["url"])
    _log_run(payload["log"], "end", ctx.job_id, ctx.attempt, os.getpid())
    return {"pid": os.getpid()}


def socket_io(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Blocking stdlib socket calls against a slow server: cooperative only if
    the worker monkey-patched `socket` before this module was imported."""
    ctx.publish({"pid": os.getpid()})
    with socket.create_connection(("127.0.0.1", payload["port"]), timeout=30) as conn:
        conn.sendall(b"hello\n")
        received = 0
        while chunk := conn.recv(4096):
            received += len(chunk)
    return {"pid": os.getpid(), "received": received}


def _has_run(path: str, job_id: str) -> bool:
    try:
        with open(path) as lines:
            return any(line.split()[:2] == ["run", job_id] for line in lines)
    except FileNotFoundError:
        return False


def crash(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """On its first run, SIGKILLs its own process at the state change named by
    `at`; later runs go to the end. (Not by attempt: an interruption refunds
    the attempt, so the run after the crash has the same attempt number.)"""
    at, log = payload["at"], payload["log"]
    first = not _has_run(log, ctx.job_id)
    _log_run(log, "run", ctx.job_id, ctx.attempt, os.getpid())
    if first and at == "claimed":
        _kill_this_process()
    ctx.publish({"pid": os.getpid()})
    if first and at == "published":
        _kill_this_process()
    _log_run(log, "done", ctx.job_id, ctx.attempt, os.getpid())
    if first and at == "returning":
        _kill_this_process()
    if first and at == "finished":
        _kill_after_success.add(ctx.job_id)
    return {"pid": os.getpid()}


# Jobs whose process must die right after their success is recorded.
_kill_after_success: set[str] = set()


class _KillAfterFinish(logging.Handler):
    """SIGKILLs the process right after the runner recorded a `crash` job with
    `at=finished` as succeeded: the runner logs "job succeeded" just after
    that write commits, so this is the moment between the final write and
    anything else the worker would do."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() != "job succeeded" or getattr(record, "kind", None) != "crash":
            return
        if getattr(record, "job_id", None) in _kill_after_success:
            _kill_this_process()


def hog(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A poison pill: holds the event loop with a CPU loop until its process dies."""
    ctx.publish({"pid": os.getpid()})
    while True:
        pass


def register_serving_kinds(registry: Registry) -> None:
    registry.register("pid", pid, payload=EmptySchema, result=PidSchema)
    registry.register("pid_gate", pid_gate, payload=PidGateSchema, result=PidSchema)
    registry.register(
        "pid_gate_retried",
        pid_gate,
        payload=PidGateSchema,
        result=PidSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register("socket_io", socket_io, payload=SocketIOSchema, result=PidSchema)
    registry.register(
        "hog",
        hog,
        payload=EmptySchema,
        result=PidSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    # Enough attempts for a job killed once by its own crash and once more as
    # a bystander of another job's crash in the same process.
    registry.register(
        "crash",
        crash,
        payload=CrashSchema,
        result=PidSchema,
        options=KindOptions(max_attempts=5, backoff=FAST_RETRY),
    )


class EnqueueSchema(Schema):
    kind = fields.String(required=True)
    payload = fields.Dict(required=True)
    crash_after_enqueue = fields.Boolean(load_default=False)


bp = Blueprint("serving_tests", __name__, url_prefix="/api/v1/test-jobs")
_enqueue_schema = EnqueueSchema()


@bp.before_request
@token_auth.login_required
def _require_token() -> None:
    """Returns None to let an authenticated request through."""


@bp.post("")
def enqueue() -> tuple[dict[str, Any], int, dict[str, str]]:
    """Enqueues as `POST /api/v1/recipe-imports` does, `Idempotency-Key` included."""
    key = jobs_http.idempotency_key()
    body = _enqueue_schema.load(request.get_json())
    enqueued = jobs_http.enqueue(body["kind"], body["payload"], key)
    if body["crash_after_enqueue"]:
        _kill_this_process()  # the job is committed; the answer never leaves
    return jobs_http.answer(enqueued)


def _worker_pid(response: Response) -> Response:
    response.headers[WORKER_PID_HEADER] = str(os.getpid())
    return response


app = create_app()
register_test_kinds(get_jobs(app).registry)
register_serving_kinds(get_jobs(app).registry)
app.register_blueprint(bp)
app.after_request(_worker_pid)
logging.getLogger("mealquest.jobs.runner.executor").addHandler(_KillAfterFinish())
