"""MkDocs hooks: the reference pages that are generated from the code.

A page holds a marker where its generated part goes, so that the prose
around it stays written by hand and the part that would drift (every
setting, the HTTP API, each migration's notes) is read from the code at
each build: the settings table (`mealquest.config.table`), the OpenAPI
document the service serves, and the leading comment of each migration.
The CLI (mkdocs-click) and the Python API (mkdocstrings) have plugins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

from mealquest import create_app
from mealquest.config.table import markdown_table
from mealquest.openapi import build_document

ROOT = Path(__file__).resolve().parents[1]


def settings_table() -> str:
    return markdown_table()


def http_api() -> str:
    # create_app opens nothing: the document is read from the views' declarations.
    app = create_app({"TESTING": True, "DATABASE": os.devnull})
    with app.app_context():
        document = build_document(app)
    return str(OpenAPIV3DocumentationHandler(document, style="MKDOCS").write())


def migration_notes() -> str:
    parts = []
    for database, title in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        parts.append(f"### {title}\n")
        for path in sorted((ROOT / "migrations" / database).glob("*.sql")):
            parts.append(f"- **`{path.stem}`**: {_leading_comment(path)}")
        parts.append("")
    return "\n".join(parts)


def _leading_comment(path: Path) -> str:
    """The migration's first paragraph of comment: what it does and why."""
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        text = line[2:].strip()
        if not text:
            if lines:
                break
            continue
        lines.append(text)
    # A header that restates the file's number says nothing the name does not.
    return re.sub(r"^\d{4}: ", "", " ".join(lines))


MARKERS: dict[str, Callable[[], str]] = {
    "<!-- mealquest: settings table -->": settings_table,
    "<!-- mealquest: http api -->": http_api,
    "<!-- mealquest: migrations -->": migration_notes,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
