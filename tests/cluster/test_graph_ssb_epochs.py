"""Epochs and routing of the Slash State Backend in graph flows (`slashrt.ssb.graph_window`):
`epoch_bytes=` and `ssb_routing=` mean what they mean in a tree flow. The union behind a user
operator into a tumbling count of tests/cluster/test_graph_ssb.py, on 2 executors over shm and
3 over tcp with rings of four 256-byte slots: with epochs of a few KiB every executor ships each
window's fragments many times before the window is due (the owner joins the deltas), and the
windows stay numpy's; routed directly, each record crosses as a row of its own; folded, at most
one row per key and window and epoch; `auto` switches between them by the tree SSB's ratios.
(Late-heavy sliding windows: tests/cluster/test_graph_windows.py; inside loops:
tests/cluster/test_loop_windows_cluster.py; checkpoints taken while early shipments are on
their way: tests/snapshot/test_graph_cluster_epochs.py.)"""

import numpy as np
import pytest

import slashrt
from slashrt.ops.event_time import NO_TIME
from slashrt.ssb.epochs import ROUTINGS

from tests.cluster.test_graph_ssb import KEYS, N, RINGS, expected, inputs, union_count, windows

CLUSTERS = [(2, "shm"), (3, "tcp")]


def shipments(result) -> list:
    return [e for per_executor in result.epochs["uc.counts"] for e in per_executor]


@pytest.mark.parametrize(("executors", "transport"), CLUSTERS)
def test_epochs_of_a_few_kib_ship_every_fragment_many_times_before_its_window_is_due(executors, transport):
    """Epochs of 2 KiB (~85 records) against ~1,500 records of a 100 ms window per executor:
    each epoch's end ships every fragment's delta, due or not; the owners join them."""
    want = expected()
    np.testing.assert_array_equal(windows(slashrt.run(union_count(), inputs(), **RINGS)), want)
    result = slashrt.run(union_count(), inputs(), executors=executors, transport=transport, epoch_bytes=2048,
                         ssb_routing="fragments", **RINGS)
    np.testing.assert_array_equal(windows(result), want)
    n_windows = len(np.unique(want[:, 0]))
    assert len(result.epochs["uc.counts"]) == executors
    assert all(len(epochs) > 5 * n_windows for epochs in result.epochs["uc.counts"])
    everything = shipments(result)
    assert sum(e.records for e in everything) == 3 * N  # every record folded once, where it was read
    assert not any(e.direct for e in everything)
    # more rows than one per key, window and executor: a key's window left each executor in several deltas
    assert sum(e.keys_touched for e in everything) > executors * KEYS * n_windows
    assert 0 < sum(s.shipped_bytes for s in result.stats) == sum(e.shipped_bytes for e in everything)


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize(("executors", "transport"), CLUSTERS)
def test_every_routing_gives_the_same_windows(executors, transport, routing):
    """Windows of 1 s (two in all), epochs of 16 KiB (~680 records): folded, an epoch ships at
    most one row per key and window (its keys repeat); routed directly, one per record (none
    is late); `auto` folds (an epoch's delta holds far fewer than `DIRECT_AT` rows per record),
    but for an epoch cut short by a due window now and then."""
    result = slashrt.run(union_count(1000), inputs(), executors=executors, transport=transport, epoch_bytes=16 << 10,
                         ssb_routing=routing, **RINGS)
    np.testing.assert_array_equal(windows(result), expected(1000))
    everything = shipments(result)
    assert sum(e.records for e in everything) == 3 * N
    assert 0 < sum(s.shipped_bytes for s in result.stats) == sum(e.shipped_bytes for e in everything)
    if routing == "direct":
        assert all(e.direct and e.keys_touched == e.records for e in everything)
        return
    if routing == "fragments":
        assert not any(e.direct for e in everything)
        assert all(e.keys_touched <= 2 * KEYS for e in everything)
    assert sum(e.keys_touched for e in everything) * 5 < 3 * N
    assert sum(e.direct for e in everything) * 5 < len(everything)


@pytest.mark.parametrize(("executors", "transport"), CLUSTERS)
def test_auto_routes_directly_while_keys_are_new_and_folds_once_they_repeat(executors, transport):
    """The first 1 s window's keys are all distinct, the second's repeat (KEYS of them): `auto`
    starts folding, goes direct after the first epoch (its delta held more than `DIRECT_AT`
    rows per record) and folds again in the second window (fewer than `COMBINE_BELOW` of its
    own records' keys were new to their slice), as the tree SSB does (`routes_directly`); the
    windows stay numpy's. (Each executor reads blocks of both windows: `slashrt.cluster.share`.)"""

    def keys(rng):
        return np.where(np.arange(N) < N // 2, KEYS + rng.permutation(N), rng.integers(0, KEYS, N))

    data = inputs(keys)
    result = slashrt.run(union_count(1000), data, executors=executors, transport=transport, epoch_bytes=16 << 10,
                         **RINGS)
    np.testing.assert_array_equal(windows(result), expected(1000, data))
    for epochs in result.epochs["uc.counts"]:  # (the last, at the end, has no watermark)
        first = [e.direct for e in epochs if NO_TIME < e.watermark < 1000]
        second = [e.direct for e in epochs if e.watermark >= 1000]
        assert len(first) > 3 and first == [False] + [True] * (len(first) - 1)
        assert len(second) > 3 and not any(second[-3:])


def test_a_fragment_shipped_at_an_epochs_end_keeps_its_capability_until_its_window_is_due():
    """Executor 0 of 2 in this process, its tracker on its own: an epoch's end ships the
    fragment of [0, 100) before it is due, its rows counted in flight at (w.in0, 99); the
    fragment, empty, still holds its capability at (w.in1, 99) (a checkpoint keeps it), more
    records of it fold into it again, and once the records' frontier passes 100 its last
    shipment drops the capability."""
    import trio

    from slashrt._batch import Batch
    from slashrt._plan import ClusterRole, build_plan
    from slashrt.progress import Location, Timestamp
    from slashrt.scheduler._pointstamp import PointstampProgress
    from slashrt.ssb.partitions import Partitioning

    flow = union_count()
    plan = build_plan(flow, ClusterRole(0, Partitioning(16, 2), epoch_bytes=1000, ssb_routing="fragments"))
    route, at = plan.steps["uc.counts"], list(flow.steps).index("uc.counts")
    route.add_peer(1, sender=None)  # (its queue is read below, not sent)
    progress = PointstampProgress(plan, None)
    records = inputs()["b"][:100]  # 2,400 bytes, all in [0, 100)
    theirs = int((route.partitioning.owner_of(np.unique(records[:50]["k"])) == 1).sum())  # a row per key of 1's
    assert theirs > 0

    def counted() -> dict:
        trio.run(progress.settle)
        return {(loc.port, time): n for (loc, time), n in progress.tracker.pointstamps()
                if loc == Location.input(at, 0) or loc == Location.input(at, 1)}

    trio.run(route.push, Batch(records[:50]))  # 1,200 bytes: the epoch ends
    assert len(route.window.epochs) == 1 and route.window.kept == {Timestamp(99)}
    assert not route.window.fragments.slices  # (shipped whole: it restarts from the zero value)
    assert sum(len(rows) for rows in route._queues[1]) == theirs
    assert counted() == {(0, Timestamp(99)): theirs, (1, Timestamp(99)): 1}
    again = type(route.window)(route.window.spec, None, epoch_bytes=1000, routing="fragments")
    again.restore(route.window.snapshot())
    assert again.fragment_holds() == {Timestamp(99)}
    trio.run(route.push, Batch(records[50:]))  # folded into it again, shipped at the next epoch's end
    assert len(route.window.epochs) == 2 and route.window.fragment_holds() == {Timestamp(99)}
    route._queues[1].clear()
    trio.run(route.on_upstream, [Timestamp(100)])  # due: nothing left to ship, the capability goes
    assert route.window.fragment_holds() == frozenset() and not route.window.kept
    assert (1, Timestamp(99)) not in counted()
