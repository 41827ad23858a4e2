"""The SSB window's own checks (`slashrt.ssb.graph_window`), in one process: an owner fires a
window only once every executor's fragments of it arrived (two executors' plans, each on its
own tracker, over two real progress buses and a real channel); an owner joins a run of ring
slots with the fields read in place; a computed column of unknown type is refused before a
cluster starts; `auto` routing judges an epoch only from enough records. (The protocol in real
processes: tests/cluster/test_graph_ssb*.py; the bound of the queues shipping to an owner
that stalls: test_graph_ssb.py.)"""

import numpy as np
import pytest
import trio

from slashrt import Dataflow, Schema, Sliding, Tumbling
from slashrt._batch import Batch
from slashrt._buffer import FOOTER_SIZE
from slashrt._plan import ClusterRole, build_plan, check_cluster_flow
from slashrt.errors import DataflowError
from slashrt.ops.sinks import Collect
from slashrt.progress import Location, Timestamp
from slashrt.scheduler._bus_counts import initial_capabilities
from slashrt.scheduler._pointstamp import PointstampProgress
from slashrt.ssb.graph_window import SsbRoute
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import RingSpec, open_inproc_channel

from tests.cluster.test_progress_bus import two_buses

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
PARTITIONING = Partitioning(8, 2)


def _plan(index: int, window=Tumbling(ms=100)):
    """Executor `index` of 2's plan of a keyed sum in mode "slash" (its fragments ship when due)."""
    f = Dataflow("w")
    f.source("r", SCHEMA, time="ts").window(window).sum("value", key="key", name="agg").sink(Collect(), name="out")
    plan = build_plan(f, ClusterRole(index, PARTITIONING, "slash", ssb_routing="fragments"))
    for node in plan.sinks:
        node.open()
    assert isinstance(plan.steps["w.agg"], SsbRoute)
    return plan


def _owned_by(index: int, n: int) -> np.ndarray:
    keys = np.arange(20 * n)
    return keys[PARTITIONING.owner_of(keys) == index][:n]


def _records(times, keys) -> Batch:
    rows = np.zeros(len(keys), SCHEMA.dtype)
    rows["ts"], rows["key"], rows["value"] = times, keys, np.arange(len(keys)) + 1
    return Batch(rows)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_an_owner_fires_a_window_only_once_every_executors_fragments_of_it_arrived(transport):
    """Executors 0 and 1 fold records of the window [0, 100) of keys executor 0 owns; executor 0
    reads to its input's end. Executor 1 then reads a record at 250: its records' frontier
    passed the window, and its fragment is due, but its rows are not yet on their way as far as
    executor 0 knows (the update that counts them is not published): executor 0's window is
    held by executor 1's fragment at the step's second port, not by the records' frontier. It
    then holds on the rows counted in flight, and fires once they arrived, with both executors'
    records."""
    plans = [_plan(0), _plan(1)]
    src = list(plans[0].flow.steps).index("w.r")
    at = list(plans[0].flow.steps).index("w.agg")
    initial = initial_capabilities([src], 2)[0]
    mine, theirs = _owned_by(0, 30), _owned_by(0, 40)[10:]  # 20 keys in both
    async with two_buses(transport, initial=initial, graph=plans[0].graph) as buses:
        progress = [PointstampProgress(plan, bus) for plan, bus in zip(plans, buses)]
        roots = [plan.roots["w.r"] for plan in plans]
        route0, route1 = (plan.steps["w.agg"] for plan in plans)
        sender, receiver = open_inproc_channel(RingSpec(slots=4, slot_size=256, record_size=route1.exchange_dtype.itemsize))
        route1.add_peer(0, sender)
        out = plans[0].sinks[0].sink

        async def heard_everything_from_1() -> None:
            while buses[0].stats.received < buses[1].stats.messages:
                await buses[0].wait_changed()
            await progress[0].settle()

        def fired() -> int:
            return 0 if out.records is None else len(out.records)

        def frontier(port: int) -> list:
            return list(progress[0].tracker.frontier(Location.input(at, port)))

        async with trio.open_nursery() as nursery:
            for task in route1.background():
                nursery.start_soon(task)
            await roots[1].push(_records(np.arange(30) * 3, theirs))
            await progress[1].settle()
            assert route1.window.fragment_holds() == {Timestamp(99)}
            progress[1].publish()  # (idle: it tells its peers)
            await roots[0].push(_records(np.arange(30) * 3 + 1, mine))
            await roots[0].on_end()  # executor 0 passed the window (its input ended)
            await heard_everything_from_1()
            assert not fired()

            await roots[1].push(_records([250], _owned_by(1, 1)))  # executor 1's records pass the window
            await progress[1].settle()
            assert not route1.window.fragment_holds() & {Timestamp(99)}  # shipped to executor 0 ...
            await heard_everything_from_1()  # ... as far as executor 1 published: its frontier moved
            assert min(t.epoch for t in progress[0].tracker.frontier(Location.output(src, 0))) == 250
            assert frontier(0) == [Timestamp(250)] and frontier(1) == [Timestamp(99)]  # its fragment holds it
            assert not fired()

            progress[1].publish()  # the rows on their way, the fragment's capability dropped
            await heard_everything_from_1()
            assert frontier(0) == [Timestamp(99)] and not fired()  # held by the rows in flight

            while True:  # the rows arrive
                await receiver.wait_readable()
                buffer = receiver.poll()
                await route0.inbound(1).push(Batch(buffer.records(route0.exchange_dtype)))
                receiver.release()
                await progress[0].settle()
                if fired():
                    break
            nursery.cancel_scope.cancel()
    fired = out.records
    assert (fired["window_start"] == 0).all()
    values = np.arange(30) + 1
    expected = dict(zip(mine.tolist(), values.tolist()))
    for k, v in zip(theirs.tolist(), values.tolist()):
        expected[k] = expected.get(k, 0) + v
    assert dict(zip(fired["key"].tolist(), fired["sum_value"].tolist())) == expected


def _split_and_joined(s):
    """The stream split in two and joined again by a union."""
    return s.filter(lambda b: b["key"] % 2 == 0).union(s.filter(lambda b: b["key"] % 2 == 1))


@pytest.mark.parametrize("shape", [lambda s: s, _split_and_joined], ids=["linear", "union"])
def test_a_computed_column_of_unknown_type_is_refused_in_a_cluster(shape):
    f = Dataflow("w")
    s = f.source("r", SCHEMA, time="ts").with_column("v2", lambda b: b["value"] * 2)
    shape(s).window(Tumbling(ms=100)).sum("v2", key="key").sink(Collect())
    sentence = r"^step 'w\.sum_window_\d+': a multi-executor run needs the type of the aggregated column 'v2' .*dtype="
    for mode in ("slash", "uppar"):  # planned for a cluster: where the SSB (or the route) learns its type
        with pytest.raises(DataflowError, match=sentence):
            build_plan(f, ClusterRole(0, Partitioning(8, 2), mode))
    with pytest.raises(DataflowError, match=sentence):
        check_cluster_flow(f)  # run(executors=...) says the same before any executor starts
    build_plan(f, ClusterRole(0, Partitioning(8, 1)))  # one executor: a plain window decides at run time


# slice ids and the time each was shipped at, under Sliding(100, 50) (slices of 50 ms): slice 1
# joins its first window, ending 100 (time 99); slice 0's tail after its window ending 50 closed
# where it was judged joins the same one; slice 2 its first, ending 150 (time 149)
RUNS = {"one slice": ([1], [99]), "two slices at one time": ([0, 1], [99, 99]), "two times": ([1, 2], [99, 149])}


@pytest.mark.parametrize("run", list(RUNS))
async def test_an_owner_joins_a_run_of_slots_in_place(run, monkeypatch):
    """Partial rows for executor 0 arrive in a run of 4 full ring slots, which the executor
    hands over as one 2-D view (slots x rows). All of one slice and time, the owner joins them
    slot by slot, its fields read in place in the ring; of several slices, flattened and cut by
    slice; of several times, cut by time. The tables hold each key's joined count and sum, and
    no row is counted in flight any more."""
    plan = _plan(0, Sliding(100, 50))
    progress = PointstampProgress(plan)
    route = plan.steps["w.agg"]
    at = Location.input(list(plan.flow.steps).index("w.agg"), 0)
    slices, times = RUNS[run]
    rng = np.random.default_rng(3)
    rows = np.zeros(100, route.exchange_dtype)
    rows["slice"], rows["__epoch"] = np.repeat(slices, 100 // len(slices)), np.repeat(times, 100 // len(times))
    rows["key"] = rng.choice(_owned_by(0, 30), 100)
    rows["count"], rows["value"] = rng.integers(1, 4, 100), rng.integers(-50, 50, 100)
    for time in set(times):  # counted in flight, as their sender did
        progress.in_flight(route, Timestamp(time), int((rows["__epoch"] == time).sum()))
    spec = RingSpec(slots=4, slot_size=25 * rows.itemsize + FOOTER_SIZE, record_size=rows.itemsize)
    sender, receiver = open_inproc_channel(spec)
    for slot in range(4):
        await sender.send_records(rows[25 * slot : 25 * (slot + 1)])
    ring = receiver._ring()
    joined = []  # (keys read in the ring, how many)
    merge_slice = route.window.merge_slice

    def looked_at(slice_id, keys, counts, vals, closed_until):
        joined.append((np.shares_memory(keys, ring), len(keys)))
        return merge_slice(slice_id, keys, counts, vals, closed_until)

    monkeypatch.setattr(route.window, "merge_slice", looked_at)
    taken = receiver.poll_run(4)
    assert taken.n == 4
    await route.inbound(1).push(Batch(receiver.run_records(taken, route.exchange_dtype)))
    receiver.release(taken.n)
    if run == "one slice":
        assert joined == [(True, 25)] * 4
    else:
        assert sorted(n for _, n in joined) == [50, 50] and not any(inside for inside, _ in joined)
    assert all(progress.tracker.count(at, Timestamp(t)) == 0 for t in times)
    window = route.window
    for s, t in set(zip(slices, times)):
        mine = rows[(rows["slice"] == s) & (rows["__epoch"] == t)]
        table = window.slices[s] if window._earliest_end(s) > t else window.tails[(s, t)]
        keys, counts, vals = table.export()
        expected = {k: (int(mine["count"][mine["key"] == k].sum()), int(mine["value"][mine["key"] == k].sum()))
                    for k in set(mine["key"].tolist())}
        assert dict(zip(keys.tolist(), zip(counts.tolist(), vals.tolist()))) == expected


def test_auto_routing_judges_an_epoch_only_from_enough_records():
    """`routes_directly`: a delta of a row per two records turns fragments direct, and direct
    routing whose own records were mostly old keys folds again; an epoch of fewer than
    `JUDGED_FROM` records (one a window's end cut short: 90 records of 50 keys) changes neither."""
    from slashrt.ssb.epochs import JUDGED_FROM, routes_directly

    big = JUDGED_FROM
    assert routes_directly(False, rows=big // 2, records=big, own_records=0, own_new=0)
    assert not routes_directly(False, rows=big // 2 - 1, records=big, own_records=0, own_new=0)
    assert not routes_directly(True, rows=big, records=big, own_records=big // 2, own_new=0)
    assert routes_directly(True, rows=big, records=big, own_records=big // 2, own_new=big // 4)
    assert not routes_directly(False, rows=50, records=90, own_records=0, own_new=0)
    assert routes_directly(True, rows=90, records=90, own_records=45, own_new=0)
