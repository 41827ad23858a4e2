"""What the coordinator sends each executor: the job, and this executor's share of the input.

Inputs are split into disjoint physical streams, never by key: executor i of N gets blocks
i, i + N, i + 2N, ... of `SPLIT_BLOCK` records of every in-memory input (so every executor's
stream covers the whole event-time range, as parallel readers of one log would), or
generates its own stream where the input is a `PerExecutor` function, or opens an ingest
endpoint that Spark tasks (or any producer speaking `slashrt.spark`'s protocol) stream into,
where the input is `Ingest()`. A shared-out array keeps the order of the whole input for
lateness: each block carries the largest event time before it (`slashrt.ops.event_time`).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import cloudpickle
import numpy as np

from slashrt._dataflow import Dataflow
from slashrt.ops.event_time import Share, blocks_before

__all__ = ["Job", "Ingest", "PerExecutor", "share", "split_input", "job_message", "SPLIT_BLOCK"]

SPLIT_BLOCK = 4096  # records per block when splitting an array across executors


@attrs.frozen
class PerExecutor:
    """An input each executor makes for itself: `make(index, executors)` returns its stream,
    e.g. generated data or the executor's own files (on one executor: `make(0, 1)`, in the
    caller's process). Either one structured array, made in the executor's process before the
    job starts (so not part of the measured run), or an iterable of them (chunks: a generator,
    a list, an object making chunk i on demand), made lazily while the run goes, each when the
    feed needs it, so a long or unbounded stream runs in bounded memory (`slashrt.ops.chunks`).

    `deterministic=True` declares that `make` returns the same records whenever it is called
    with the same arguments (seeded generators, files that do not change): a checkpointed run
    then rewinds it by calling it again and skipping what its checkpoint had fed (whole chunks
    without making them where `make` returns a sequence). A checkpointed run refuses a
    PerExecutor without it."""

    make: Callable[[int, int], object]
    deterministic: bool = attrs.field(default=False, kw_only=True)

    def open(self, source: str, index: int, executors: int):
        """Executor `index`'s input for `source`: the array `make` returned, or its chunks as a
        `ChunkStream` that makes them as the run feeds them."""
        from slashrt.ops.chunks import per_executor_input

        return per_executor_input(source, self.make(index, executors))


@attrs.frozen
class Ingest:
    """A source that every executor feeds from its own ingest endpoint
    (`slashrt.spark.IngestEndpoint`, listening on the executor's host). The coordinator hands
    every executor's `IngestTarget` to its `on_ready` callback before the run starts; the
    source's stream on each executor is what gets committed into its endpoint, and ends with
    the ingest's end (`slashrt.spark.ingest(..., end=True)` or `slashrt.spark.finish`).
    `slots` and `slot_size` shape the connections' rings (the protocol's defaults if None);
    `transport` is the endpoints' ("auto": a verbs listener too where the executor's host has
    an RDMA device; "tcp"; "verbs": required)."""

    slots: int | None = None
    slot_size: int | None = None
    transport: str = attrs.field(default="auto")

    @transport.validator
    def _check(self, attribute, value) -> None:
        from slashrt.spark._protocol import check_transport  # the spark package imports the cluster

        check_transport(value)


def share(records: np.ndarray, index: int, executors: int, block: int = SPLIT_BLOCK) -> np.ndarray:
    """Executor `index`'s blocks of `records` (block-interleaved round robin), in order."""
    n = len(records)
    if executors == 1:
        return records
    starts = np.arange(index * block, n, executors * block)
    if not len(starts):
        return records[:0]
    rows = (starts[:, None] + np.arange(block)).ravel()
    return records[rows[rows < n]]


def split_input(records: np.ndarray, time: str | None, executors: int, block: int = SPLIT_BLOCK) -> list:
    """Every executor's share of `records`; with an event-time column, `Share`s that carry
    per block the largest event time of the whole input before it, so that each executor
    judges lateness by the input's order (as one executor would), not by its share's."""
    if time is None:
        return [share(records, i, executors, block) for i in range(executors)]
    before = blocks_before(records[time], block)
    return [Share(share(records, i, executors, block), before[i::executors], block) for i in range(executors)]


@attrs.define
class Job:
    """One executor's part of a run (pickled to the agent with cloudpickle)."""

    flow: Dataflow
    index: int
    executors: int
    inputs: dict  # source name -> this executor's structured array, or a PerExecutor
    transport: str = "shm"
    mode: str = "slash"
    partitions: int = 256
    epoch_bytes: int = 64 << 20
    host: str = "127.0.0.1"  # where this executor's data listeners bind (its own address)
    options: dict = attrs.field(factory=dict)  # slots, slot_size, watermark_every, coalesce, yield_every
    checkpoint: dict | None = None  # checkpoints: config, location, keep, restore (`slashrt.snapshot.cluster`)


def job_message(job: Job, heartbeat_interval: float, heartbeat_timeout: float) -> dict:
    """The payload of the "job" control message: the job pickled on its own, so that the agent
    unpickles it (importing the user's modules, seconds on a loaded machine) in a thread while
    its heartbeats go on, beside what it needs before that (its index, the heartbeat settings)."""
    return {
        "index": job.index,
        "heartbeat_interval": heartbeat_interval,
        "heartbeat_timeout": heartbeat_timeout,
        "job": cloudpickle.dumps(job, protocol=5),
    }
