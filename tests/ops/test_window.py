"""Event-time windows: results equal a sequential reference (P2), firing waits for the watermark
(P1), one slice per record, late records counted and routed, snapshot and restore.

Whole-dataflow tests go through `slashrt.run` with small slots (many buffers, coalesced runs);
the firing and slicing tests drive a `WindowAggregate` directly with scripted batches and
watermarks and a child node that records what it emits.
"""

import re

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Batch, Dataflow, Schema, Sliding, Tumbling, sinks
from slashrt.ops._node import Node
from slashrt.ops.sinks import SinkNode
from slashrt.ops.window import WindowAggregate

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8", "f": "f8"})
I64 = np.iinfo(np.int64)
KEY_POOL = np.array([0, 1, -1, 5, -7, 2**40, -(2**40), I64.max, I64.min + 1, I64.min], np.int64)
KINDS = ["count", "sum", "min", "max", "mean"]
ASSIGNERS = [
    pytest.param(Tumbling(ms=100), id="tumbling100"),
    pytest.param(Tumbling(ms=1), id="tumbling1"),
    pytest.param(Sliding(size_ms=100, slide_ms=25), id="sliding100/25"),
    pytest.param(Sliding(size_ms=100, slide_ms=30), id="sliding100/30"),
    pytest.param(Sliding(size_ms=50, slide_ms=50), id="sliding50/50"),
]


def make_input(n, *, seed=0, start=0, span=2000, disorder=0, keys=KEY_POOL):
    """`n` records over `span` ms of event time from `start`, each moved back by < `disorder` ms."""
    rng = np.random.default_rng(seed)
    a = np.zeros(n, SCHEMA.dtype)
    t = start + np.arange(n, dtype=np.int64) * span // n
    if disorder:
        t = t - rng.integers(0, disorder, n)
    a["t"] = t
    a["k"] = rng.choice(keys, n)
    a["v"] = rng.integers(-1000, 1000, n)
    a["f"] = rng.normal(size=n)
    return a


def reference(records, size, slide, kind, column="v"):
    """Sequential numpy reference: each record in every window [s, s + size), s a multiple of
    `slide`, that contains it; rows (start, key, value) sorted by start then key."""
    t, k = records["t"], records["k"]
    v = records[column] if kind != "count" else np.zeros(len(t), np.int64)
    last = t // slide * slide
    starts = np.concatenate([last - j * slide for j in range(-(-size // slide))])
    keys, vals, times = np.tile(k, len(starts) // len(t)), np.tile(v, len(starts) // len(t)), np.tile(t, len(starts) // len(t))
    inside = starts + size > times
    starts, keys, vals = starts[inside], keys[inside], vals[inside]
    order = np.lexsort((keys, starts))
    starts, keys, vals = starts[order], keys[order], vals[order]
    first = np.flatnonzero(np.concatenate(([True], (starts[1:] != starts[:-1]) | (keys[1:] != keys[:-1]))))
    counts = np.diff(np.append(first, len(starts)))
    if kind == "count":
        out = counts
    elif kind == "sum":
        out = np.add.reduceat(vals, first)
    elif kind == "min":
        out = np.minimum.reduceat(vals, first)
    elif kind == "max":
        out = np.maximum.reduceat(vals, first)
    else:
        out = np.add.reduceat(vals, first) / counts
    return starts[first], keys[first], out


def sorted_output(records, output):
    order = np.lexsort((records["k"], records["window_start"]))
    r = records[order]
    return r["window_start"], r["window_end"], r["k"], r[output]


def window_flow(assigner, kind, *, column="v", max_delay=0, late=None):
    flow = Dataflow("w")
    src = flow.source("events", SCHEMA, time="t", max_delay=max_delay)
    win = src.window(assigner, late=late)
    agg = win.count(key="k", name="agg") if kind == "count" else getattr(win, kind)(column, key="k", name="agg")
    out = sinks.Collect()
    agg.sink(out, name="out")
    return flow, out, agg.fields


def assert_equals_reference(result_records, records, assigner, kind, output, column="v"):
    starts, ends, keys, values = sorted_output(result_records, output)
    ref_starts, ref_keys, ref_values = reference(records, assigner.size, assigner.slide, kind, column)
    assert np.array_equal(starts, ref_starts)
    assert np.array_equal(ends, starts + assigner.size)
    assert np.array_equal(keys, ref_keys)
    if kind == "mean" or column == "f":
        assert np.allclose(values, ref_values, rtol=1e-12, atol=1e-12)
    else:
        assert np.array_equal(values, ref_values)


# -- results equal the sequential reference -------------------------------------------------------


@pytest.mark.parametrize("assigner", ASSIGNERS)
@pytest.mark.parametrize("kind", KINDS)
def test_windows_equal_the_sequential_reference(assigner, kind):
    records = make_input(3000, seed=assigner.size * 1000 + assigner.slide * 10 + KINDS.index(kind))
    flow, out, fields = window_flow(assigner, kind)
    result = slashrt.run(flow, {"events": records}, slot_size=1024, slots=8, watermark_every=2)
    output = "count" if kind == "count" else f"{kind}_v"
    assert result.records == len(records)
    assert result.late_records == {"w.agg": 0}
    assert out.records.dtype.names == tuple(fields)
    assert_equals_reference(out.records, records, assigner, kind, output)


@pytest.mark.parametrize("kind", ["min", "max", "sum", "mean"])
def test_float_values_and_negative_event_times(kind):
    assigner = Sliding(size_ms=60, slide_ms=20)
    records = make_input(2000, seed=3, start=-1000, span=1500)
    flow, out, _ = window_flow(assigner, kind, column="f")
    slashrt.run(flow, {"events": records}, slot_size=1024, slots=4)
    assert out.records[f"{kind}_f"].dtype == np.float64
    assert_equals_reference(out.records, records, assigner, kind, f"{kind}_f", column="f")


@pytest.mark.parametrize("coalesce", [1, 16])
@pytest.mark.parametrize("assigner", [Tumbling(ms=100), Sliding(size_ms=100, slide_ms=30)], ids=str)
def test_out_of_order_input_within_max_delay_is_exact(assigner, coalesce):
    records = make_input(4000, seed=11, disorder=150)
    flow, out, _ = window_flow(assigner, "sum", max_delay=150)
    result = slashrt.run(flow, {"events": records}, slot_size=1024, slots=8, watermark_every=1, coalesce=coalesce)
    assert result.late_records == {"w.agg": 0}
    assert_equals_reference(out.records, records, assigner, "sum", "sum_v")


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 600),
    size=st.integers(1, 60),
    slide_div=st.integers(1, 4),
    disorder=st.integers(0, 40),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(KINDS),
)
def test_random_windows_equal_the_reference(n, size, slide_div, disorder, seed, kind):
    assigner = Sliding(size_ms=size, slide_ms=max(1, size // slide_div))
    records = make_input(n, seed=seed, span=400, disorder=disorder, keys=KEY_POOL[: 1 + seed % len(KEY_POOL)])
    flow, out, _ = window_flow(assigner, kind, max_delay=disorder)
    result = slashrt.run(flow, {"events": records}, slot_size=256, slots=4, watermark_every=1, coalesce=4)
    assert result.late_records == {"w.agg": 0}
    assert_equals_reference(out.records, records, assigner, kind, "count" if kind == "count" else f"{kind}_v")


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda s: s.with_column("kk", lambda b: b["k"].astype("S16")).window(Tumbling(ms=10)).count(key="kk", name="agg"),
         "key column 'kk' is |S16, 16 bytes wide"),
        (lambda s: s.with_column("x", lambda b: b["t"].astype("S4")).window(Tumbling(ms=10)).sum("x", key="k", name="agg"),
         "column 'x' must be numeric, is |S4"),
    ],
)  # fmt: skip
def test_columns_typed_only_at_run_time_are_checked_by_the_window(build, match):
    flow = Dataflow("w")
    build(flow.source("events", SCHEMA, time="t")).sink(sinks.Collect())
    with pytest.raises(slashrt.OperatorError, match=rf"step 'w\.agg': {re.escape(match)}"):
        slashrt.run(flow, {"events": make_input(100)})


# -- driving the node directly ---------------------------------------------------------------------


class Recorder(Node):
    """A child that keeps every emitted batch and the watermarks it was told about."""

    def __init__(self):
        super().__init__("recorder")
        self.batches: list[np.ndarray] = []
        self.watermarks: list[int] = []
        self.ended = False

    async def push(self, batch):
        self.batches.append(batch.to_numpy().copy())

    async def on_watermark(self, watermark):
        self.watermarks.append(watermark)

    async def on_end(self):
        self.ended = True

    def windows(self):
        return sorted({(int(s), int(e)) for b in self.batches for s, e in zip(b["window_start"], b["window_end"])})

    def rows(self):
        return np.concatenate(self.batches) if self.batches else None


def window_node(assigner, kind="count", late=None, **agg):
    """A WindowAggregate built from a real dataflow spec, with a Recorder child; `agg`: more
    arguments of the aggregate (overflow=)."""
    flow = Dataflow("w")
    win = flow.source("events", SCHEMA, time="t").window(assigner, late=late)
    stream = win.count(key="k", name="agg") if kind == "count" else getattr(win, kind)("v", key="k", name="agg", **agg)
    late_node = SinkNode("w.agg.late", late) if late is not None else None
    node = WindowAggregate(flow.steps[stream.step_id], late_node)
    rec = Recorder()
    node.children = [rec]
    return node, rec


def batch_at(times, keys=None, values=None):
    a = np.zeros(len(times), SCHEMA.dtype)
    a["t"] = times
    a["k"] = 1 if keys is None else keys
    a["v"] = 1 if values is None else values
    return Batch(a)


def test_assigners_take_their_lengths_positionally_or_by_keyword():
    assert Tumbling(10_000) == Tumbling(ms=10_000) == Tumbling(seconds=10)
    assert Sliding(10_000, 5_000) == Sliding(size_ms=10_000, slide_ms=5_000) == Sliding(seconds=10, every_seconds=5)
    assert (Sliding(10_000, 5_000).size, Sliding(10_000, 5_000).slide) == (10_000, 5_000)
    assert Tumbling.__doc__ and Sliding.__doc__
    with pytest.raises(slashrt.errors.DataflowError, match="exactly one of ms= or seconds="):
        Tumbling(10, seconds=1)
    with pytest.raises(slashrt.errors.DataflowError, match="slide 20 ms is longer"):
        Sliding(10, 20)


@pytest.mark.parametrize(("unit", "per_ms"), [("s", 0.001), ("ms", 1), ("us", 1000), ("ns", 10**6)])
def test_window_lengths_apply_in_the_time_unit_of_the_source(unit, per_ms):
    flow = Dataflow("units")
    out = sinks.Collect()
    flow.source("e", SCHEMA, time="t", time_unit=unit).window(Sliding(seconds=10, every_seconds=5)).count(key="k").sink(out)
    data = np.zeros(3, SCHEMA.dtype)
    data["t"] = (np.array([0, 9_999, 10_000]) * per_ms).astype(np.int64)
    slashrt.run(flow, {"e": data})
    rows = np.sort(out.records, order="window_start")
    ten_s = int(10_000 * per_ms)
    assert rows["window_start"].tolist() == [-ten_s // 2, 0, ten_s // 2, ten_s]
    assert rows["count"].tolist() == [1, 2, 2, 1]
    assert (rows["window_end"] - rows["window_start"] == ten_s).all()


def test_bad_time_units_are_refused_naming_the_source_or_the_window():
    with pytest.raises(slashrt.errors.DataflowError, match="source 'e': time_unit must be one of s, ms, us, ns"):
        Dataflow("u").source("e", SCHEMA, time="t", time_unit="min")
    with pytest.raises(slashrt.errors.DataflowError, match="1500 ms .* not a whole number of s"):
        Dataflow("u").source("e", SCHEMA, time="t", time_unit="s").window(Tumbling(1500))
    with pytest.raises(slashrt.errors.DataflowError, match="10000 is no window assigner; give slashrt.Tumbling"):
        Dataflow("u").source("e", SCHEMA, time="t").window(10_000)


async def test_a_record_updates_exactly_one_slice():
    node, _ = window_node(Sliding(size_ms=100, slide_ms=30))  # slices of 10 ms, up to 4 windows each
    assert node.slice_len == 10
    await node.push(batch_at([55]))
    assert list(node.slices) == [5]
    assert len(node.slices[5]) == 1
    times = np.array([0, 1, 9, 10, 55, 99, 100, 345, -1, -10, -11])
    await node.push(batch_at(times, keys=np.arange(len(times)) % 3))
    want = {}
    for s in np.concatenate([[55], times]) // 10:
        want[int(s)] = want.get(int(s), 0) + 1
    got = {s: int(agg.export()[1].sum()) for s, agg in node.slices.items()}
    assert got == want
    assert sum(got.values()) == len(times) + 1  # every record counted once, in one slice


async def test_tumbling_window_fires_only_once_the_watermark_reaches_its_end():
    node, rec = window_node(Tumbling(ms=100))
    await node.push(batch_at(np.arange(0, 250, 5)))
    for w in (-5, 0, 50, 99):
        await node.on_watermark(w)
        assert rec.batches == [], f"fired at watermark {w}"
    await node.on_watermark(100)
    assert rec.windows() == [(0, 100)]
    assert list(rec.rows()["count"]) == [20]
    await node.on_watermark(199)
    assert rec.windows() == [(0, 100)]
    await node.on_watermark(250)
    assert rec.windows() == [(0, 100), (100, 200)]
    assert node.fired_until == 200
    await node.on_end()  # a bounded stream completes every window with state
    assert rec.windows() == [(0, 100), (100, 200), (200, 300)]
    assert list(rec.rows()["count"]) == [20, 20, 10]
    assert rec.watermarks == [-5, 0, 50, 99, 100, 199, 250] and rec.ended
    assert node.slices == {}


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 50),
    slide_div=st.integers(1, 5),
    steps=st.lists(st.tuples(st.lists(st.integers(0, 300), max_size=20), st.integers(0, 60)), max_size=12),
)
def test_windows_fire_exactly_when_the_watermark_passes_their_end(size, slide_div, steps):
    """P1 both ways: nothing fires before its end <= watermark; everything with data fires then."""
    assigner = Sliding(size_ms=size, slide_ms=max(1, size // slide_div))

    async def main():
        node, rec = window_node(assigner)
        watermark = -(10**9)
        seen: list[int] = []  # on-time event times pushed so far
        for times, advance in steps:
            times = [t for t in times if t >= watermark]  # a well-behaved source: nothing late
            if times:
                await node.push(batch_at(times))
                seen.extend(times)
            before = len(rec.batches)
            watermark = max(watermark, 0) + advance
            await node.on_watermark(watermark)
            for b in rec.batches[before:]:
                assert (b["window_end"] <= watermark).all(), "fired before the watermark passed the end"
            due = {
                (s, s + assigner.size)
                for t in seen
                for s in range(t // assigner.slide * assigner.slide, t - assigner.size, -assigner.slide)
                if s + assigner.size <= watermark
            }
            assert set(rec.windows()) == due
        assert node.late_records == 0

    trio.run(main)


async def test_late_records_are_counted_routed_and_never_silently_dropped():
    late_sink = sinks.Collect()
    late_sink.open()
    node, rec = window_node(Sliding(size_ms=100, slide_ms=50), late=late_sink)
    await node.push(batch_at([10, 60, 120], keys=[1, 2, 3]))
    await node.on_watermark(150)  # fires [-50, 50) and [0, 100); [50, 150) too
    assert rec.windows() == [(-50, 50), (0, 100), (50, 150)]
    # t=20 and t=70: every window of them has fired. t=120: [50, 150) has fired, [100, 200) not.
    # t=170: on time. A record whose first window fired is late; it still counts where it can.
    await node.push(batch_at([20, 70, 120, 170], keys=[4, 5, 6, 7]))
    assert node.late_records == 3
    late_sink.close()
    assert list(late_sink.records["t"]) == [20, 70, 120]
    assert list(late_sink.records["k"]) == [4, 5, 6]
    await node.on_end()
    rows = rec.rows()
    assert sorted(zip(rows["window_start"].tolist(), rows["k"].tolist())) == [
        (-50, 1), (0, 1), (0, 2), (50, 2), (50, 3),
        (100, 3), (100, 6), (100, 7), (150, 7),
    ]  # fmt: skip
    assert not np.isin([4, 5], rows["k"]).any(), "records whose windows all fired updated one"


@pytest.mark.parametrize("with_sink", [True, False])
def test_late_records_through_run(with_sink):
    on_time = make_input(2000, seed=5, span=1000)
    late = np.zeros(7, SCHEMA.dtype)
    late["t"] = [0, 5, 10, 20, 50, 99, 150]
    late["k"] = 99
    records = np.concatenate([on_time, late])
    late_sink = sinks.Collect() if with_sink else None
    flow, out, _ = window_flow(Tumbling(ms=100), "count", late=late_sink)
    # a watermark after every buffer: by the last buffer, windows up to 900 have fired
    result = slashrt.run(flow, {"events": records}, slot_size=1024, slots=8, watermark_every=1)
    assert result.late_records == {"w.agg": 7}
    assert_equals_reference(out.records, on_time, Tumbling(ms=100), "count", "count")
    if with_sink:
        assert np.array_equal(late_sink.records, late)
        assert result["w.agg.late"] is late_sink.records


async def test_snapshot_and_restore_continue_to_the_same_result():
    records = make_input(3000, seed=9, span=3000, disorder=30)
    chunks = np.array_split(records, 12)

    async def feed(node, chunks, first=0):
        for i, c in enumerate(chunks, first):
            await node.push(Batch(c))
            if i % 2:
                await node.on_watermark(int(records["t"][: (i + 1) * 250].max()) - 30)

    assigner = Sliding(size_ms=200, slide_ms=50)
    node, rec = window_node(assigner, kind="mean")
    await feed(node, chunks[:6])
    state = node.snapshot()
    assert len(state.arrays["slices.ids"]) and all(isinstance(a, np.ndarray) for a in state.arrays.values())
    emitted_before = len(rec.batches)

    # a fresh node restored from the snapshot ...
    restored, rec2 = window_node(assigner, kind="mean")
    restored.restore(state)
    await feed(restored, chunks[6:], first=6)
    await restored.on_end()
    # ... and the original, continuing, produce the same; both complete the reference
    await feed(node, chunks[6:], first=6)
    await node.on_end()
    after = np.concatenate(rec.batches[emitted_before:])
    assert np.array_equal(np.sort(rec2.rows(), order=["window_start", "k"]), np.sort(after, order=["window_start", "k"]))
    full = np.concatenate(rec.batches[:emitted_before] + rec2.batches)
    assert node.late_records == restored.late_records == 0
    assert_equals_reference(full, records, assigner, "mean", "mean_v")


async def test_restore_does_not_share_state_with_the_snapshot():
    node, rec = window_node(Tumbling(ms=10), kind="sum")
    await node.push(batch_at([1, 2, 3], values=[1, 2, 3]))
    state = node.snapshot()
    await node.push(batch_at([4], values=[100]))  # after the snapshot: not in it
    other, rec2 = window_node(Tumbling(ms=10), kind="sum")
    other.restore(state)
    await other.on_end()
    assert list(rec2.rows()["sum_v"]) == [6]


@pytest.mark.parametrize("derived", ["key", "value", "time", "key+value"])
def test_derived_columns_beside_fields_of_multi_slot_runs(derived):
    """Columns added by with_column are 1-D while record fields of a run of slots are 2-D views:
    the window takes any mix of them (regression: 'values has shape (32, 1637), keys has ...')."""
    records = make_input(6000, seed=3)
    flow = Dataflow("w")
    src = flow.source("events", SCHEMA, time="t")
    names = {"key": "k", "value": "v", "time": "t"}
    if "key" in derived:
        src = src.with_column("k2", lambda b: b["k"] + 0)
        names["key"] = "k2"
    if "value" in derived:
        src = src.with_column("v2", lambda b: b["v"] + 0)
        names["value"] = "v2"
    if derived == "time":  # the event time replaced by a derived column of the same name
        src = src.with_column("t", lambda b: b["t"] + 0)
    win = src.window(Tumbling(ms=100))
    agg = win.sum(names["value"], key=names["key"], name="agg")
    out = sinks.Collect()
    agg.sink(out, name="out")
    slashrt.run(flow, {"events": records}, slot_size=4096, slots=16, coalesce=8)
    got = out.records
    order = np.lexsort((got[names["key"]], got["window_start"]))
    starts, keys, vals = reference(records, 100, 100, "sum")
    assert np.array_equal(got["window_start"][order], starts)
    assert np.array_equal(got[names["key"]][order], keys)
    assert np.array_equal(got[f"sum_{names['value']}"][order], vals)


async def test_records_judged_elsewhere_join_only_the_windows_still_open_for_them_through_a_snapshot():
    # a leader or owner still holds windows [0, 100) and [50, 150) open (its own watermark is
    # behind); records read on another executor whose watermark closed windows ending by 100
    # join [50, 150) and [100, 200) only, also after a snapshot and restore
    node, rec = window_node(Sliding(100, 50), kind="sum")
    await node.push(batch_at([60], values=[1]))  # its own record, open for every window
    await node.push_judged(batch_at([70, 120], values=[10, 100]), closed_until=100)
    restored, rec = window_node(Sliding(100, 50), kind="sum")
    restored.restore(node.snapshot())
    await restored.on_end()
    sums = {(int(r["window_start"]), int(r["window_end"])): int(r["sum_v"]) for r in rec.rows()}
    assert sums == {(0, 100): 1, (50, 150): 111, (100, 200): 100}
    assert restored.late_records == 0  # counted where they were read


async def test_an_overflow_error_sum_checks_records_judged_late_elsewhere():
    # records read on another executor, late there for the window [0, 100), make a tail of
    # their slice [50, 100): its int64 sum is checked like a slice's, and the window [50, 150)
    # it joins fails naming the step (regression: tails were unchecked tables)
    node, _ = window_node(Sliding(100, 50), kind="sum", overflow="error")
    await node.push(batch_at([60], values=[1]))
    await node.push_judged(batch_at([70, 80], values=[I64.max, I64.max]), closed_until=100)
    assert node.tails
    with pytest.raises(slashrt.OperatorError, match=r"step 'w\.agg': .*overflowed in window \[50, 150\)"):
        await node.on_end()


@pytest.mark.parametrize("where", ["slice", "tail"])
async def test_a_snapshot_keeps_the_overflow_of_a_slice_or_a_tail(where):
    node, _ = window_node(Sliding(100, 50), kind="sum", overflow="error")
    await node.push(batch_at([60], values=[1]))
    overflowing = batch_at([70, 80], values=[I64.max, I64.max])
    if where == "slice":
        await node.push(overflowing)
    else:
        await node.push_judged(overflowing, closed_until=100)
    state = node.snapshot()
    flagged = {name: state.arrays[f"{name}.ids"][state.arrays[f"{name}.overflowed"]].tolist() for name in ("slices", "tails")}
    assert flagged == ({"slices": [[1]], "tails": []} if where == "slice" else {"slices": [], "tails": [[1, 100]]})
    restored, _ = window_node(Sliding(100, 50), kind="sum", overflow="error")
    restored.restore(state)  # the exported sums have wrapped: only the flag tells
    window = "[0, 100)" if where == "slice" else "[50, 150)"
    with pytest.raises(slashrt.OperatorError, match=rf"step 'w\.agg': .*overflowed in window {re.escape(window)}"):
        await restored.on_end()
