"""The `partition` fault of `slashrt bench chaos --faults`: a network partition between two
executors that both still answer the coordinator, recovered exactly once.

Three hosts (network namespaces, `slashrt.testing._netns`) run an agent each, given to the
coordinator by address; a checkpointed window job over tcp into a transactional Collect, with
`restart=`. Once every executor has processed records, every packet between hosts 1 and 2 is
dropped (a blackhole route on each side); the executors' data channels notice within the
heartbeat timeout (`transport._channel.Liveness`) and the job fails naming both; the restart
strategy heals the partition as it decides to restart, and the job is re-submitted to the same
agents and resumes from its last complete checkpoint. Each executor's stream is slowed (a
pass-through filter) until the partition healed, so the job cannot end before it. The output
is compared with a run on one executor: `duplicates` and `missing` must be 0.

Needs root (network namespaces): `refused` with the reason otherwise.
"""

from __future__ import annotations

import collections
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from slashrt.bench._held import HeldUntil

__all__ = ["trial"]

PORT = 7712
HEARTBEAT = {"heartbeat_interval": 0.5, "heartbeat_timeout": 3.0}
SLOW_S = 1e-4  # per record, each executor, until the partition healed (whatever the batching)


def _stream(index: int, executors: int, records: int) -> np.ndarray:
    rng = np.random.default_rng(index)
    out = np.zeros(records, [("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
    out["ts"] = np.arange(records) // 20
    out["key"] = rng.integers(0, 500, records)
    out["value"] = rng.integers(0, 100, records)
    return out


def _flow(sink, pace=None):
    from slashrt import Dataflow, Schema, Tumbling

    f = Dataflow("partition")
    stream = f.source("r", Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")]), time="ts")
    if pace is not None:
        stream = stream.filter(pace, name="slowed")
    stream.window(Tumbling(ms=200)).sum("value", key="key", output="total").sink(sink, name="out")
    return f


def _rows(records) -> collections.Counter:
    return collections.Counter(map(tuple, np.asarray(records).tolist()))


def trial(args) -> dict:
    """Run the partition fault once (see the module doc); `args`: `events` (all executors'
    records together; the chaos bench's option, capped here), `interval` (checkpoints)."""
    import functools

    import trio

    import slashrt
    from slashrt.cluster import ClusterError, PerExecutor
    from slashrt.cluster.coordinator import run_cluster_async
    from slashrt.ops.sinks import Collect
    from slashrt.snapshot.restart import FixedDelay
    from slashrt.testing import _netns as netns
    from slashrt.transport._auth import generate_secret

    events = min(int(getattr(args, "events", 300_000) or 300_000), 600_000)
    per_executor = max(events // 3, 10_000)
    interval = float(getattr(args, "interval", 0.2) or 0.2)
    fields = {"fault": "partition", "refused": False, "exact": False, "duplicates": 0, "missing": 0, "cause": None,
              "seconds": 0.0, "executors": 3, "events": 3 * per_executor, "transport": "tcp",
              "heartbeat_timeout_s": HEARTBEAT["heartbeat_timeout"], "detect_s": None, "recoveries": 0}
    if (why := netns.why_not()) is not None:
        fields.update(refused=True, cause=f"the partition fault runs its executors in network namespaces: {why}")
        return fields
    make = functools.partial(_stream, records=per_executor)
    whole = np.concatenate([make(i, 3) for i in range(3)])
    expected = Collect()
    slashrt.run(_flow(expected), {"r": whole[np.argsort(whole["ts"], kind="stable")]})
    secret = generate_secret()
    with tempfile.TemporaryDirectory(prefix="slashrt-partition-") as scratch, netns.open_hosts(3) as hosts:
        tally, healed = Path(scratch, "tally"), Path(scratch, "healed")
        tally.mkdir()
        stamps: dict = {}

        class HealThenRestart(FixedDelay):
            def on_failure(self, now):
                stamps.setdefault("failed", time.monotonic())
                netns.blackhole(hosts, 1, 2, on=False)
                healed.touch()
                return super().on_failure(now)

        async def cut() -> None:
            while len(os.listdir(tally)) < 3:
                await trio.sleep(0.02)
            await trio.to_thread.run_sync(netns.blackhole, hosts, 1, 2)
            stamps["cut"] = time.monotonic()

        async def run():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cut)
                result = await run_cluster_async(
                    _flow(sink, HeldUntil(str(healed), SLOW_S, per_record=True, tally=str(tally))), {"r": PerExecutor(make, deterministic=True)},
                    executors=[f"{a}:{PORT}" for a in hosts.addresses], transport="tcp", secret=secret,
                    slot_size=4096, checkpoint={"interval": interval}, checkpoint_dir=str(Path(scratch, "chk")),
                    restart=HealThenRestart(attempts=2, delay=0), **HEARTBEAT,
                )
                nursery.cancel_scope.cancel()
                return result

        sink = Collect(transactional=True)
        procs = netns.start_agents(hosts, secret, PORT, once=False, log_level="error")
        started = time.perf_counter()
        try:
            result = trio.run(run)
        except ClusterError as exc:
            fields.update(cause=str(exc), seconds=round(time.perf_counter() - started, 3))
            return fields
        finally:
            netns.blackhole(hosts, 1, 2, on=False)
            netns.stop_agents(procs)
    got, want = _rows(sink.records), _rows(expected.records)
    duplicates = sum(max(n - want.get(row, 0), 0) for row, n in got.items())
    missing = sum(max(n - got.get(row, 0), 0) for row, n in want.items())
    fields.update(
        exact=duplicates == 0 and missing == 0 and len(result.recoveries) == 1, duplicates=duplicates, missing=missing,
        cause=result.recoveries[0]["cause"] if result.recoveries else None, recoveries=len(result.recoveries),
        seconds=round(time.perf_counter() - started, 3),
        detect_s=round(stamps["failed"] - stamps["cut"], 3) if {"failed", "cut"} <= stamps.keys() else None,
    )
    return fields
