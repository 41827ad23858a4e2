"""Keyed windows in graph flows (union, connect(...).apply, exchange(key=), after a loop) on several executors
in real processes: the windows, late counts and late records equal one executor's and the
per-record rule (a record is late for the windows ending at or before its source's watermark
before it), over shm and tcp, with rings of a few 256-byte slots that every channel wraps."""

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Sliding, Tumbling, sinks
from tests.test_lateness import MAX_DELAY, SCHEMA, late_heavy, reference

N = 8_000  # per source: ~750 slots of 256 bytes through each source's ring of 4
ROUNDS = 3


def graph_windows(sliding) -> tuple[Dataflow, sinks.Collect]:
    flow = Dataflow("gw")
    a = flow.source("a", SCHEMA, time="t", max_delay=MAX_DELAY)
    b = flow.source("b", SCHEMA, time="t", max_delay=MAX_DELAY)
    late = sinks.Collect()
    # a union into a sliding window (its rows routed by key to their owners)
    a.union(b).window(sliding, late=late).sum("v", key="k", name="sums").sink(sinks.Collect(), name="sums_out")
    # a two-input function, then an exchange by the window's key (the window needs no route)
    both = a.connect(b).apply(lambda batch, port: batch, name="both", schema=SCHEMA)
    both.exchange(key="k", name="by_k").window(Tumbling(100)).count(key="k", name="counts").sink(
        sinks.Collect(), name="counts_out"
    )
    # a's records go round a loop (crossing executors by key) three times, then into a window
    with flow.loop("rounds") as loop:
        entered = loop.enter(a.with_column("n", lambda b: np.zeros(len(b), np.int64), dtype="<i8", name="zero"))
        step = entered.exchange(key="k", name="hop").with_column("n", lambda b: b["n"] + 1, dtype="<i8", name="inc")
        loop.feed_back(step.filter(lambda b: b["n"] < ROUNDS, name="again"))
        left = loop.leave(step.filter(lambda b: b["n"] >= ROUNDS, name="done"))
    left.window(Tumbling(100)).count(key="k", name="looped").sink(sinks.Collect(), name="looped_out")
    return flow, late


def inputs() -> dict:
    data = late_heavy(2 * N, seed=5)
    return {"a": data[:N], "b": data[N:]}


def expected(assigner) -> tuple[np.ndarray, np.ndarray]:
    """The rule on each source, the two sources' rows joined: (start, key, count, sum), late records."""
    parts = [reference(x, assigner.size, assigner.slide, MAX_DELAY) for x in inputs().values()]
    rows = np.concatenate([p[0] for p in parts])
    keys, inverse = np.unique(rows[:, :2], axis=0, return_inverse=True)
    inverse = inverse.ravel()
    joined = np.column_stack([keys, np.bincount(inverse, rows[:, 2]), np.bincount(inverse, rows[:, 3])]).astype(np.int64)
    return joined, np.sort(np.concatenate([p[1] for p in parts]), order=["t", "k", "v"])


def results(result, late: sinks.Collect) -> dict:
    sums = np.sort(result.outputs["gw.sums_out"], order=["window_start", "k"])
    counts = np.sort(result.outputs["gw.counts_out"], order=["window_start", "k"])
    looped = np.sort(result.outputs["gw.looped_out"], order=["window_start", "k"])
    return {
        "looped": np.column_stack([looped["window_start"], looped["k"], looped["count"]]),
        "sums": np.column_stack([sums["window_start"], sums["k"], sums["sum_v"]]),
        "counts": np.column_stack([counts["window_start"], counts["k"], counts["count"]]),
        "late": np.sort(late.records.astype(SCHEMA.dtype), order=["t", "k", "v"]),
        "late_counts": result.late_records,
    }


@pytest.mark.parametrize(("executors", "transport", "mode"), [(2, "shm", "uppar"), (3, "tcp", "uppar"), (2, "shm", "slash"), (3, "tcp", "slash")])
def test_graph_windows_on_executors_equal_one_executor_and_the_rule(executors, transport, mode):
    """mode="slash": the windows behind the union and after the loop fold their records into
    fragments shipped as partial states (late-heavy sliding windows: tails of partly late
    slices too); "uppar": their records go to their keys' owners."""
    sliding = Sliding(200, 50)
    flow, late = graph_windows(sliding)
    one = results(slashrt.run(flow, inputs(), slot_size=256, slots=4), late)
    flow, late = graph_windows(sliding)
    many = results(slashrt.run(flow, inputs(), executors=executors, transport=transport, mode=mode, slot_size=256,
                               slots=4), late)
    rows, late_records = expected(sliding)
    assert len(late_records) > N // 5  # late-heavy
    np.testing.assert_array_equal(one["sums"], rows[:, [0, 1, 3]])
    np.testing.assert_array_equal(one["late"], late_records)
    for got in (one, many):
        np.testing.assert_array_equal(got["sums"], one["sums"])
        np.testing.assert_array_equal(got["counts"], one["counts"])
        np.testing.assert_array_equal(got["late"], late_records)
        assert got["late_counts"]["gw.sums"] == len(late_records)
        assert got["late_counts"] == one["late_counts"]
    tumbling_rows, tumbling_late = expected(Tumbling(100))
    np.testing.assert_array_equal(many["counts"], tumbling_rows[:, [0, 1, 2]])
    assert many["late_counts"]["gw.counts"] == len(tumbling_late)
    # after the loop each record is judged by its source's order still (leaving drops the counter)
    a_rows, a_late = reference(inputs()["a"], 100, 100, MAX_DELAY)
    for got in (one, many):
        np.testing.assert_array_equal(got["looped"], a_rows[:, [0, 1, 2]])
        assert got["late_counts"]["gw.looped"] == len(a_late) > 0


@pytest.mark.parametrize(("executors", "transport", "routing", "sliding"),
                         [(2, "shm", "fragments", Sliding(200, 50)), (3, "tcp", "fragments", Sliding(200, 50)),
                          (2, "shm", "direct", Sliding(200, 50)), (3, "tcp", "auto", Sliding(200, 50)),
                          (2, "shm", "direct", Sliding(200, 80)), (3, "tcp", "fragments", Sliding(200, 80))],
                         ids=["2-shm-fragments", "3-tcp-fragments", "2-shm-direct", "3-tcp-auto", "2-shm-direct-slices-of-40",
                              "3-tcp-fragments-slices-of-40"])
def test_graph_windows_in_epochs_of_bytes_equal_one_executor_whatever_the_routing(executors, transport, routing, sliding):
    """`epoch_bytes=` and `ssb_routing=` mean for a graph flow what they mean for a tree flow:
    with epochs of 1 KiB the late-heavy sliding window's fragments (its slices, and the tails
    of partly late ones) ship many times before their windows are due, or each record on its
    own (direct); the windows, late counts and late records are one executor's either way.
    Windows of 200 ms every 80 ms are cut into slices of 40 ms, of which two have the same
    first window: routed directly, a batch's rows of both ship at one time."""
    flow, late = graph_windows(sliding)
    one = results(slashrt.run(flow, inputs(), slot_size=256, slots=4), late)
    flow, late = graph_windows(sliding)
    result = slashrt.run(flow, inputs(), executors=executors, transport=transport, epoch_bytes=1024,
                         ssb_routing=routing, slot_size=256, slots=4)
    many = results(result, late)
    for name in ("sums", "counts", "looped", "late"):
        np.testing.assert_array_equal(many[name], one[name], err_msg=name)
    assert many["late_counts"] == one["late_counts"]
    rows, late_records = expected(sliding)
    np.testing.assert_array_equal(many["sums"], rows[:, [0, 1, 3]])
    np.testing.assert_array_equal(many["late"], late_records)
    for step, records in (("gw.sums", 2 * N), ("gw.looped", N)):  # (the windows on the state backend)
        epochs = [e for per_executor in result.epochs[step] for e in per_executor]
        assert sum(e.records for e in epochs) == records
        # epochs of 1 KiB (cut after the batch that fills them, of a few KiB at most); without
        # epoch_bytes a dozen shipments in all (the late-heavy stream holds the windows open)
        assert len(epochs) > records * SCHEMA.record_size // 4096
        if routing != "auto":
            assert {e.direct for e in epochs} == {routing == "direct"}
        if routing == "direct":  # a row per record, but for those late for every window of theirs
            assert records - one["late_counts"][step] <= sum(e.keys_touched for e in epochs) <= records
