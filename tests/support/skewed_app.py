"""The serving test app on a host whose clock is 5 minutes ahead
(`tests.support.skewed_app:app`).

Only this process's idea of "now" is faked (`mealquest.clock.utc_now`, and
every module that imported it by name), not the machine's clock, and before
the app is built: what the process computes from its own clock is off by
`SKEW`, as on a host whose clock drifted. Each answer carries the process's
now in `X-Host-Now`, so a test can see the fake is in force.
"""

from __future__ import annotations

import sys
from datetime import datetime

import mealquest.clock
from mealquest.clock import to_text
from tests.support.skew import HOST_NOW_HEADER, SKEW

_real_utc_now = mealquest.clock.utc_now


def _skewed_utc_now() -> datetime:
    return _real_utc_now() + SKEW


for _module in list(sys.modules.values()):
    if getattr(_module, "utc_now", None) is _real_utc_now:
        _module.utc_now = _skewed_utc_now  # type: ignore[attr-defined]

from flask import Response  # noqa: E402  (after the clock is faked, on purpose)

from tests.support.serving_app import app  # noqa: E402


def _host_now(response: Response) -> Response:
    response.headers[HOST_NOW_HEADER] = to_text(mealquest.clock.utc_now())
    return response


app.after_request(_host_now)
