"""Every configuration value checked in one place, when the app is created.

`create_app` calls `check_config` before it builds anything, so a bad value
stops every entry point (gunicorn, `flask db upgrade`, `flask jobs work`)
before it opens or starts anything, with one line naming the `MEALQUEST_`
variable the operator sets:

    MEALQUEST_JOB_LEASE_SECONDS: must be a positive number (got "abc")

Values come from `DEFAULTS`, then the environment (parsed as JSON where it
is JSON, else kept as text), then a test's mapping. Each rule returns the
value normalised (a float for seconds, an int for counts, upper case for a
choice, a bool for a flag), which is written back, so later code reads
plain values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from mealquest.db import DatabaseURLError, check_url
from mealquest.recipes.addresses import AddressPolicy
from mealquest.store import SYNCHRONOUS_MODES

ENV_PREFIX = "MEALQUEST_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Without an explicit value, a process renews its leases three times per
# lease and rescues expired ones twice per lease.
HEARTBEATS_PER_LEASE = 3
RESCUES_PER_LEASE = 2
# The dashboard's session key: long enough that it cannot be guessed.
MIN_SECRET_KEY_LENGTH = 32
MAX_PORT = 65535

Rule = Callable[[Any], Any]


class ConfigError(ValueError):
    """A configuration value cannot be used; the message names its variable."""


class _Invalid(Exception):
    """Why a rule refuses a value ("must be ..."); `check_config` adds the key."""


class _Secret(_Invalid):
    """A refusal whose value is not shown: it may hold a password."""


def _number(value: Any) -> float:
    """`value` as a float, or NaN if it is not a finite number (NaN fails every range)."""
    # bool is an int to Python, but `true` is no number of seconds.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return math.nan
    return float(value)


def positive(value: Any) -> float:
    number = _number(value)
    if not number > 0:
        raise _Invalid("must be a positive number")
    return number


def not_negative(value: Any) -> float:
    number = _number(value)
    if not number >= 0:
        raise _Invalid("must be a number, 0 or more")
    return number


def whole(minimum: int) -> Rule:
    def rule(value: Any) -> int:
        number = _number(value)
        if not (number.is_integer() and number >= minimum):
            raise _Invalid(f"must be a whole number, {minimum} or more")
        return int(number)

    return rule


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str:
        if not isinstance(value, str) or value.upper() not in choices:
            raise _Invalid(f"must be one of {', '.join(choices)}")
        return value.upper()

    return rule


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _Invalid("must be true or false")


def file_path(value: Any) -> str | None:
    # None (or empty): the default file in the instance folder.
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Invalid("must be a file path")
    return value


def database_url(value: Any) -> str | None:
    # None (or empty): the SQLite file DATABASE names.
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Secret("must be a sqlite:// or postgresql:// URL")
    try:
        check_url(value)
    except DatabaseURLError as error:
        raise _Secret(str(error)) from None
    return value


def networks(value: Any) -> Any:
    try:
        AddressPolicy.build(False, value)
    except (TypeError, ValueError):
        raise _Invalid('must be a list of networks, e.g. ["10.1.2.0/24"]') from None
    return value


def secret_key(value: Any) -> str | None:
    # None (or empty): no key; the dashboard then refuses to start.
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) < MIN_SECRET_KEY_LENGTH:
        raise _Secret(f"must be a text of {MIN_SECRET_KEY_LENGTH} characters or more")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid("must be a text")
    return value


def derived(rule: Rule) -> Rule:
    """`rule`, or None: the value is derived from another one (see `_derive`)."""

    def optional(value: Any) -> Any:
        return None if value is None else rule(value)

    return optional


RULES: dict[str, Rule] = {
    "DATABASE": file_path,
    "DATABASE_URL": database_url,
    "PG_POOL_SIZE": whole(1),
    "PG_LISTEN": flag,
    "DB_SYNCHRONOUS": one_of(*SYNCHRONOUS_MODES),
    "DB_BUSY_TIMEOUT_SECONDS": positive,
    "JOB_WORKERS": whole(1),
    "JOB_POLL_SECONDS": positive,
    "JOB_CHANGE_CHECK_SECONDS": positive,
    "JOB_LEASE_SECONDS": positive,
    "JOB_HEARTBEAT_SECONDS": derived(positive),
    "JOB_RESCUE_SECONDS": derived(positive),
    "JOB_STOP_TIMEOUT_SECONDS": not_negative,
    "JOB_KILL_GRACE_SECONDS": positive,
    "JOB_UNHANDLED_REPORT_SECONDS": positive,
    "JOB_MAX_BLOCKING_SECONDS": not_negative,
    "JOB_POOL_IN_WEB": flag,
    "JOB_CRON_CATCHUP_SECONDS": positive,
    "JOB_RETENTION_DAYS": whole(0),
    "JOB_MAX_PENDING_PER_HOUSEHOLD": whole(1),
    "PROXY_FIX_HOPS": whole(0),
    "MAX_CONTENT_LENGTH": whole(1),
    "MAX_URI_LENGTH": whole(1),
    "DASHBOARD": flag,
    "SECRET_KEY": secret_key,
    "DASHBOARD_SESSION_HOURS": positive,
    "METRICS_PORT": derived(whole(1)),
    "METRICS_HOST": text,
    "LOG_LEVEL": one_of(*LOG_LEVELS),
    "ALLOW_PRIVATE_URLS": flag,
    "RECIPE_FETCH_ALLOWED_NETWORKS": networks,
    "RECIPE_FETCH_CONNECT_TIMEOUT_SECONDS": positive,
    "RECIPE_FETCH_TIMEOUT_SECONDS": positive,
    "RECIPE_FETCH_MAX_BYTES": whole(1),
    "RECIPE_FETCH_MAX_REDIRECTS": whole(0),
    # Bounds a parser process's wall clock and its CPU time (RLIMIT_CPU,
    # whole seconds: a fraction is rounded up there).
    "RECIPE_PARSE_SECONDS": positive,
    "RECIPE_IMPORT_RETRY_SECONDS": positive,
}


def check_config(config: MutableMapping[str, Any]) -> None:
    """Check every key of `RULES`, derive the job intervals left unset, and
    write the normalised values back; raise ConfigError at the first bad one."""
    values = {}
    for key, rule in RULES.items():
        try:
            values[key] = rule(config.get(key))
        except _Secret as invalid:
            raise ConfigError(f"{ENV_PREFIX}{key}: {invalid}") from None
        except _Invalid as invalid:
            raise _error(key, str(invalid), config.get(key)) from None
    _derive(values, config)
    config.update(values)


def _derive(values: dict[str, Any], given: Mapping[str, Any]) -> None:
    """The heartbeat and the rescue interval follow the lease unless set, so
    that changing the lease alone keeps them consistent with it."""
    lease = values["JOB_LEASE_SECONDS"]
    if values["JOB_HEARTBEAT_SECONDS"] is None:
        values["JOB_HEARTBEAT_SECONDS"] = lease / HEARTBEATS_PER_LEASE
    elif values["JOB_HEARTBEAT_SECONDS"] >= lease:
        raise _error(
            "JOB_HEARTBEAT_SECONDS",
            f"must be below {ENV_PREFIX}JOB_LEASE_SECONDS ({lease:g}), or unset "
            "to renew every third of the lease",
            given["JOB_HEARTBEAT_SECONDS"],
        )
    if values["JOB_RESCUE_SECONDS"] is None:
        values["JOB_RESCUE_SECONDS"] = lease / RESCUES_PER_LEASE
    if values["DASHBOARD"] and values["SECRET_KEY"] is None:
        raise ConfigError(
            f"{ENV_PREFIX}SECRET_KEY: must be set ({MIN_SECRET_KEY_LENGTH} characters or more) "
            f"when {ENV_PREFIX}DASHBOARD is on"
        )
    if values["METRICS_PORT"] is not None and values["METRICS_PORT"] > MAX_PORT:
        port = values["METRICS_PORT"]
        raise _error("METRICS_PORT", f"must be a port number, 1 to {MAX_PORT}", port)


def _error(key: str, reason: str, value: Any) -> ConfigError:
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):
        shown = repr(value)
    return ConfigError(f"{ENV_PREFIX}{key}: {reason} (got {shown})")
