"""Reachability: least summaries through loops (the seed's loop, two nested loops),
could-result-in against exploring the graph state by state, and the graph checks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.errors import DataflowError
from slashrt.progress.reachability import Builder, Location
from slashrt.progress.summary import EGRESS, IDENTITY, INGRESS, PathSummary, feedback
from slashrt.progress.timestamp import Timestamp
from tests.progress._graphs import loop, nested_loops, pipeline

GRAPHS = {"pipeline": pipeline(), "loop": loop(), "nested": nested_loops()}
BOUND = 4  # counters explored by brute force; the queries use counters up to 3


def test_the_seeds_loop():
    graph, n = GRAPHS["loop"]
    body0, body1 = Location.input(n["body"], 0), Location.input(n["body"], 1)
    sink, source = Location.input(n["sink"]), Location.output(n["source"])
    assert set(graph.summaries(body0, body1)) == {feedback(1)}
    assert set(graph.summaries(body0, sink)) == {EGRESS}
    assert set(graph.summaries(body0, body0)) == {IDENTITY}  # the cycle advances: not least
    assert set(graph.summaries(body1, body0)) == set()  # body.in1 only leads to body.out0
    assert set(graph.summaries(source, body1)) == {PathSummary(push=(1,))}
    assert set(graph.summaries(source, body0)) == {INGRESS}
    assert graph.could_result_in(body0, Timestamp(3, (2,)), body1, Timestamp(3, (3,)))
    assert not graph.could_result_in(body0, Timestamp(3, (2,)), body1, Timestamp(3, (2,)))
    assert graph.could_result_in(body0, Timestamp(3, (9,)), sink, Timestamp(3))
    assert not graph.could_result_in(body0, Timestamp(4, (0,)), sink, Timestamp(3))
    assert graph.depths[body0] == 1 and graph.depths[sink] == 0


def test_two_nested_loops():
    graph, n = GRAPHS["nested"]
    inner0, inner1 = Location.input(n["inner"], 0), Location.input(n["inner"], 1)
    outer1 = Location.input(n["outer"], 1)
    # around the inner loop is least; out through the outer feedback and back in is above it
    assert set(graph.summaries(inner0, inner1)) == {feedback(1)}
    assert set(graph.summaries(inner0, outer1)) == {PathSummary(pop=1, advance=1)}
    assert graph.could_result_in(inner0, Timestamp(0, (2, 7)), outer1, Timestamp(0, (3,)))
    assert not graph.could_result_in(inner0, Timestamp(0, (2, 7)), outer1, Timestamp(0, (2,)))
    # the next outer iteration restarts the inner counter at 1 after the inner feedback
    assert graph.could_result_in(inner0, Timestamp(0, (2, 7)), inner1, Timestamp(0, (3, 1)))
    assert not graph.could_result_in(inner0, Timestamp(0, (2, 7)), inner1, Timestamp(0, (2, 7)))
    assert graph.depths[inner0] == 2


def explore(graph, a, ta):
    """Every (location, timestamp) a path from (a, ta) reaches, counters capped at BOUND."""
    seen, stack = {(a, ta)}, [(a, ta)]
    while stack:
        location, time = stack.pop()
        for target, summaries in graph.steps(location):
            for summary in summaries:
                result = summary.apply(time)
                if result is None or any(c > BOUND for c in result.counters):
                    continue
                if (target, result) not in seen:
                    seen.add((target, result))
                    stack.append((target, result))
    return seen


def located_times(graph):
    located = [loc for loc in graph.locations if loc in graph.depths]
    return st.sampled_from(located).flatmap(
        lambda loc: st.tuples(
            st.just(loc),
            st.builds(Timestamp, st.integers(0, 2), st.tuples(*[st.integers(0, 3)] * graph.depths[loc])),
        )
    )


@settings(max_examples=50, derandomize=True, deadline=None)
@given(st.sampled_from(sorted(GRAPHS)).flatmap(lambda g: st.tuples(st.just(g), located_times(GRAPHS[g][0]), located_times(GRAPHS[g][0]))))
def test_could_result_in_iff_some_path_gets_there(case):
    name, (a, ta), (b, tb) = case
    graph = GRAPHS[name][0]
    reached = explore(graph, a, ta)
    expected = any(loc == b and t <= tb for loc, t in reached)
    assert graph.could_result_in(a, ta, b, tb) == expected


@settings(max_examples=50, derandomize=True, deadline=None)
@given(st.sampled_from(sorted(GRAPHS)).flatmap(lambda g: st.tuples(st.just(g), *[located_times(GRAPHS[g][0])] * 3)))
def test_could_result_in_is_reflexive_and_transitive(case):
    name, (a, ta), (b, tb), (c, tc) = case
    graph = GRAPHS[name][0]
    assert graph.could_result_in(a, ta, a, ta)
    if graph.could_result_in(a, ta, b, tb) and graph.could_result_in(b, tb, c, tc):
        assert graph.could_result_in(a, ta, c, tc)


def test_a_cycle_without_feedback_is_refused_naming_its_nodes():
    b = Builder()
    source, first, second = b.add_node("source", 0, 1), b.add_node("first", 2, 1), b.add_node("second")
    b.connect(source, 0, first, 0)
    b.connect(first, 0, second)
    b.connect(second, 0, first, 1)
    with pytest.raises(DataflowError, match="cycle first -> second -> first does not advance"):
        b.build()


def test_an_inner_feedback_does_not_make_an_outer_cycle_legal():
    b = Builder()
    source, merge = b.add_node("source", 0, 1), b.add_node("merge", 2, 1)
    ingress, body, fb, egress = b.add_ingress("ingress"), b.add_node("body", 2, 1), b.add_feedback("fb"), b.add_egress("egress")
    b.connect(source, 0, merge, 0)
    b.connect(merge, 0, ingress)
    b.connect(ingress, 0, body, 0)
    b.connect(body, 0, fb)
    b.connect(fb, 0, body, 1)
    b.connect(body, 0, egress)
    b.connect(egress, 0, merge, 1)
    with pytest.raises(DataflowError, match="merge -> ingress -> body -> egress -> merge"):
        b.build()


def test_loop_depth_checks():
    b = Builder()
    source, egress = b.add_node("source", 0, 1), b.add_egress("egress")
    b.connect(source, 0, egress)
    with pytest.raises(DataflowError, match="'egress' leaves or advances a loop"):
        b.build()
    b = Builder()
    source, ingress, join = b.add_node("source", 0, 1), b.add_ingress("ingress"), b.add_node("join", 2, 1)
    b.connect(source, 0, ingress)
    b.connect(ingress, 0, join, 0)
    b.connect(source, 0, join, 1)
    with pytest.raises(DataflowError, match="join.out0 is reached inside 0 and inside 1 loops"):
        b.build()


def test_wiring_errors():
    b = Builder()
    node = b.add_node("op")
    with pytest.raises(DataflowError, match="two nodes are named 'op'"):
        b.add_node("op")
    with pytest.raises(DataflowError, match="missing port"):
        b.connect(node, 1, node, 0)
    with pytest.raises(DataflowError, match="no port pair"):
        b.add_node("bad", summaries={(1, 0): IDENTITY})
