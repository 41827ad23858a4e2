"""Operator state: a run snapshotted part-way, its states written and read back in the snapshot
format and restored into a new plan, gives what an uninterrupted run gives (a window; an SSB
window, `SsbRoute`: the owner's windows, the fragments, the open epoch); restore then snapshot
gives the state back; a state for another operator, a later layout or another step is refused;
an SSB window's state in the partitioned layout of a rescale (`rescale.as_partitioned`), cut by
partition and merged on another executor count (`slashrt.ssb.partitioned`), fires the same
windows, also from owners that had fired up to different times. (Whole windows cut and merged:
tests/snapshot/test_rescale.py.)"""

import numpy as np
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slashrt import Batch, Dataflow, Schema, Sliding, Tumbling, sinks
from slashrt._plan import ClusterRole, build_plan
from slashrt.errors import OperatorError, SnapshotError
from slashrt.ops._node import Node
from slashrt.ops.window import NO_TIME
from slashrt.ops.sources import ChannelFeeder, feed_array
from slashrt.progress import Timestamp
from slashrt.scheduler._pointstamp import PointstampProgress
from slashrt.snapshot import State, decode_state, encode_state
from slashrt.snapshot.operators import restore_plan, snapshot_plan, unpack_tables
from slashrt.snapshot.rescale import as_graph_window, as_partitioned, as_window
from slashrt.ssb.graph_window import SsbGraphWindow, SsbRoute, _join, partial_dtype
from slashrt.ssb.partitioned import merge_partitions, split_partitions
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


# -- the SSB window (`SsbRoute`: the owner's windows and the fragments) ---------------------------------
class Recorder(Node):
    def __init__(self):
        super().__init__("rec")
        self.batches = []

    async def push(self, batch):
        self.batches.append(batch.to_numpy())

    def rows(self):
        return rows(self.batches)


class LoneExecutor:
    """Executor `index`'s plan (under `partitioning`) of a keyed window with late records, in
    mode "slash" (where it has peers an `SsbRoute`: the owner's windows beside the fragments,
    which ship in epochs of `epoch_bytes`; on one executor a plain window), on a tracker of its
    own: the rows it ships to its peers wait in its queues, counted in flight at their times
    (they hold its owner's windows back) until `taken_by_peers`."""

    def __init__(self, partitioning: Partitioning, index: int = 0, window=Sliding(100, 25), kind="sum",
                 epoch_bytes=2000):
        flow = Dataflow("w")
        self.out, self.late = sinks.Collect(), sinks.Collect()
        win = flow.source("src", SCHEMA, time="t", max_delay=MAX_DELAY).window(window, late=self.late)
        getattr(win, kind)(*(() if kind == "count" else ("v",)), key="k", name="agg").sink(self.out, name="out")
        self.plan = build_plan(flow, ClusterRole(index, partitioning, "slash", epoch_bytes, "fragments"))
        for node in self.plan.sinks:
            node.open()
        self.step = self.plan.steps["w.agg"]
        self.window = self.step.window if isinstance(self.step, SsbRoute) else self.step
        for peer in range(partitioning.executors) if isinstance(self.step, SsbRoute) else ():
            if peer != index:
                self.step.add_peer(peer, None)  # (its queue is read below, not sent)
        self.progress = PointstampProgress(self.plan)

    async def feed(self, chunks) -> None:
        for chunk in chunks:
            await self.plan.roots["w.src"].push(Batch(chunk))
            await self.progress.settle()

    async def end(self) -> None:
        """Its input ends: every window fires that no row on its way to a peer holds back."""
        await self.plan.roots["w.src"].on_end()

    async def taken_by_peers(self) -> None:
        """The peers took what it queued for them (their updates: no longer in flight)."""
        for time, n in self.step.queued_times().items():
            self.progress.in_flight(self.step, time, -n)
        for queue in self.step._queues.values():
            queue.clear()
        await self.progress.settle()

    async def restore(self, state: State) -> None:
        """Its window's state `state` (written and read back), counted by its tracker, which
        settles (as an executor does before its first input)."""
        (state,) = through_the_format({"s": state}).values()
        self.window.restore(state)
        self.progress.recount()
        await self.progress.settle()

    def emitted(self) -> np.ndarray:
        return rows([self.out.records])


BEFORE = Partitioning(8, 2)


def ssb_input(n: int, seed: int, disorder: int, owned_by_0: Partitioning | None = None) -> list:
    """`make_input` in 12 batches (some may be empty); with `owned_by_0`, of 12 keys that
    executor 0 owns under that partitioning."""
    records = make_input(n, seed, disorder)
    if owned_by_0 is not None:
        keys = np.arange(-40, 40)[owned_by_0.owner_of(np.arange(-40, 40)) == 0][:12]
        records["k"] = keys[(records["k"] + 6) % len(keys)]
    return np.array_split(records, 12)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 600), seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(KINDS),
    at=st.integers(0, 12), epoch_bytes=st.sampled_from([200, 2000, 1 << 20]), disorder=st.sampled_from([0, 60]),
)
def test_an_ssb_window_restored_from_its_snapshot_continues_as_an_uninterrupted_run(
    n, seed, window, kind, at, epoch_bytes, disorder
):
    """Executor 0 of 2 with the keys it owns (its fragments ship to its own windows): its
    plan's state (the source's position, the owner's windows, the fragments, the open epoch,
    the capabilities of fragments shipped early) after `at` of 12 batches, written and read back
    and restored into a new plan, which goes on with the rest: what both emit, and the late
    records, are an uninterrupted run's; restore then snapshot gives the state back."""
    chunks = ssb_input(n, seed, disorder, BEFORE)

    def make():
        return LoneExecutor(BEFORE, window=window, kind=kind, epoch_bytes=epoch_bytes)

    async def main():
        whole = make()
        await whole.feed(chunks)
        await whole.end()
        first = make()
        await first.feed(chunks[:at])
        states = through_the_format(snapshot_plan(first.plan))
        assert states["w.agg"].meta["kind"] == "ssb_graph_window"
        emitted = [None if c.records is None else c.records.copy() for c in (first.out, first.late)]
        second = make()
        restore_plan(second.plan, states)
        second.progress.recount()
        assert {k: canonical(s) for k, s in snapshot_plan(second.plan).items()} == {
            k: canonical(s) for k, s in states.items()}
        await second.progress.settle()  # (as an executor does before its first input)
        await first.feed(chunks[at:])  # the original runs on: the snapshot shares nothing with it
        await first.end()
        await second.feed(chunks[at:])
        await second.end()
        assert second.window.late_records == first.window.late_records == whole.window.late_records
        assert np.array_equal(rows([emitted[0], second.out.records]), whole.emitted())
        assert np.array_equal(rows([emitted[1], second.late.records]), rows([whole.late.records]))
        assert np.array_equal(first.emitted(), whole.emitted())

    trio.run(main)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 600), seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(KINDS),
    at=st.integers(0, 12), executors=st.integers(1, 4), partitions=st.sampled_from([1, 4, 16]),
    disorder=st.sampled_from([0, 60]), peer_keys=st.booleans(), epoch_bytes=st.sampled_from([700, 1 << 20]),
)
@example(  # records late where they were read for windows its owner (held by rows in flight: it fired up to
    # -75) has still to fire: tails in its fragments (2) and in its owner's windows (13)
    n=300, seed=0, window=Sliding(100, 25), kind="count", at=5, executors=1, partitions=4, disorder=60,
    peer_keys=True, epoch_bytes=1 << 20,
)
def test_ssb_state_cut_by_partition_and_reassigned_fires_the_same_windows(
    n, seed, window, kind, at, executors, partitions, disorder, peer_keys, epoch_bytes
):
    """The old executor 0 of 2, with the keys it owns only or with its peer's too (the rows it
    ships to its peer wait, counted in flight: they hold back its windows, while its fragments
    judge records late by their own times, those still in windows open there in tails), after
    `at` of 12 batches: its window state in the partitioned layout (`as_partitioned`), cut by
    partition (`split_partitions`), merged on 1 to 4 new executors (`merge_partitions`) and
    restored as each one's window (`as_graph_window`; on one, a plain one: `as_window`), fires
    the windows of the keys it owned as the old executor goes on to fire them (its peer having
    taken its rows)."""
    before = Partitioning(partitions, 2)
    chunks = ssb_input(n, seed, disorder, None if peer_keys else before)

    def of_executor_0(out: np.ndarray) -> np.ndarray:
        return out[before.owner_of(out["k"]) == 0] if len(out) else out

    async def main():
        old = LoneExecutor(before, window=window, kind=kind, epoch_bytes=epoch_bytes)
        await old.feed(chunks[:at])
        fired = len(old.out.records)
        state = old.window.snapshot()
        await old.end()  # the reference: the rest of its windows
        await old.taken_by_peers()
        reference = rows([old.out.records[fired:]])
        after = Partitioning(partitions, executors)
        by_partition = split_partitions(as_partitioned(state, None, 2, 0), after)
        got = []
        for i in range(executors):
            led = after.led_by(i).tolist()
            if not led:
                continue
            merged = merge_partitions([by_partition[p] for p in led], after, i)
            new = LoneExecutor(after, i, window=window, kind=kind)
            await new.restore(as_graph_window(merged) if executors > 1 else as_window(merged))
            await new.end()
            got.append(new.out.records)
        return of_executor_0(reference), of_executor_0(rows(got))

    reference, got = trio.run(main)
    assert got.tolist() == reference.tolist()


def owner(window=Sliding(100, 25), kind="sum") -> tuple[SsbGraphWindow, Recorder]:
    """An SSB window (its owner's windows: its fragments left aside), its output kept."""
    plan, _, _ = window_flow(window, kind)
    node = SsbGraphWindow(plan.flow.steps["w.agg"], None, routing="fragments")
    rec = Recorder()
    node.children = [rec]
    return node, rec


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), window=st.sampled_from(WINDOWS), kind=st.sampled_from(["count", "sum", "max"]),
       cut=st.integers(1, 11), lag=st.integers(1, 6), executors=st.integers(1, 3))
@example(seed=0, window=Sliding(100, 25), kind="sum", cut=8, lag=4, executors=1)
def test_partitions_of_owners_that_fired_up_to_different_times_merge_exactly(seed, window, kind, cut, lag, executors):
    """Fragments fold batch after batch, each at the time of the watermark before it (records
    late, or partly late into tails, by that time), and ship all they hold at each batch's end
    (epochs of a batch); owners 0 and 1 of 2 join the partial rows of their keys, each firing on
    the frontier it has heard of: owner 0 has not heard of the last `lag` watermarks before the
    cut that owner 1 has. Their states in the partitioned layout, cut and merged on
    `executors` new owners, fire the windows in between again with owner 0's keys only: before
    and after the cut, every window of every key once, exactly as one owner of every key
    uninterrupted."""
    before, after = Partitioning(4, 2), Partitioning(4, executors)
    chunks = [c for c in np.array_split(make_input(600, seed, 60), 12) if len(c)]
    watermarks = (np.maximum.accumulate([int(c["t"].max()) for c in chunks]) - MAX_DELAY).tolist()
    heard = [w if i < cut - lag else NO_TIME for i, w in enumerate(watermarks)]  # owner 0's

    async def main():
        clock = PointstampProgress(window_flow(window, kind)[0])
        shipping, _ = owner(window=window, kind=kind)  # (its fragments: its own windows take nothing)
        reference, reference_rec = owner(window=window, kind=kind)

        async def ship(i: int, owners: list, partitioning: Partitioning) -> None:
            """Batch i folded at the watermark before it and shipped: every piece's rows to the
            reference and to their owners among `owners`."""
            clock.now = Timestamp(watermarks[i - 1] if i else NO_TIME)
            await shipping.fold(Batch(chunks[i]), clock)
            for piece in shipping.take_all():
                shipped = np.zeros(len(piece.keys), partial_dtype(piece.vals.dtype))
                shipped["slice"], shipped["key"] = piece.slices, piece.keys
                shipped["count"], shipped["value"] = piece.counts, piece.vals
                _join(reference, shipped, piece.time.epoch)
                owned = partitioning.owner_of(shipped["key"])
                for index, (node, _) in enumerate(owners):
                    _join(node, shipped[owned == index], piece.time.epoch)

        old = [owner(window, kind) for _ in (0, 1)]
        for i in range(min(cut, len(chunks))):
            await ship(i, old, before)
            await reference.on_frontier(watermarks[i])
            for index, (node, _) in enumerate(old):
                await node.on_frontier(heard[i] if index == 0 else watermarks[i])
        fired = [node.fired_until for node, _ in old]
        parts = [split_partitions(as_partitioned(node.snapshot(), None, 2, index), after)
                 for index, (node, _) in enumerate(old)]
        new = []
        for index in range(executors):
            led = after.led_by(index).tolist()
            state = merge_partitions([part[p] for part in parts for p in led], after, index)
            (state,) = through_the_format({"s": as_graph_window(state)}).values()
            node, rec = owner(window, kind)
            node.restore(state)
            assert node.fired_until == min(fired)
            new.append((node, rec))
        for i in range(cut, len(chunks)):
            await ship(i, new, after)
            await reference.on_frontier(watermarks[i])
            for node, _ in new:
                await node.on_frontier(watermarks[i])
        for node, _ in [(reference, None), *new]:
            await node.on_frontier(None)
        return fired, rows([b for _, rec in old + new for b in rec.batches]), reference_rec.rows()

    fired, got, reference = trio.run(main)
    assert fired[0] <= fired[1]
    assert got.tolist() == reference.tolist()


def test_owners_fired_up_to_different_times_join_the_merged_windows_as_tails_closed_at_their_times():
    """The later owner's slices whose first windows it fired become tails closed at its time
    (its own tails too, where they closed earlier); the earlier owner's stay as they are."""
    before = Partitioning(4, 2)

    async def fired_to(index: int, time: int):
        node, _ = owner()  # Sliding(100, 25): slices of 25
        keys = np.array([k for k in range(40) if before.owner_of(np.array([k]))[0] == index][:3], np.int64)
        ones = np.ones(len(keys), np.int64)
        node.merge_slice(3, keys, ones, ones)  # [75, 100): windows ending 100 to 175
        node.merge_slice(4, keys, ones, ones, 125)  # a tail of [100, 125): windows ending 150 to 200
        node.merge_slice(5, keys, ones, ones)  # [125, 150): windows ending 150 to 225
        await node.on_frontier(time)
        return list(split_partitions(as_partitioned(node.snapshot(), None, 2, index), before).values())

    parts = trio.run(fired_to, 0, 100) + trio.run(fired_to, 1, 150)
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


def test_the_snapshot_cost_benchmark_restores_what_it_snapshotted():
    from slashrt.bench.snapshot_cost import bench

    result = bench(keys=2000, windows=2, repeat=1)
    assert result["correct"] and result["state_bytes"] == 2 * 2000 * 24
    assert result["snapshot_bytes"] >= result["state_bytes"]
