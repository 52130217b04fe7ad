"""`GET /healthz`: whether this process can use the database now (no auth).

Unauthenticated, so anyone can send a flood of it: each process answers
from one check of the database at most `MAX_AGE_SECONDS` old, made by one
request while the others wait for it, so a flood costs the database one
check per process per second, not one per request (and takes no connection
from the requests that need one). The check takes the write lock and writes
nothing, except while writes meet a storage fault; the migration check runs
until it first passes, then never again in this process (the code's
migrations do not change while it runs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app
from gevent.lock import Semaphore
from marshmallow import Schema, fields

from mealquest.db import database_errors, migrations
from mealquest.db.driver import Store
from mealquest.db.errors import StoreBusy, StoreUnavailable
from mealquest.errors import error_response, unavailable_response
from mealquest.extensions import get_store
from mealquest.openapi import operation

logger = logging.getLogger(__name__)

bp = Blueprint("health", __name__)

MAX_AGE_SECONDS = 1.0
_CHECK_KEY = "mealquest.health"


class HealthSchema(Schema):
    status = fields.Constant("ok", required=True)


_health_schema = HealthSchema()


@dataclass(frozen=True)
class _Checked:
    """One check's finding: None when healthy, else the store's error (or
    the type of a database library's error, whose text is not kept)."""

    unavailable: StoreUnavailable | None = None
    failed: str | None = None


class HealthCheck:
    """One process's latest check of its store, made again once older than `max_age`."""

    def __init__(
        self,
        store: Store,
        max_age: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.max_age = max_age
        self.clock = clock
        self._checked: _Checked | None = None
        self._at = 0.0
        self._one_at_a_time = Semaphore()

    def latest(self) -> _Checked:
        """A check at most `max_age` old: the last one, or one made now (by the
        first caller; those that come meanwhile wait for it, and take it)."""
        if self._fresh():
            assert self._checked is not None
            return self._checked
        with self._one_at_a_time:
            if not self._fresh():
                self._checked = self._check()
                self._at = self.clock()
            assert self._checked is not None
            return self._checked

    def _fresh(self) -> bool:
        return self._checked is not None and self.clock() - self._at < self.max_age

    def _check(self) -> _Checked:
        try:
            self.store.check_writable()
            migrations.require_migrated(self.store)
        except StoreUnavailable as error:
            # A storage fault or a dead writer is logged by the store when it starts.
            if isinstance(error, StoreBusy):
                logger.warning("health check failed: %s", type(error).__name__)
            return _Checked(unavailable=error)
        except database_errors() as error:
            # (A driver's own error text may quote its server or the statement: the type only.)
            logger.warning("health check failed: %s", type(error).__name__)
            return _Checked(failed=type(error).__name__)
        return _Checked()


def init_app(app: Flask) -> None:
    app.extensions[_CHECK_KEY] = HealthCheck(get_store(app))
    app.register_blueprint(bp)


def health_check(app: Flask | None = None) -> HealthCheck:
    check: HealthCheck = (app or current_app).extensions[_CHECK_KEY]
    return check


@bp.get("/healthz")
@operation(response=_health_schema, errors=(503,), authenticated=False)
def healthz() -> tuple[Response, int] | dict[str, Any]:
    """Whether this process can use the database now (no token needed)."""
    checked = health_check().latest()
    if checked.unavailable is not None:
        return unavailable_response(checked.unavailable)
    if checked.failed is not None:
        return error_response(503, "unavailable", "the database is not available")
    answer: dict[str, Any] = _health_schema.dump({})
    return answer
