"""Where the app keeps its per-process services, and how code finds them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask, current_app

from mealquest.db import open_store
from mealquest.db.driver import Store

if TYPE_CHECKING:
    from mealquest.jobs.service import JobService

STORE_KEY = "mealquest.store"
JOBS_KEY = "mealquest.jobs"


def init_store(app: Flask) -> Store:
    """Attach the store; it opens nothing until first used, in the process that uses it."""
    store = open_store(app.config)
    app.extensions[STORE_KEY] = store
    return store


def get_store(app: Flask | None = None) -> Store:
    return (app or current_app).extensions[STORE_KEY]


def get_jobs(app: Flask | None = None) -> JobService:
    return (app or current_app).extensions[JOBS_KEY]
