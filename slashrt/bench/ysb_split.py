"""YSB split across two executors in two processes, joined by one channel of any transport.

The front executor (a producer process) reads the events, keeps views and maps ads to
campaigns; its sink is a `ChannelSink`, which carries records, watermarks and the end of the
stream to the back executor (this process), which counts views per campaign per 10-second
window. The result must equal the single-process query and the numpy reference, whatever the
transport: this is the end-to-end check of a transport under the real runtime.

    python -m slashrt.bench.ysb_split --transport shm --events 1000000   # prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import trio

from slashrt._dataflow import Dataflow
from slashrt._runtime import run_async
from slashrt._schema import Schema
from slashrt.bench import ysb
from slashrt.bench._process import producer_channel, run_with_producer
from slashrt.ops.exchange import ChannelSink
from slashrt.ops.sinks import Collect
from slashrt.ops.window import Tumbling
from slashrt.transport import RingSpec
from slashrt.transport._auth import load_secret

__all__ = ["VIEWS_SCHEMA", "front_flow", "back_flow", "run_split"]

VIEWS_SCHEMA = Schema([("event_time", "<i8"), ("campaign_id", "<i8")])


def front_flow(mapping: np.ndarray, sink, *, max_delay: int = 0) -> Dataflow:
    flow = Dataflow("ysb_front")
    events = flow.source("events", ysb.YSB_SCHEMA, time="event_time", max_delay=max_delay)
    (
        events.filter(lambda b: b["event_type"] == ysb.VIEW, name="views")
        .with_column("campaign_id", lambda b: mapping[b["ad_id"]])
        .project("event_time", "campaign_id")
        .sink(sink, name="to_back")
    )
    return flow


def back_flow(sink) -> Dataflow:
    flow = Dataflow("ysb_back")
    views = flow.source("views", VIEWS_SCHEMA, time="event_time")
    views.window(Tumbling(ms=ysb.WINDOW_MS)).count(key="campaign_id").sink(sink, name="counts")
    return flow


def run_split(transport: str, *, events: int, campaigns: int, seed: int = 42, slot_size: int = 65536, slots: int = 32) -> dict:
    """Run the split query; return the result rows' check against the reference."""
    spec = RingSpec(slots=slots, slot_size=slot_size, record_size=VIEWS_SCHEMA.record_size)
    sink = Collect()
    args = ["--events", str(events), "--campaigns", str(campaigns), "--seed", str(seed)]
    result = trio.run(run_with_producer, transport, spec, back_flow(sink), "views", "slashrt.bench.ysb_split", args)
    got = ysb.to_result(sink.records)
    records = ysb.generate(events, campaigns, seed=seed)
    expected = ysb.reference(records, ysb.campaign_map(campaigns))
    return {
        "query": "ysb_split",
        "transport": transport,
        "events": events,
        "executors": 2,
        "seconds": round(result.seconds, 6),
        "records_per_s": round(events / result.seconds, 1),
        "result_rows": len(got),
        "correct": bool(np.array_equal(got, expected)),
        "digest": int(np.bitwise_xor.reduce(got.view(np.uint64))) if len(got) else 0,
    }


async def _front(args) -> None:
    spec = RingSpec(slots=args.slots, slot_size=args.slot_size, record_size=VIEWS_SCHEMA.record_size)
    records = ysb.generate(args.events, args.campaigns, seed=args.seed)  # before the clock starts
    async with producer_channel(args, spec, load_secret()) as sender:
        # the sink ends with aclose(), which waits until the back executor has the whole stream
        await run_async(front_flow(ysb.campaign_map(args.campaigns), ChannelSink(sender, VIEWS_SCHEMA)), {"events": records})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m slashrt.bench.ysb_split")
    p.add_argument("--transport", required=True)
    p.add_argument("--address", help="(producer side) the back executor's listener, as JSON")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--campaigns", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--slot-size", type=int, default=65536)
    p.add_argument("--slots", type=int, default=32)
    args = p.parse_args(argv)
    if args.address is not None:
        trio.run(_front, args)
        return 0
    result = run_split(args.transport, events=args.events, campaigns=args.campaigns, seed=args.seed,
                       slot_size=args.slot_size, slots=args.slots)
    print(json.dumps(result))
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
