"""`GET /healthz`: whether this process can use the database now (no auth)."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from flask import Blueprint, Response
from marshmallow import Schema, fields

from mealquest import migrations
from mealquest.errors import error_response
from mealquest.extensions import get_store
from mealquest.openapi import operation
from mealquest.store import StoreError, Transaction

logger = logging.getLogger(__name__)

bp = Blueprint("health", __name__)


class HealthSchema(Schema):
    status = fields.Constant("ok", required=True)


_health_schema = HealthSchema()


def _probe_write(tx: Transaction) -> None:
    # Taking the write lock is the check: the queue is useless without writes,
    # and in WAL mode a read would answer even while the lock is stuck.
    tx.execute("SELECT 1")


@bp.get("/healthz")
@operation(response=_health_schema, errors=(503,), authenticated=False)
def healthz() -> tuple[Response, int] | dict[str, Any]:
    """Whether this process can use the database now (no token needed)."""
    try:
        get_store().write(_probe_write)
        get_store().read(migrations.require_current_of, migrations.discover())
    except (StoreError, sqlite3.Error, migrations.MigrationError) as error:
        logger.warning("health check failed: %s", type(error).__name__)
        return error_response(503, "unavailable", "the database is not available")
    return _health_schema.dump({})
