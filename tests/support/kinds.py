"""Job kinds the tests register: real handlers, so the real runner runs them."""

from __future__ import annotations

import os
import time
from typing import Any

import gevent
from gevent.monkey import get_original
from marshmallow import (
    Schema,
    ValidationError,
    fields,
    post_load,
    pre_load,
    validate,
    validates_schema,
)

from mealquest.jobs.context import JobContext
from mealquest.jobs.registry import Backoff, KindOptions, Registry
from mealquest.model.jobs import Failure, Snooze
from tests.support import chaos_ledger, shared_lines
from tests.support.gates import pass_gate

SECRET = "sk_live_TOPSECRET_7f3a9"


class ValueSchema(Schema):
    value = fields.Integer(required=True, strict=True)


class MessageSchema(Schema):
    message = fields.String(required=True)


class SecretSchema(Schema):
    secret = fields.String(required=True)


class SecondsSchema(Schema):
    seconds = fields.Float(required=True)


class StepsSchema(Schema):
    steps = fields.Integer(required=True, strict=True)
    pause = fields.Float(load_default=0.0)


class StepResultSchema(Schema):
    step = fields.Integer(required=True, strict=True)
    done = fields.Boolean(load_default=False)


class BigStepSchema(Schema):
    step = fields.Integer(required=True, strict=True)
    pad = fields.String(load_default="")


class EmptySchema(Schema):
    pass


class LogSchema(Schema):
    log = fields.String(required=True)
    seconds = fields.Float(load_default=0.0)


class TalkSchema(Schema):
    lines = fields.Integer(required=True)
    text = fields.String(load_default="")
    fail_first = fields.Boolean(load_default=False)


def talk(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Logs `lines` lines through `ctx.log` (the first with `text`), and fails
    its first attempt when asked to."""
    ctx.log.info("attempt %d says: %s", ctx.attempt, payload["text"])
    for number in range(2, payload["lines"] + 1):
        ctx.log.warning("line %d", number)
    if payload["fail_first"] and ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {}


class FlakySchema(Schema):
    fail_times = fields.Integer(required=True, strict=True)


class AttemptSchema(Schema):
    attempt = fields.Integer(required=True, strict=True)


class GateSchema(Schema):
    url = fields.String(required=True)


class GateLogSchema(Schema):
    url = fields.String(required=True)
    log = fields.String(required=True)


class GatePassedSchema(Schema):
    pid = fields.Integer(required=True, strict=True)


class SnoozeSchema(Schema):
    seconds = fields.Float(required=True)
    times = fields.Integer(load_default=1, strict=True)


class SnoozeAtGateSchema(Schema):
    url = fields.String(required=True)


class RatedSchema(Schema):
    key = fields.String(required=True)


class BlockHubSchema(Schema):
    pid = fields.Integer(required=True, strict=True)
    log = fields.String(required=True)


def succeed(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"value": payload["value"]}


def fail_with_failure(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    raise Failure(payload["message"])


def fail_with_number(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    raise Failure(payload["value"])  # a handler's bug, on purpose: not text


def raise_secret_error(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    raise RuntimeError(f"upstream answered 500 for https://api.example/?token={payload['secret']}")


def sleep(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    gevent.sleep(payload["seconds"])
    return {}


def wait_for_gate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Runs until the test opens the gate at `url` (tests.support.gates), in any
    process; says which process it ran in."""
    pass_gate(payload["url"])
    return {"pid": os.getpid()}


def publish_then_finish(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    for step in range(1, payload["steps"] + 1):
        ctx.publish({"step": step})
        gevent.sleep(payload["pause"])
    return {"step": payload["steps"], "done": True}


def publish_big(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Publishes `steps` partial results of about 200 KB each: what fills a
    stalled stream reader's socket buffers."""
    for step in range(1, payload["steps"] + 1):
        ctx.publish({"step": step, "pad": "x" * 200_000})
        gevent.sleep(payload["pause"])
    return {"step": payload["steps"]}


def append_job_id(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Records each run in a file shared by processes (`shared_lines`)."""
    if payload["seconds"]:
        gevent.sleep(payload["seconds"])
    shared_lines.append(payload["log"], f"{ctx.job_id} {os.getpid()} {ctx.claim}")
    return {}


def ledger_run(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The chaos test's kind: a `start` line when the run begins and an `end`
    line when its work is done, each with the job, the pid, the claim and
    the wall-clock time (`tests.support.chaos_ledger` writes and reads them)."""
    chaos_ledger.append(payload["log"], "start", ctx.job_id, ctx.claim)
    if payload["seconds"]:
        gevent.sleep(payload["seconds"])
    chaos_ledger.append(payload["log"], "end", ctx.job_id, ctx.claim)
    return {}


class BatchReportSchema(Schema):
    batch_id = fields.String(required=True)
    succeeded = fields.List(fields.String(), required=True)
    failed = fields.List(fields.String(), required=True)
    cancelled = fields.List(fields.String(), required=True)


def batch_report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A batch's callback: records each run (as `append_job_id`) and answers
    what it was given of its batch."""
    append_job_id(payload, ctx)
    outcome = ctx.batch()
    if outcome is None:
        raise Failure("not a batch's callback")
    return outcome.as_dict()


def log_around_gate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Writes `+ ID PID` to the shared log file when it starts and `- ID PID` when
    it ends, and waits at the gate between: the lines, in file order, say how
    many of these jobs ran at once across processes (see `most_at_once`)."""
    shared_lines.append(payload["log"], f"+ {ctx.job_id} {os.getpid()}")
    try:
        pass_gate(payload["url"])
    finally:
        shared_lines.append(payload["log"], f"- {ctx.job_id} {os.getpid()}")
    return {"pid": os.getpid()}


def most_at_once(log_path: str) -> int:
    """The most jobs of `log_around_gate` between their start and end lines at once."""
    running = most = 0
    with open(log_path) as log:
        for line in log:
            running += 1 if line.startswith("+") else -1
            most = max(most, running)
    return most


# A sleep that holds the event loop even in a monkey-patched process.
_blocking_sleep = get_original("time", "sleep")


def block_hub_in(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """In the process `pid`, holds its event loop (a sleep gevent cannot make
    cooperative) until that process dies; in any other, returns at once.
    Each start is logged as `start JOB_ID PID`."""
    shared_lines.append(payload["log"], f"start {ctx.job_id} {os.getpid()}")
    if os.getpid() == payload["pid"]:
        while True:
            _blocking_sleep(60)
    return {"pid": os.getpid()}


def busy(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Keeps the CPU busy for `seconds`, letting the event loop run between
    slices of a few milliseconds, as a well-behaved CPU-heavy handler does."""
    end = time.monotonic() + payload["seconds"]
    while time.monotonic() < end:
        slice_end = time.monotonic() + 0.005
        while time.monotonic() < slice_end:
            pass
        gevent.sleep(0)
    return {}


def sleep_on_first_attempt(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    if ctx.attempt == 1:
        gevent.sleep(payload["seconds"])
    return {}


def sleep_reporting_stop(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Attempt 1 sleeps; whatever stops it early is written to the log file."""
    if ctx.attempt == 1:
        try:
            gevent.sleep(payload["seconds"])
        except BaseException as stop:
            with open(payload["log"], "a") as log:
                log.write(f"attempt 1 stopped by {type(stop).__name__}\n")
            raise
    return {}


def flaky(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    if ctx.attempt <= payload["fail_times"]:
        raise ConnectionError(f"flaky dependency, token={SECRET}")
    return {"attempt": ctx.attempt}


def until_cancelled(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A cooperative handler: publishes a step, then stops as soon as its job
    is cancelled (the cancel is what ends it)."""
    ctx.publish({"step": 1})
    while not ctx.cancelled:
        gevent.sleep(0.005)
    return {"step": 1, "done": False}


class FollowUpSchema(Schema):
    values = fields.List(fields.Integer(strict=True), required=True)
    fail_times = fields.Integer(load_default=0, strict=True)
    failure = fields.String(load_default=None)


def enqueue_follow_ups(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Enqueues a `succeed` job per value, then fails (a Failure, or its first
    `fail_times` attempts) or succeeds."""
    for value in payload["values"]:
        ctx.enqueue("succeed", {"value": value}, priority=value)
    if payload["failure"]:
        raise Failure(payload["failure"])
    if ctx.attempt <= payload["fail_times"]:
        raise ConnectionError("flaky dependency")
    return {"attempt": ctx.attempt}


def snooze_then_succeed(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Snoozes for `seconds` on each of its first `times` runs, then succeeds."""
    if ctx.snoozes < payload["times"]:
        raise Snooze(payload["seconds"])
    return {"attempt": ctx.attempt}


def snooze_at_gate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Waits at the gate, then snoozes (whatever happened meanwhile)."""
    pass_gate(payload["url"])
    raise Snooze(60.0)


def bad_result(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"value": "not a number"}


class RangeSchema(Schema):
    """A payload checked before its fields are read, and as a whole after."""

    low = fields.Integer(required=True, strict=True)
    high = fields.Integer(required=True, strict=True)

    @pre_load
    def refuse_thirteen(self, data: Any, **kwargs: Any) -> Any:
        if isinstance(data, dict) and data.get("low") == 13:
            raise ValidationError("13 is refused before the fields are read")
        return data

    @validates_schema
    def low_below_high(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data["low"] >= data["high"]:
            raise ValidationError("must be above low", "high")


class OneAtATimeSchema(Schema):
    """A hook that takes the whole collection, written for one payload at a time."""

    value = fields.Integer(required=True, strict=True)

    @post_load(pass_collection=True)
    def copy(self, data: dict[str, Any], many: bool, **kwargs: Any) -> dict[str, Any]:
        return {"value": data["value"]}


def accept(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {}


FAST_RETRY = Backoff(base_seconds=0.01, factor=2.0, max_seconds=0.05, jitter=0.0)
# The `rated` kind's rate: two starts per partition in any second.
RATED = (2, 1.0)
# The `rated_hourly` kind's: a partition it fills stays full for the whole test.
RATED_HOURLY = (2, 3600.0)


class AskSchema(Schema):
    log = fields.String(required=True)
    timeout = fields.Float(load_default=86_400.0)
    # A gate the job passes between its step and its wait (a test holds it there).
    gate = fields.String(load_default=None)


class AnswerSchema(Schema):
    count = fields.Integer(required=True, strict=True, validate=validate.Range(min=0, max=100))


class AskedSchema(Schema):
    answer = fields.Integer(allow_none=True, required=True)
    prepared = fields.Integer(required=True)


def _prepare(log: str) -> dict[str, Any]:
    """The step: counted in the log, one line a run of it."""
    shared_lines.append(log, f"step {os.getpid()}")
    with open(log) as lines:
        return {"prepared": sum(1 for line in lines if line.startswith("step "))}


def ask_household(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """A step, then (past the gate, if any) a wait for the household's `answer`."""
    prepared = ctx.step("prepare", _prepare, payload["log"])
    if payload["gate"]:
        pass_gate(payload["gate"])
    answer = ctx.wait_for(
        "answer",
        timeout_seconds=payload["timeout"],
        prompt={"question": "how many?", "prepared": prepared["prepared"]},
    )
    return {
        "answer": None if answer is None else answer["count"],
        "prepared": prepared["prepared"],
    }


def register_test_kinds(registry: Registry) -> None:
    registry.register(
        "ask_household",
        ask_household,
        payload=AskSchema,
        result=AskedSchema,
        # A run cut short (its process killed) is run again.
        options=KindOptions(
            max_attempts=3,
            backoff=FAST_RETRY,
            signals={"answer": AnswerSchema, "other": AnswerSchema},
        ),
    )
    registry.register("succeed", succeed, payload=ValueSchema, result=ValueSchema)
    registry.register("range", accept, payload=RangeSchema, result=EmptySchema)
    registry.register("one_at_a_time", accept, payload=OneAtATimeSchema, result=EmptySchema)
    registry.register(
        "fail_with_failure", fail_with_failure, payload=MessageSchema, result=EmptySchema
    )
    registry.register("fail_with_number", fail_with_number, payload=ValueSchema, result=EmptySchema)
    registry.register(
        "raise_secret_error", raise_secret_error, payload=SecretSchema, result=EmptySchema
    )
    registry.register("sleep", sleep, payload=SecondsSchema, result=EmptySchema)
    registry.register(
        "sleep_retried",
        sleep,
        payload=SecondsSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "hang",
        sleep,
        payload=SecondsSchema,
        result=EmptySchema,
        options=KindOptions(timeout_seconds=0.3),
    )
    registry.register(
        "hang_retried",
        sleep,
        payload=SecondsSchema,
        result=EmptySchema,
        options=KindOptions(timeout_seconds=0.3, max_attempts=2, backoff=FAST_RETRY),
    )
    registry.register("wait_for_gate", wait_for_gate, payload=GateSchema, result=GatePassedSchema)
    registry.register(
        "wait_for_gate_retried",
        wait_for_gate,
        payload=GateSchema,
        result=GatePassedSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "publish_then_finish", publish_then_finish, payload=StepsSchema, result=StepResultSchema
    )
    registry.register("publish_big", publish_big, payload=StepsSchema, result=BigStepSchema)
    registry.register("append_job_id", append_job_id, payload=LogSchema, result=EmptySchema)
    registry.register("batch_report", batch_report, payload=LogSchema, result=BatchReportSchema)
    registry.register(
        "talk",
        talk,
        payload=TalkSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=2, backoff=FAST_RETRY),
    )
    # Of several attempts, each run's start and end in the ledger: a run cut
    # short by a killed process is run again (the chaos test's kind).
    registry.register(
        "ledger_run",
        ledger_run,
        payload=LogSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    # The same as `append_job_id`, of several attempts.
    registry.register(
        "append_job_id_retried",
        append_job_id,
        payload=LogSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "flaky",
        flaky,
        payload=FlakySchema,
        result=AttemptSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "sleep_on_first_attempt",
        sleep_on_first_attempt,
        payload=SecondsSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "sleep_reporting_stop",
        sleep_reporting_stop,
        payload=LogSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register("bad_result", bad_result, payload=EmptySchema, result=ValueSchema)
    registry.register(
        "block_hub_in",
        block_hub_in,
        payload=BlockHubSchema,
        result=GatePassedSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register("busy", busy, payload=SecondsSchema, result=EmptySchema)
    registry.register(
        "until_cancelled",
        until_cancelled,
        payload=EmptySchema,
        result=StepResultSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "enqueue_follow_ups",
        enqueue_follow_ups,
        payload=FollowUpSchema,
        result=AttemptSchema,
        options=KindOptions(max_attempts=3, backoff=FAST_RETRY),
    )
    registry.register(
        "capped_per_process",
        log_around_gate,
        payload=GateLogSchema,
        result=GatePassedSchema,
        options=KindOptions(max_running_per_process=2),
    )
    registry.register(
        "capped_deployment",
        log_around_gate,
        payload=GateLogSchema,
        result=GatePassedSchema,
        options=KindOptions(max_running=2),
    )
    registry.register("gated", log_around_gate, payload=GateLogSchema, result=GatePassedSchema)
    registry.register(
        "snooze_then_succeed",
        snooze_then_succeed,
        payload=SnoozeSchema,
        result=AttemptSchema,
        options=KindOptions(max_attempts=2, backoff=FAST_RETRY),
    )
    registry.register(
        "snooze_at_gate", snooze_at_gate, payload=SnoozeAtGateSchema, result=EmptySchema
    )
    registry.register(
        "rated",
        accept,
        payload=RatedSchema,
        result=EmptySchema,
        options=KindOptions(partition="key", rate=RATED),
    )
    registry.register(
        "rated_hourly",
        accept,
        payload=RatedSchema,
        result=EmptySchema,
        options=KindOptions(partition="key", rate=RATED_HOURLY),
    )
    registry.register(
        "one_per_key",
        accept,
        payload=RatedSchema,
        result=EmptySchema,
        options=KindOptions(partition="key", max_running_per_partition=1),
    )
