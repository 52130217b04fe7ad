"""MkDocs hooks: the reference pages that are generated from the code.

A page holds a marker where its generated part goes, so that the prose
around it stays written by hand and the part that would drift (every
setting, the HTTP API, each migration's notes) is read from the code at
each build: the settings table (`mealquest.config.table`), the OpenAPI
document the service serves, and the leading comment of each migration.
The CLI (mkdocs-click) and the Python API (mkdocstrings) have plugins.

Pages that include code (`--8<-- "docs/examples/scale_recipe.py:handler"`,
pymdownx.snippets) are held to it: a build fails when a page carries a
marker the extension does not read (a formatter once put spaces around the
`<` of four of them, which then rendered as text while `mkdocs build
--strict` passed), or when a built page lacks the first line of a section
it includes.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

from mealquest.application import create_app
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


# A snippet marker as pymdownx.snippets reads it, and anything like one.
_SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$', re.MULTILINE)
_LIKE_A_SNIPPET = re.compile(r"-\s*-\s*8\s*<\s*-\s*-|--8&lt;--")
# The snippets each page includes (its source path to the files and sections).
_INCLUDED: dict[str, list[str]] = {}


def on_page_markdown(markdown: str, page: Any = None, **kwargs: Any) -> str:
    name = page.file.src_uri if page is not None else "a page"
    marked = [line for line in markdown.splitlines() if _LIKE_A_SNIPPET.search(line)]
    read = {match.group(0).strip() for match in _SNIPPET.finditer(markdown)}
    malformed = [line.strip() for line in marked if line.strip() not in read]
    if malformed:
        raise PluginError(f"{name}: a snippet marker that is not read: {malformed[0]}")
    _INCLUDED[name] = [match.group(1) for match in _SNIPPET.finditer(markdown)]
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown


def on_post_page(output: str, page: Any, **kwargs: Any) -> str:
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", output)).split())
    if _LIKE_A_SNIPPET.search(text):
        raise PluginError(f"{page.file.src_uri}: the built page shows a snippet marker")
    for reference in _INCLUDED.get(page.file.src_uri, []):
        first = _first_line(reference)
        if first and " ".join(first.split()) not in text:
            raise PluginError(f"{page.file.src_uri}: the built page lacks {reference}: {first}")
    return output


def _first_line(reference: str) -> str | None:
    """The first line of code a snippet reference includes (a named section
    `path:name`); None for another form, which is not checked."""
    path, _, section = reference.partition(":")
    if not section or section.isdigit():
        return None
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.strip().endswith(f"[start:{section}]")), None
    )
    if start is None:
        raise PluginError(f"{reference}: no section {section!r} in {path}")
    for line in lines[start + 1 :]:
        if line.strip():
            return line.strip()
    return None
