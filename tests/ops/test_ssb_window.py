"""The SSB window operator's own checks, in one process (the protocol runs in tests/cluster)."""

import numpy as np
import pytest
import trio
import trio.testing

from slashrt import Dataflow, Schema, Tumbling
from slashrt._batch import Batch
from slashrt._plan import ClusterRole, build_plan, check_cluster_flow
from slashrt.errors import DataflowError, OperatorError
from slashrt.ops.sinks import Collect
from slashrt.ssb.window import SsbWindowAggregate, delta_dtype
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import RingSpec, open_inproc_channel

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])


def _plan(executors=2, index=0, **window):
    f = Dataflow("w")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=100)).sum("value", key="key").sink(Collect())
    return build_plan(f, ClusterRole(index, Partitioning(8, executors), "slash", 1 << 20))


def _delta(epochs, keys):
    rows = np.zeros(len(keys), delta_dtype(np.dtype("<i8")))
    rows["epoch"], rows["slice"], rows["key"], rows["count"], rows["value"] = epochs, 0, keys, 1, 5
    return Batch(rows)


async def test_deltas_out_of_epoch_order_are_refused():
    (op,) = _plan().exchanges()
    assert isinstance(op, SsbWindowAggregate)
    await op._merge_delta(1, _delta([2, 2], [1, 2]))
    with pytest.raises(OperatorError, match="out of order"):
        await op._merge_delta(1, _delta([1], [3]))
    with pytest.raises(OperatorError, match="out of order"):
        await op._merge_delta(1, _delta([3, 2], [3, 4]))


async def test_a_leader_fires_only_when_every_executor_passed_the_window():
    plan = _plan()
    (op,) = plan.exchanges()
    sink_node = plan.sinks[0]
    sink_node.open()
    await op._merge_delta(1, _delta([1, 1], [10, 11]))  # helper 1's state for slice 0 ([0, 100))
    await op.gate.advance(0, 150)  # this executor is past the window ...
    assert len(sink_node.sink.records) == 0
    await op.gate.advance(1, 99)  # ... executor 1 not yet
    assert len(sink_node.sink.records) == 0
    await op.gate.advance(1, 100)
    got = sink_node.sink.records
    assert sorted(got["key"].tolist()) == [10, 11] and (got["sum_value"] == 5).all()


def _split_and_joined(s):
    """A graph flow: the stream split in two and joined again by a union (the window behind it
    runs as an `SsbRoute` in a cluster)."""
    return s.filter(lambda b: b["key"] % 2 == 0).union(s.filter(lambda b: b["key"] % 2 == 1))


@pytest.mark.parametrize("shape", [lambda s: s, _split_and_joined], ids=["tree", "graph"])
def test_a_computed_column_of_unknown_type_is_refused_in_a_cluster(shape):
    f = Dataflow("w")
    s = f.source("r", SCHEMA, time="ts").with_column("v2", lambda b: b["value"] * 2)
    shape(s).window(Tumbling(ms=100)).sum("v2", key="key").sink(Collect())
    assert f.is_graph() or shape is not _split_and_joined
    sentence = r"^step 'w\.sum_window_\d+': a multi-executor run needs the type of the aggregated column 'v2' .*dtype="
    for mode in ("slash", "uppar"):  # planned for a cluster: where the SSB (or the route) learns its type
        with pytest.raises(DataflowError, match=sentence):
            build_plan(f, ClusterRole(0, Partitioning(8, 2), mode))
    with pytest.raises(DataflowError, match=sentence):
        check_cluster_flow(f)  # run(executors=...) says the same before any executor starts
    build_plan(f, ClusterRole(0, Partitioning(8, 1)))  # one executor: a plain window decides at run time


@pytest.mark.parametrize("slices", [[0], [0, 1]])
def test_a_leader_joins_a_run_of_slots_in_place(slices):
    # a delta arriving as a run of 4 full slots: 2-D field views (slot x row), read in place
    # when it holds one slice, flattened and cut by slice otherwise
    (op,) = _plan().exchanges()
    rng = np.random.default_rng(3)
    rows = np.zeros(100, delta_dtype(np.dtype("<i8")))
    rows["epoch"] = 1
    rows["slice"] = np.repeat(slices, 100 // len(slices))
    rows["key"] = rng.integers(0, 30, 100)
    rows["count"] = rng.integers(1, 4, 100)
    rows["value"] = rng.integers(-50, 50, 100)
    op.merged.merge_partials(*(rows.reshape(4, 25)[f] for f in ("slice", "key", "count", "value")))
    for s in slices:
        mine = rows[rows["slice"] == s]
        keys, counts, vals = op.merged.slices[s].export()
        expected = {
            k: (mine["count"][mine["key"] == k].sum(), mine["value"][mine["key"] == k].sum())
            for k in set(mine["key"].tolist())
        }
        assert dict(zip(keys.tolist(), zip(counts.tolist(), vals.tolist()))) == expected


async def _helper_against_a_stalled_leader(n: int, routing: str):
    """Executor 0 of 2 folds `n` records of distinct keys, epoch after epoch, while executor 1
    (the leader of half the keys) takes nothing from its channel. Returns the most bytes queued
    for the leader and the records consumed by the time everything is blocked, and, once the
    leader drains the channel, the counts that arrived there and those joined locally."""
    f = Dataflow("w")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=100)).sum("value", key="key").sink(Collect())
    plan = build_plan(f, ClusterRole(0, Partitioning(8, 2), "slash", 16 << 10, routing))
    for node in plan.sinks:
        node.open()
    (op,) = plan.exchanges()
    sender, receiver = open_inproc_channel(RingSpec(slots=4, slot_size=4096, record_size=op.exchange_dtype.itemsize))
    op.add_peer(1, sender)
    op.shippers[1].limit = 64 << 10
    data = np.zeros(n, SCHEMA.dtype)
    data["key"] = np.arange(n)  # every record a new key: every epoch's delta is as large as its input
    data["value"] = 1
    fed = 0
    arrived = 0

    async def feed():
        nonlocal fed
        for start in range(0, n, 1024):
            await op.push(Batch(data[start : start + 1024]))
            fed = min(n, start + 1024)
        await op.on_end()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for task in op.background():
                nursery.start_soon(task)
            nursery.start_soon(feed)
            await trio.testing.wait_all_tasks_blocked()  # the leader is stalled: all wait on it
            stalled = (op.shippers[1].peak_bytes, fed)
            while not receiver.finished:  # the leader comes back and takes everything
                await receiver.wait_readable()
                while (buf := receiver.poll()) is not None:
                    if not buf.is_control:
                        arrived += int(buf.records(op.exchange_dtype)["count"].sum())
                    receiver.release()
    local = sum(int(s.export()[1].sum()) for s in op.merged.slices.values())
    return stalled, arrived, local, op.epochs


@pytest.mark.parametrize("routing", ["fragments", "direct"])
async def test_a_stalled_leader_holds_its_helpers_queue_flat_while_the_input_doubles(routing):
    (peak, fed), arrived, local, epochs = await _helper_against_a_stalled_leader(100_000, routing)
    (peak2, fed2), arrived2, local2, _ = await _helper_against_a_stalled_leader(200_000, routing)
    # compute waited for the leader: the queue stayed at its bound, whatever the input's size
    bound = (64 << 10) + 1024 * 40  # the limit, plus the rows of one batch
    assert peak == peak2 <= bound
    assert fed == fed2 < 100_000
    assert peak <= max(e.queued_peak for e in epochs) <= bound  # the stat each epoch reports
    # and nothing was lost once the leader came back
    assert (arrived + local, arrived2 + local2) == (100_000, 200_000)
    assert arrived > 40_000 and arrived2 > 80_000


def test_auto_routing_judges_an_epoch_only_from_enough_records():
    """`routes_directly`: a delta of a row per two records turns fragments direct, and direct
    routing whose own records were mostly old keys folds again; an epoch of fewer than
    `JUDGED_FROM` records (one a window's end cut short: 90 records of 50 keys) changes neither."""
    from slashrt.ssb.window import JUDGED_FROM, routes_directly

    big = JUDGED_FROM
    assert routes_directly(False, rows=big // 2, records=big, own_records=0, own_new=0)
    assert not routes_directly(False, rows=big // 2 - 1, records=big, own_records=0, own_new=0)
    assert not routes_directly(True, rows=big, records=big, own_records=big // 2, own_new=0)
    assert routes_directly(True, rows=big, records=big, own_records=big // 2, own_new=big // 4)
    assert not routes_directly(False, rows=50, records=90, own_records=0, own_new=0)
    assert routes_directly(True, rows=90, records=90, own_records=45, own_new=0)
