"""What a source reads besides one array, and how an array is shared among executors.

A `PerExecutor` function makes each executor's own stream (one array, or chunks made as the run
goes: `slashrt.ops.chunks`); `Ingest()` reads what producers (Spark) stream into each executor's
ingest endpoint. An in-memory array on N executors is split into disjoint physical streams,
never by key: executor i gets blocks i, i + N, i + 2N, ... of `SPLIT_BLOCK` records (`share`),
so every executor's stream covers the whole event-time range; with an event-time column, as
`Share`s that keep the order of the whole input for lateness (`split_input`,
`slashrt.ops.event_time`). One executor's run (`slashrt._runtime`), a cluster's
(`slashrt.cluster`, which exports these) and a rescaled resume (`slashrt.snapshot.rescale`)
use them.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from slashrt.ops.event_time import Share, blocks_before

__all__ = ["Ingest", "Paced", "PerExecutor", "share", "split_input", "SPLIT_BLOCK"]

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
class Paced(PerExecutor):
    """A `PerExecutor` input released at a steady rate, as a live source would: `rate` records
    per second in all (each of N executors feeds `rate / N` of its own stream), each record's
    event time the wall-clock time it is due (`start_ms`, milliseconds since the epoch, plus
    its place in the schedule; the source's time column is overwritten, in its time unit).
    A run whose sinks are fed only from paced sources measures their rows' latency
    (`RunResult.latency`, `slashrt._latency`). `make(index, executors)` gives the records as a
    `PerExecutor`'s does (one array or chunks, an endless generator for an unbounded run).

    Without `start_ms` each executor's schedule starts when its source begins to feed; give one
    for the same schedule on every executor (event times a reference can compute). A
    checkpoint records the schedule: a resumed run keeps it, and emits what is overdue at once.
    See `slashrt.ops.paced`."""

    rate: float = attrs.field(kw_only=True)
    start_ms: int | None = attrs.field(default=None, kw_only=True)

    paced = True

    def __attrs_post_init__(self):
        from slashrt.errors import DataflowError

        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 < self.rate < float("inf"):
            raise DataflowError(f"Paced: rate must be a positive number of records per second, got {self.rate!r}")
        if self.start_ms is not None and (isinstance(self.start_ms, bool) or not isinstance(self.start_ms, int)):
            raise DataflowError(f"Paced: start_ms must be whole milliseconds since the epoch, got {self.start_ms!r}")

    def open(self, source: str, index: int, executors: int):
        """Executor `index`'s paced stream for `source` (`slashrt.ops.paced.PacedStream`)."""
        from slashrt.ops.paced import PacedStream

        return PacedStream(source, self.make(index, executors), rate=self.rate / executors, start_ms=self.start_ms)


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
