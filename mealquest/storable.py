"""Text from outside the service made storable by both databases.

A handler's `Failure` message and a fetched page's text are whatever their
authors made them. Two kinds of character in them would fail the write that
stores them, which for a job's outcome leaves the job running until its
lease expires: NUL, which PostgreSQL's `text` refuses (SQLite stores it),
and lone surrogates (a JSON `"\\udcff"` decodes to one), which are not
Unicode scalar values, so neither driver can encode them as UTF-8.
"""

from __future__ import annotations

import re

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """`text` with each NUL and lone surrogate replaced by U+FFFD, the
    character Unicode reserves for what could not be represented."""
    return _UNSTORABLE.sub(REPLACEMENT, text)
