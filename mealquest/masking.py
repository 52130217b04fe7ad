"""Masking secrets in text shown to operators: in URLs, and credentials a line quotes.

A household's payload may carry a URL with a token in its query (a signed
link, `?token=...`), its fragment or its user info. Whatever shows jobs to
people (`flask jobs show` and `list`, the dashboard) masks every URL found
anywhere in the job's values, keeping what identifies the request (scheme,
host, path, the names of query parameters) and replacing what may be a
credential with `***`.

Where a URL ends in a text is not for its characters to say: quotes, angle
brackets and the like are legal in a URL, or let through by the clients
that send them. So a URL runs from `://` to the first space or control
character (which no URL can hold, and which the recipe import's validation
refuses), and everything in that run that the URL's syntax could make a
credential is masked: anything glued to a URL is masked with it rather than
shown. Every `://` in the run starts a URL of its own, so an address
written right after another has its own user info masked too.

Beyond URLs, a text may quote a credential outright, and is masked there
too: a service token (`mq_…`, `mqop_…`), what follows `Bearer`, the value of
a `password=`, `secret:`, `token=` (and the like), and the user info, query
and fragment of an address written without its scheme
(`user:pw@db.example/x`, `recipes.example/r?sig=…`). The job log lines
handlers keep (`ctx.log`) and the service's own log lines (`mealquest.logs`)
are masked by this one function, `mask_text`.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"

# A URL anywhere in a text: an optional scheme, `://`, then up to the first
# space or control character.
URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z0-9+.-]*://[^\x00-\x20\x7f]*")
_AUTHORITY_END = re.compile(r"[/?#]")
# A query parameter's name that is shown: one that looks like a name. Any
# other (one made by a raw `&` inside a value, say) is masked with its value.
_NAME = re.compile(r"[A-Za-z0-9_.~%\[\]-]{1,64}")
# Credentials quoted outright; group 1 is what is masked. Each is looked for
# only where a plain substring test finds its mark: every log line of the
# service is masked, and most have none of them.
_TOKEN = re.compile(r"(?<![A-Za-z0-9_])mq(?:op)?_([A-Za-z0-9_-]+)")
_BEARER = re.compile(r"(?i:\bbearer)\s+(\S+)")
_ASSIGNMENT_NAMES = ("password", "passwd", "pwd", "secret", "token", "api_key", "apikey")
_ASSIGNMENT = re.compile(
    r"(?i:\b(?:password|passwd|pwd|secret|token|access_token|api_?key))\s*[=:]\s*([^\s&;,]*)"
)
# An address without its scheme: a dotted host name, with user info, a path,
# a query or a fragment (one with `://` before it is a URL's, masked as such).
_SCHEMELESS = re.compile(
    r"(?<![A-Za-z0-9+.:/@-])(?P<user>[^\s/@:]+:[^\s/@]*@)?"
    r"(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?::[0-9]+)?(?:/[^\s?#]*)?"
    r"(?:\?(?P<query>[^\s#]*))?(?:#(?P<fragment>\S*))?"
)

Span = tuple[int, int]


def mask(value: Any) -> Any:
    """`value` with every URL and credential in it masked, through dicts, lists and strings."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {key: mask(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask(item) for item in value]
    return value


def mask_url(url: str) -> str:
    """Query values, the fragment and user info of `url` replaced by `***`."""
    return mask_text(url)


def mask_text(text: str) -> str:
    """`text` with the secrets of every URL and every credential it quotes replaced by `***`."""
    spans: list[Span] = []
    if "://" in text:
        for found in URL_IN_TEXT.finditer(text):
            spans += _secrets(text, found.start(), found.end())
    if "mq" in text:
        spans += [found.span(1) for found in _TOKEN.finditer(text)]
    lowered = text.lower()
    if "bearer" in lowered:
        spans += [found.span(1) for found in _BEARER.finditer(text)]
    if any(name in lowered for name in _ASSIGNMENT_NAMES):
        spans += [found.span(1) for found in _ASSIGNMENT.finditer(text)]
    if "@" in text or "?" in text or "#" in text:
        for found in _SCHEMELESS.finditer(text):
            spans += _schemeless_secrets(text, found)
    return _replaced(text, spans)


def _schemeless_secrets(text: str, found: re.Match[str]) -> list[Span]:
    spans: list[Span] = []
    if found.group("user") is not None:
        start, end = found.span("user")
        spans.append((start, end - 1))  # the `@` shown, as in a URL
    if found.group("query") is not None:
        start, end = found.span("query")
        spans += _query_secrets(text, start, end, set())
    if found.group("fragment") is not None:
        spans.append(found.span("fragment"))
    return spans


def _secrets(text: str, start: int, end: int) -> list[Span]:
    """The spans of `text[start:end]` (one run of URL characters) that are a
    credential of any URL starting at one of its `://`.

    Linear in the run however many `://` it holds: the URLs of one run end
    together, so a later one's fragment and query pairs are the earlier
    ones' (each pair is read once), and a URL starting inside a span that
    already runs to the end has nothing left to mask.
    """
    spans: list[Span] = []
    masked_from = end  # [masked_from, end) is masked already
    hash_at = question_at = -1  # the first `#` and `?` found at or after an authority's end
    pairs_read: set[int] = set()
    slashes = text.find("://", start, end)
    while slashes != -1 and slashes + 3 < masked_from:
        authority = slashes + 3
        found = _AUTHORITY_END.search(text, authority, end)
        authority_end = found.start() if found else end
        at = text.rfind("@", authority, authority_end)
        if at != -1:
            spans.append((authority, at))
        if hash_at < authority_end:
            hash_at = _find(text, "#", authority_end, end)
        if hash_at + 1 < end:
            spans.append((hash_at + 1, end))
            masked_from = min(masked_from, hash_at + 1)
        if question_at < authority_end:
            question_at = _find(text, "?", authority_end, end)
        if question_at < hash_at:
            query = _query_secrets(text, question_at + 1, hash_at, pairs_read)
            spans += query
            if query and query[-1][1] == end:
                masked_from = min(masked_from, query[-1][0])
        slashes = text.find("://", slashes + 1, end)
    return spans


def _query_secrets(text: str, start: int, end: int, pairs_read: set[int]) -> list[Span]:
    """The values of the query `text[start:end]` (a pair without `=`, or with
    a name that looks like none, whole), from its first pair up to one that
    was read already (from there on, every pair was)."""
    spans: list[Span] = []
    if start == end:
        return spans
    pair = start
    while pair not in pairs_read:
        pairs_read.add(pair)
        amp = text.find("&", pair, end)
        pair_end = end if amp == -1 else amp
        equals = text.find("=", pair, pair_end)
        if equals != -1 and _NAME.fullmatch(text, pair, equals):
            spans.append((equals + 1, pair_end))
        else:
            spans.append((pair, pair_end))
        if amp == -1:
            break
        pair = amp + 1
    return spans


def _find(text: str, char: str, start: int, end: int) -> int:
    """`text.find`, with `end` for "not there"."""
    found = text.find(char, start, end)
    return end if found == -1 else found


def _replaced(text: str, spans: list[Span]) -> str:
    """`text` with each run of overlapping or touching spans replaced by one
    `***` (an empty span too: an empty value is shown masked)."""
    if not spans:
        return text
    parts: list[str] = []
    shown_from = 0
    run_start, run_end = -1, -1
    for span_start, span_end in sorted(spans):
        if run_start >= 0 and span_start <= run_end:
            run_end = max(run_end, span_end)
            continue
        if run_start >= 0:
            parts += [text[shown_from:run_start], MASK]
            shown_from = run_end
        run_start, run_end = span_start, span_end
    parts += [text[shown_from:run_start], MASK, text[run_end:]]
    return "".join(parts)


# A `Failure` message is for a person to read in a job's answer: one longer
# than this (a page's whole text, say) is cut, not stored and served in full.
MAX_FAILURE_MESSAGE = 2_000
_CUT = "…"


def bounded_failure_message(message: str) -> str:
    """`message` cut to `MAX_FAILURE_MESSAGE` characters, never inside a URL:
    a URL's credentials are masked where jobs are shown only when the URL
    is whole (a cut one might have lost the `@` that marks them)."""
    if len(message) <= MAX_FAILURE_MESSAGE:
        return message
    end = MAX_FAILURE_MESSAGE - len(_CUT)
    for url in URL_IN_TEXT.finditer(message, 0, end + 1):
        if url.end() > end:
            end = url.start()
    return message[:end] + _CUT
