"""The rules a configuration value must keep, one function each.

Each rule returns the value normalised (a float for seconds, an int for
counts, upper case for a choice, a bool for a flag), which is written back,
so later code reads plain values; or raises `Invalid` with the end of a
sentence ("must be a positive number") that `check_config` prefixes with
the variable's name.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from typing import Any

from mealquest.db import check_url
from mealquest.db.errors import DatabaseURLError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# The dashboard's session key: long enough that it cannot be guessed.
MIN_SECRET_KEY_LENGTH = 32
MAX_PORT = 65535

Rule = Callable[[Any], Any]


class Invalid(Exception):
    """Why a rule refuses a value ("must be ..."); `check_config` adds the key."""


class Secret(Invalid):
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
        raise Invalid("must be a positive number")
    return number


def positive_at_most(limit: float) -> Rule:
    def rule(value: Any) -> float:
        number = _number(value)
        if not 0 < number <= limit:
            raise Invalid(f"must be a positive number, {limit:g} at most")
        return number

    return rule


def not_negative(value: Any) -> float:
    number = _number(value)
    if not number >= 0:
        raise Invalid("must be a number, 0 or more")
    return number


def whole(minimum: int) -> Rule:
    def rule(value: Any) -> int:
        number = _number(value)
        if not (number.is_integer() and number >= minimum):
            raise Invalid(f"must be a whole number, {minimum} or more")
        return int(number)

    return rule


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str:
        if not isinstance(value, str) or value.upper() not in choices:
            raise Invalid(f"must be one of {', '.join(choices)}")
        return value.upper()

    return rule


def lower_one_of(*choices: str) -> Rule:
    """One of `choices`, as the docs write them (lower case)."""

    def rule(value: Any) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise Invalid(f"must be one of {', '.join(choices)}")
        return value.strip().lower()

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
    raise Invalid("must be true or false")


def file_path(value: Any) -> str | None:
    # None (or empty): the default file in the instance folder.
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise Invalid("must be a file path")
    return value


def database_url(value: Any) -> str | None:
    # None (or empty): the SQLite file DATABASE names.
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise Secret("must be a sqlite:// or postgresql:// URL")
    try:
        check_url(value)
    except DatabaseURLError as error:
        raise Secret(str(error)) from None
    return value


def networks(value: Any) -> list[str]:
    """A list of networks in CIDR notation (or one text of them, comma-separated)."""
    texts = [part for part in value.split(",") if part.strip()] if isinstance(value, str) else value
    try:
        return [str(ipaddress.ip_network(text.strip(), strict=False)) for text in texts]
    except (AttributeError, TypeError, ValueError):
        raise Invalid('must be a list of networks, e.g. ["10.1.2.0/24"]') from None


def secret_key(value: Any) -> str | None:
    # None (or empty): no key; the dashboard then refuses to start.
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) < MIN_SECRET_KEY_LENGTH:
        raise Secret(f"must be a text of {MIN_SECRET_KEY_LENGTH} characters or more")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid("must be a text")
    return value


def derived(rule: Rule) -> Rule:
    """`rule`, or None: the value is derived from another one (see `check_config`)."""

    def optional(value: Any) -> Any:
        return None if value is None else rule(value)

    return optional
