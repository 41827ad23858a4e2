"""Path summary laws: monotone, composition is application in sequence, identity, the order is
the pointwise order (sound and complete), and a summary that `advances` strictly advances."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.progress.summary import EGRESS, IDENTITY, INGRESS, PathSummary, feedback
from slashrt.progress.timestamp import MAX_EPOCH, Timestamp

FAST = settings(max_examples=60, derandomize=True, deadline=None)

steps = st.sampled_from([IDENTITY, INGRESS, EGRESS, feedback(1), feedback(2)])


def run(ops, t):
    for op in ops:
        if t is None:
            return None
        t = op.apply(t)
    return t


def compose(ops):
    summary = IDENTITY
    for op in ops:
        summary = summary.followed_by(op)
    return summary


def timestamps(depth):
    return st.builds(Timestamp, st.integers(0, 3), st.tuples(*[st.integers(0, 3)] * depth))


paths = st.lists(steps, max_size=6)
# summaries in normal form from a small space, so that two of one shape meet often
normal = st.builds(
    lambda pop, advance, push: [PathSummary(pop, advance, tuple(push))],
    st.integers(0, 1), st.integers(0, 2), st.lists(st.integers(0, 2), max_size=1),
)
summaries = st.one_of(paths, normal)
depth_and_pair = st.integers(0, 3).flatmap(lambda d: st.tuples(timestamps(d), timestamps(d)))


@FAST
@given(summaries, depth_and_pair)
def test_monotone(ops, pair):
    a, b = pair
    s = compose(ops)
    ra, rb = s.apply(a), s.apply(b)
    assert (ra is None) == (rb is None)
    if a <= b and ra is not None:
        assert ra <= rb


@FAST
@given(paths, st.integers(0, 3).flatmap(timestamps))
def test_composition_is_application_in_sequence(ops, t):
    assert compose(ops).apply(t) == run(ops, t)


@FAST
@given(summaries, summaries, summaries)
def test_composition_is_associative(a, b, c):
    x, y, z = compose(a), compose(b), compose(c)
    assert x.followed_by(y).followed_by(z) == x.followed_by(y.followed_by(z))


@FAST
@given(paths, st.integers(0, 3).flatmap(timestamps))
def test_identity(ops, t):
    s = compose(ops)
    assert IDENTITY.apply(t) is t
    assert IDENTITY.followed_by(s) == s == s.followed_by(IDENTITY)


@FAST
@given(summaries, summaries, st.integers(0, 3).flatmap(timestamps))
def test_order_is_sound(a, b, t):
    s1, s2 = compose(a), compose(b)
    r1, r2 = s1.apply(t), s2.apply(t)
    if s1 <= s2 and r1 is not None and r2 is not None:
        assert r1 <= r2


@FAST
@given(normal, normal)
def test_order_is_complete(a, b):
    """s1 <= s2 whenever s1(t) <= s2(t) for every t both apply to (counters 0..4 suffice:
    these summaries push counters up to 2)."""
    s1, s2 = compose(a), compose(b)
    need = max(s.pop + (1 if s.advance else 0) for s in (s1, s2))
    pointwise = all(
        s1.apply(t) <= s2.apply(t)
        for depth in (need, need + 1)
        for counters in itertools.product(range(5), repeat=depth)
        for t in [Timestamp(0, counters)]
    )
    assert (s1 <= s2) == pointwise


@FAST
@given(paths, st.integers(0, 3).flatmap(timestamps))
def test_a_summary_that_advances_strictly_advances(ops, t):
    s = compose(ops)
    result = s.apply(t)
    if s.advances and result is not None:
        assert t < result


def test_the_seeds_table():
    t = Timestamp(7, (1, 2))
    assert INGRESS(t) == Timestamp(7, (1, 2, 0))
    assert EGRESS(t) == Timestamp(7, (1,))
    assert feedback()(t) == Timestamp(7, (1, 3))
    assert EGRESS(Timestamp(7)) is None  # no loop to leave
    assert feedback()(Timestamp(7)) is None


def test_normal_forms():
    assert INGRESS.followed_by(EGRESS) == IDENTITY
    assert INGRESS.followed_by(feedback(2)) == PathSummary(push=(2,))
    # leaving an inner loop forgets its iterations; the outer counter still advances after
    assert feedback().followed_by(EGRESS).followed_by(feedback()) == PathSummary(pop=1, advance=1)
    assert repr(feedback(3)) == "feedback(3)" and repr(EGRESS) == "EGRESS"


def test_summaries_that_drop_counters_compare_with_those_that_keep_them():
    out_and_back = PathSummary(pop=1, advance=1, push=(1,))  # egress, outer feedback, ingress, feedback
    assert feedback(1) < out_and_back  # (o, i+1) is lexicographically below (o+1, 1)
    assert PathSummary(pop=1, push=(0,)) <= IDENTITY  # the inner counter restarts at 0
    assert not PathSummary(pop=1, push=(3,)) <= IDENTITY and not IDENTITY <= PathSummary(pop=1, push=(3,))


def test_overflow_results_in_nothing():
    assert feedback()(Timestamp(0, (MAX_EPOCH,))) is None


def test_invalid_summaries():
    with pytest.raises(ValueError, match="at least 1"):
        feedback(0)
    with pytest.raises(ValueError, match="negative"):
        PathSummary(pop=-1)
