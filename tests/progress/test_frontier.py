"""The vector clock's laws, for any sequence of monotone watermark updates."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slashrt.progress import PointstampClock, VectorClock, make_frontier
from slashrt.progress.frontier import END_TIME, NO_TIME

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


# --- the pointstamp implementation agrees with the vector clock --------------------------------

ended = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.booleans()), max_size=60)


@given(ended)
def test_pointstamp_clock_equals_the_vector_clock(steps):
    """Same updates, same answers: moved, low, entries; a source that ends gives its
    capability up, and once every source has ended both report END_TIME."""
    clocks = [VectorClock(4, start=0), PointstampClock(4, start=0)]
    for source, delta, end in steps:
        now = clocks[0].entries[source]
        if now == END_TIME:
            continue
        time = END_TIME if end else now + delta
        moved = [clock.advance(source, time) for clock in clocks]
        assert moved[0] == moved[1]
        assert clocks[0].low == clocks[1].low
        assert clocks[0].entries == clocks[1].entries
    for source in range(4):
        moved = [clock.advance(source, END_TIME) for clock in clocks]
        assert moved[0] == moved[1]
    assert clocks[0].low == clocks[1].low == END_TIME


def test_pointstamp_clock_counts_capabilities_in_its_tracker():
    clock = PointstampClock(3)
    clock.advance(0, 10)
    clock.advance(1, 10)
    assert clock.low == NO_TIME  # source 2 holds the frontier at the start
    clock.advance(2, 7)
    assert clock.low == 7
    at = dict(((loc.kind, t.epoch), n) for (loc, t), n in clock.tracker.pointstamps())
    assert at == {("out", 10): 2, ("out", 7): 1}
    for source in range(3):
        clock.advance(source, END_TIME)
    assert clock.low == END_TIME and clock.tracker.is_idle()


@pytest.mark.parametrize("kind,cls", [("watermark", VectorClock), ("pointstamp", PointstampClock)])
def test_make_frontier_builds_the_chosen_kind(kind, cls):
    assert isinstance(make_frontier(kind, 2), cls)


def test_make_frontier_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="progress must be one of watermark, pointstamp, got 'lamport'"):
        make_frontier("lamport", 2)
