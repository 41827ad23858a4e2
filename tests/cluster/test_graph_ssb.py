"""The Slash State Backend in graph flows (`slashrt.ssb.graph_window`): a union, with a user
operator in front of it, feeding a keyed tumbling count on several executors in real
processes, over shm and tcp, with rings of four 256-byte slots that every channel wraps many
times. The windows equal one executor's; every executor folds its records into fragments and
ships one partial row per key and window, not a row per record (`RunResult.epochs` names the
window); the same flow routed by key (`mode="uppar"`) ships every record another executor owns.
(A checkpoint resumed in the other mode: tests/snapshot/test_rescale.py.) An owner that stalls
holds the rows queued for it on the executors shipping to it at a bound set by the rings,
not by their input (`EpochStats.queued_peak`)."""

import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Operator, Schema, Tumbling, sinks
from slashrt.cluster import PerExecutor
from slashrt.cluster._ring_budget import EXCHANGE_SLOTS
from slashrt._buffer import FOOTER_SIZE
from slashrt.ssb.partitions import DEFAULT_PARTITIONS, Partitioning

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
N = 20_000  # per source: ~1,900 slots of 256 bytes through each source's ring of 4
KEYS = 50
RINGS = {"slot_size": 256, "slots": 4}


class Doubled(Operator):
    """A user step in front of the union: every record twice (its state: how many it saw)."""

    stateless = True

    async def on_batch(self, ctx, port, batch):
        rows = batch.to_numpy(SCHEMA.dtype)
        await ctx.emit(np.concatenate([rows, rows]))


def union_count(size: int = 100, sink=None) -> Dataflow:
    flow = Dataflow("uc")
    a = flow.source("a", SCHEMA, time="t")
    b = flow.source("b", SCHEMA, time="t")
    doubled = a.operator(Doubled(), name="doubled", schema=SCHEMA)
    doubled.union(b).window(Tumbling(size)).count(key="k", name="counts").sink(sink or sinks.Collect(), name="out")
    return flow


def inputs(keys=None) -> dict:
    """Each source's N records, 10 a ms, of KEYS keys drawn at random (`keys(rng)`: others)."""
    rng = np.random.default_rng(3)
    out = {}
    for name in "ab":
        data = np.zeros(N, SCHEMA.dtype)
        data["t"] = np.arange(N) // 10
        data["k"] = rng.integers(0, KEYS, N) if keys is None else keys(rng)
        out[name] = data
    return out


def expected(size: int = 100, data: dict | None = None) -> np.ndarray:
    """numpy's count per window of `size` ms and key of `data` (by default `inputs()`)."""
    data = inputs() if data is None else data
    rows = np.concatenate([data["a"], data["a"], data["b"]])
    keys, counts = np.unique(np.stack([rows["t"] // size * size, rows["k"]], axis=1), axis=0, return_counts=True)
    return np.column_stack([keys, counts])


def windows(result) -> np.ndarray:
    out = np.sort(result.outputs["uc.out"], order=["window_start", "k"])
    return np.column_stack([out["window_start"], out["k"], out["count"]])


@pytest.mark.parametrize(("executors", "transport"), [(2, "shm"), (3, "tcp")])
def test_a_union_behind_a_user_step_counts_on_the_state_backend_and_ships_partials_not_records(executors, transport):
    np.testing.assert_array_equal(windows(slashrt.run(union_count(), inputs(), **RINGS)), expected())
    slash = slashrt.run(union_count(), inputs(), executors=executors, transport=transport, mode="slash", **RINGS)
    uppar = slashrt.run(union_count(), inputs(), executors=executors, transport=transport, mode="uppar", **RINGS)
    np.testing.assert_array_equal(windows(slash), expected())
    np.testing.assert_array_equal(windows(uppar), expected())
    assert list(slash.epochs) == ["uc.counts"] and len(slash.epochs["uc.counts"]) == executors
    shipments = [e for per_executor in slash.epochs["uc.counts"] for e in per_executor]
    assert sum(e.records for e in shipments) == 3 * N  # every record folded once, where it was read
    windows_seen = 3 * N // 1000 + 1  # (windows of 100 ms, 10 records a ms per source)
    assert sum(e.keys_touched for e in shipments) <= executors * KEYS * windows_seen  # a row per key and window
    shipped = sum(s.shipped_bytes for s in slash.stats)
    routed = sum(s.shipped_bytes for s in uppar.stats)
    assert 0 < shipped == sum(e.shipped_bytes for e in shipments)
    assert shipped * 10 < routed  # partial states, not records


def test_one_executor_and_a_slash_cluster_report_no_shipment_where_nothing_crosses():
    one = slashrt.run(union_count(), inputs(), executors=1, mode="slash", **RINGS)
    np.testing.assert_array_equal(windows(one), expected())
    assert sum(s.shipped_bytes for s in one.stats) == 0


class StallOnce:
    """A pass-through filter that stalls its executor for `seconds` at the first batch holding a
    record flagged v=1 (only executor 1's are): its whole loop waits, channels and all."""

    def __init__(self, seconds: float):
        self.seconds, self.stalled = seconds, False

    def __call__(self, batch):
        if not self.stalled and batch["v"].any():
            self.stalled = True
            time.sleep(self.seconds)
        return np.ones(len(batch), bool)


def owned_by_1(n: int, executors: int, skip: int = 0) -> np.ndarray:
    """`n` distinct keys that executor 1 of `executors` owns, after the first `skip` of them."""
    keys = np.arange(2 * executors * (n + skip) + 1000)
    return keys[Partitioning(DEFAULT_PARTITIONS, executors).owner_of(keys) == 1][skip : skip + n]


def shipping_to_a_stalled_owner(n: int):
    """Each executor's stream: executor 1's, 1,000 records of 50 keys it owns, flagged (it stalls
    at the first); every other executor's, `n` records of keys new to the window, which executor
    1 owns: every one of them is shipped to it, folded (an epoch of 1 KiB holds no key twice) or
    routed directly."""

    def make(index: int, executors: int) -> np.ndarray:
        out = np.zeros(1000 if index == 1 else n, SCHEMA.dtype)
        out["t"] = np.arange(len(out)) // 10
        if index == 1:
            out["k"], out["v"] = owned_by_1(50, executors)[np.arange(1000) % 50], 1
        else:
            out["k"] = owned_by_1(n, executors, skip=50 + index * n)
        return out

    return PerExecutor(make)


@pytest.mark.parametrize(("executors", "transport", "routing"), [(2, "shm", "fragments"), (3, "tcp", "direct")])
def test_a_stalled_owner_holds_the_queues_shipping_to_it_flat_while_their_input_doubles(executors, transport, routing):
    """Executor 1 stalls for 0.3 s at its first batch. Every other executor ships it all it
    reads: its queue for executor 1 stays at the bound of two exchange rings' worth of rows a
    peer (`ExchangeNode.backlogged`: its sources are read no more meanwhile), plus what it
    had read (a source ring's records) and an epoch's rows, with 20,000 records as with 40,000;
    without the bound it would queue all it reads. The counts are exact."""
    row = 48  # a partial row and its time
    bound = (executors - 1) * 2 * EXCHANGE_SLOTS * ((RINGS["slot_size"] - FOOTER_SIZE) // row)
    read = RINGS["slots"] * ((RINGS["slot_size"] - FOOTER_SIZE) // SCHEMA.record_size)  # a ring of records
    epoch = 1024 // SCHEMA.record_size + 1
    peaks = []
    for n in (20_000, 40_000):
        flow, out = Dataflow("stall"), sinks.Collect()
        flow.source("r", SCHEMA, time="t").filter(StallOnce(0.3), name="stall").window(Tumbling(10**9)).count(
            key="k", name="counts").sink(out, name="out")
        result = slashrt.run(flow, {"r": shipping_to_a_stalled_owner(n)}, executors=executors, transport=transport,
                             mode="slash", epoch_bytes=1024, ssb_routing=routing, **RINGS)
        counted = dict(zip(out.records["k"].tolist(), out.records["count"].tolist()))
        assert sum(counted.values()) == (executors - 1) * n + 1000 and len(counted) == (executors - 1) * n + 50
        shippers = [epochs for i, epochs in enumerate(result.epochs["stall.counts"]) if i != 1]
        assert all(sum(e.shipped_rows for e in epochs) == n for epochs in shippers)  # every record to executor 1
        peaks.append(max(e.queued_peak for epochs in shippers for e in epochs))
    assert 0 < max(peaks) <= (bound + read + epoch) * row, (peaks, (bound + read + epoch) * row)
