"""Turning a fetched page into a recipe, with recipe-scrapers' schema.org support.

recipe-scrapers reads JSON-LD and microdata (through extruct) and uses a
site's own scraper where it has one. We never scrape HTML by hand. The
values are then cut to the sizes the `recipes` table accepts, and made
storable by both databases, so that an odd page gives a shorter recipe
rather than a failed write.

The library and what it brings (bs4, extruct, rdflib, requests) are loaded
by `parsing_library`, never by importing this module: pages are parsed
only in parser processes (`mealquest.recipes.parser_pool`), which load it
before they say they are ready, while the service's processes import this
module for `ParserFailed` and `fit_recipe` alone. Loaded at import, it was
about 0.7 s of every web and job worker's start.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin, urlsplit

from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes.fetch import Page
from mealquest.storable import storable_text

MAX_TITLE = 500
MAX_ITEMS = 300
MAX_ITEM = 5000
MAX_SHORT = 200
MAX_URL = 2048
MAX_MINUTES = 100_000
# A recipe as stored and answered, as JSON, at most: it is read whole by every
# answer that shows it, and a job's result embeds it within the bound of any
# job's result (256 KiB; the rest is the result's `recipe_id`).
MAX_RECIPE_JSON_BYTES = 255 * 1024
# What a list item cut to fit ends with.
_CUT = "…"
# The fields a stored recipe adds to what a page gives, at their widest: ids
# and the job's id (32 hex digits), a time (fixed-width UTC text).
_STORED = {
    "id": "0" * 32,
    "job_id": "0" * 32,
    "created_at": "0000-00-00T00:00:00.000000Z",
}
_HTML_TYPES = ("text/html", "application/xhtml+xml", "text/plain")


class ParserFailed(Exception):
    """The parsing library failed on this page. Carries only the error's type:
    the library's messages quote the URL."""


@dataclass(frozen=True)
class ParsingLibrary:
    """What `parse_page` calls of recipe-scrapers and w3lib."""

    scrape_html: Callable[..., Any]
    no_schema: type[Exception]
    html_to_unicode: Callable[[str | None, bytes], tuple[str, str]]


@functools.cache
def parsing_library() -> ParsingLibrary:
    """recipe-scrapers and w3lib, imported at the first call (see the module)."""
    from recipe_scrapers import scrape_html
    from recipe_scrapers._exceptions import NoSchemaFoundInWildMode
    from w3lib.encoding import html_to_unicode

    return ParsingLibrary(scrape_html, NoSchemaFoundInWildMode, html_to_unicode)


def parse_page(page: Page) -> ParsedRecipe | None:
    """The page's recipe, or None when it has none (or is not HTML).

    Pure CPU work that logs nothing and that a page can make endless: the
    service runs it in a parser process (`mealquest.recipes.parser_pool`).
    """
    content_type = (page.content_type or "").split(";", 1)[0].strip().lower()
    if content_type and content_type not in _HTML_TYPES:
        return None
    library = parsing_library()
    _encoding, html = library.html_to_unicode(page.content_type, page.body)
    try:
        scraper = library.scrape_html(html, org_url=page.url, supported_only=False)
    except library.no_schema:
        return None
    except MemoryError:
        raise  # the page is past the parser's memory limit, not the library's failure
    except Exception as error:
        raise ParserFailed(type(error).__name__) from None
    title = _text(_optional(scraper.title), MAX_TITLE)
    ingredients = _texts(_optional(scraper.ingredients))
    instructions = _texts(_optional(scraper.instructions_list))
    if title is None or not (ingredients or instructions):
        return None
    return ParsedRecipe(
        title=title,
        ingredients=ingredients,
        instructions=instructions,
        yields=_text(_optional(scraper.yields), MAX_SHORT),
        total_time_minutes=_minutes(_optional(scraper.total_time)),
        image_url=_image_url(_optional(scraper.image), page.url),
        author=_text(_optional(scraper.author), MAX_SHORT),
    )


def _optional(getter: Callable[[], Any]) -> Any:
    """A field the page may lack: recipe-scrapers raises (a variety of
    exceptions, site scrapers included) where a field is missing or odd."""
    try:
        return getter()
    except MemoryError:
        raise
    except Exception:
        return None


def _text(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    text = " ".join(storable_text(str(value)).split())
    return text[:limit] or None


def _texts(values: Any) -> list[str]:
    if not isinstance(values, list | tuple):
        return []
    texts = (_text(value, MAX_ITEM) for value in values[:MAX_ITEMS])
    return [text for text in texts if text]


def _minutes(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    minutes = round(value)
    return minutes if 0 < minutes <= MAX_MINUTES else None


def _image_url(value: Any, page_url: str) -> str | None:
    """The image's absolute http(s) address, or None where the page's value is
    none (a NUL or a lone surrogate in it: no address holds one)."""
    if not isinstance(value, str) or not value.strip() or storable_text(value) != value:
        return None
    url = urljoin(page_url, value.strip())
    if urlsplit(url).scheme not in ("http", "https") or len(url) > MAX_URL:
        return None
    return url


def _json_size(value: Any) -> int:
    """Bytes of `value` as the service writes JSON (ASCII escapes, no spaces)."""
    return len(json.dumps(value, separators=(",", ":")))


def fit_recipe(parsed: ParsedRecipe, source_url: str) -> ParsedRecipe:
    """`parsed`, its lists cut so that the recipe stored from `source_url` is
    at most `MAX_RECIPE_JSON_BYTES` of JSON.

    Every other field is already bounded by its own limit; the lists share
    what those leave, half each, a list that needs less leaving the rest to
    the other. A list keeps its items in order while they fit; the item that
    does not is cut to what room is left, ending with "…", and the items
    after it are dropped.
    """
    fixed = _json_size(
        {**_STORED, **vars(parsed), "ingredients": [], "instructions": [], "source_url": source_url}
    )
    budget = MAX_RECIPE_JSON_BYTES - fixed
    ingredients, instructions = parsed.ingredients, parsed.instructions
    needs = _json_size(ingredients) - 2, _json_size(instructions) - 2
    if sum(needs) <= budget:
        return parsed
    half = budget // 2
    if needs[0] <= half:
        shares = needs[0], budget - needs[0]
    elif needs[1] <= half:
        shares = budget - needs[1], needs[1]
    else:
        shares = half, budget - half
    return replace(
        parsed,
        ingredients=_cut_to(ingredients, shares[0]),
        instructions=_cut_to(instructions, shares[1]),
    )


def _cut_to(items: list[str], budget: int) -> list[str]:
    """The first of `items` that fit in `budget` bytes of JSON list content."""
    kept: list[str] = []
    used = 0
    for item in items:
        comma = 1 if kept else 0
        size = _json_size(item) + comma
        if used + size <= budget:
            kept.append(item)
            used += size
            continue
        room = budget - used - comma - _json_size(_CUT)
        if room > 0:
            kept.append(_prefix_within(item, room) + _CUT)
        break
    return kept


def _prefix_within(text: str, room: int) -> str:
    """The longest start of `text` whose JSON, without its quotes, takes at most `room` bytes."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if _json_size(text[:middle]) - 2 <= room:
            low = middle
        else:
            high = middle - 1
    return text[:low]
