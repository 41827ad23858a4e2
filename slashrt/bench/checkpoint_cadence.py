"""Do checkpoints keep their cadence under backpressure? (`slashrt bench checkpoint --slow-step-ms MS`)

YSB on one executor (or `--executors N`: a cluster, each executor's share behind its own slow
step) with a step after the source that sleeps `slow_step_ms` per buffer (64 KiB of records),
default rings (96 slots): the rings fill and every aligned barrier queues behind their backlog. Checkpoints every `interval` with `max_in_flight` 1 and the given
`alignment_timeout` ("auto": half the interval; None: always aligned; 0: unaligned at once,
docs/architecture.md "Unaligned checkpoints"). Reports `checkpoints_expected` (the run's
length over the interval; on a cluster `stream_s`, from the slow step's first call on any
executor to its last, over the interval: the agents' start and the input's shipping are no time
a periodic checkpoint could be taken in), `checkpoints_completed` (periodic ones), `cadence_ratio` (target
>= 0.9), `duration_p99_s` (target <= 2x the interval), `unaligned` (how many were taken
unaligned, with their in-flight records as channel state), and `correct` (the output equals
the numpy reference).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

import slashrt
from slashrt._buffer import DEFAULT_SLOT_SIZE, FOOTER_SIZE
from slashrt.bench import ysb
from slashrt.errors import OptionError
from slashrt.ops.sinks import Collect
from slashrt.snapshot import SnapshotStore

__all__ = ["bench"]

KEEP = 10_000  # every checkpoint stays, to count them and read their manifests


INTERVALS = 20  # a default run lasts about this many checkpoint intervals of the slow step alone


def bench(*, slow_step_ms: float, interval: float, events: int | None = None, alignment_timeout="auto",
          executors: int = 1, query: str = "ysb", **options) -> dict:
    if query != "ysb":
        raise OptionError("bench checkpoint --slow-step-ms measures YSB: drop --query")
    per_buffer = (options.get("slot_size", DEFAULT_SLOT_SIZE) - FOOTER_SIZE) // ysb.YSB_SCHEMA.record_size
    if events is None:  # sized from the interval: the slow step alone takes INTERVALS of them (on each executor)
        events = executors * per_buffer * max(1, round(INTERVALS * interval / (slow_step_ms / 1000)))
    if executors > 1:
        options["executors"] = executors  # a cluster (its exchange is a stage of its own: the slow step is before it)
    records, mapping = ysb.generate(events), ysb.campaign_map(1000)

    spans = tempfile.mkdtemp(prefix="slashrt-cadence-spans-")
    first: list[float] = []

    def slow(batch):  # the slow step: `slow_step_ms` per buffer of records
        time.sleep(slow_step_ms / 1000 * -(-len(batch) // per_buffer))
        if executors > 1:  # when this executor's stream ran (a system-wide clock: agents are processes)
            first[:] = first or [time.monotonic()]
            with open(f"{spans}/{os.getpid()}", "w") as out:
                out.write(f"{first[0]} {time.monotonic()}")
        return np.ones(len(batch), bool)

    sink = Collect(transactional=True)
    flow = ysb.dataflow(mapping, sink, step=slow)
    with tempfile.TemporaryDirectory(prefix="slashrt-cadence-") as directory:
        started = time.perf_counter()
        result = slashrt.run(flow, {"events": records}, checkpoint_dir=directory, **options, checkpoint={
            "interval": interval, "keep": KEEP, "alignment_timeout": alignment_timeout})
        seconds = time.perf_counter() - started
        store = SnapshotStore(directory, job=flow.name, keep=KEEP)
        manifests = [store.load(n).meta for n in store.checkpoints()]
    periodic = [c for c in result.checkpoints if c["status"] == "completed" and not c["savepoint"]]
    durations = [c["seconds"] for c in periodic]
    stream = seconds
    if executors > 1:  # a cluster: the time its streams ran, not the agents' start nor the input's shipping
        times = [tuple(map(float, open(f"{spans}/{name}").read().split())) for name in os.listdir(spans)]
        stream = max(b for _, b in times) - min(a for a, _ in times)
    shutil.rmtree(spans, ignore_errors=True)
    expected = int(stream // interval)
    completed = sum(1 for meta in manifests if meta.get("kind", "checkpoint") == "checkpoint")
    return {
        "query": "ysb", "events": len(records), "executors": executors, "slow_step_ms": slow_step_ms, "interval_s": interval,
        "alignment_timeout": alignment_timeout, "seconds": round(seconds, 3), "stream_s": round(stream, 3),
        "checkpoints_expected": expected, "checkpoints_completed": completed,
        "cadence_ratio": round(completed / expected, 3) if expected else None,
        "duration_p50_s": round(float(np.percentile(durations, 50)), 3) if durations else None,
        "duration_p99_s": round(float(np.percentile(durations, 99)), 3) if durations else None,
        "unaligned": sum(1 for meta in manifests if meta.get("unaligned")),
        "correct": bool(np.array_equal(ysb.to_result(sink.records), ysb.reference(records, mapping))),
    }
