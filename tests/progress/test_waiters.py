"""Waiters' law: `unblocked_by` answers what its definition says (checked by listing every
waited-for time and asking the graph's could-result-in), on graphs with and without loops,
with random waited-for times coming and going and random buffers of drops and adds."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.progress.reachability import Location
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.waiters import Waiters
from tests.progress._graphs import loop, nested_loops, pipeline

GRAPHS = {"pipeline": pipeline, "loop": loop, "nested_loops": nested_loops}


def _time(graph, location, rng) -> Timestamp:
    return Timestamp(rng.randrange(6), tuple(rng.randrange(3) for _ in range(graph.depths[location])))


def _waits(graph, rng):
    """Every node with an output and an input waits at its inputs, on notifications; a node
    outside loops sometimes waits like a window (before its pointstamps' times)."""
    waits = {}
    for loc in graph.locations:
        if loc.kind != "out":
            continue
        inputs = tuple(i for i in graph.locations if i.kind == "in" and i.node == loc.node)
        if inputs and rng.random() < 0.7:
            before = not any(graph.depths[x] for x in (loc, *inputs)) and rng.random() < 0.4
            waits[loc] = (inputs, before)
    return waits


def _definition(waiters: Waiters, drops, adds) -> bool:
    g = waiters.graph
    for w in waiters.waited():
        if any(g.could_result_in(*p, *w) for p in drops) and not any(g.could_result_in(*p, *w) for p in adds):
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(GRAPHS)), seed=st.integers(0, 2**32 - 1))
def test_unblocked_by_is_its_definition(name, seed):
    rng = random.Random(seed)
    graph = GRAPHS[name]()[0]
    waiters = Waiters(graph, _waits(graph, rng))
    outputs = list(waiters.waits)
    held: list[tuple[Location, Timestamp]] = []
    for _ in range(40):
        if outputs and (not held or rng.random() < 0.6):  # a request (or window end) comes
            at = rng.choice(outputs)
            held.append((at, _time(graph, at, rng)))
            waiters.update(*held[-1], 1)
        elif held:  # one is delivered
            waiters.update(*held.pop(rng.randrange(len(held))), -1)
        locations = graph.locations
        drops = [(loc, _time(graph, loc, rng)) for loc in rng.sample(locations, rng.randrange(3))]
        adds = [(loc, _time(graph, loc, rng)) for loc in rng.sample(locations, rng.randrange(4))]
        assert waiters.unblocked_by(drops, adds) == _definition(waiters, drops, adds)


def test_a_capability_moving_inside_a_window_is_not_urgent_until_it_passes_the_end():
    graph, n = pipeline()
    source, map_in, map_out = Location.output(n["source"]), Location.input(n["map"]), Location.output(n["map"])
    notify = Waiters(graph, {map_out: ((map_in,), False)})
    window = Waiters(graph, {map_out: ((map_in,), True)})
    for waiters in (notify, window):
        waiters.update(map_out, Timestamp(10), 1)
    published = (source, Timestamp(3))
    assert not notify.unblocked_by([published], [(source, Timestamp(10))])  # still holds 10 back
    assert notify.unblocked_by([published], [(source, Timestamp(11))])
    assert window.unblocked_by([published], [(source, Timestamp(10))])  # a window ending at 10 fires
    assert not window.unblocked_by([published], [(source, Timestamp(9))])
    assert not notify.unblocked_by([(source, Timestamp(11))], [])  # a drop after the waited-for time
    notify.update(map_out, Timestamp(10), -1)  # delivered: nothing waits any more
    assert not notify.unblocked_by([published], [])


def test_waiting_before_a_time_inside_a_loop_is_refused():
    graph = loop()[0]
    inside = next(loc for loc in graph.locations if loc.kind == "in" and graph.depths[loc])
    with pytest.raises(ValueError, match="outside loops"):
        Waiters(graph, {Location.output(inside.node): ((inside,), True)})
