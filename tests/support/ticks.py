"""A monotonic clock that moves only when the test says, for the services that take one."""

from __future__ import annotations


class Ticks:
    """A monotonic clock that moves only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
