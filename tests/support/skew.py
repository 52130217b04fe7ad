"""How far the skewed host's clock is off (`tests.support.skewed_app`), and the
header its answers show its now in. Kept apart from that app: importing the
app fakes the importing process's clock."""

from __future__ import annotations

from datetime import timedelta

SKEW = timedelta(minutes=5)
HOST_NOW_HEADER = "X-Host-Now"
