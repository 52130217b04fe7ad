"""Times as the database stores them: fixed-width UTC text that sorts as the instants do."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from mealquest.clock import from_text, to_text

MOMENTS = [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(5, 1, 2, 3, 4, 5, tzinfo=UTC),
    datetime(999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 12, 6, 23, 55, 48, 145_717, tzinfo=UTC),
    datetime(2026, 12, 6, 23, 55, 48, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
]


@pytest.mark.parametrize("moment", MOMENTS, ids=str)
def test_a_time_is_the_same_text_in_any_zone_and_reads_back(moment: datetime) -> None:
    # East of UTC near the first year, west near the last: both in range.
    offset = (
        timedelta(hours=5, minutes=30) if moment.year < 5000 else -timedelta(hours=5, minutes=30)
    )
    elsewhere = moment.astimezone(timezone(offset))

    text = to_text(moment)

    assert text == to_text(elsewhere)
    assert len(text) == len("2026-12-06T23:55:48.145717Z")
    assert text[10] == "T"
    assert text.endswith("Z")
    assert from_text(text) == moment
    # The very zone object: `to_text` formats a time in it without converting.
    assert from_text(text).tzinfo is UTC


def test_the_texts_sort_as_the_times_do() -> None:
    texts = [to_text(moment) for moment in MOMENTS]

    assert sorted(texts) == [to_text(moment) for moment in sorted(MOMENTS)]
