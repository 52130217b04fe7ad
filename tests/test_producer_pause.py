"""How long an idle producer waits between its looks for a due job: a look
that costs little runs at every change, one that costs much keeps to a
tenth of the process's time, and no pause grows past its bound."""

from __future__ import annotations

import pytest

from mealquest.jobs.runner.producer import pause_after_look

CHANGE_CHECK = 0.005


@pytest.mark.parametrize("look", [0.0, 0.000044, 0.0005])
def test_a_cheap_look_waits_only_for_the_next_change_check(look):
    assert pause_after_look(look, CHANGE_CHECK) == CHANGE_CHECK


def test_a_look_that_passes_over_a_held_backlog_takes_a_tenth_of_the_time_at_most():
    # 2.3 ms: a look on SQLite past 5,000 jobs of one host at its limit.
    look = 0.0023
    pause = pause_after_look(look, CHANGE_CHECK)
    assert pause > CHANGE_CHECK
    assert look / (look + pause) == pytest.approx(0.1)


def test_no_look_makes_the_producer_wait_longer_than_the_bound():
    assert pause_after_look(0.5, CHANGE_CHECK) == pytest.approx(0.1)
    # A change check slower than the bound is kept as configured.
    assert pause_after_look(0.5, 0.25) == 0.25
