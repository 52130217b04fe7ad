"""The service's configuration: one table of settings, and the check of every value.

`create_app` starts from `DEFAULTS`, then `MEALQUEST_*` environment
variables (Flask's `from_prefixed_env`, which parses values as JSON:
`MEALQUEST_JOB_WORKERS=8` is the number 8), then the mapping a test
passes, and calls `check_config` before it builds anything. So a bad value
stops every entry point (gunicorn, `flask db upgrade`, `flask jobs work`)
before it opens or starts anything, with one line naming the variable the
operator sets:

    MEALQUEST_JOB_LEASE_SECONDS: must be a positive number (got "abc")
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, MutableMapping
from typing import Any

from mealquest.config import rules
from mealquest.config.table import (
    BLOCKED_EXIT_PER_MAX_BLOCKING,
    DEFAULTS,
    ENV_PREFIX,
    HANDLER_CONNECTIONS,
    HEARTBEATS_PER_LEASE,
    OTHER_PREFIXES,
    OTHER_VARIABLES,
    RESCUES_PER_LEASE,
    SETTINGS,
)
from mealquest.documented import DocumentedError

__all__ = ["DEFAULTS", "SETTINGS", "ConfigError", "check_config", "check_gunicorn_timeout"]


class ConfigError(DocumentedError):
    """A configuration value cannot be used; the message names its variable."""


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each `MEALQUEST_*` variable that no setting has (a typo is
    otherwise ignored: the setting keeps its default), naming the nearest
    known one."""
    known = {setting.variable for setting in SETTINGS}
    lines = []
    for name in sorted(environ):
        if (
            not name.startswith(ENV_PREFIX)
            or name in known
            or name in OTHER_VARIABLES
            or name.startswith(OTHER_PREFIXES)
        ):
            continue
        nearest = difflib.get_close_matches(name, sorted(known | OTHER_VARIABLES), n=1)
        hint = f"; did you mean {nearest[0]}?" if nearest else ""
        lines.append(f"{name} is no setting of this service and is ignored{hint}")
    return lines


def check_config(config: MutableMapping[str, Any]) -> None:
    """Check every setting by its rule, derive the values left to follow
    others, and write the normalised values back; raise ConfigError at the
    first bad one."""
    values = {}
    for setting in SETTINGS:
        try:
            values[setting.key] = setting.rule(config.get(setting.key))
        except rules.Secret as invalid:
            raise ConfigError(f"{setting.variable}: {invalid}") from None
        except rules.Invalid as invalid:
            raise _error(setting.key, str(invalid), config.get(setting.key)) from None
    _derive(values, config)
    config.update(values)


def _derive(values: dict[str, Any], given: Mapping[str, Any]) -> None:
    """The heartbeat and the rescue interval follow the lease unless set, so
    that changing the lease alone keeps them consistent with it; and the
    settings that only make sense together are checked together."""
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
    _check_blocked_exit(values, given)
    if values["PG_RUNNER_POOL_SIZE"] is None:
        # Connections the handlers' writes share, and the heartbeat's, the
        # completer's and the producer's.
        values["PG_RUNNER_POOL_SIZE"] = min(values["JOB_WORKERS"], HANDLER_CONNECTIONS) + 3
    # A transaction pooler gives a LISTEN's server connection to other clients.
    through_transaction_pooler = values["PG_POOLER"] == "transaction"
    if values["PG_LISTEN"] is None:
        values["PG_LISTEN"] = not through_transaction_pooler
    elif values["PG_LISTEN"] and through_transaction_pooler:
        raise ConfigError(
            f"{ENV_PREFIX}PG_LISTEN: must be off (or unset) with "
            f"{ENV_PREFIX}PG_POOLER=transaction: a transaction pooler cannot hold a LISTEN"
        )
    if values["DASHBOARD"] and values["SECRET_KEY"] is None:
        raise ConfigError(
            f"{ENV_PREFIX}SECRET_KEY: must be set ({rules.MIN_SECRET_KEY_LENGTH} characters "
            f"or more) when {ENV_PREFIX}DASHBOARD is on"
        )
    if values["METRICS_PORT"] is not None and values["METRICS_PORT"] > rules.MAX_PORT:
        port = values["METRICS_PORT"]
        raise _error("METRICS_PORT", f"must be a port number, 1 to {rules.MAX_PORT}", port)


def _check_blocked_exit(values: dict[str, Any], given: Mapping[str, Any]) -> None:
    """A process exits once its event loop has been blocked past the limit; its
    jobs' leases were last renewed up to a heartbeat before the block began,
    so the lease must outlast both, or another process rescues and runs a job
    whose handler still runs."""
    if values["JOB_BLOCKED_EXIT_SECONDS"] is None:
        monitor = values["JOB_MAX_BLOCKING_SECONDS"] or DEFAULTS["JOB_MAX_BLOCKING_SECONDS"]
        values["JOB_BLOCKED_EXIT_SECONDS"] = monitor * BLOCKED_EXIT_PER_MAX_BLOCKING
    limit = values["JOB_BLOCKED_EXIT_SECONDS"]
    heartbeat = values["JOB_HEARTBEAT_SECONDS"]
    if not values["JOB_LEASE_SECONDS"] > limit + heartbeat:
        raise _error(
            "JOB_LEASE_SECONDS",
            f"must exceed {ENV_PREFIX}JOB_BLOCKED_EXIT_SECONDS ({limit:g}) plus "
            f"{ENV_PREFIX}JOB_HEARTBEAT_SECONDS ({heartbeat:g}), so that a process whose "
            "event loop is blocked exits before its jobs' leases expire",
            given["JOB_LEASE_SECONDS"],
        )


def check_gunicorn_timeout(config: Mapping[str, Any], timeout: float) -> None:
    """Under gunicorn, whose master kills a worker that has not said it lives
    for `timeout` seconds (its event loop blocked): a worker that runs jobs
    must be killed before their leases expire. ConfigError (one line) if not;
    `config` is a checked configuration."""
    if not config["JOB_POOL_IN_WEB"]:
        return  # web-only workers hold no lease
    if timeout <= 0:
        raise ConfigError(
            "gunicorn's timeout is 0, which never kills a worker whose event loop is blocked: "
            "its jobs' leases would expire while it lives; set one (gunicorn.conf.py), or run "
            f"the jobs in `flask jobs work` processes ({ENV_PREFIX}JOB_POOL_IN_WEB=false)"
        )
    lease, heartbeat = config["JOB_LEASE_SECONDS"], config["JOB_HEARTBEAT_SECONDS"]
    if not lease > timeout + heartbeat:
        raise ConfigError(
            f"{ENV_PREFIX}JOB_LEASE_SECONDS: must exceed gunicorn's timeout ({timeout:g}) plus "
            f"{ENV_PREFIX}JOB_HEARTBEAT_SECONDS ({heartbeat:g}), so that gunicorn kills a "
            f"worker whose event loop is blocked before its jobs' leases expire (got {lease:g})"
        )


def _error(key: str, reason: str, value: Any) -> ConfigError:
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):
        shown = repr(value)
    return ConfigError(f"{ENV_PREFIX}{key}: {reason} (got {shown})")
