"""Windows inside loops: one window per (window, iteration), firing when the input frontier
passes (window end, iteration); checked against a numpy reference iterated by hand, nested two
deep, and on random graphs and event orders (never early, never a record lost)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, Operator, Sliding, Timestamp, Tumbling, sinks

REC = np.dtype([("t", "<i8"), ("k", "<i8"), ("v", "<i8")])
SCHEMA = {"t": "i8", "k": "i8", "v": "i8"}
SIZE = 10
KEYS = 7


def records(t, k, v) -> np.ndarray:
    a = np.zeros(len(t), REC)
    a["t"], a["k"], a["v"] = t, k, v
    return a


def window_sums(recs: np.ndarray) -> np.ndarray:
    """Reference: sum of v per (tumbling window of SIZE, key), as the window step's rows."""
    out = np.dtype([("window_start", "<i8"), ("window_end", "<i8"), ("k", "<i8"), ("sum_v", "<i8")])
    if not len(recs):
        return np.zeros(0, out)
    starts = recs["t"] // SIZE * SIZE
    groups, inverse = np.unique(np.stack([starts, recs["k"]], axis=1), axis=0, return_inverse=True)
    sums = np.zeros(len(groups), np.int64)
    np.add.at(sums, inverse.ravel(), recs["v"])
    rows = np.zeros(len(groups), out)
    rows["window_start"], rows["window_end"], rows["k"], rows["sum_v"] = groups[:, 0], groups[:, 0] + SIZE, groups[:, 1], sums
    return rows


def halved(rows: np.ndarray, divisor: int, shift: int = 0) -> np.ndarray:
    """Reference of the feedback: each row as a record at its window's end, v = sum // divisor,
    kept while v > 0, its key moved on by `shift` (round the KEYS)."""
    back = records(rows["window_end"], (rows["k"] + shift) % KEYS, rows["sum_v"] // divisor)
    return back[back["v"] > 0]


def feed_back_step(divisor: int, shift: int = 0):
    def step(batch):
        rows = batch.to_numpy()
        return halved(rows, divisor, shift)

    return step


def as_rows(a: np.ndarray) -> list:
    return sorted(map(tuple, a.tolist()))


def reference_loop(inputs: np.ndarray, divisor: int = 2, shift: int = 0) -> list[np.ndarray]:
    """Per iteration, the window rows of the loop below (iterated by hand in numpy)."""
    out, current = [], inputs
    while len(current):
        rows = window_sums(current)
        out.append(rows)
        current = halved(rows, divisor, shift)
    return out


def reference_nested(inputs: np.ndarray, shift: int = 0) -> dict[tuple[int, int], np.ndarray]:
    """Per (outer, inner) iteration, the window rows of the nested loops below: outer iteration
    o enters the inner loop with its input; every inner iteration's rows leave the inner loop,
    and the outer feedback is all of them at a third."""
    want, current, o = {}, inputs, 0
    while len(current):
        per_inner = reference_loop(current, 2, shift)
        for i, rows in enumerate(per_inner):
            want[(o, i)] = rows
        current = halved(np.concatenate(per_inner), 3, shift)
        o += 1
    return want


def input_records(seed: int, n: int = 600) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, 200, n))
    return records(t, rng.integers(0, KEYS, n), rng.integers(1, 50, n))


class Iterations(Operator):
    """Passes its batches on and logs the time of each (per_time False: whole batches)."""

    per_time = False

    def __init__(self, log):
        self.log = log

    async def on_batch(self, ctx, port, batch):
        self.log.append((ctx.time, batch.to_numpy().copy()))
        await ctx.emit(batch)


def halving(src, seen=None, *, schema=None, shift: int = 0, nested: bool = False):
    """The loops of the tests below on `src`: a keyed tumbling window sums v per iteration (its
    rows passing the operator `seen` if given, which emits `schema`, default the rows) and feeds
    them back halved (`halved`, keys moved on by `shift`) until none is left (`reference_loop`);
    `nested`: inside an outer loop that feeds every inner result back at a third
    (`reference_nested`). The stream of every iteration's rows, left."""

    def inner_loop(loop, entered):
        sums = loop.enter(entered).window(Tumbling(ms=SIZE)).sum("v", key="k", name="win")
        rows = sums if seen is None else sums.operator(seen, name="seen", schema=schema)
        loop.feed_back(rows.apply(feed_back_step(2, shift), schema=SCHEMA, name="halve"))
        return loop.leave(rows)

    if not nested:
        with src.flow.loop("halve", max_iterations=40) as loop:
            return inner_loop(loop, src)
    with src.flow.loop("outer", max_iterations=20) as outer:
        o_in = outer.enter(src)
        with outer.loop("inner", max_iterations=20) as inner:
            left = inner_loop(inner, o_in)
        outer.feed_back(left.apply(feed_back_step(3, shift), schema=SCHEMA, name="third"), into=o_in)
        return outer.leave(left)


def halving_loop(seen, name: str = "lw", schema=None, shift: int = 0) -> tuple[Dataflow, sinks.Collect]:
    """`halving` in a flow of its own, its rows into the returned sink."""
    flow = Dataflow(name)
    out = sinks.Collect()
    halving(flow.source("src", REC, time="t"), seen, schema=schema, shift=shift).sink(out)
    return flow, out


def nested_loops(seen, name: str = "nest", schema=None, shift: int = 0) -> tuple[Dataflow, sinks.Collect]:
    """`halving` nested two deep in a flow of its own: the window runs per (outer, inner)
    iteration; its rows into the returned sink."""
    flow = Dataflow(name)
    out = sinks.Collect()
    halving(flow.source("src", REC, time="t"), seen, schema=schema, shift=shift, nested=True).sink(out)
    return flow, out
def late_loop(
    offset: int, seen, late: sinks.Collect, name: str = "late", schema=None
) -> tuple[Dataflow, sinks.Collect]:
    """Iteration 0 counts per key; the rows of [0, 10) go round once more as records at event
    time 10 + offset and time (10, <1>): at 9 behind their time, whose epoch 10 closed [0, 10)
    of iteration 1, so they are late."""
    flow = Dataflow(name)
    src = flow.source("src", REC, time="t")

    def back(batch):
        rows = batch.to_numpy()
        return records(rows["window_end"] + offset, rows["k"], rows["count"])

    with flow.loop("l") as loop:
        counts = loop.enter(src).window(Tumbling(ms=SIZE), late=late).count(key="k", name="win")
        seen = counts.operator(seen, name="seen", schema=schema)
        loop.feed_back(seen.filter(lambda b: b["window_start"] == 0).apply(back, schema=SCHEMA, name="back"))
        loop.leave(seen).sink(out := sinks.Collect())
    return flow, out


@pytest.mark.parametrize("slots", [(512, 4), (65536, 8)])
def test_a_keyed_tumbling_window_in_a_loop_aggregates_each_iteration_apart(slots):
    data = input_records(1)
    log = []
    flow, out = halving_loop(Iterations(log))
    result = slashrt.run(flow, {"src": data}, slot_size=slots[0], slots=slots[1])
    want = reference_loop(data)
    assert len(want) > 4  # several iterations, whose windows overlap in event time
    by_iteration = {}
    for time, rows in log:
        assert time.epoch == int(rows["window_end"].min()) and (rows["window_end"] == time.epoch).all()
        by_iteration.setdefault(time.counters, []).extend(map(tuple, rows.tolist()))
    assert sorted(by_iteration) == [(i,) for i in range(len(want))]
    for i, rows in enumerate(want):
        assert sorted(by_iteration[(i,)]) == as_rows(rows), f"iteration {i}"
    assert as_rows(out.records) == as_rows(np.concatenate(want))
    assert result.late_records == {"lw.win": 0}
    assert all(f == [] for f in result.frontiers.values())


def test_windows_in_loops_nested_two_deep():
    data = input_records(2, 300)
    log = []
    flow, out = nested_loops(Iterations(log))
    result = slashrt.run(flow, {"src": data}, slot_size=512, slots=4)
    want = {c: as_rows(rows) for c, rows in reference_nested(data).items()}
    assert max(o for o, _ in want) >= 2 and max(i for _, i in want) >= 3
    got = {}
    for time, rows in log:
        got.setdefault(time.counters, []).extend(map(tuple, rows.tolist()))
    assert {c: sorted(r) for c, r in got.items()} == want
    assert as_rows(out.records) == sorted(r for rows in want.values() for r in rows)
    assert result.late_records == {"nest.win": 0}


@pytest.mark.parametrize("offset, late_rows", [(0, 0), (-1, 1)])
def test_late_records_in_loops_are_judged_by_their_batch_time(offset, late_rows):
    """One record at 5: iteration 0 counts it in [0, 10); fed back at 10 it lands in [10, 20)
    of iteration 1, at 9 it is late, counted and in the late sink."""
    late, log = sinks.Collect(), []
    flow, _ = late_loop(offset, Iterations(log), late)
    result = slashrt.run(flow, {"src": records([5], [3], [1])})
    got = [(t, (int(r["window_start"]), int(r["count"]))) for t, rows in log for r in rows]
    want = [(Timestamp(10, (0,)), (0, 1))] + ([(Timestamp(20, (1,)), (10, 1))] if not late_rows else [])
    assert got == want
    assert result.late_records == {"late.win": late_rows}
    assert late.records["t"].tolist() == [9] * late_rows


@pytest.mark.parametrize("assigner", [Tumbling(ms=100), Sliding(300, 100)])
def test_a_late_heavy_input_is_judged_at_iteration_zero_as_outside_loops(assigner):
    """The input-order rule of lateness carries over into loops: iteration 0 of a window in a
    loop gives the windows and late records of the independent numpy evaluation
    (tests/test_lateness.py), whatever the slots."""
    from tests.test_lateness import MAX_DELAY, SCHEMA as LSCHEMA, late_heavy, reference

    data = late_heavy(3000)
    want_rows, want_late = reference(data, assigner.size, assigner.slide, MAX_DELAY)
    for slot_size, slots in [(256, 4), (8192, 16)]:
        flow = Dataflow("lh")
        src = flow.source("events", LSCHEMA, time="t", max_delay=MAX_DELAY)
        late, out = sinks.Collect(), sinks.Collect()
        with flow.loop("once", max_iterations=0) as loop:
            x = loop.enter(src)
            sums = x.window(assigner, late=late).sum("v", key="k", name="sums")
            counts = x.window(assigner).count(key="k", name="counts")
            loop.feed_back(x.filter(lambda b: b["k"] < 0))  # never: one iteration
            loop.leave(sums).sink(out)
            loop.leave(counts).sink(counted := sinks.Collect())
        result = slashrt.run(flow, {"events": data}, slot_size=slot_size, slots=slots)
        sums, cnts = (np.sort(c.records, order=["window_start", "k"]) for c in (out, counted))
        assert np.array_equal(sums[["window_start", "k"]], cnts[["window_start", "k"]])
        rows = np.column_stack([sums["window_start"], sums["k"], cnts["count"], sums["sum_v"]])
        assert np.array_equal(rows, want_rows)
        got_late = np.sort(late.records.astype(LSCHEMA.dtype), order=["t", "k", "v"])
        assert np.array_equal(got_late, want_late) and len(want_late) > 100
        assert result.late_records["lh.sums"] == len(want_late)


# --- random graphs and event orders ---------------------------------------------------------

PREC = np.dtype([("id", "<i8"), ("t", "<i8"), ("k", "<i8"), ("n", "<i8"), ("m", "<i8")])
PSCHEMA = {name: "i8" for name in PREC.names}


class Log(Operator):
    """Logs each batch (its time and records) in the shared log, in event order."""

    def __init__(self, log, kind, per_time=True):
        self.log, self.kind, self.per_time = log, kind, per_time

    async def on_batch(self, ctx, port, batch):
        self.log.append((self.kind, ctx.time, batch.to_numpy().copy()))
        await ctx.emit(batch)


def back_records(ids, offset: int, level: str):
    """Window rows -> records fed back: at the window's end + offset (a negative offset puts
    them behind their time, where they may be late), the next inner (n) or outer (m) round."""

    def back(batch):
        rows = batch.to_numpy()
        out = np.zeros(len(rows), PREC)
        out["id"] = [next(ids) for _ in range(len(rows))]
        out["t"] = rows["window_end"] + offset
        out["k"] = rows["kn"] // 64
        n, m = rows["kn"] // 8 % 8, rows["kn"] % 8
        out["n"], out["m"] = (n + 1, m) if level == "inner" else (0, m + 1)
        return out

    return back


def windows_of(t: int, size: int, slide: int) -> list[int]:
    last = t // slide * slide
    return [s for s in range(last - (size // slide + 1) * slide, last + 1, slide) if s <= t < s + size]


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.data())
def test_windows_in_loops_never_fire_early_and_never_lose_records(data):
    draw = data.draw
    log, ids = [], itertools.count(10**6)
    flow = Dataflow("p")
    inputs, sources = {}, []
    for s in range(draw(st.integers(1, 2), label="sources")):
        times = draw(st.lists(st.integers(0, 30), min_size=1, max_size=30), label=f"times{s}")
        a = np.zeros(len(times), PREC)
        a["id"], a["t"] = np.arange(len(times)) + 1000 * s, times
        a["k"] = draw(st.lists(st.integers(0, 2), min_size=len(times), max_size=len(times)), label=f"keys{s}")
        inputs[f"s{s}"] = a
        sources.append(flow.source(f"s{s}", PREC, time="t", max_delay=draw(st.integers(0, 4), label=f"delay{s}")))
    if draw(st.booleans(), label="tumbling"):
        assigner = Tumbling(ms=draw(st.integers(2, 6), label="size"))
    else:
        slide = draw(st.integers(1, 3), label="slide")
        assigner = Sliding(slide * draw(st.integers(1, 3), label="slides"), slide)
    late = sinks.Collect()

    def body(loop, streams):
        entered = [loop.enter(s) for s in streams]
        if len(entered) == 1:
            x = entered[0]
        elif draw(st.booleans(), label="union"):
            x = entered[0].union(entered[1])
        else:  # a two-input step inside the loop, before the window
            x = entered[0].connect(entered[1]).apply(lambda b, port: b)
        x = x.with_column("kn", lambda b: b["k"] * 64 + b["n"] * 8 + b["m"], dtype="i8")
        pre = x.operator(Log(log, "in", per_time=draw(st.booleans(), label="per_time")), name="pre")
        counts = pre.window(assigner, late=late).count(key="kn", name="win")
        post = counts.operator(Log(log, "out"), name="post")
        back = post.apply(back_records(ids, draw(st.integers(-3, 3), label="offset"), "inner"), schema=PSCHEMA)
        loop.feed_back(back.filter(lambda b: b["n"] < 3), into=entered[0])
        return loop.leave(post)

    if draw(st.booleans(), label="nested"):
        with flow.loop("outer", max_iterations=4) as outer:
            o_in = [outer.enter(s) for s in sources]
            with outer.loop("inner", max_iterations=4) as inner:
                left = body(inner, o_in)
            again = left.apply(back_records(ids, draw(st.integers(-3, 3), label="offset2"), "outer"), schema=PSCHEMA)
            outer.feed_back(again.filter(lambda b: b["m"] < 2), into=o_in[0])
            done = outer.leave(left)
    else:
        with flow.loop("l", max_iterations=4) as loop:
            done = body(loop, sources)
    done.sink(sinks.Collect())
    slots = draw(st.sampled_from([(128, 4), (4096, 16)]), label="slots")
    result = slashrt.run(flow, inputs, slot_size=slots[0], slots=slots[1])

    size, slide = assigner.size, assigner.slide
    fired = {}  # (iteration, window start, key) -> (log position, count)
    for p, (kind, time, rows) in enumerate(log):
        if kind == "out":
            assert (rows["window_end"] == time.epoch).all()  # results at (end, iteration)
            for r in rows:
                key = (time.counters, int(r["window_start"]), int(r["kn"]))
                assert key not in fired, f"window {key} fired twice"
                fired[key] = (p, int(r["count"]))
    late_ids = late.records["id"].tolist()
    assert len(set(late_ids)) == len(late_ids) == sum(result.late_records.values())
    late_ids = set(late_ids)
    counted = dict.fromkeys(fired, 0)
    seen = 0
    for p, (kind, time, rows) in enumerate(log):
        if kind != "in":
            continue
        # a record is late for its windows ending at or before its batch's epoch (at its
        # iteration): those never take it; every other window of it fires after it came
        closed = (time.epoch - size) // slide * slide + size
        for r in rows:
            seen += 1
            t, rid = int(r["t"]), int(r["id"])
            for s in windows_of(t, size, slide):
                if s + size <= closed:
                    continue
                at = fired.get((time.counters, s, int(r["kn"])))
                assert at is not None and at[0] > p, (rid, t, time, s, at, p)  # never early, never lost
                counted[(time.counters, s, int(r["kn"]))] += 1
            assert (rid in late_ids) == (windows_of(t, size, slide)[0] + size <= closed), (rid, t, time)
    assert counted == {key: count for key, (_, count) in fired.items()}  # no record lost or counted twice
    assert seen >= sum(len(a) for a in inputs.values())
    assert all(f == [] for f in result.frontiers.values())
