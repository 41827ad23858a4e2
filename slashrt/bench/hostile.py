"""What strangers at the door cost a cluster job: wall time with and without hostile connections.

    python -m slashrt.bench.hostile [--transport tcp|shm] [--strangers 50] [--events N] [--repeat R]
    python -m slashrt.bench.hostile --listener ingest [--strangers 50] [--events N] [--repeat R]

Two agents run in this process (`agent.serve`), so the channel ports of a real job can be
attacked the moment they open. A job (a keyed tumbling-window sum over `--events` records, two
executors) runs `--repeat` times alone, then `--repeat` times with `--strangers` hostile
connections (`slashrt.testing.hostile_connections`: idle, garbage, wrong secret, slowloris) on
each agent's control port and on each channel port, connected before the real peers. Reported:
the wall time of each job from connecting to the agents to the result (setup included: that is
where a listener that waited on strangers would lose time), less the time the attack itself
spends opening its connections inside the job's set-up (it runs in the agents' task here),
median of the repeats, and whether the results were equal. One JSON object on stdout.

With `--listener ingest`, an ingest endpoint in this process takes two task attempts of half
the records each and the driver's commit, alone and then beside the strangers on its listener
(connected before the tasks); the time runs from the first task's connection to the end of
the dataflow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import numpy as np
import trio

from slashrt import Dataflow, Schema, Tumbling
from slashrt._logging import configure
from slashrt.bench._common import sort_rows
from slashrt.cluster import agent, run_cluster_async
from slashrt.ops.sinks import Collect
from slashrt.testing import hostile_connections
from slashrt.transport._auth import generate_secret
from slashrt.transport._registry import open_port

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])


def _records(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    out = np.zeros(n, SCHEMA.dtype)
    out["ts"] = np.arange(n) // 1000
    out["key"] = rng.integers(0, 1000, n)
    out["value"] = rng.integers(-100, 100, n)
    return out


def _flow(sink) -> Dataflow:
    f = Dataflow("hostile-bench")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=100)).sum("value", key="key", output="out").sink(sink, name="out")
    return f


async def _job(addresses, secret, data, transport) -> tuple[float, np.ndarray]:
    sink = Collect()
    started = time.perf_counter()
    await run_cluster_async(_flow(sink), {"r": data}, executors=addresses, transport=transport, secret=secret)
    return time.perf_counter() - started, sort_rows(sink.records, "window_start", "key")


async def measure(transport: str, strangers: int, events: int, repeat: int) -> dict:
    secret = generate_secret()
    data = _records(events)
    attacking = False
    opened = [0.0]  # per job beside strangers: seconds spent opening the channel ports' strangers

    @contextlib.asynccontextmanager
    async def attacked_port(name, secret, **where):
        async with open_port(name, secret, **where) as port:
            if not attacking:
                yield port
                return
            opening = time.perf_counter()
            async with hostile_connections(port.address, strangers):
                opened[-1] += time.perf_counter() - opening  # the attacker's work, in this process
                yield port

    original, agent.open_port = agent.open_port, attacked_port
    try:
        async with trio.open_nursery() as nursery:
            addresses = []
            for _ in range(2):
                host, port = await nursery.start(agent.serve, "127.0.0.1", 0, secret)
                addresses.append(f"{host}:{port}")
            alone, reference = [], None
            for _ in range(repeat):
                seconds, rows = await _job(addresses, secret, data, transport)
                alone.append(seconds)
                reference = rows if reference is None else reference
            attacking = True
            beside, equal = [], True
            async with contextlib.AsyncExitStack() as stack:
                for address in addresses:
                    host, port = address.rsplit(":", 1)
                    await stack.enter_async_context(hostile_connections((host, int(port)), strangers))
                for _ in range(repeat):
                    opened.append(0.0)
                    seconds, rows = await _job(addresses, secret, data, transport)
                    beside.append(seconds - opened[-1])
                    equal = equal and np.array_equal(rows, reference)
            nursery.cancel_scope.cancel()
    finally:
        agent.open_port = original
    return {
        "transport": transport,
        "events": events,
        "strangers_per_listener": strangers,
        "listeners_attacked": 4,  # two control ports, one channel port per agent
        "seconds_alone": [round(s, 3) for s in alone],
        "seconds_beside_strangers": [round(s, 3) for s in beside],
        "attack_opening_seconds": [round(s, 3) for s in opened[1:]],
        "median_alone": round(statistics.median(alone), 3),
        "median_beside_strangers": round(statistics.median(beside), 3),
        "results_equal": equal,
    }


async def measure_ingest(strangers: int, rows: int, repeat: int) -> dict:
    """An ingest endpoint (in this process) fed two task attempts of `rows` rows each and the
    driver's commit, alone and beside `strangers` on its listener; wall time from the first
    task's connection to the end of the dataflow."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from slashrt._buffer import Control
    from slashrt._runtime import run_receivers
    from slashrt.spark import IngestEndpoint, plan_columns
    from slashrt.spark._ingest import _driver_send, _PartitionPusher

    schema = Schema({"t": "i8", "key": "i8"})
    plan = plan_columns(T.StructType([T.StructField("t", T.LongType(), False), T.StructField("key", T.LongType(), False)]), schema)
    ids = np.arange(2 * rows, dtype=np.int64)
    batches = [pa.RecordBatch.from_arrays([pa.array(ids[a : a + 65536]), pa.array(ids[a : a + 65536] % 1000)], names=["t", "key"])
               for a in range(0, len(ids), 65536)]
    half = len(batches) // 2
    secret = generate_secret()

    async def one(with_strangers: bool) -> tuple[float, int]:
        flow = Dataflow("ingest-bench")
        sink = Collect()
        flow.source("events", schema, time="t").window(Tumbling(ms=1000)).count(key="key").sink(sink, name="out")
        endpoint = IngestEndpoint.for_source(flow, "events", secret, transport="tcp")
        async with endpoint, contextlib.AsyncExitStack() as stack:
            if with_strangers:
                await stack.enter_async_context(hostile_connections(endpoint.address, strangers))
            target = endpoint.target
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_receivers, flow, {"events": endpoint.receiver})
                parts = [batches[:half], batches[half:]]
                for p, part in enumerate(parts):
                    await _PartitionPusher(target, plan, 1, secret)._push(iter(part), p, 10 + p, 0)
                picks = [(Control.INGEST_PICK, 10 + p, sum(len(b) for b in part), p) for p, part in enumerate(parts)]
                await _driver_send(target, secret, picks + [(Control.INGEST_COMMIT, 1, 2, 0), (Control.INGEST_END, 0, 0, 0)])
            return time.perf_counter() - started, int(sink.records["count"].sum())

    alone = [await one(False) for _ in range(repeat)]
    beside = [await one(True) for _ in range(repeat)]
    return {
        "listener": "ingest",
        "rows": 2 * rows,
        "strangers": strangers,
        "seconds_alone": [round(s, 3) for s, _ in alone],
        "seconds_beside_strangers": [round(s, 3) for s, _ in beside],
        "median_alone": round(statistics.median(s for s, _ in alone), 3),
        "median_beside_strangers": round(statistics.median(s for s, _ in beside), 3),
        "results_equal": all(n == 2 * rows for _, n in alone + beside),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m slashrt.bench.hostile", description=__doc__.split("\n\n")[0])
    p.add_argument("--listener", choices=["job", "ingest"], default="job",
                   help="a cluster job's control and data listeners (default), or an ingest endpoint's")
    p.add_argument("--transport", choices=["tcp", "shm"], default="tcp", help="between the job's executors")
    p.add_argument("--strangers", type=int, default=50, help="hostile connections per listener (default 50)")
    p.add_argument("--events", type=int, default=1_000_000, help="records per job (default 1 M)")
    p.add_argument("--repeat", type=int, default=3, help="jobs alone, then as many beside strangers (default 3)")
    p.add_argument("--log-level", default="error", help="of this process's log lines, on stderr (default error)")
    args = p.parse_args(argv)
    try:
        configure(args.log_level)
    except ValueError as exc:
        p.error(str(exc))
    for name in ("strangers", "events", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be positive")
    with contextlib.redirect_stdout(sys.stderr):  # the agents announce their addresses there
        if args.listener == "ingest":
            result = trio.run(measure_ingest, args.strangers, args.events // 2, args.repeat)
        else:
            result = trio.run(measure, args.transport, args.strangers, args.events, args.repeat)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
