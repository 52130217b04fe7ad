"""Job kinds: a handler with its typed payload and result, and how it retries.

Payloads and results cross the database as JSON and are typed by marshmallow
schemas only at these edges: unknown fields are rejected, so that a misspelt
field is an error at enqueue rather than a value the handler silently never
sees; inside, handlers see plain loaded values.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marshmallow import RAISE, Schema, ValidationError

from mealquest.jobs.cron import CronSchedule
from mealquest.jobs.errors import RegistrationError
from mealquest.model.jobs import OnInterrupt, PartitionLimits, Rate
from mealquest.model.signals import NAME_RULE, is_name
from mealquest.storable import storable_text

if TYPE_CHECKING:
    from mealquest.jobs.context import JobContext

Handler = Callable[[Any, "JobContext"], Any]
# What names a job's partition: a field of its payload, or a function of the
# payload as stored (validated and dumped by the kind's schema: JSON values).
PartitionOf = str | Callable[[Mapping[str, Any]], str | None]

# The longest partition key stored; a longer one is stored as its digest.
MAX_PARTITION_KEY = 255
# The longest window a rate may have: retention deletes a partition's starts
# once none has been this long.
MAX_RATE_SECONDS = 86_400.0


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n (n = the attempt that just failed, from 1):
    `min(max_seconds, base_seconds * factor ** (n - 1))`, spread by ±jitter so
    that jobs failed together by one outage do not all come back at once."""

    base_seconds: float = 5.0
    factor: float = 2.0
    max_seconds: float = 600.0
    jitter: float = 0.1

    def delay(self, attempt: int) -> float:
        base = min(self.max_seconds, self.base_seconds * self.factor ** max(attempt - 1, 0))
        return base * (1 + random.uniform(-self.jitter, self.jitter))  # noqa: S311 - not crypto


@dataclass(frozen=True)
class KindOptions:
    """How the runner treats a kind's jobs.

    `on_interrupt` is what a stop that cuts a job short, or its process's
    death, does to it (see `OnInterrupt`); None picks the default: `requeue`
    when `max_attempts` is above 1 (the author said a re-run is safe), else
    `fail` (at most once, as a job of one attempt promises).

    `cron` makes the kind periodic: a five-field cron expression, in UTC, at
    each of whose times one job of the kind is enqueued with `cron_payload`,
    for the system household (see `mealquest.jobs.runner.scheduler`).
    Concurrency caps (None: no cap): `max_running_per_process` is how many of
    the kind's jobs one process runs at once (its pool claims no more);
    `max_running` how many run at once in the whole deployment, counted in
    the database by each claim (exact on SQLite, where writes take turns; on
    PostgreSQL claims that could take the kind count under an advisory lock
    per kind). Every process should register a kind with the same caps.

    Limits per partition: `partition` names the partition of a job's
    payload, computed once at enqueue and stored with the job: a payload
    field (its value, as stored), or a function of the payload as stored
    (validated and dumped by the schema: plain JSON values) returning a
    string, or None for no partition (no limit). A key longer than 255
    characters is stored as its SHA-256 digest. `max_running_per_partition`
    is how many of a partition's jobs run at once in the whole deployment;
    `rate=(count, per_seconds)` how many of them may start in any window of
    `per_seconds` (at most a day). Both are exact across processes and
    hosts, and claims pass over a partition at its limit to take the next
    job in their order. Register a kind with the same limits everywhere.

    `signals` are the answers a job of the kind may wait for from its
    household (`ctx.wait_for`), each with the marshmallow schema that
    validates it before it is stored (`POST /api/v1/jobs/{id}/signals/{name}`).
    """

    max_attempts: int = 1
    backoff: Backoff = field(default_factory=Backoff)
    timeout_seconds: float = 600.0
    on_interrupt: OnInterrupt | None = None
    cron: str | None = None
    cron_payload: Mapping[str, Any] = field(default_factory=dict)
    max_running_per_process: int | None = None
    max_running: int | None = None
    partition: PartitionOf | None = None
    max_running_per_partition: int | None = None
    rate: tuple[int, float] | None = None
    signals: Mapping[str, Schema | type[Schema]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise RegistrationError("max_attempts must be at least 1")
        if self.timeout_seconds <= 0:
            raise RegistrationError("timeout_seconds must be positive")
        if self.on_interrupt is not None and not isinstance(self.on_interrupt, OnInterrupt):
            raise RegistrationError("on_interrupt must be an OnInterrupt or None")
        if self.cron is not None:
            try:
                CronSchedule(self.cron)
            except ValueError as error:
                raise RegistrationError(f"cron {self.cron!r}: {error}") from None
        for name in ("max_running_per_process", "max_running", "max_running_per_partition"):
            cap = getattr(self, name)
            if cap is not None and not _whole(cap, 1):
                raise RegistrationError(f"{name} must be a whole number, 1 or more, or None")
        self._check_partition()
        for name, schema in self.signals.items():
            if not isinstance(name, str) or not is_name(name):
                raise RegistrationError(f"signal {name!r}: its name {NAME_RULE}")
            if not (
                isinstance(schema, Schema)
                or (isinstance(schema, type) and issubclass(schema, Schema))
            ):
                raise RegistrationError(f"signal {name!r}: its schema must be a marshmallow Schema")

    def signal_schema(self, name: str) -> Schema | None:
        """The schema of the signal `name` (an instance), or None if the kind
        declares no such signal."""
        schema = self.signals.get(name)
        return schema() if isinstance(schema, type) else schema

    def _check_partition(self) -> None:
        partition = self.partition
        if partition is not None and not (
            (isinstance(partition, str) and partition) or callable(partition)
        ):
            raise RegistrationError("partition must be a payload field's name or a function")
        if self.rate is not None:
            count, per = _pair(self.rate)
            if not _whole(count, 1):
                raise RegistrationError("rate's count must be a whole number, 1 or more")
            if (
                isinstance(per, bool)
                or not isinstance(per, int | float)
                or not (math.isfinite(per) and 0 < per <= MAX_RATE_SECONDS)
            ):
                raise RegistrationError(
                    f"rate's per_seconds must be above 0 and at most {MAX_RATE_SECONDS:g}"
                )
        limited = self.max_running_per_partition is not None or self.rate is not None
        if limited and partition is None:
            raise RegistrationError("max_running_per_partition and rate need a partition")

    @property
    def partition_limits(self) -> PartitionLimits | None:
        """What each partition may do; None without a partition or a limit."""
        if self.partition is None:
            return None
        if self.max_running_per_partition is None and self.rate is None:
            return None
        rate = None
        if self.rate is not None:
            count, per = _pair(self.rate)
            rate = Rate(int(count), float(per))
        return PartitionLimits(self.max_running_per_partition, rate)

    @property
    def interrupt_policy(self) -> OnInterrupt:
        if self.on_interrupt is not None:
            return self.on_interrupt
        return OnInterrupt.REQUEUE if self.max_attempts > 1 else OnInterrupt.FAIL


def _whole(value: Any, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


def _pair(rate: Any) -> tuple[Any, Any]:
    try:
        count, per = rate
    except (TypeError, ValueError):
        raise RegistrationError("rate must be (count, per_seconds)") from None
    return count, per


def _schema(schema: Schema | type[Schema]) -> Schema:
    instance = schema() if isinstance(schema, type) else schema
    if not isinstance(instance, Schema):
        raise RegistrationError("payload and result types must be marshmallow schemas")
    if instance.unknown != RAISE:
        raise RegistrationError("job schemas must reject unknown fields (unknown=RAISE)")
    return instance


def _has_collection_hooks(schema: Schema) -> bool:
    """Whether one of the schema's hooks takes the whole collection
    (`pass_collection=True`), which a `many=True` call would hand the list.
    Read from marshmallow's table of the schema's hooks: a table of another
    shape counts as having one."""
    hooks: Any = getattr(schema, "_hooks", None)
    try:
        return any(collection for entries in hooks.values() for _, collection, _ in entries)
    except (AttributeError, TypeError, ValueError):
        return True


# One encoder for every call: `json.dumps` with options builds one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)


def encode(data: Any) -> str:
    return _ENCODER.encode(data)


@dataclass(frozen=True)
class Kind:
    name: str
    handler: Handler
    payload_schema: Schema
    result_schema: Schema
    partial_schema: Schema
    options: KindOptions

    def canonical_payload(self, payload: Mapping[str, Any]) -> str:
        """Validate a payload and return the JSON stored for it (ValidationError if bad)."""
        if _is_empty(self.payload_schema) and isinstance(payload, Mapping) and not payload:
            return _EMPTY
        return encode(self.payload_schema.dump(self.payload_schema.load(payload)))

    def canonical_payloads(self, payloads: Sequence[Mapping[str, Any]]) -> list[str]:
        """`canonical_payload` of each; ValidationError with each bad payload's
        errors under its position, as `canonical_payload` gives them.

        By one load and one dump of them all (marshmallow's `many=True`: its
        cost per call is most of a small payload's validation) when that
        answers as one at a time would: the schema has no hook that takes the
        whole collection, and every payload is valid. Otherwise one at a time:
        with `many=True`, one payload's field error skips the schema's
        validators for all, and a hook's error has no position."""
        schema = self.payload_schema
        if not _has_collection_hooks(schema):
            try:
                loaded = schema.load(payloads, many=True)
            except ValidationError:
                pass
            else:
                return [encode(data) for data in schema.dump(loaded, many=True)]
        texts: list[str] = []
        errors: dict[int, Any] = {}
        for position, payload in enumerate(payloads):
            try:
                texts.append(self.canonical_payload(payload))
            except ValidationError as error:
                errors[position] = error.normalized_messages()
        if errors:
            raise ValidationError(errors)
        return texts

    def partition_key(self, stored: str) -> str | None:
        """The partition of a job with this payload (as stored), or None.
        Stored whether or not the kind's limits are on now, so that a
        release that turns them on finds its queued jobs' partitions.

        A function's answer must be a string or None (anything else is the
        kind's bug: TypeError); a field's value is taken as it is stored (a
        string as it is, any other value as its JSON).
        """
        partition = self.options.partition
        if partition is None:
            return None
        data = json.loads(stored)
        if isinstance(partition, str):
            value = data.get(partition) if isinstance(data, dict) else None
            key = None if value is None else value if isinstance(value, str) else encode(value)
        else:
            key = partition(data)
            if key is not None and not isinstance(key, str):
                raise TypeError(f"the partition of kind {self.name!r} is not a string")
        if not key:
            return None
        # As either database can store it (no NUL, no lone surrogate).
        key = storable_text(key)
        if len(key) > MAX_PARTITION_KEY:
            return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
        return key

    def load_payload(self, stored: str) -> Any:
        if stored == _EMPTY and _is_empty(self.payload_schema):
            return {}
        return self.payload_schema.load(json.loads(stored))

    def encode_result(self, value: Any) -> str:
        return _encode_typed(self.result_schema, value)

    def encode_partial(self, value: Any) -> str:
        return _encode_typed(self.partial_schema, value)


# The stored JSON of an empty object.
_EMPTY = "{}"


def _is_empty(schema: Schema) -> bool:
    """Whether the schema has no fields and no hooks: it loads and dumps `{}`
    to `{}` and refuses anything else (unknown=RAISE), so an empty mapping
    needs no marshmallow at all. Most of a no-op job's validation cost on
    the hub was marshmallow's per-call setup for such schemas."""
    hooks: Any = getattr(schema, "_hooks", None)
    return not schema.fields and not (isinstance(hooks, Mapping) and any(hooks.values()))


def _encode_typed(schema: Schema, value: Any) -> str:
    # dump() does not validate, so a mapping is loaded first (unknown fields
    # and wrong types raise) and an object is validated after dumping.
    if isinstance(value, Mapping) and not value and _is_empty(schema):
        return _EMPTY
    if isinstance(value, Mapping):
        return encode(schema.dump(schema.load(value)))
    data = schema.dump(value)
    errors = schema.validate(data)
    if errors:
        raise ValidationError(errors)
    return encode(data)


class Registry:
    """The kinds a process knows. Closed when its pool starts: a kind added
    later would be unknown to the workers already running."""

    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}
        self._closed = False

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        payload: Schema | type[Schema],
        result: Schema | type[Schema],
        partial: Schema | type[Schema] | None = None,
        options: KindOptions | None = None,
    ) -> Kind:
        if not name or not name.strip():
            raise RegistrationError("register: empty kind")
        if not callable(handler):
            raise RegistrationError(f"register {name!r}: handler is not callable")
        kind = Kind(
            name=name,
            handler=handler,
            payload_schema=_schema(payload),
            result_schema=_schema(result),
            partial_schema=_schema(partial if partial is not None else result),
            options=options or KindOptions(),
        )
        if kind.options.cron is not None:
            try:
                kind.canonical_payload(kind.options.cron_payload)
            except ValidationError as error:
                raise RegistrationError(
                    f"register {name!r}: cron_payload does not fit the payload schema: "
                    f"{error.messages}"
                ) from None
        if self._closed:
            raise RegistrationError(f"register {name!r}: the pool has already started")
        if name in self._kinds:
            raise RegistrationError(f"register {name!r}: kind already registered")
        self._kinds[name] = kind
        return kind

    def get(self, name: str) -> Kind | None:
        return self._kinds.get(name)

    def periodic(self) -> tuple[Kind, ...]:
        """The kinds registered with a cron schedule."""
        return tuple(kind for kind in self._kinds.values() if kind.options.cron is not None)

    def names(self) -> tuple[str, ...]:
        """The kinds registered, the only ones this process's pool claims."""
        return tuple(self._kinds)

    def per_process_caps(self) -> dict[str, int]:
        """Kinds whose jobs one process runs at most so many of at once."""
        return {
            name: kind.options.max_running_per_process
            for name, kind in self._kinds.items()
            if kind.options.max_running_per_process is not None
        }

    def deployment_caps(self) -> dict[str, int]:
        """Kinds whose jobs the whole deployment runs at most so many of at once."""
        return {
            name: kind.options.max_running
            for name, kind in self._kinds.items()
            if kind.options.max_running is not None
        }

    def partition_limits(self) -> dict[str, PartitionLimits]:
        """Kinds whose partitions have limits, and what each partition may do."""
        return {
            name: limits
            for name, kind in self._kinds.items()
            if (limits := kind.options.partition_limits) is not None
        }

    def close(self) -> None:
        self._closed = True
