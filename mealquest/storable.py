"""Text from outside the service, made storable by both databases or refused.

A handler's `Failure` message and a fetched page's text are whatever their
authors made them. Two kinds of character in them would fail the write that
stores them, which for a job's outcome leaves the job running until its
lease expires: NUL, which PostgreSQL's `text` refuses (SQLite stores it),
and lone surrogates (a JSON `"\\udcff"` decodes to one), which are not
Unicode scalar values, so neither driver can encode them as UTF-8.
"""

from __future__ import annotations

import re
import unicodedata

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """`text` with each NUL and lone surrogate replaced by U+FFFD, the
    character Unicode reserves for what could not be represented."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


# Control and format characters (a bidi override among them), line and
# paragraph separators, and lone surrogates.
_NOT_IN_A_NAME = {"Cc", "Cf", "Cs", "Zl", "Zp"}
MAX_NAME = 200


def name_problem(name: str) -> str | None:
    """What keeps `name` from naming a household or an operator, as the end
    of a sentence; None if nothing does. A name is shown on one line of
    listings and logs, so nothing in it may break or disguise a line (a
    newline, a bidi override); a lone surrogate is how a command line's bytes
    that are not UTF-8 arrive, and no database stores one."""
    if not 1 <= len(name) <= MAX_NAME:
        return f"has 1 to {MAX_NAME} characters"
    if any(unicodedata.category(char) in _NOT_IN_A_NAME for char in name):
        return "has no control characters and no bytes that are not UTF-8"
    return None
