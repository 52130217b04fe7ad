"""The collector settings a serving process takes once it has started."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from mealquest.serving import collector


@pytest.fixture
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settling_leaves_what_was_made_out_of_collections_and_collects_young_objects_less_often(
    collector_restored: None,
) -> None:
    _, middle, oldest = gc.get_threshold()
    gc.unfreeze()
    made = [[], [[]]]
    assert {id(value) for value in made} <= _collected()

    collector.settle()

    assert not {id(value) for value in made} & _collected()
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, middle, oldest)


def _collected() -> set[int]:
    """The objects the collector's collections walk (frozen ones are not)."""
    return {id(value) for value in gc.get_objects()}
