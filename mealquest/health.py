"""`GET /healthz`: whether this process can use the database now (no auth).

Unauthenticated, so it must stay cheap: the store's `check_writable` takes
the write lock and writes nothing, except while writes meet a storage fault,
and the migration check runs until it first passes, then never again in this
process (the code's migrations do not change while it runs).
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response
from marshmallow import Schema, fields

from mealquest.db import database_errors, migrations
from mealquest.db.errors import StoreBusy, StoreUnavailable
from mealquest.errors import error_response, unavailable_response
from mealquest.extensions import get_store
from mealquest.openapi import operation

logger = logging.getLogger(__name__)

bp = Blueprint("health", __name__)


class HealthSchema(Schema):
    status = fields.Constant("ok", required=True)


_health_schema = HealthSchema()


@bp.get("/healthz")
@operation(response=_health_schema, errors=(503,), authenticated=False)
def healthz() -> tuple[Response, int] | dict[str, Any]:
    """Whether this process can use the database now (no token needed)."""
    store = get_store()
    try:
        store.check_writable()
        migrations.require_migrated(store)
    except StoreUnavailable as error:
        # A storage fault or a dead writer is logged by the store when it starts.
        if isinstance(error, StoreBusy):
            logger.warning("health check failed: %s", type(error).__name__)
        return unavailable_response(error)
    except database_errors() as error:
        # (A driver's own error text may quote its server or the statement: the type only.)
        logger.warning("health check failed: %s", type(error).__name__)
        return error_response(503, "unavailable", "the database is not available")
    return _health_schema.dump({})
