"""MealQuest jobs service: a durable job runner (SQLite or PostgreSQL) behind a Flask API.

`create_app` and `create_app_or_exit` live in `mealquest.application`; they
are found here too (`mealquest:create_app()` for gunicorn, `from mealquest
import create_app`), loaded on first use, so that importing one part of the
service (`mealquest.jobs`, a driver) does not load every other.
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM_APPLICATION = ("create_app", "create_app_or_exit")


def __getattr__(name: str) -> Any:
    if name in _FROM_APPLICATION:
        return getattr(importlib.import_module("mealquest.application"), name)
    raise AttributeError(f"module 'mealquest' has no attribute {name!r}")
