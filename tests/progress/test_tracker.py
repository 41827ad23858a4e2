"""Tracker laws: completeness is exactly "no active pointstamp could-result-in it", reported
frontier changes rebuild the frontiers, and batching does not matter."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.progress.reachability import Location
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Tracker, move_capability
from tests.progress._graphs import loop, nested_loops, pipeline

GRAPHS = {"loop": loop(), "nested": nested_loops()}
FAST = settings(max_examples=30, derandomize=True, deadline=None)


def pointstamps(graph):
    located = [loc for loc in graph.locations if loc in graph.depths]
    return st.sampled_from(located).flatmap(
        lambda loc: st.tuples(
            st.just(loc),
            st.builds(Timestamp, st.integers(0, 2), st.tuples(*[st.integers(0, 2)] * graph.depths[loc])),
        )
    )


def cases(batches=4):
    def for_graph(name):
        graph = GRAPHS[name][0]
        update = st.tuples(pointstamps(graph), st.integers(-1, 2))
        return st.tuples(st.just(name), st.lists(st.lists(update, max_size=6), max_size=batches), pointstamps(graph))

    return st.sampled_from(sorted(GRAPHS)).flatmap(for_graph)


@FAST
@given(cases())
def test_complete_iff_no_active_pointstamp_could_result_in_it(case):
    name, batches, (b, tb) = case
    graph = GRAPHS[name][0]
    tracker = Tracker(graph)
    totals = Counter()
    for batch in batches:
        tracker.update_iter(batch)
        for pointstamp, delta in batch:
            totals[pointstamp] += delta
        active = [p for p, c in totals.items() if c > 0]
        expected = not any(graph.could_result_in(a, ta, b, tb) for a, ta in active)
        assert tracker.is_complete(b, tb) == expected
        assert dict(tracker.pointstamps()) == {p: c for p, c in totals.items() if c > 0}
        for a, ta in active:
            others = sum(1 for q in active if q != (a, ta) and graph.could_result_in(*q, a, ta))
            assert tracker.precursor_count(a, ta) == others


@FAST
@given(cases())
def test_reported_changes_rebuild_the_frontiers(case):
    name, batches, _ = case
    graph = GRAPHS[name][0]
    tracker = Tracker(graph)
    rebuilt = {loc: set() for loc in graph.locations}
    for batch in batches:
        tracker.update_iter(batch)
        for location, time, sign in tracker.propagate():
            if sign > 0:
                assert time not in rebuilt[location]
                rebuilt[location].add(time)
            else:
                rebuilt[location].remove(time)
        for location in graph.locations:
            assert rebuilt[location] == set(tracker.frontier(location))
    assert tracker.propagate() == []


@FAST
@given(cases(), st.randoms(use_true_random=False))
def test_batching_and_order_do_not_matter(case, rng):
    name, batches, _ = case
    graph = GRAPHS[name][0]
    together, one_by_one = Tracker(graph), Tracker(graph)
    together.update_iter([u for batch in batches for u in batch])
    singles = [u for batch in batches for u in batch]
    rng.shuffle(singles)
    for (location, time), delta in singles:
        one_by_one.update(location, time, delta)
        one_by_one.propagate()
    for location in graph.locations:
        assert together.frontier(location) == one_by_one.frontier(location)


def test_the_seeds_run_through_a_loop():
    """One epoch goes around the loop twice and leaves; the sink hears of epoch 0 only then."""
    graph, n = GRAPHS["loop"]
    source, body0, body1 = Location.output(n["source"]), Location.input(n["body"], 0), Location.input(n["body"], 1)
    sink = Location.input(n["sink"])
    tracker = Tracker(graph)
    tracker.update(source, Timestamp(0), 1)  # the input's first capability, as the seed starts
    assert not tracker.is_complete(sink, Timestamp(0))
    # the input sends a record into the loop and moves to epoch 1
    tracker.update_iter([((body0, Timestamp(0, (0,))), 1), ((source, Timestamp(1)), 1), ((source, Timestamp(0)), -1)])
    assert tracker.frontier(body1).elements == (Timestamp(0, (1,)),)
    assert not tracker.is_complete(body0, Timestamp(0, (0,))) and tracker.is_complete(body1, Timestamp(0, (0,)))
    # the body sends it around once (through the feedback) ...
    tracker.update_iter([((body1, Timestamp(0, (1,))), 1), ((body0, Timestamp(0, (0,))), -1)])
    assert tracker.is_complete(body1, Timestamp(0, (0,))) and not tracker.is_complete(body1, Timestamp(0, (1,)))
    assert not tracker.is_complete(sink, Timestamp(0))
    # ... and out of the loop to the sink
    sink_in = Location.input(n["sink"])
    tracker.update_iter([((sink_in, Timestamp(0)), 1), ((body1, Timestamp(0, (1,))), -1)])
    assert not tracker.is_complete(sink, Timestamp(0))
    tracker.update(sink_in, Timestamp(0), -1)  # the sink took it
    assert tracker.is_complete(sink, Timestamp(0)) and not tracker.is_complete(sink, Timestamp(1))
    tracker.update(source, Timestamp(1), -1)  # the input closes
    assert tracker.is_idle() and tracker.is_complete(sink, Timestamp(10**6))


def test_a_sources_capability_follows_its_watermark():
    graph, n = GRAPHS["loop"]
    source, sink = Location.output(n["source"]), Location.input(n["sink"])
    tracker = Tracker(graph)
    tracker.update(source, Timestamp.at(100), 1)
    tracker.update_iter(move_capability(source, Timestamp.at(100), Timestamp.at(250)))
    assert tracker.is_complete(sink, Timestamp.at(249)) and not tracker.is_complete(sink, Timestamp.at(250))
    with pytest.raises(ValueError, match="cannot move from"):
        move_capability(source, Timestamp.at(250), Timestamp.at(100))


# --- fast paths equal the general path ---------------------------------------------------------

ALL_GRAPHS = {**GRAPHS, "pipeline": pipeline()}


@FAST
@given(st.sampled_from(sorted(ALL_GRAPHS)).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.lists(st.lists(st.tuples(pointstamps(ALL_GRAPHS[name][0]), st.integers(-1, 2)), max_size=6), max_size=5),
    )
))
def test_fast_paths_equal_the_general_path(case):
    """One-element frontiers outside loops and the identity shortcut, on and forced off: the
    same frontier changes from every propagate, the same frontiers and completeness."""
    name, batches = case
    graph = ALL_GRAPHS[name][0]
    fast, general = Tracker(graph), Tracker(graph, fast_paths=False)
    for batch in batches:
        fast.update_iter(batch)
        general.update_iter(batch)
        assert sorted(fast.propagate(), key=repr) == sorted(general.propagate(), key=repr)
        for location in graph.locations:
            assert fast.frontier(location) == general.frontier(location)
            for (_, time), _ in batch:
                assert fast.is_complete(location, time) == general.is_complete(location, time)
