"""A `Paced` input's stream: records released on a wall-clock schedule, stamped with it.

Record j of an executor's stream (counted from its start, j = 0, 1, ...) is due at
``start_ms + j * 1000 / rate`` milliseconds since the epoch, where `rate` is the executor's
share of the input's records per second; its event-time column is set to that time (in the
source's time unit) and it enters the dataflow once the wall clock reaches it. The feed sends
whatever is due as one piece, and waits until at least a millisecond's worth (`TICK_S`) is
due again, so a fast rate goes in pieces of a thousandth of a second, a slow one record by
record. A source that the dataflow holds back (no credit) falls behind the schedule: its next
piece is everything overdue at once, and those records' latency shows the wait.

The records come from `make`'s output as a `PerExecutor`'s do (`slashrt.ops.chunks`: made in
a worker thread, checked against the schema); each piece is a copy with the times stamped.
Its position is ``{"paced": j, "start_ms": start}``: the records fed, and the schedule. A
resume keeps the schedule (the event times are those of the checkpointed run), draws the
chunks again and drops the first j records.
"""

from __future__ import annotations

import math
import time

import numpy as np
import trio

from slashrt._dataflow import ms_per_unit
from slashrt.errors import DataflowError, SlashError
from slashrt.ops.chunks import ChunkStream, per_executor_input
from slashrt.ops.reads import feed_reads

__all__ = ["PacedStream", "TICK_S", "schedule"]

TICK_S = 0.001  # the least a piece waits for: a millisecond of records (one, at a slow rate)
MAX_PIECE = 1 << 16  # records per piece when catching up: several full slots, a bounded copy


def schedule(first: int, n: int, *, rate: float, start_ms: int, unit: str = "ms") -> np.ndarray:
    """Event times (int64, in `unit`) of records first .. first + n - 1 of a stream of `rate`
    records per second starting at `start_ms`: when each is due, rounded down (exactly, for a
    whole rate)."""
    per_s = round(1000 / ms_per_unit(unit))  # units per second: 1, 1000, 10**6 or 10**9
    start = start_ms * per_s // 1000
    j = np.arange(first, first + n, dtype=np.int64)
    if float(rate).is_integer():  # whole numbers: (j * per_s) // rate without overflowing int64
        r = int(rate)
        return start + (j // r) * per_s + (j % r) * per_s // r
    return start + np.floor(j * (per_s / rate)).astype(np.int64)


class PacedStream(ChunkStream):
    """One executor's stream of a `Paced` input (see the module doc): the input hook of
    `slashrt._runtime.local_inputs` (`feed`). `position` counts the records fed."""

    paced = True  # its sinks measure latency (`slashrt._latency`)

    def __init__(self, source: str, made, *, rate: float, start_ms: int | None):
        made = per_executor_input(source, made)
        super().__init__(source, [made] if isinstance(made, np.ndarray) else made.chunks)
        self.rate = rate
        self.start_ms = start_ms  # None until the feed begins, without a given start
        self.position = 0

    async def feed(self, sender, spec, *, watermark_every: int, resume=None, barriers=None) -> None:
        if spec.time is None:
            name = spec.step_id.split(".", 1)[-1]
            raise DataflowError(
                f"source {name!r} is Paced, which stamps each record's event time: declare its time column "
                f"(source({name!r}, ..., time=...))"
            )
        if self.start_ms is None:
            self.start_ms = time.time_ns() // 1_000_000
        await feed_reads(sender, spec, watermark_every=watermark_every, read=lambda reads: self._paced(reads, spec),
                         advance=self._advance, resume_hint=self._resume_hint, cursor=self._cursor,
                         rewind=self._rewind, resume=resume, barriers=barriers, lend=True)

    def _cursor(self) -> dict:
        return {"paced": self.position, "start_ms": self.start_ms}

    def _rewind(self, cursor: dict) -> None:
        position, start = cursor["paced"], cursor["start_ms"]  # KeyError: another kind of input's position
        if not isinstance(position, int) or position < 0 or not isinstance(start, int):
            raise TypeError(cursor)
        self.position, self.start_ms = position, start

    def _advance(self, position: int, count: int) -> None:
        self.position = position
        self.fed += count

    def _resume_hint(self, delivered: int) -> str:
        return f"it came after {self.position} records ({delivered} in this run) were fed"

    def _due(self) -> int:
        """How many records of the stream are due by now."""
        elapsed_ms = time.time_ns() / 1e6 - self.start_ms
        return 0 if elapsed_ms < 0 else math.floor(elapsed_ms * self.rate / 1000) + 1

    async def _paced(self, reads, spec) -> None:
        """Send the records as they fall due, stamped (see the module doc), or the error that ended them."""
        schema, unit = spec.schema, spec.time_unit
        least = max(1, math.ceil(self.rate * TICK_S))
        async with reads:
            chunks = self._from(0)
            skip, k = self.position, self.position  # a resume draws the records fed before again, and drops them
            chunk, offset = None, 0
            try:
                while True:
                    if chunk is None or offset == len(chunk):
                        item = await trio.to_thread.run_sync(self._next, chunks, schema)
                        if item is None:
                            break
                        chunk, offset = item[0], min(skip, len(item[0]))
                        skip -= offset
                        continue
                    due = self._due() - k
                    if due < least:  # wait until a tick's worth is due
                        at_ms = self.start_ms + (k + least - 1) * 1000 / self.rate
                        await trio.sleep(max(0.0, at_ms / 1000 - time.time()))
                        continue
                    n = min(due, len(chunk) - offset, MAX_PIECE)
                    piece = chunk[offset : offset + n].copy()
                    piece[spec.time] = schedule(k, n, rate=self.rate, start_ms=self.start_ms, unit=unit)
                    await reads.send((piece, k + n))
                    k, offset = k + n, offset + n
            except SlashError as exc:
                await reads.send(exc)
            finally:
                chunks.close()
