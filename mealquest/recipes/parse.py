"""Turning a fetched page into a recipe, with recipe-scrapers' schema.org support.

recipe-scrapers reads JSON-LD and microdata (through extruct) and uses a
site's own scraper where it has one. We never scrape HTML by hand. The
values are then cut to the sizes the `recipes` table accepts, and made
storable by both databases, so that an odd page gives a shorter recipe
rather than a failed write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

from recipe_scrapers import scrape_html
from recipe_scrapers._exceptions import NoSchemaFoundInWildMode
from w3lib.encoding import html_to_unicode

from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes.fetch import Page
from mealquest.storable import storable_text

MAX_TITLE = 500
MAX_ITEMS = 300
MAX_ITEM = 5000
MAX_SHORT = 200
MAX_URL = 2048
MAX_MINUTES = 100_000
_HTML_TYPES = ("text/html", "application/xhtml+xml", "text/plain")


class ParserFailed(Exception):
    """The parsing library failed on this page. Carries only the error's type:
    the library's messages quote the URL."""


def parse_page(page: Page) -> ParsedRecipe | None:
    """The page's recipe, or None when it has none (or is not HTML).

    Pure CPU work that logs nothing and that a page can make endless: the
    service runs it in a parser process (`mealquest.recipes.parser_pool`).
    """
    content_type = (page.content_type or "").split(";", 1)[0].strip().lower()
    if content_type and content_type not in _HTML_TYPES:
        return None
    _encoding, html = html_to_unicode(page.content_type, page.body)
    try:
        scraper = scrape_html(html, org_url=page.url, supported_only=False)
    except NoSchemaFoundInWildMode:
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
