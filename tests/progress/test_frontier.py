"""The vector clock's laws, for any sequence of monotone watermark updates."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slashrt.progress import VectorClock

updates = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=60)


@given(updates)
def test_low_is_the_minimum_and_never_moves_back(steps):
    clock = VectorClock(4, start=0)
    model = [0] * 4
    previous = clock.low
    for source, delta in steps:
        moved = clock.advance(source, model[source] + delta)
        model[source] += delta
        assert clock.low == min(model)
        assert clock.low >= previous
        assert moved == (clock.low != previous)
        previous = clock.low


@given(updates, st.integers(0, 200))
def test_passed_only_when_every_source_passed(steps, t):
    clock = VectorClock(4, start=0)
    model = [0] * 4
    for source, delta in steps:
        model[source] += delta
        clock.advance(source, model[source])
    assert clock.passed(t) == all(w >= t for w in model)


def test_a_watermark_going_back_is_refused():
    clock = VectorClock(2)
    clock.advance(0, 10)
    with pytest.raises(ValueError, match="back"):
        clock.advance(0, 9)


def test_a_slow_source_holds_the_frontier():
    clock = VectorClock(3)
    for source in (0, 1):
        clock.advance(source, 1000)
    assert not clock.passed(1)  # source 2 has promised nothing yet
    clock.advance(2, 500)
    assert clock.low == 500 and clock.passed(500) and not clock.passed(501)
