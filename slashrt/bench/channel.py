"""RO over a transport: a producer process streams 16-byte records through one channel to a
consumer process that counts them per key (`slashrt bench ro --transport T --buffer-size B`).

The consumer is this process: it opens a listener, starts the producer (slashrt.bench._producer)
and runs the RO dataflow on one executor whose input is the accepted channel. Two phases:
throughput (the whole stream, as fast as credits allow) and latency (single buffers, one in
flight, each stamped with CLOCK_MONOTONIC at the producer and measured when the consumer's
pipeline receives it). A plain memcpy of the same bytes, timed in the same run, is the
yardstick. `inproc` runs the producer as a task in this process instead.
"""

from __future__ import annotations

import time

import numpy as np
import trio

from slashrt._dataflow import Dataflow
from slashrt._runtime import run_receivers
from slashrt.bench import ro
from slashrt.bench._common import Timer, lazy
from slashrt.bench._process import run_with_producer
from slashrt.ops.sinks import Callback, Collect
from slashrt.ops.sources import feed_array
from slashrt.transport import RingSpec, open_inproc_channel

__all__ = ["bench"]

WINDOW_MS = 1 << 40  # one window over the whole stream: the count per key is the result
PRODUCER = "slashrt.bench._producer"
# 64 slots of 64 KiB: a 4 MiB ring, the size of a core's L2 here; 32 slots measured 0.29-0.47
# of memcpy over shm, 64 slots 0.56-0.60, 96 slots 0.46 (docs/benchmarks.md)
DEFAULT_SLOTS = 64


def _latency_flow(latencies: list) -> Dataflow:
    flow = Dataflow("latency")

    def probe(batch):
        latencies.append(time.perf_counter_ns() - int(batch["key"][0]))

    flow.source("records", ro.RO_SCHEMA).apply(probe).sink(Callback(lambda r: None))
    return flow


async def _inproc(spec: RingSpec, flow: Dataflow, records: np.ndarray | None, latency_count: int):
    sender, receiver = open_inproc_channel(spec)

    async def produce():
        if records is not None:
            await feed_array(sender, records, time="ts", max_delay=0, watermark_every=max(1, spec.slots - 1))
        else:
            per_slot = spec.payload_capacity // ro.RO_SCHEMA.record_size
            probe = np.zeros(per_slot, ro.RO_SCHEMA.dtype)
            for i in range(latency_count):
                await sender.wait_credit(spec.slots)
                probe["key"][0] = time.perf_counter_ns()
                sender.reserve()[: probe.nbytes] = probe.view(np.uint8)
                sender.post(nbytes=probe.nbytes, count=per_slot)
            await sender.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        return await run_receivers(flow, {"records": receiver})


def bench(
    *,
    transport: str,
    buffer_size: int,
    events: int,
    key_range: int,
    slots: int = DEFAULT_SLOTS,
    latency_count: int = 2000,
    seed: int = 7,
    repeat: int = 1,
    floating: int = 0,
    **_ignored,
) -> dict:
    """Throughput: the best of `repeat` runs of the whole stream, every run's count checked.
    `floating`: the channel is one of a slot pool (`transport._pool`) with `slots` exclusive
    slots and as many floating ones as this, which it borrows while its producer has a backlog."""
    spec = RingSpec(slots=slots, slot_size=buffer_size, record_size=ro.RO_SCHEMA.record_size)
    if spec.records_per_slot < 1:
        raise ValueError(f"buffer size {buffer_size} is too small for one record")
    records = ro.generate(events, key_range, seed=seed)  # the producer makes the same ones
    expected = lazy(lambda: ro.reference(records, WINDOW_MS))
    latencies: list[int] = []
    result, correct = None, True
    for _ in range(repeat):
        sink = Collect()
        count_flow = ro.dataflow(sink, window_ms=WINDOW_MS)
        if transport == "inproc":
            run = trio.run(_inproc, spec, count_flow, records, 0)
        else:
            producer = ["--events", str(events), "--key-range", str(key_range), "--seed", str(seed)]
            run = trio.run(run_with_producer, transport, spec, count_flow, "records", PRODUCER,
                           ["--phase", "throughput", *producer], floating)
        correct = correct and bool(np.array_equal(ro.to_result(sink.records), expected()))
        result = run if result is None or run.seconds < result.seconds else result
    latency_spec = RingSpec(slots=slots, slot_size=4096, record_size=16)
    if transport == "inproc":
        trio.run(_inproc, latency_spec, _latency_flow(latencies), None, latency_count)
    else:
        trio.run(
            run_with_producer, transport, latency_spec, _latency_flow(latencies), "records", PRODUCER,
            ["--phase", "latency", "--count", str(latency_count)],
        )

    nbytes = events * ro.RO_SCHEMA.record_size
    # the yardstick: a plain copy of the same bytes, best of three, in this same run
    src = records.view(np.uint8)
    dst = np.ones_like(src)  # touched: no page faults inside the timing
    best = None
    for _ in range(3):
        with Timer() as t:
            np.copyto(dst, src)
        best = t.seconds if best is None else min(best, t.seconds)
    lat = np.array(latencies[10:] or latencies, dtype=np.float64) / 1e3  # skip warm-up buffers
    gbps = nbytes / result.seconds / 1e9
    extra = _ib_write_bw_fields(buffer_size, gbps) if transport == "verbs" else {}
    return {
        "query": "ro",
        "transport": transport,
        "buffer_size": buffer_size,
        "slots": slots,
        "floating": floating,
        "floating_peak": result.stats[0].floating_peak,  # the most it borrowed at once (best run)
        "events": events,
        "repeat": repeat,
        "seconds": round(result.seconds, 6),
        "gbytes_per_s": round(gbps, 3),
        "records_per_s": round(events / result.seconds, 1),
        "latency_us_p50": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "latency_us_p99": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
        "latency_buffer_size": 4096,
        "memcpy_gbytes_per_s": round(nbytes / best / 1e9, 3),
        "fraction_of_memcpy": round(gbps / (nbytes / best / 1e9), 3),
        "correct": correct,
        **extra,
    }


def _ib_write_bw_fields(buffer_size: int, gbps: float) -> dict:
    """perftest's ib_write_bw on the device the verbs channel used, in this same run."""
    import ipaddress

    from slashrt.bench.perftest import ib_write_bw
    from slashrt.transport.verbs import discover_device

    choice = discover_device()
    words = [int(w, 16) for w in choice.gid.split(":")]
    address = str(ipaddress.IPv4Address((words[6] << 16) | words[7]))  # the GID's IPv4-mapped address
    bw = ib_write_bw(choice.name, choice.gid_index, address, size=buffer_size, iters=300)
    reference = bw["avg_mb_per_s"] / 1e3
    return {
        "ib_write_bw_gbytes_per_s": round(reference, 4),
        "fraction_of_ib_write_bw": round(gbps / reference, 3) if reference else None,
    }
