"""The ingest endpoint without Spark: task attempts and the driver played by coroutines over
real TCP channels. Only committed attempts count, each once, whatever else arrives."""

import numpy as np
import pyarrow as pa
import pytest
import trio

import slashrt
from slashrt import Schema, Tumbling
from slashrt._runtime import run_receivers
from slashrt.errors import ChannelClosed
from slashrt.spark import IngestEndpoint, IngestError, plan_columns
from slashrt.spark._ingest import _driver_send, _PartitionPusher
from slashrt._buffer import Control
from slashrt.testing import hostile_connections
from slashrt.transport import _accept
from slashrt.transport._auth import generate_secret
from pyspark.sql import types as T

SCHEMA = Schema({"t": "i8", "key": "i8"})
SPARK = T.StructType([T.StructField("t", T.LongType(), False), T.StructField("key", T.LongType(), False)])
PLAN = plan_columns(SPARK, SCHEMA)


def flow_and_sink(max_delay=0):
    flow = slashrt.Dataflow("counts")
    events = flow.source("events", SCHEMA, time="t", max_delay=max_delay)
    sink = slashrt.sinks.Collect()
    events.window(Tumbling(ms=100)).count(key="key").sink(sink, name="out")
    return flow, sink


def batches(start, end, per_batch=700):
    for a in range(start, end, per_batch):
        ids = np.arange(a, min(end, a + per_batch), dtype=np.int64)
        yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(ids % 5)], names=["t", "key"])


def reference(ts):
    ts = np.asarray(ts)
    pairs = {(int(w), int(k)): 0 for w, k in zip(ts // 100 * 100, ts % 5)}
    for w, k in zip(ts // 100 * 100, ts % 5):
        pairs[(int(w), int(k))] += 1
    return sorted((w, k, c) for (w, k), c in pairs.items())


def rows_of(sink):
    r = sink.records
    return sorted(zip(r["window_start"].tolist(), r["key"].tolist(), r["count"].tolist())) if r is not None else []


async def attempt(target, secret, ingest_id, partition, attempt_id, data, fail_after_rows=None):
    """One task attempt; with `fail_after_rows` it dies mid-partition, as a killed task does."""
    def fault(p, number, rows):
        if fail_after_rows is not None and rows >= fail_after_rows:
            raise RuntimeError("task killed")

    pusher = _PartitionPusher(target, PLAN, ingest_id, secret, fault=fault)
    return await pusher._push(iter(data), partition, attempt_id, 0)


def commit(ingest_id, picks, end=False):
    msgs = [(Control.INGEST_PICK, a, rows, p) for p, a, rows in picks] + [(Control.INGEST_COMMIT, ingest_id, len(picks), 0)]
    return msgs + ([(Control.INGEST_END, 0, 0, 0)] if end else [])


async def test_only_the_committed_attempt_of_each_partition_counts():
    secret = generate_secret()
    flow, sink = flow_and_sink()
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    async with endpoint, trio.open_nursery() as nursery:
        target = endpoint.target
        done, results = trio.Event(), []

        async def run():
            results.append(await run_receivers(flow, {"events": endpoint.receiver}))
            done.set()

        nursery.start_soon(run)
        # partition 0: a first attempt dies half-way, its retry completes, a speculative copy too
        with pytest.raises(RuntimeError, match="task killed"):
            await attempt(target, secret, 7, 0, 100, batches(0, 5000), fail_after_rows=2000)
        r0 = await attempt(target, secret, 7, 0, 101, batches(0, 5000))
        r0b = await attempt(target, secret, 7, 0, 102, batches(0, 5000))
        await attempt(target, secret, 7, 1, 103, batches(5000, 9000))
        assert (r0["rows"], r0["bytes"], r0["first_seq"]) == (5000, 80000, 1)
        assert r0["last_seq"] - r0["first_seq"] + 1 == r0["buffers"] == -(-5000 // (4064 // 16))
        assert endpoint.stats.attempts_aborted == 1 and endpoint.stats.attempts_prepared == 3
        assert rows_of(sink) == []  # nothing counts before the commit
        await _driver_send(target, secret, commit(7, [(0, 101, 5000), (1, 103, 4000)], end=True))
        await done.wait()
    stats = endpoint.stats
    assert rows_of(sink) == reference(np.arange(9000))
    assert (stats.rows_committed, stats.partitions_committed, stats.attempts_dropped) == (9000, 2, 1)
    assert stats.staged_bytes == 0 and results[0].records == 9000
    assert r0b["rows"] == 5000


async def test_a_replayed_ingest_is_discarded_and_watermarks_follow_commits():
    secret = generate_secret()
    flow, sink = flow_and_sink(max_delay=50)
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    async with endpoint, trio.open_nursery() as nursery:
        target = endpoint.target
        nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
        await attempt(target, secret, 1, 0, 10, batches(0, 1000))
        await _driver_send(target, secret, commit(1, [(0, 10, 1000)]))
        # the watermark is 999 - 50: windows ending by 949 have fired, the rest wait
        with trio.fail_after(5):
            while rows_of(sink) != reference(np.arange(900)):
                await trio.sleep(0.01)
        # the same micro-batch again (a replay after a restart): its data and commit are dropped
        await attempt(target, secret, 1, 0, 11, batches(0, 1000))
        await _driver_send(target, secret, commit(1, [(0, 11, 1000)]))
        await attempt(target, secret, 2, 0, 12, batches(1000, 1500))
        await _driver_send(target, secret, commit(2, [(0, 12, 500)], end=True))
    assert rows_of(sink) == reference(np.arange(1500))
    assert endpoint.stats.duplicate_buffers > 0 and endpoint.stats.rows_committed == 1500


async def test_a_commit_naming_data_never_received_fails_the_source():
    secret = generate_secret()
    flow, sink = flow_and_sink()
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    failed = None
    async with endpoint, trio.open_nursery() as nursery:
        target = endpoint.target

        async def run():
            nonlocal failed
            with pytest.raises(slashrt.ChannelFailed) as info:
                await run_receivers(flow, {"events": endpoint.receiver})
            failed = info.value

        nursery.start_soon(run)
        await attempt(target, secret, 3, 0, 20, batches(0, 100))
        with pytest.raises(IngestError, match="refused the commit"):
            await _driver_send(target, secret, commit(3, [(0, 20, 100), (1, 21, 100)]))
    assert "attempt 21 of partition 1, which never arrived complete" in str(failed)


async def test_peers_without_the_secret_are_refused_and_the_endpoint_goes_on():
    secret = generate_secret()
    flow, sink = flow_and_sink()
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    async with endpoint, trio.open_nursery() as nursery:
        target = endpoint.target
        nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
        with pytest.raises(ChannelClosed):
            await attempt(target, generate_secret(), 4, 0, 30, batches(0, 100))
        await attempt(target, secret, 4, 0, 31, batches(0, 100))
        await _driver_send(target, secret, commit(4, [(0, 31, 100)], end=True))
    assert endpoint.stats.refused_connections == 1
    assert rows_of(sink) == reference(np.arange(100))


async def test_strangers_on_the_endpoint_delay_no_task_and_never_count(monkeypatch):
    """50 strangers (idle, garbage, wrong secret, slowloris) connected before the tasks: with a
    set-up deadline of a minute, an endpoint that waited on any of them could not finish in 30 s."""
    monkeypatch.setattr(_accept, "SETUP_TIMEOUT", 60.0)
    secret = generate_secret()
    flow, sink = flow_and_sink()
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    with trio.fail_after(30):
        async with endpoint, trio.open_nursery() as nursery:
            target = endpoint.target
            nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
            async with hostile_connections(endpoint.address, 50) as strangers:
                await attempt(target, secret, 6, 0, 50, batches(0, 1000))
                await attempt(target, secret, 6, 1, 51, batches(1000, 2000))
                await _driver_send(target, secret, commit(6, [(0, 50, 1000), (1, 51, 1000)], end=True))
    assert strangers.connected == 50
    assert endpoint.stats.connections == 3  # the two tasks and the driver: no stranger
    assert rows_of(sink) == reference(np.arange(2000))


async def test_verbs_is_used_only_where_offered_and_insisting_on_it_elsewhere_fails_clearly(monkeypatch):
    """No usable RDMA device (a device name that exists nowhere): an endpoint that must offer
    verbs refuses to open and closes its TCP listener; "auto" offers TCP only; a task that
    insists on verbs against it fails before sending anything, and the stream goes on."""
    monkeypatch.setenv("SLASHRT_VERBS_DEVICE", "nosuch0")
    secret = generate_secret()
    flow, sink = flow_and_sink()
    with pytest.raises(ValueError, match="unknown ingest transport 'rdma'"):
        IngestEndpoint.for_source(flow, "events", secret, transport="rdma")
    must = IngestEndpoint.for_source(flow, "events", secret, transport="verbs")
    with pytest.raises(IngestError, match="source 'events': verbs asked for, but .*(nosuch0|pyverbs|no RDMA devices)"):
        async with must:
            pass
    assert must._listener_cms == [] and must.verbs_address is None
    with pytest.raises(OSError):  # its TCP listener was closed again
        await trio.open_tcp_stream(*must.address)

    endpoint = IngestEndpoint.for_source(flow, "events", secret)  # "auto"
    async with endpoint, trio.open_nursery() as nursery:
        target = endpoint.target
        assert target.verbs_address is None
        nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
        insisting = _PartitionPusher(target, PLAN, 5, secret, transport="verbs")
        with pytest.raises(IngestError, match="partition 0: verbs asked for, but the endpoint offers no verbs listener"):
            await insisting._push(batches(0, 100), 0, 40, 0)
        report = await attempt(target, secret, 5, 0, 41, batches(0, 100))
        await _driver_send(target, secret, commit(5, [(0, 41, 100)], end=True))
    assert report["verbs"] == 0 and endpoint.stats.connections == 2  # the task and the driver
    assert endpoint.stats.verbs_connections == 0
    assert rows_of(sink) == reference(np.arange(100))


async def test_a_watermark_below_the_int64_minimum_saturates():
    # event times near int64's minimum minus a larger max_delay: no watermark yet, no overflow
    secret = generate_secret()
    flow, sink = flow_and_sink(max_delay=10_000)
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    t = np.iinfo(np.int64).min + 5000 + np.arange(3, dtype=np.int64)
    data = [pa.RecordBatch.from_arrays([pa.array(t), pa.array(t % 5)], names=["t", "key"])]
    async with endpoint, trio.open_nursery() as nursery:
        nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
        await attempt(endpoint.target, secret, 1, 0, 10, data)
        await _driver_send(endpoint.target, secret, commit(1, [(0, 10, 3)], end=True))
    assert rows_of(sink) == reference(t)


async def test_the_watermark_advances_with_each_committed_batch_not_within_it():
    # records of one micro-batch out of order by more than max_delay are not late: they are
    # judged against the watermark of the batches committed before theirs
    secret = generate_secret()
    flow, sink = flow_and_sink(max_delay=0)
    endpoint = IngestEndpoint.for_source(flow, "events", secret, slot_size=4096, slots=4)
    t = np.array([500, 100, 120], np.int64)
    data = [pa.RecordBatch.from_arrays([pa.array(t), pa.array(t % 5)], names=["t", "key"])]
    async with endpoint, trio.open_nursery() as nursery:
        nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
        await attempt(endpoint.target, secret, 1, 0, 10, data)
        await _driver_send(endpoint.target, secret, commit(1, [(0, 10, 3)], end=True))
    assert rows_of(sink) == reference(t)
