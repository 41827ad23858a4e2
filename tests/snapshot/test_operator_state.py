"""Operator state: a run snapshotted part-way, its states written and read back in the snapshot
format and restored into a new plan, gives what an uninterrupted run gives; restore then
snapshot gives the state back; a state for another operator, a later layout or another step is
refused; SSB state cut by partition and reassigned to another executor count fires the same
windows."""

import numpy as np
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slashrt import Batch, Dataflow, Schema, Sliding, Tumbling, sinks
from slashrt._plan import ClusterRole, build_plan
from slashrt.errors import OperatorError, SnapshotError
from slashrt.progress.frontier import END_TIME
from slashrt.ops._node import Node
from slashrt.ops.window import NO_TIME
from slashrt.ops.sources import ChannelFeeder, feed_array
from slashrt.snapshot import State, decode_state, encode_state
from slashrt.snapshot.operators import restore_plan, snapshot_plan, unpack_tables
from slashrt.ssb.window import SsbWindowAggregate, merge_partitions, split_partitions
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import RingSpec, open_inproc_channel

from ._channel import read_all

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
KINDS = ("count", "sum", "min", "max", "mean")
WINDOWS = (Tumbling(ms=50), Sliding(100, 25), Sliding(90, 30))
MAX_DELAY = 20


def make_input(n: int, seed: int, disorder: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.zeros(n, SCHEMA.dtype)
    a["t"] = np.arange(n) * 3 - rng.integers(0, disorder + 1, n)  # some records behind the watermark: late
    a["k"] = rng.integers(-6, 6, n)
    a["v"] = rng.integers(-1000, 1000, n)
    return a


def through_the_format(states: dict[str, State]) -> dict[str, State]:
    """Each state written as snapshot bytes and read back (arrays become views into them)."""
    return {step: decode_state(encode_state(s.arrays, s.meta), name=step) for step, s in states.items()}


def window_flow(window, kind: str, overflow: str = "wrap"):
    flow = Dataflow("w")
    late = sinks.Collect()
    win = flow.source("src", SCHEMA, time="t", max_delay=MAX_DELAY).window(window, late=late)
    options = {"overflow": overflow} if kind == "sum" else {}
    agg = getattr(win, kind)(*(() if kind == "count" else ("v",)), key="k", name="agg", **options)
    out = sinks.Collect()
    agg.sink(out, name="out")
    plan = build_plan(flow)
    for node in plan.sinks:
        node.open()
    return plan, out, late


async def push(plan, chunks) -> None:
    for chunk in chunks:
        await plan.roots["w.src"].push(Batch(chunk))


def rows(parts) -> np.ndarray:
    got = np.concatenate([p for p in parts if p is not None and len(p)]) if any(
        p is not None and len(p) for p in parts
    ) else None
    if got is None:
        return np.empty(0)
    names = list(got.dtype.names)
    return np.sort(got, order=names[::-1] if "window_start" not in names else ["window_start", "window_end", "k"])


def windows_of(plan):
    (window,) = plan.windows()
    return window


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 600), seed=st.integers(0, 2**16), disorder=st.sampled_from([0, 10, 60]),
    window=st.sampled_from(WINDOWS), kind=st.sampled_from(KINDS), cut=st.floats(0, 1), pieces=st.integers(1, 6),
)
def test_a_window_restored_from_its_snapshot_continues_as_an_uninterrupted_run(n, seed, disorder, window, kind, cut, pieces):
    records = make_input(n, seed, disorder)
    chunks = np.array_split(records, pieces)
    at = round(cut * pieces)

    async def main():
        whole, whole_out, whole_late = window_flow(window, kind)
        await push(whole, chunks)
        await whole.roots["w.src"].on_end()

        first, out1, late1 = window_flow(window, kind)
        await push(first, chunks[:at])
        states = snapshot_plan(first)
        emitted = [None if c.records is None else c.records.copy() for c in (out1, late1)]
        await push(first, chunks[at:])  # the original runs on: the snapshot shares nothing with it
        second, out2, late2 = window_flow(window, kind)
        restore_plan(second, through_the_format(states))
        await push(second, chunks[at:])
        await second.roots["w.src"].on_end()
        assert np.array_equal(rows([emitted[0], out2.records]), rows([whole_out.records]))
        assert np.array_equal(rows([emitted[1], late2.records]), rows([whole_late.records]))
        assert windows_of(second).late_records == windows_of(whole).late_records

    trio.run(main)


def canonical(state: State):
    """A state with the rows of each table sorted by key (a table's export order is its own)."""
    out = {"meta": state.meta}
    arrays = dict(state.arrays)
    for name in [k[: -len(".bounds")] for k in arrays if k.endswith(".bounds") and f"{k[:-7]}.keys" in arrays]:
        bounds = arrays.pop(f"{name}.bounds")
        cols = [arrays.pop(f"{name}.{c}") for c in ("keys", "counts", "vals")]
        tables = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            order = np.argsort(cols[0][a:b], kind="stable")
            tables.append(tuple(c[a:b][order].tobytes() for c in cols))
        out[name] = tables
    out.update({k: (v.dtype.str, v.shape, v.tobytes()) for k, v in arrays.items()})
    return out


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 400), seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(KINDS))
def test_restore_then_snapshot_gives_the_state_back(n, seed, window, kind):
    async def main():
        plan, _, _ = window_flow(window, kind)
        await push(plan, np.array_split(make_input(n, seed, 60), 3))
        states = through_the_format(snapshot_plan(plan))
        again, _, _ = window_flow(window, kind)
        restore_plan(again, states)
        return states, snapshot_plan(again)

    states, again = trio.run(main)
    assert {k: canonical(s) for k, s in states.items()} == {k: canonical(s) for k, s in again.items()}


async def test_an_overflow_flag_survives_the_snapshot_format():
    plan, _, _ = window_flow(Tumbling(ms=100), "sum", overflow="error")
    big = np.zeros(2, SCHEMA.dtype)
    big["v"] = np.iinfo(np.int64).max
    await push(plan, [big])
    restored, _, _ = window_flow(Tumbling(ms=100), "sum", overflow="error")
    restore_plan(restored, through_the_format(snapshot_plan(plan)))
    with pytest.raises(OperatorError, match=r"overflowed in window \[0, 100\)"):
        await restored.roots["w.src"].on_end()


# -- refusals ------------------------------------------------------------------------------------------
async def test_restoring_another_kind_a_later_layout_or_another_step_is_refused():
    plan, _, _ = window_flow(Tumbling(ms=50), "sum")
    await push(plan, [make_input(50, 1, 0)])
    states = snapshot_plan(plan)
    assert {s.meta["kind"] for s in states.values()} == {"source", "window", "sink"}
    fresh, _, _ = window_flow(Tumbling(ms=50), "sum")
    swapped = dict(states, **{"w.agg": states["w.src"]})
    with pytest.raises(SnapshotError, match=r"step 'w\.agg' is a window operator and cannot restore the state of a source"):
        restore_plan(fresh, swapped)
    assert fresh.roots["w.src"].position == 0  # refused before any node changed
    newer = dict(states, **{"w.agg": State(states["w.agg"].arrays, {**states["w.agg"].meta, "version": 99})})
    with pytest.raises(SnapshotError, match=r"step 'w\.agg': its window state has layout version 99"):
        restore_plan(fresh, newer)
    with pytest.raises(SnapshotError, match=r"no state for step 'w\.agg'"):
        restore_plan(fresh, {k: v for k, v in states.items() if k != "w.agg"})
    with pytest.raises(SnapshotError, match=r"state for step 'w\.gone', which this dataflow does not have"):
        restore_plan(fresh, dict(states, **{"w.gone": states["w.agg"]}))
    other, _, _ = window_flow(Sliding(100, 25), "sum")
    with pytest.raises(SnapshotError, match=r"windows \(size, slide\) \[\(50, 50\)\] downstream"):
        restore_plan(other, states)
    other_agg, _, _ = window_flow(Tumbling(ms=50), "max")
    with pytest.raises(SnapshotError, match=r"step 'w\.agg': the state is of a sum .* this step is a max"):
        other_agg.roots["w.src"].children[0].restore(states["w.agg"])


# -- the SSB window at the object level -------------------------------------------------------------------
class Recorder(Node):
    def __init__(self):
        super().__init__("rec")
        self.batches = []

    async def push(self, batch):
        self.batches.append(batch.to_numpy())

    def rows(self):
        return rows(self.batches)


def ssb(partitioning: Partitioning, index: int = 0, window=Sliding(100, 25), kind="sum", epoch_bytes=2000):
    flow = Dataflow("w")
    win = flow.source("src", SCHEMA, time="t").window(window)
    getattr(win, kind)(*(() if kind == "count" else ("v",)), key="k", name="agg").sink(sinks.Collect())
    spec = flow.steps["w.agg"]
    op = SsbWindowAggregate(spec, None, index=index, partitioning=partitioning, epoch_bytes=epoch_bytes, routing="fragments")
    rec = Recorder()
    op.children = [rec]
    return op, rec


def ssb_input(n: int, seed: int, disorder: int) -> list:
    """Six batches, each followed by the watermark of the input so far: 12 events, so that a
    cut may fall between a batch and its watermark (fragments not shipped yet)."""
    chunks = [c for c in np.array_split(make_input(n, seed, disorder), 6) if len(c)]  # no empty batch
    tops = np.maximum.accumulate([int(c["t"].max()) for c in chunks])
    return [event for c, top in zip(chunks, tops.tolist()) for event in (c, top - MAX_DELAY)]


async def feed_ssb(op, events) -> None:
    for event in events:
        await (op.on_watermark(event) if isinstance(event, int) else op.push(Batch(event)))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 600), seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(KINDS),
    at=st.integers(0, 12), epoch_bytes=st.sampled_from([200, 2000, 1 << 20]), disorder=st.sampled_from([0, 60]),
)
def test_an_ssb_window_restored_from_its_snapshot_continues_as_an_uninterrupted_run(
    n, seed, window, kind, at, epoch_bytes, disorder
):
    chunks = ssb_input(n, seed, disorder)

    async def main():
        whole, whole_rec = ssb(Partitioning(8, 1), window=window, kind=kind, epoch_bytes=epoch_bytes)
        await feed_ssb(whole, chunks)
        await whole.on_end()
        first, rec1 = ssb(Partitioning(8, 1), window=window, kind=kind, epoch_bytes=epoch_bytes)
        await feed_ssb(first, chunks[:at])
        (state,) = through_the_format({"s": first.snapshot()}).values()
        second, rec2 = ssb(Partitioning(8, 1), window=window, kind=kind, epoch_bytes=epoch_bytes)
        second.restore(state)
        assert canonical(second.snapshot()) == canonical(state)  # restore gives the state back
        assert second.state_bytes == first.state_bytes
        fired = len(rec1.batches)
        await feed_ssb(first, chunks[at:])  # the original runs on: the snapshot shares nothing with it
        await first.on_end()
        await feed_ssb(second, chunks[at:])
        await second.on_end()
        assert second.late_records == first.late_records == whole.late_records
        return whole_rec.rows(), rows(rec1.batches[:fired] + rec2.batches), rec1.rows()

    whole, resumed, original = trio.run(main)
    assert np.array_equal(whole, resumed) and np.array_equal(whole, original)


async def test_a_restored_leader_keeps_each_helpers_epoch_and_watermark():
    op, _ = ssb(Partitioning(8, 2))
    delta = np.zeros(2, op.exchange_dtype)
    delta["epoch"], delta["key"], delta["count"], delta["value"] = 3, [1, 2], 1, 5
    await op._merge_delta(1, Batch(delta))
    await op.gate.advance(1, 60)
    again, _ = ssb(Partitioning(8, 2))
    again.restore(op.snapshot())
    assert again.gate.frontier.entries == [-(2**63), 60]
    stale = delta.copy()
    stale["epoch"] = 2
    with pytest.raises(OperatorError, match="sent epoch 2 after epoch 3"):
        await again._merge_delta(1, Batch(stale))
    with pytest.raises(SnapshotError, match="cut it by partition and reassign"):
        ssb(Partitioning(8, 3))[0].restore(op.snapshot())
    with pytest.raises(SnapshotError, match="ssb_window operator and cannot restore the state of a window"):
        again.restore(State({}, {**op.snapshot().meta, "kind": "window"}))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 600), seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(KINDS),
    at=st.integers(0, 12), executors=st.integers(1, 4), partitions=st.sampled_from([1, 4, 16]),
    disorder=st.sampled_from([0, 60]), leader_lags=st.booleans(), epoch_bytes=st.sampled_from([700, 1 << 20]),
)
@example(  # a fragment holding records late here for a window its lagging leader has still to fire
    n=300, seed=0, window=Sliding(100, 25), kind="count", at=3, executors=1, partitions=4, disorder=60,
    leader_lags=True, epoch_bytes=1 << 20,
)
def test_ssb_state_cut_by_partition_and_reassigned_fires_the_same_windows(
    n, seed, window, kind, at, executors, partitions, disorder, leader_lags, epoch_bytes
):
    """The old executor 0 of 1, or of 2 with a peer that never answers (its leader state then
    fires nothing, and records late here for windows still open there wait in tails): the
    windows of its partitions fire the same from the old operator and from the new executors."""
    chunks = ssb_input(n, seed, disorder)
    before = Partitioning(partitions, 2 if leader_lags else 1)

    def of_executor_0(out: np.ndarray) -> np.ndarray:
        return out[before.owner_of(out["k"]) == 0] if len(out) else out

    async def main():
        old, rec = ssb(before, window=window, kind=kind, epoch_bytes=epoch_bytes)
        if leader_lags:  # deltas for executor 1 queue up, unread; its watermark never comes
            sender, _ = open_inproc_channel(RingSpec(slots=2, slot_size=4096, record_size=old.exchange_dtype.itemsize))
            old.add_peer(1, sender)
            old.shippers[1].limit = 1 << 40
        await feed_ssb(old, chunks[:at])
        fired = len(rec.batches)
        by_partition = split_partitions(old.snapshot(), old.partitioning)
        await old.on_end()  # the reference: the rest of its windows
        if leader_lags:
            await old.gate.advance(1, END_TIME)
        reference = rows(rec.batches[fired:])
        new = Partitioning(partitions, executors)
        got = []
        for i in range(executors):
            led = new.led_by(i).tolist()
            if not led:
                continue
            state = merge_partitions([by_partition[p] for p in led], new, i)
            (state,) = through_the_format({"s": state}).values()
            op, out = ssb(new, i, window=window, kind=kind)
            op.restore(state)
            await op.merged.on_end()
            got.extend(out.batches)
        return of_executor_0(reference), of_executor_0(rows(got))

    reference, got = trio.run(main)
    assert got.tolist() == reference.tolist()


def judged(op: SsbWindowAggregate, chunk: np.ndarray, watermark: int) -> tuple[Batch, int]:
    """What a helper ships of `chunk`, read after `watermark`: the records some window of which
    is still open for them, and the end of the last window closed for them."""
    closed = op.promise(watermark)
    return Batch(chunk[op._latest_end(chunk["t"] // op.slice_len) > closed]), closed


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(["count", "sum", "max"]),
       cut=st.integers(1, 11), lag=st.integers(1, 6), executors=st.integers(1, 3))
@example(seed=0, window=Sliding(100, 25), kind="sum", cut=8, lag=4, executors=1)
def test_partitions_of_leaders_that_fired_up_to_different_times_merge_exactly(seed, window, kind, cut, lag, executors):
    """Two leaders take the same stream of partial states (records read behind a watermark,
    the partly late ones only into the windows still open for them: tails); leader 0 has not
    heard the last `lag` watermarks before the cut that leader 1 has (an unaligned
    checkpoint's watermarks in flight; a graph flow's owners, each on the progress it heard
    of). Their partitions merged on `executors` new leaders fire the windows in between again
    with leader 0's keys only: before and after the cut, every window of every key once,
    exactly as one leader of every key uninterrupted."""
    before = Partitioning(4, 2)
    chunks = [c for c in np.array_split(make_input(600, seed, 60), 12) if len(c)]
    watermarks = (np.maximum.accumulate([int(c["t"].max()) for c in chunks]) - MAX_DELAY).tolist()
    heard = [w if i < cut - lag else NO_TIME for i, w in enumerate(watermarks)]  # leader 0's

    async def main():
        reference, reference_rec = ssb(Partitioning(4, 1), window=window, kind=kind)
        old = [ssb(before, index, window=window, kind=kind) for index in (0, 1)]
        for i, chunk in enumerate(chunks):
            batch, closed = judged(reference, chunk, watermarks[i - 1] if i else NO_TIME)
            await reference.merged.push_judged(batch, closed)
            await reference.merged.on_watermark(watermarks[i])
            if i >= cut:
                continue
            owners = before.owner_of(batch["k"])
            for index, (op, _) in enumerate(old):
                await op.merged.push_judged(batch.select(owners == index), closed)
                await op.merged.on_watermark(heard[i] if index == 0 else watermarks[i])
        await reference.merged.on_end()
        fired = [op.merged.fired_until for op, _ in old]
        parts = [part for op, _ in old for part in split_partitions(op.snapshot(), before).values()]
        emitted = [b for _, rec in old for b in rec.batches]
        after = Partitioning(4, executors)
        for index in range(executors):
            led = set(after.led_by(index).tolist())
            state = merge_partitions([parts[p] for p in range(len(parts)) if p % 4 in led], after, index)
            (state,) = through_the_format({"s": state}).values()
            new, rec = ssb(after, index, window=window, kind=kind)
            new.restore(state)
            assert new.merged.fired_until == min(fired)
            for i in range(cut, len(chunks)):
                batch, closed = judged(new, chunks[i], watermarks[i - 1])
                await new.merged.push_judged(batch.select(after.owner_of(batch["k"]) == index), closed)
                await new.merged.on_watermark(watermarks[i])
            await new.merged.on_end()
            emitted += rec.batches
        return fired, rows(emitted), reference_rec.rows()

    fired, got, reference = trio.run(main)
    assert fired[0] <= fired[1]
    assert got.tolist() == reference.tolist()


def test_leaders_fired_up_to_different_times_join_the_merged_windows_as_tails_closed_at_their_times():
    """The later leader's slices whose first windows it fired become tails closed at its time
    (its own tails too, where they closed earlier); the earlier leader's stay as they are."""
    before = Partitioning(4, 2)

    async def leader(index: int, fired_to: int):
        op, _ = ssb(before, index)  # Sliding(100, 25): slices of 25
        keys = np.array([k for k in range(40) if before.owner_of(np.array([k]))[0] == index][:3], np.int64)
        ones = np.ones(len(keys), np.int64)
        op.merged.merge_slice(3, keys, ones, ones)  # [75, 100): windows ending 100 to 175
        op.merged.merge_slice(4, keys, ones, ones, 125)  # a tail of [100, 125): windows ending 150 to 200
        op.merged.merge_slice(5, keys, ones, ones)  # [125, 150): windows ending 150 to 225
        await op.merged.on_watermark(fired_to)
        return [part for part in split_partitions(op.snapshot(), before).values()]

    parts = trio.run(leader, 0, 100) + trio.run(leader, 1, 150)
    state = merge_partitions(parts, Partitioning(4, 1), 0)
    assert state.meta["leader"]["fired_until"] == 100 and state.meta["leader"]["next_start"] == 25
    tails = {tid: len(keys) for tid, keys, *_ in unpack_tables("leader.tails", state.arrays)}
    slices = {tid: len(keys) for tid, keys, *_ in unpack_tables("leader.slices", state.arrays)}
    assert tails == {(4, 125): 3, (3, 150): 3, (4, 150): 3, (5, 150): 3}
    assert slices == {3: 3, 4: 0, 5: 3}
    with pytest.raises(SnapshotError, match="no partition state to give executor 1"):
        merge_partitions([], Partitioning(4, 2), 1)


# -- the array source's position, sinks' pending transactions -----------------------------------------------
@pytest.mark.parametrize("cut", [0, 1, 333, 1000])
async def test_a_rewound_array_source_resumes_at_the_next_record(cut):
    records = make_input(1000, 4, 30)
    spec = RingSpec(slots=8, slot_size=512, record_size=records.dtype.itemsize)

    async def run(feed) -> list:
        sender, receiver = open_inproc_channel(spec)
        got: list = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all, receiver, records.dtype, got)
            await feed(sender)
        return got

    async def uninterrupted(sender):
        feeder = ChannelFeeder(sender, time="t", max_delay=MAX_DELAY, watermark_every=3)
        await feeder.feed(records[:cut])
        await feeder.feed(records[cut:])
        await sender.aclose()

    state = None

    async def until_cut(sender):
        nonlocal state
        feeder = ChannelFeeder(sender, time="t", max_delay=MAX_DELAY, watermark_every=3)
        await feeder.feed(records[:cut])
        state = feeder.snapshot("src")
        await sender.aclose()

    whole = await run(uninterrupted)
    before = await run(until_cut)
    assert state.meta["fed"] == cut
    after = await run(lambda s: feed_array(s, records, time="t", max_delay=MAX_DELAY, watermark_every=3,
                                           resume=through_the_format({"src": state})["src"]))
    resumed = before + after

    def split(events):
        data = [r for kind, r in events if kind == "records"]
        return (np.concatenate(data) if data else records[:0]), [v for kind, v in events if kind == "watermark"]

    assert np.array_equal(split(resumed)[0], records)
    assert split(resumed)[1] == split(whole)[1]


async def test_a_transactional_collect_keeps_its_pending_records_and_nothing_committed():
    flow = Dataflow("w")
    out = sinks.Collect(transactional=True)
    flow.source("src", SCHEMA).sink(out, name="out")
    plan = build_plan(flow)
    (node,) = plan.sinks
    node.open()
    data = make_input(10, 2, 0)
    await plan.roots["w.src"].push(Batch(data[:4]))
    out.pre_commit(1)
    out.commit(1)  # published: not state
    await plan.roots["w.src"].push(Batch(data[4:7]))
    out.pre_commit(2)  # pending: state
    await plan.roots["w.src"].push(Batch(data[7:]))  # after the last barrier: replayed, not state
    state = through_the_format(snapshot_plan(plan))["w.out"]
    assert state.meta["pending"] == [2] and np.array_equal(state.arrays["pending.records"], data[4:7])
    again = Dataflow("w")
    out2 = sinks.Collect(transactional=True)
    again.source("src", SCHEMA).sink(out2, name="out")
    plan2 = build_plan(again)
    plan2.sinks[0].open()
    restore_plan(plan2, {"w.out": state, "w.src": snapshot_plan(plan)["w.src"]})
    assert out2.pending() == [2]
    out2.commit(2)
    assert np.array_equal(out2.records, data[4:7])


async def test_a_file_sink_state_names_its_pending_parts_only(tmp_path):
    flow = Dataflow("w")
    out = sinks.CsvFile(tmp_path / "out", transactional=True)
    flow.source("src", SCHEMA).sink(out, name="out")
    plan = build_plan(flow)
    plan.sinks[0].open()
    await plan.roots["w.src"].push(Batch(make_input(5, 1, 0)))
    out.pre_commit(7)
    state = snapshot_plan(plan)["w.out"]
    assert state.meta["pending"] == [7] and state.arrays == {}


async def test_an_uppar_router_keeps_where_it_judges_and_the_watermarks_seen():
    mode = "uppar"
    flow = Dataflow("w")
    flow.source("src", SCHEMA, time="t").window(Tumbling(ms=50)).sum("v", key="k", name="agg").sink(sinks.Collect())
    plan = build_plan(flow, ClusterRole(0, Partitioning(8, 2), mode))
    (router,) = plan.exchanges()
    await router.gate.advance(1, 80)
    router.fired_until = 50
    states = snapshot_plan(plan)
    assert {"w.src", "w.agg.route", "w.agg"} <= set(states)
    again = build_plan(flow, ClusterRole(0, Partitioning(8, 2), mode))
    restore_plan(again, through_the_format(states))
    (router2,) = again.exchanges()
    assert router2.fired_until == 50 and router2.gate.frontier.entries == [-(2**63), 80]


def test_the_snapshot_cost_benchmark_restores_what_it_snapshotted():
    from slashrt.bench.snapshot_cost import bench

    result = bench(keys=2000, windows=2, repeat=1)
    assert result["correct"] and result["state_bytes"] == 2 * 2000 * 24
    assert result["snapshot_bytes"] >= result["state_bytes"]
