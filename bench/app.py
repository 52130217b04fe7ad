"""The app the benchmarks run: the real one, plus bench job kinds and a trivial route.

The trivial JSON route is the HTTP baseline, so it is served by the very same
app and gunicorn settings as the route it is compared with (`bench/wsgi.py`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import gevent.event
from flask import Flask, jsonify
from marshmallow import Schema, fields

from mealquest.application import create_app
from mealquest.jobs.context import JobContext
from mealquest.jobs.service import get_jobs
from mealquest.recipes.kind import KIND


class EmptySchema(Schema):
    pass


class StampSchema(Schema):
    # time.monotonic() when enqueued: CLOCK_MONOTONIC is one clock for every
    # process of the machine, so another process's stamp compares with ours.
    enqueued = fields.Float(required=True)


class Counter:
    """Counts handler runs in this process; `done` is set when `target` is reached."""

    def __init__(self) -> None:
        self.count = 0
        self.target = -1
        self.done = gevent.event.Event()
        self.delays: list[float] = []

    def expect(self, target: int) -> None:
        self.count = 0
        self.target = target
        self.delays = []
        self.done.clear()

    def hit(self) -> None:
        self.count += 1
        if self.count == self.target:
            self.done.set()


counter = Counter()


def noop(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    counter.hit()
    return {}


def stamp(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    counter.delays.append(time.monotonic() - payload["enqueued"])
    counter.hit()
    return {}


def trivial() -> Any:
    return jsonify({"status": "ok"})


# The benchmarks queue thousands of jobs for one household: they measure the
# runner, not the per-household quota.
_NO_QUOTA = {"JOB_MAX_PENDING_PER_HOUSEHOLD": 1_000_000_000}


def create_bench_app(config: dict[str, Any] | None = None) -> Flask:
    app = create_app({**_NO_QUOTA, **(config or {})})
    registry = get_jobs(app).registry
    if os.environ.get("MEALQUEST_BENCH_NOOP_IMPORTS"):
        # `POST /api/v1/recipe-imports` as is (validation, quota, the insert, the
        # answer) with a handler that fetches nothing: what the HTTP enqueue
        # figure measures is the enqueue, not the web page's server.
        kind = registry.get(KIND)
        assert kind is not None
        registry._kinds[KIND] = dataclasses.replace(
            kind, handler=noop, result_schema=EmptySchema(), partial_schema=EmptySchema()
        )
    registry.register("noop", noop, payload=EmptySchema, result=EmptySchema)
    registry.register("stamp", stamp, payload=StampSchema, result=EmptySchema)
    app.add_url_rule("/bench/trivial", "bench_trivial", trivial)
    return app
