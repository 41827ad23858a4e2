"""Windows inside loops on several executors in real processes: each row is routed by key to a
`LoopWindow` on its owner with its logical time (loop counters included), and every
iteration fires on the distributed frontier. The loops and numpy reference of
tests/test_loop_windows.py give exactly one executor's windows per iteration and late records,
over shm and tcp with rings of four 256-byte slots that every channel wraps many times. The
loops feed rows back under the next key, so every iteration's rows cross executors. In mode
"slash" every executor folds each iteration's rows into fragments shipped to their keys' owners
as partial states at the iteration's counters (`SsbLoopWindow`): the same windows."""

import numpy as np
import pytest

import slashrt
from slashrt import Operator, sinks
from tests.test_loop_windows import (
    REC, SIZE, as_rows, halved, halving_loop, input_records, late_loop, nested_loops, reference_loop, reference_nested,
)

SLOTS = {"slot_size": 256, "slots": 4}
SHIFT = 1  # the loops feed each row back under the next key: every iteration's rows change executors


def tagged(depth: int, value: str) -> dict:
    """The window's rows with their iteration: one column per loop counter, outermost first."""
    return {"window_start": "i8", "window_end": "i8", "k": "i8", value: "i8", **{f"c{i}": "i8" for i in range(depth)}}


class Tag(Operator):
    """Passes the window's rows on with the loop counters of their time as columns (the
    executors' operators run in other processes: what they saw comes back in the rows)."""

    per_time = False

    def __init__(self, depth: int, value: str):
        self.depth, self.value = depth, value

    async def on_batch(self, ctx, port, batch):
        rows = batch.to_numpy()
        assert (rows["window_end"] == ctx.time.epoch).all()  # results at (end, iteration)
        out = np.zeros(len(rows), [(n, "<i8") for n in tagged(self.depth, self.value)])
        for name in ("window_start", "window_end", "k", self.value):
            out[name] = rows[name]
        for i, counter in enumerate(ctx.time.counters):
            out[f"c{i}"] = counter
        await ctx.emit(out)


def per_iteration(rows: np.ndarray, depth: int) -> dict:
    """Tagged rows -> {counters: sorted (start, end, k, value) rows}."""
    got = {}
    for r in rows.tolist():
        got.setdefault(tuple(r[4 : 4 + depth]), []).append(tuple(r[:4]))
    return {c: sorted(v) for c, v in got.items()}


def run_halving(data, **options):
    flow, out = halving_loop(Tag(1, "sum_v"), schema=tagged(1, "sum_v"), shift=SHIFT)
    result = slashrt.run(flow, {"src": data}, **SLOTS, **options)
    return per_iteration(out.records, 1), result


@pytest.mark.parametrize(("executors", "transport", "mode"), [(2, "shm", "uppar"), (3, "tcp", "uppar"),
                                                             (2, "tcp", "slash"), (3, "shm", "slash")])
def test_a_keyed_window_in_a_loop_on_executors_equals_one_executor(executors, transport, mode):
    data = input_records(1, 6000)  # ~1000 slots of 256 bytes through the 4-slot rings
    want = {(i,): as_rows(rows) for i, rows in enumerate(reference_loop(data, shift=SHIFT))}
    one, one_result = run_halving(data)
    many, many_result = run_halving(data, executors=executors, transport=transport, mode=mode)
    assert len(want) > 4 and one == want
    assert many == one  # every iteration's windows, none missing, none fired twice
    assert many_result.late_records == one_result.late_records == {"lw.win": 0}
    assert all(f == [] for f in many_result.frontiers.values())


@pytest.mark.parametrize(("executors", "transport", "routing"), [(2, "shm", "fragments"), (3, "tcp", "fragments"),
                                                                 (2, "tcp", "direct"), (3, "shm", "auto")])
def test_a_keyed_window_in_a_loop_in_epochs_of_bytes_equals_one_executor(executors, transport, routing):
    """`epoch_bytes=` and `ssb_routing=` inside loops: with epochs of 512 bytes each iteration's
    fragments ship many times before their windows are due, their rows at the iteration's
    counters (or each record on its own, direct), each keeping its capability until due; every
    iteration's windows equal one executor's."""
    data = input_records(1, 6000)
    iterations = reference_loop(data, shift=SHIFT)
    records = len(data) + sum(len(halved(rows, 2, SHIFT)) for rows in iterations)  # what enters the window
    one, _ = run_halving(data)
    many, result = run_halving(data, executors=executors, transport=transport, mode="slash", epoch_bytes=512,
                               ssb_routing=routing)
    assert one == {(i,): as_rows(rows) for i, rows in enumerate(iterations)}
    assert many == one
    assert result.late_records == {"lw.win": 0}
    epochs = [e for per_executor in result.epochs["lw.win"] for e in per_executor]
    assert sum(e.records for e in epochs) == records
    # epochs of 512 bytes, cut after the batch that fills them (~100 shipments without: one per
    # window and iteration due)
    assert len(epochs) > records * REC.itemsize // 1024
    if routing == "direct":
        assert all(e.direct and e.keys_touched == e.records for e in epochs)
    elif routing == "fragments":
        assert not any(e.direct for e in epochs) and sum(e.keys_touched for e in epochs) < records


@pytest.mark.parametrize("offset, late_rows, mode", [(0, False, "uppar"), (-1, True, "uppar"), (-1, True, "slash")])
def test_late_records_in_a_loop_on_executors_equal_one_executor(offset, late_rows, mode):
    """Every key's [0, 10) goes round once more at time (10, <1>), at event time 10 + offset: at
    9 each is late at iteration 1 on its owner as on one executor (counted, in the late sink):
    the epoch 10 of its time closed [0, 10), on any number of executors."""
    data = input_records(4, 3000)
    outcomes = []
    for options in ({}, {"executors": 2, "transport": "shm", "mode": mode}):
        late = sinks.Collect()
        flow, out = late_loop(offset, Tag(1, "count"), late, schema=tagged(1, "count"))
        result = slashrt.run(flow, {"src": data}, **SLOTS, **options)
        late_sorted = np.sort(late.records, order=["t", "k", "v"])
        outcomes.append((per_iteration(out.records, 1), result.late_records, late_sorted))
    (one, one_late, one_sink), (many, many_late, many_sink) = outcomes
    keys = np.unique(data["k"][data["t"] < SIZE])
    assert sorted(one) == ([(0,)] if late_rows else [(0,), (1,)]) and len(one[(0,)]) > len(keys)
    assert many == one
    assert one_late == many_late == {"late.win": len(keys) if late_rows else 0}
    if late_rows:  # the late sink gets the records fed back: one per key, at 9, its count
        assert one_sink["t"].tolist() == [SIZE + offset] * len(keys) and one_sink["k"].tolist() == keys.tolist()
    else:
        assert not len(one_sink)
    np.testing.assert_array_equal(many_sink, one_sink)


@pytest.mark.parametrize("mode", ["uppar", "slash"])
def test_windows_in_loops_nested_two_deep_on_two_executors(mode):
    data = input_records(2, 5000)
    want = {c: as_rows(rows) for c, rows in reference_nested(data, SHIFT).items()}
    flow, out = nested_loops(Tag(2, "sum_v"), schema=tagged(2, "sum_v"), shift=SHIFT)
    result = slashrt.run(flow, {"src": data}, executors=2, transport="shm", mode=mode, **SLOTS)
    assert max(o for o, _ in want) >= 2 and max(i for _, i in want) >= 3
    assert per_iteration(out.records, 2) == want
    assert result.late_records == {"nest.win": 0}


def test_a_window_in_a_loop_is_routed_with_its_loop_counters_unless_its_key_was_exchanged_just_before():
    from slashrt._dataflow import Dataflow
    from slashrt._plan import ClusterRole, build_plan
    from slashrt.ops.loop_window import LoopWindow
    from slashrt.ops.route import ExchangeNode, WindowRoute
    from slashrt.ssb.graph_window import SsbLoopWindow, SsbRoute
    from slashrt.ssb.partitions import Partitioning
    from tests.test_loop_windows import REC, SCHEMA, feed_back_step

    flow, _ = nested_loops(Tag(2, "sum_v"), schema=tagged(2, "sum_v"))
    route = build_plan(flow, ClusterRole(1, Partitioning(16, 3), "uppar")).steps["nest.win"]
    assert isinstance(route, WindowRoute) and isinstance(route.window, LoopWindow)
    assert route.exchange_dtype.names == ("t", "k", "v", "__epoch", "__c0", "__c1")
    fragments = build_plan(flow, ClusterRole(1, Partitioning(16, 3), "slash")).steps["nest.win"]
    assert isinstance(fragments, SsbRoute) and isinstance(fragments.window, SsbLoopWindow)
    assert fragments.exchange_dtype.names == ("slice", "key", "count", "value", "__epoch", "__c0", "__c1")

    flow = Dataflow("x")
    with flow.loop("l", max_iterations=3) as loop:
        sums = loop.enter(flow.source("src", REC, time="t")).exchange(key="k").window(slashrt.Tumbling(ms=SIZE))
        sums = sums.sum("v", key="k", name="win")
        loop.feed_back(sums.apply(feed_back_step(2), schema=SCHEMA))
        loop.leave(sums).sink(sinks.Collect())
    plan = build_plan(flow, ClusterRole(0, Partitioning(16, 2)))  # (mode "slash")
    assert isinstance(plan.steps["x.win"], LoopWindow)  # the exchange before it routed its rows by k already
    assert [type(n) for n in plan.exchanges()] == [ExchangeNode]


def test_the_peer_message_that_makes_the_view_idle_still_reaches_the_route_which_ends_its_channels():
    """Forced interleaving: executor 0's own input is done when a peer's message retires the
    last pointstamp. The executor must settle that news (the route's input frontier is empty
    now: it ends its channels, else the peer waits forever for their end) before it stops."""
    import trio

    from slashrt._plan import ClusterRole, build_plan
    from slashrt.progress import Location, Timestamp
    from slashrt.progress.timestamp import MIN_EPOCH
    from slashrt.scheduler._pointstamp import PointstampProgress
    from slashrt.ssb.partitions import Partitioning
    from tests.cluster.test_bus_counts import ViewOnlyBus

    flow, _ = halving_loop(Tag(1, "sum_v"), schema=tagged(1, "sum_v"))
    plan = build_plan(flow, ClusterRole(0, Partitioning(16, 2), "uppar"))

    bus = ViewOnlyBus(plan.graph)
    source = Location.output(list(flow.steps).index("lw.src"), 0)
    bus.exchange.view.update(source, Timestamp(MIN_EPOCH), 1)  # the peer's source, still reading
    progress = PointstampProgress(plan, bus)
    woken = []
    progress.wake = lambda: woken.append(True)
    route = plan.steps["lw.win"]
    trio.run(progress.settle)
    assert progress.waiting() and not route._ended
    bus.exchange.view.update(source, Timestamp(MIN_EPOCH), -1)  # the peer's last message...
    bus.on_frontier_change(bus.exchange.view.propagate())  # ...arrives: the view is idle now
    assert woken and bus.exchange.view.is_idle() and not route._ended
    assert progress.waiting()  # news to settle: the compute loop must not stop yet
    assert progress.quiet()
    trio.run(progress.settle)
    assert route._ended and not progress.waiting()
