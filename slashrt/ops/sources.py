"""Sources: feed records into a channel as full buffers, with watermarks in-band.

`feed_array` is the in-memory source: it copies a structured array slot by slot into a
channel (payload, then footer) and, every `watermark_every` buffers, sends a watermark
control buffer: the largest event time seen so far minus the declared out-of-orderness bound.
At the end it closes the channel (END_OF_STREAM), which completes every window downstream.
`ChannelFeeder` is that filling for a source whose records come in several arrays (a broker's
reads, `slashrt.connectors`).
"""

from __future__ import annotations

import numpy as np
import trio

from slashrt._buffer import Control
from slashrt._kernels import copy_rows_max
from slashrt._schema import Schema
from slashrt.errors import SchemaError
from slashrt.ops.event_time import watermark_of
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.transport import Sender

__all__ = ["ChannelFeeder", "feed_array", "validate_input"]


def validate_input(step_id: str, schema: Schema, records) -> np.ndarray:
    """Check an input array against its source's schema; return it as a contiguous array of the
    schema's layout (reordered or byte-swapped once here if it must be: `Schema.conform`)."""
    if not isinstance(records, np.ndarray):
        raise TypeError(f"input for source {step_id!r} must be a numpy structured array, got {type(records).__name__}")
    if records.ndim != 1:
        raise SchemaError(f"input for source {step_id!r} must be 1-D, has shape {records.shape}")
    return schema.conform(records, f"input for source {step_id!r}")


async def feed_array(
    sender: Sender,
    records: np.ndarray,
    *,
    time: str | None,
    max_delay: int,
    watermark_every: int = 16,
    resume: State | None = None,
    barriers=None,
) -> None:
    """Feed `records`, then end the stream; with `resume` (a `ChannelFeeder.snapshot()`), from
    the first record that snapshot had not fed, as if the feeding had not stopped. `barriers`
    (`slashrt.snapshot.runtime.SourceBarriers`): checkpoints' barriers go in band."""
    feeder = ChannelFeeder(sender, time=time, max_delay=max_delay, watermark_every=watermark_every)
    feeder.barriers = barriers
    if resume is not None:
        feeder.restore(resume)
    await feeder.feed(records[feeder.fed :] if feeder.fed else records)
    if barriers is not None:
        await barriers.emit(feeder)
        barriers.end(feeder)  # later checkpoints record the end as its position
    await sender.aclose()


class ChannelFeeder:
    """Fills a channel from consecutive arrays of one source (an in-memory input at once, a
    broker's reads one after another): full slots by runs, a watermark every `watermark_every`
    buffers and after each array; the largest event time and the cadence carry across arrays."""

    def __init__(self, sender: Sender, *, time: str | None, max_delay: int, watermark_every: int = 16):
        self.sender = sender
        self.time = time
        self.max_delay = max_delay
        self.watermark_every = watermark_every
        self.max_time: int | None = None
        self.sent = 0  # data buffers posted
        self.fed = 0  # records posted: where a rewind to this feeder's snapshot resumes
        self.barriers = None  # SourceBarriers: barriers requested by checkpoints, sent between runs

    async def feed(self, records: np.ndarray) -> None:
        """Send a contiguous structured array (of the channel's record layout) into the channel."""
        sender, time, watermark_every = self.sender, self.time, self.watermark_every
        size = records.dtype.itemsize
        per_slot = sender.spec.payload_capacity // size
        raw = records.view(np.uint8).reshape(-1)
        n = len(records)
        full_slots, tail = divmod(n, per_slot)
        time_offset = -1 if time is None else records.dtype.fields[time][1]
        fused = time is None or records.dtype.fields[time][0] == np.dtype("<i8")

        def fill(view: np.ndarray, first: int, count: int) -> int | None:
            """Copy `count` records per row of `view` from record `first` on; return their max time.

            The max is read from the slots just written (in cache), in the same native pass as the
            copy, not from the input (another pass over main memory)."""
            row_bytes = count * size
            src = raw[first * size : first * size + view.shape[0] * row_bytes]
            if fused:
                top = copy_rows_max(view, src, row_bytes, size, time_offset)
                return None if time is None else top
            view[:, :row_bytes] = src.reshape(view.shape[0], row_bytes)
            return int(view[:, :row_bytes].view(records.dtype)[time].max())

        sent = 0  # data buffers of this array posted
        while sent < full_slots + (tail > 0):
            if self.barriers is not None and self.barriers.due:
                await self.barriers.emit(self)
            want = min(max(1, sender.spec.slots // 2), full_slots + (tail > 0) - sent)
            if sender.credits() < want:
                # wait for half a ring of credits, not one: writing (and so computing) runs of
                # buffers amortises the fixed cost per step; cf. silly-window avoidance in TCP
                await sender.wait_credit(want)
            # as many full slots as one copy can fill: up to the credits, the ring's end, the input's
            # last full slot and the next watermark
            k = min(sender.contiguous_credits(), full_slots - sent, watermark_every - self.sent % watermark_every)
            count = per_slot if k > 0 else tail
            k = max(k, 1)  # else: the last, partial slot
            run_max = fill(sender.reserve_run(k), sent * per_slot, count)
            if run_max is not None:
                self.max_time = run_max if self.max_time is None else max(self.max_time, run_max)
            sender.post_run(k, nbytes=count * size, count=count)
            sent += k
            self.sent += k
            self.fed += k * count
            end = min(sent * per_slot, n)
            if self.sent % watermark_every == 0 or end == n:
                if self.max_time is not None:
                    await sender.send_control(Control.WATERMARK, watermark_of(self.max_time, self.max_delay))
                await trio.lowlevel.checkpoint()

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    STATE_KIND, STATE_VERSION = "array_source", 1
    state_bytes = 0  # a few integers

    def snapshot(self, step_id: str = "<source>") -> State:
        """How far the input was fed (records, buffers) and its largest event time so far:
        restored, feeding the input from record `fed` on continues the same stream and watermarks."""
        return tagged(self.STATE_KIND, self.STATE_VERSION, {}, step=step_id, fed=self.fed, sent=self.sent,
                      max_time=self.max_time)

    def restore(self, state: State, step_id: str = "<source>") -> None:
        meta = check(state, step_id, self.STATE_KIND, self.STATE_VERSION)
        self.fed, self.sent, self.max_time = meta["fed"], meta["sent"], meta["max_time"]
