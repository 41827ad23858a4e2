"""Timestamp order laws: a partial order (reflexive, antisymmetric, transitive), the seed's
definition, and sort_key as a linear extension."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.progress.timestamp import MAX_EPOCH, MIN_EPOCH, Timestamp

FAST = settings(max_examples=60, derandomize=True, deadline=None)


def timestamps(depth=None):
    depths = st.just(depth) if depth is not None else st.integers(0, 2)
    return depths.flatmap(
        lambda d: st.builds(Timestamp, st.integers(-3, 3), st.tuples(*[st.integers(0, 3)] * d))
    )


@FAST
@given(timestamps())
def test_reflexive(t):
    assert t <= t and not t < t


@FAST
@given(timestamps(), timestamps())
def test_antisymmetric(a, b):
    if a <= b and b <= a:
        assert a == b and hash(a) == hash(b)


@FAST
@given(timestamps(2), timestamps(2), timestamps(2))
def test_transitive(a, b, c):
    if a <= b and b <= c:
        assert a <= c


@FAST
@given(timestamps(), timestamps())
def test_the_seeds_order(a, b):
    expected = a.depth == b.depth and a.epoch <= b.epoch and a.counters <= b.counters
    assert (a <= b) == expected == (b >= a)
    assert (a < b) == (expected and a != b) == (b > a)


@FAST
@given(timestamps(), timestamps())
def test_sort_key_extends_the_order(a, b):
    if a <= b:
        assert a.sort_key() <= b.sort_key()


def test_counters_compare_lexicographically_and_depths_do_not_compare():
    assert Timestamp(1, (0, 5)) <= Timestamp(1, (1, 0))  # lexicographic, not pointwise
    assert not Timestamp(2, (0,)) <= Timestamp(1, (9,))  # the epoch must not go back
    assert not Timestamp(1, (0,)) <= Timestamp(1) and not Timestamp(1) <= Timestamp(1, (0,))


def test_event_time_maps_onto_the_epoch():
    assert Timestamp.at(1234) == Timestamp(1234, ())
    assert Timestamp.at(MIN_EPOCH) <= Timestamp.at(0) <= Timestamp.at(MAX_EPOCH)
    with pytest.raises(ValueError, match="outside int64"):
        Timestamp.at(MAX_EPOCH + 1)


def test_loop_counters_are_never_negative():
    with pytest.raises(ValueError, match="never negative"):
        Timestamp(0, (1, -1))


def test_repr():
    assert repr(Timestamp(3)) == "(3)" and repr(Timestamp(3, (1, 2))) == "(3, <1, 2>)"


@FAST
@given(timestamps())
def test_survives_pickling_and_copying(t):
    import copy
    import pickle

    for again in (pickle.loads(pickle.dumps(t)), copy.copy(t), copy.deepcopy(t)):
        assert type(again) is Timestamp and again == t and hash(again) == hash(t)
        assert (again.epoch, again.counters, again.depth) == (t.epoch, t.counters, t.depth)
