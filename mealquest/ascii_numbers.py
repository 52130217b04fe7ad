"""Numbers a client writes in a query string or a header: ASCII digits only.

Python's `int()` and `float()` (and so marshmallow's number fields) accept
`1_0` as ten, Arabic-Indic and other Unicode digits, surrounding spaces,
`inf` and `nan`; `str.isdecimal()` accepts the Unicode digits too. A number
that reaches the service through a URL or a header is read here instead, so
that each has one spelling: what the OpenAPI document's pattern says.
"""

from __future__ import annotations

import re
from typing import Any

from marshmallow import fields

# A JSON number's spelling (what the OpenAPI document's `number` means), in
# ASCII: an exponent is allowed, an underscore, a space or `nan` is not.
_WHOLE = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"-?[0-9]{1,30}(\.[0-9]{1,30})?([eE][-+]?[0-9]{1,4})?")


def whole(text: str) -> int | None:
    """`text` as a non-negative whole number if it is one in ASCII digits
    (at most 18 of them, below 2**63), else None."""
    return int(text) if _WHOLE.fullmatch(text) else None


def decimal(text: str) -> float | None:
    """`text` as a number spelled as JSON spells one (`12`, `2.5`, `5e-3`) in
    ASCII, else None."""
    return float(text) if _DECIMAL.fullmatch(text) else None


class WholeField(fields.Integer):
    """A query parameter's whole number, in ASCII digits only."""

    default_error_messages = {"invalid": "Not a valid integer: ASCII digits only."}  # noqa: RUF012

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, str) or whole(value) is None:
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class DecimalField(fields.Float):
    """A query parameter's number (`12`, `2.5`, `5e-3`), in ASCII only."""

    default_error_messages = {"invalid": "Not a valid number: ASCII, as JSON writes one."}  # noqa: RUF012

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, str) or decimal(value) is None:
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)
