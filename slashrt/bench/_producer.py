"""The producer process of `slashrt bench ro --transport ...`: connects to the consumer's
listener and streams RO records (throughput phase) or single time-stamped buffers (latency
phase). Started by slashrt.bench.channel; the cluster secret comes in $SLASHRT_SECRET."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import trio

from slashrt.bench import ro
from slashrt.ops.sources import feed_array
from slashrt.transport import RingSpec
from slashrt.transport._auth import load_secret
from slashrt.bench._process import producer_channel

FINISH_TIMEOUT = 60.0


async def _throughput(sender, args, records) -> None:
    await feed_array(sender, records, time="ts", max_delay=0, watermark_every=max(1, args.slots - 1))


async def _latency(sender, args, _records) -> None:
    per_slot = sender.spec.payload_capacity // ro.RO_SCHEMA.record_size
    records = np.zeros(per_slot, ro.RO_SCHEMA.dtype)
    raw = records.view(np.uint8)
    for i in range(args.count):
        # one buffer in flight at a time: wait until the consumer handed every slot back
        await sender.wait_credit(sender.spec.slots)
        records["ts"] = i
        records["key"][0] = time.perf_counter_ns()  # CLOCK_MONOTONIC: comparable across processes
        payload = sender.reserve()
        payload[: raw.size] = raw
        sender.post(nbytes=raw.size, count=per_slot)
    await sender.aclose()


async def main_async(args) -> None:
    spec = RingSpec(slots=args.slots, slot_size=args.slot_size, record_size=ro.RO_SCHEMA.record_size)
    # generate before connecting: the consumer's clock starts at the connection
    records = ro.generate(args.events, args.key_range, seed=args.seed) if args.phase == "throughput" else None
    async with producer_channel(args, spec, load_secret()) as sender:
        with trio.fail_after(FINISH_TIMEOUT + args.events / 1e6):
            # both phases end with aclose(), which waits until the consumer has the whole stream
            await (_latency if args.phase == "latency" else _throughput)(sender, args, records)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="slashrt-bench-producer")
    p.add_argument("--transport", required=True)
    p.add_argument("--address", required=True, help="the listener's address as JSON")
    p.add_argument("--phase", choices=["throughput", "latency"], required=True)
    p.add_argument("--events", type=int, default=0)
    p.add_argument("--key-range", type=int, default=100_000_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--slot-size", type=int, required=True)
    p.add_argument("--slots", type=int, required=True)
    args = p.parse_args(argv)
    trio.run(main_async, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
