"""Barrier alignment (BarrierAligner), the loop head's back-edge log (LoopHead) and back_edges:
scripted per-input sequences, then random interleavings checked against the laws."""

from collections import Counter, deque
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from slashrt.errors import DataflowError
from slashrt.snapshot.alignment import (
    Abort,
    BarrierAligner,
    BarrierError,
    LogComplete,
    LoopHead,
    Snapshot,
    back_edges,
    back_edges_of,
)
from tests.progress._graphs import loop, nested_loops, pipeline

FAST = settings(max_examples=60, derandomize=True, deadline=None)


class Ticks:
    """A clock that advances one second per reading."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


# --- scripted ----------------------------------------------------------------------------------


def test_slow_input_blocks_the_fast_one_until_it_delivers():
    aligner = BarrierAligner(["fast", "slow"], clock=Ticks())
    assert aligner.barrier("fast", 1) == []
    assert not aligner.may_consume("fast") and aligner.may_consume("slow")
    aligner.blocked("fast", 4096)
    aligner.blocked("slow", 99)  # not blocked: not counted
    aligner.blocked("fast", 1024)
    assert aligner.aligning == 1
    [snapshot] = aligner.barrier("slow", 1)
    assert isinstance(snapshot, Snapshot) and snapshot.checkpoint == 1
    stats = snapshot.stats
    assert (stats.started, stats.ended, stats.seconds) == (1.0, 2.0, 1.0)
    assert stats.last_input == "slow" and stats.blocked_bytes == 5120
    assert aligner.may_consume("fast") and aligner.may_consume("slow") and aligner.aligning is None


def test_a_single_input_snapshots_at_once():
    aligner = BarrierAligner(["only"])
    assert [o.checkpoint for o in aligner.barrier("only", 7)] == [7]
    assert aligner.may_consume("only")


def test_an_ended_input_counts_as_delivered():
    aligner = BarrierAligner(["a", "b", "c"])
    assert aligner.end("c") == []
    assert aligner.barrier("a", 1) == []
    [snapshot] = aligner.end("b")
    assert snapshot.checkpoint == 1 and snapshot.stats.last_input == "b"
    assert [o.checkpoint for o in aligner.barrier("a", 2)] == [2]  # the only open input


def test_a_newer_barrier_aborts_the_aligning_one_flinks_rule():
    aligner = BarrierAligner(["a", "b", "c"])
    aligner.barrier("a", 1)
    [abort] = aligner.barrier("b", 2)  # b skipped 1: checkpoint 1 cannot complete
    assert isinstance(abort, Abort) and abort.checkpoint == 1 and "barrier 2" in abort.reason
    assert aligner.aligning == 2
    assert aligner.may_consume("a") and not aligner.may_consume("b")
    assert aligner.barrier("c", 1) == [] and aligner.stale == 1  # late barrier of the aborted one
    assert aligner.may_consume("c")
    aligner.barrier("a", 2)
    assert [o.checkpoint for o in aligner.barrier("c", 2)] == [2]


@pytest.mark.parametrize(
    "script, message",
    [
        ([("barrier", "a", 1), ("barrier", "a", 2)], "blocked behind barrier 1"),
        ([("barrier", "a", 2), ("barrier", "b", 2), ("barrier", "a", 1)], "ids must increase"),
        ([("end", "a", None), ("barrier", "a", 1)], "after it ended"),
        ([("barrier", "z", 1)], "not an input"),
    ],
)
def test_protocol_violations_name_the_input(script, message):
    aligner = BarrierAligner(["a", "b"])
    with pytest.raises(BarrierError, match=message):
        for kind, input, n in script:
            aligner.barrier(input, n) if kind == "barrier" else aligner.end(input)


def test_inputs_must_be_distinct():
    with pytest.raises(BarrierError, match="distinct"):
        BarrierAligner(["a", "a"])


# --- the law, over random interleavings ----------------------------------------------------------


@st.composite
def input_streams(draw):
    """1-4 inputs; on each, records and barriers 1..4 in order, some barriers skipped (an input
    that skips one makes that checkpoint abort), ending anywhere."""
    streams = {}
    uid = itertools.count()
    for i in range(draw(st.integers(1, 4))):
        items = []
        for n in range(1, 5):
            items += [("record", next(uid)) for _ in range(draw(st.integers(0, 3)))]
            if draw(st.integers(0, 9)) > 0:  # 1 in 10 skipped
                items.append(("barrier", n))
        items += [("record", next(uid)) for _ in range(draw(st.integers(0, 2)))]
        cut = draw(st.integers(0, len(items)))
        streams[f"in{i}"] = items[: cut if draw(st.booleans()) else len(items)]
    return streams


def expected_snapshots(streams):
    """Checkpoint n completes iff some input carries barrier n and every input carries it or ends
    below it; its snapshot holds every record before barrier n on every input."""
    expected = {}
    for n in range(1, 5):
        if not any(("barrier", n) in items for items in streams.values()):
            continue
        held = set()
        for items in streams.values():
            barriers = [b for kind, b in items if kind == "barrier"]
            if n not in barriers and any(b > n for b in barriers):
                break
            upto = items.index(("barrier", n)) if n in barriers else len(items)
            held |= {value for kind, value in items[:upto] if kind == "record"}
        else:
            expected[n] = held
    return expected


@FAST
@given(input_streams(), st.randoms(use_true_random=False))
def test_snapshot_holds_exactly_the_records_before_the_barrier(streams, rng):
    aligner = BarrierAligner(streams, clock=Ticks())
    queues = {i: deque(items) for i, items in streams.items()}
    consumed, snapshots, aborted, ended = set(), {}, set(), set()
    while ready := [i for i in queues if i not in ended and aligner.may_consume(i)]:
        i = rng.choice(ready)
        if not queues[i]:
            outcomes = aligner.end(i)
            ended.add(i)
        else:
            kind, value = queues[i].popleft()
            if kind == "record":
                consumed.add(value)
                continue
            outcomes = aligner.barrier(i, value)
        for outcome in outcomes:
            if isinstance(outcome, Snapshot):
                assert outcome.checkpoint not in snapshots and all(outcome.checkpoint > n for n in snapshots)
                snapshots[outcome.checkpoint] = set(consumed)
                assert all(aligner.may_consume(j) for j in queues if j not in ended)
            else:
                aborted.add(outcome.checkpoint)
    # liveness: every input was drained, nothing is left blocked
    assert ended == set(queues) and not any(queues.values())
    assert snapshots == expected_snapshots(streams)
    assert not aborted & set(snapshots)


# --- cycles --------------------------------------------------------------------------------------


def test_loop_head_logs_back_edge_records_until_the_barrier_returns():
    head = LoopHead(["src"], ["back"])
    head.record("back", "before")  # no log open: not logged
    [snapshot] = head.barrier("src", 1)
    assert isinstance(snapshot, Snapshot) and head.logging == [1]
    assert head.may_consume("back") and head.may_consume("src")  # back edges never block
    head.record("back", "r1")
    head.record("src", "not a back edge")
    head.record("back", "r2")
    [done] = head.barrier("back", 1)
    assert isinstance(done, LogComplete) and done.log.checkpoint == 1
    assert list(done.log.replay()) == [("back", "r1"), ("back", "r2")]
    head.record("back", "after")
    assert head.logging == []


def test_overlapping_logs_and_an_ended_back_edge():
    head = LoopHead(["src"], ["b1", "b2"])
    head.barrier("src", 1)
    head.record("b1", "x")
    head.barrier("src", 2)  # checkpoint 2 aligned before 1 came back: both logs open
    head.record("b1", "y")
    assert head.barrier("b1", 1) == []  # 1 still waits on b2
    head.record("b1", "z")  # only log 2 waits on b1 now
    head.record("b2", "w")
    outcomes = head.end("b2")
    assert [o.log.checkpoint for o in outcomes] == [1]
    assert outcomes[0].log.entries == (("b1", "x"), ("b1", "y"), ("b2", "w"))
    [done] = head.barrier("b1", 2)
    assert done.log.entries == (("b1", "y"), ("b1", "z"), ("b2", "w"))
    assert head.barrier("b1", 3) == [] and head.stale == 1  # never snapshotted here


def test_a_checkpoint_triggered_after_every_regular_input_ended_snapshots_at_once_and_logs():
    head = LoopHead(["a", "b"], ["back"])
    head.barrier("a", 1)
    [snapshot] = head.barrier("b", 1)
    assert isinstance(snapshot, Snapshot)
    head.end("a")
    with pytest.raises(BarrierError, match="regular inputs are open"):
        head.trigger(2)
    head.end("b")
    assert head.trigger(1) == [] and head.stale == 1  # 1 was taken by its barriers
    [snapshot] = head.trigger(2)  # the loop still runs: nothing to align, the log opens
    assert isinstance(snapshot, Snapshot) and snapshot.checkpoint == 2 and head.logging == [1, 2]
    head.record("back", "r")
    [done1] = head.barrier("back", 1)
    [done2] = head.barrier("back", 2)
    assert done1.log.entries == (("back", "r"),) and done2.log.entries == (("back", "r"),)


def test_a_snapshot_completed_by_a_regular_input_ending_opens_the_log_too():
    """Barrier 1 on one source, then the other source ends: its end completes the alignment,
    and barrier 1 coming back round the loop closes the log (it once stayed open for ever)."""
    head = LoopHead(["edges", "proposals"], ["back"])
    assert head.barrier("edges", 1) == []
    [snapshot] = head.end("proposals")
    assert isinstance(snapshot, Snapshot) and snapshot.checkpoint == 1 and head.logging == [1]
    head.record("back", "r")
    [done] = head.barrier("back", 1)
    assert isinstance(done, LogComplete) and done.log.entries == (("back", "r"),) and head.stale == 0


def test_loop_head_without_back_edges_is_refused():
    with pytest.raises(BarrierError, match="back-edge"):
        LoopHead(["a"], [])


def closure(record):
    """Everything the loop computes from one record at its head: (uid, v), (uid, v-1) ... (uid, 0)."""
    uid, v = record
    return Counter((uid, k) for k in range(v + 1))


@st.composite
def loop_sources(draw):
    """Two sources into the loop head; records (uid, v) go around the loop v more times; each
    source sends barriers 1.. up to a drawn one, then records, then ends."""
    uid = itertools.count()
    streams = {}
    for name in ("s0", "s1"):
        items = []
        for n in range(1, draw(st.integers(1, 3)) + 1):  # a source may end before the last barriers
            items += [("record", (next(uid), draw(st.integers(0, 3)))) for _ in range(draw(st.integers(0, 3)))]
            items.append(("barrier", n))
        items += [("record", (next(uid), draw(st.integers(0, 3)))) for _ in range(draw(st.integers(0, 2)))]
        streams[name] = items
    return streams


@FAST
@given(loop_sources(), st.randoms(use_true_random=False))
def test_state_plus_log_equals_a_stop_the_world_snapshot(streams, rng):
    """head (s0, s1, b0, b1) -> body -> b0 or b1: the body sends (uid, v - 1) back while v > 0,
    on back edge b(v % 2), and forwards barriers at once on both. Recovering checkpoint n (its state, then its log replayed and run
    to quiescence) gives what halting the sources at barrier n and draining the loop gives."""
    head = LoopHead(["s0", "s1"], ["b0", "b1"])
    queues = {name: deque(items) for name, items in streams.items()}
    to_body, back = deque(), {"b0": deque(), "b1": deque()}
    state, copies, checked, ended = Counter(), {}, set(), set()

    def handle(outcomes):
        for outcome in outcomes:
            if isinstance(outcome, Snapshot):
                copies[outcome.checkpoint] = Counter(state)
                to_body.append(("barrier", outcome.checkpoint))
            elif isinstance(outcome, LogComplete):
                n = outcome.log.checkpoint
                recovered = Counter(copies[n])
                for _, record in outcome.log.replay():
                    recovered += closure(record)
                stop_the_world = Counter()
                for items in streams.values():  # an input that ended before barrier n: all of it
                    before = items.index(("barrier", n)) if ("barrier", n) in items else len(items)
                    for kind, value in items[:before]:
                        if kind == "record":
                            stop_the_world += closure(value)
                assert recovered == stop_the_world
                checked.add(n)

    while True:
        moves = [s for s in ("s0", "s1") if s not in ended and head.may_consume(s)]
        moves += ["body"] * bool(to_body) + [edge for edge, queue in back.items() if queue]
        if not moves:
            break
        move = rng.choice(moves)
        if move == "body":
            kind, value = to_body.popleft()
            if kind == "barrier":
                for queue in back.values():
                    queue.append((kind, value))
            elif value[1] > 0:
                back[f"b{value[1] % 2}"].append(("record", (value[0], value[1] - 1)))
        elif move in back:
            kind, value = back[move].popleft()
            if kind == "barrier":
                handle(head.barrier(move, value))
            else:
                head.record(move, value)
                state[value] += 1
                to_body.append((kind, value))
        elif not queues[move]:
            handle(head.end(move))
            ended.add(move)
        else:
            kind, value = queues[move].popleft()
            if kind == "barrier":
                handle(head.barrier(move, value))
            else:
                state[value] += 1
                to_body.append((kind, value))
    barriers = {value for items in streams.values() for kind, value in items if kind == "barrier"}
    assert checked == barriers and head.logging == []


# --- back edges ----------------------------------------------------------------------------------


def test_back_edges_of_progress_graphs():
    reach, n = loop()
    assert [(reach.name(a), reach.name(b)) for a, b in back_edges_of(reach)] == [("feedback.out0", "body.in1")]
    reach, n = nested_loops()
    assert sorted((reach.name(a), reach.name(b)) for a, b in back_edges_of(reach)) == [
        ("fb_i.out0", "inner.in1"),
        ("fb_o.out0", "outer.in1"),
    ]
    reach, n = pipeline()
    assert back_edges_of(reach) == []


def test_back_edges_by_depth_first_search_and_by_markers_agree():
    edges = [("src", "head"), ("head", "body"), ("body", "fb"), ("fb", "head"), ("body", "sink")]
    assert back_edges(edges) == [("fb", "head")]
    assert back_edges(edges, feedback={"fb"}) == [("fb", "head")]


def test_a_cycle_without_a_feedback_marker_is_named():
    edges = [("src", "a"), ("a", "b"), ("b", "a"), ("b", "fb"), ("fb", "a")]
    with pytest.raises(DataflowError, match="a -> b -> a"):
        back_edges(edges, feedback={"fb"})


@FAST
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=14))
def test_removing_the_back_edges_leaves_a_dag(edges):
    back = back_edges(edges)
    rest = list(edges)
    for edge in back:
        rest.remove(edge)
    # a DAG: repeatedly removing nodes without incoming edges empties it
    nodes = {n for e in rest for n in e}
    while nodes:
        sources = {n for n in nodes if not any(b == n and a in nodes for a, b in rest)}
        assert sources, f"cycle left among {nodes} after removing {back}"
        nodes -= sources
    # and marking the sources of the back edges as feedback nodes finds the same edges or more
    assert set(back) <= set(back_edges(edges, feedback={a for a, _ in back}))
