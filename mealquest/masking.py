"""Masking secrets that travel in URLs before a job is shown to an operator.

A household's payload may carry a URL with a token in its query (a signed
link, `?token=...`), its fragment or its user info. Whatever shows jobs to
people (`flask jobs show`, a dashboard) masks every URL found anywhere in
the job's values, keeping what identifies the request (scheme, host, path,
query keys) and replacing what may be a credential with `***`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# A URL anywhere in a text: a scheme, `://`, then up to the first character
# that cannot be in one (white space, quotes, angle brackets).
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def mask(value: Any) -> Any:
    """`value` with every URL in it masked, through dicts, lists and strings."""
    if isinstance(value, str):
        return URL_IN_TEXT.sub(lambda match: mask_url(match.group()), value)
    if isinstance(value, dict):
        return {key: mask(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask(item) for item in value]
    return value


def mask_url(url: str) -> str:
    """Query values, the fragment and user info of `url` replaced by `***`."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:  # e.g. a malformed IPv6 host: hide all but the scheme
        return url.split("://", 1)[0] + "://" + MASK
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = "&".join(_mask_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    fragment = MASK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _mask_pair(pair: str) -> str:
    key, sep, _value = pair.partition("=")
    return f"{key}={MASK}" if sep else MASK
