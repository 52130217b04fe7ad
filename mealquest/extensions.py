"""The app's store: attached to the app once, found by every part through `get_store`."""

from __future__ import annotations

from flask import Flask, current_app

from mealquest.db import open_store
from mealquest.db.driver import Store

STORE_KEY = "mealquest.store"


def init_store(app: Flask) -> Store:
    """Attach the store; it opens nothing until first used, in the process that uses it."""
    store = open_store(app.config)
    app.extensions[STORE_KEY] = store
    return store


def get_store(app: Flask | None = None) -> Store:
    store: Store = (app or current_app).extensions[STORE_KEY]
    return store
