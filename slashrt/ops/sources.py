"""Sources: feed records into a channel as full buffers, with watermarks in-band.

`feed_array` is the in-memory source: it copies a structured array slot by slot into a
channel (payload, then footer) and, every `watermark_every` buffers, sends a watermark
control buffer: the largest event time seen so far minus the declared out-of-orderness bound.
At the end it closes the channel (END_OF_STREAM), which completes every window downstream.
`ChannelFeeder` is that filling for a source whose records come in several arrays (a broker's
reads, `slashrt.connectors`).

A source's position in a checkpoint is its feeder's state (`ChannelFeeder.snapshot`), one per
(source, executor): the records fed, the buffers sent and the largest event time (so a resumed
feed continues the same watermarks), and where to read on, as a `cursor` (the source's own
position, JSON: an array's length, a file index and offset, a stream id) plus `skip`, the
records fed after that cursor. A rewinding source reopens its input at the cursor and drops
`skip` records; a barrier can then fall anywhere, also inside one of its reads.
"""

from __future__ import annotations

import numpy as np
import trio

from slashrt._buffer import Control
from slashrt._kernels import copy_rows_max, minmax
from slashrt._schema import Schema
from slashrt.errors import SchemaError, SnapshotError
from slashrt.ops.event_time import watermark_of
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.transport import Sender

__all__ = ["ChannelFeeder", "feed_array", "validate_input", "another_input"]


def validate_input(step_id: str, schema: Schema, records, what: str | None = None) -> np.ndarray:
    """Check an input array against its source's schema; return it as a contiguous array of the
    schema's layout (reordered or byte-swapped once here if it must be: `Schema.conform`).
    `what` names it in errors (default: the input for source `step_id`)."""
    what = what or f"input for source {step_id!r}"
    if not isinstance(records, np.ndarray):
        raise TypeError(f"{what} must be a numpy structured array, got {type(records).__name__}")
    if records.ndim != 1:
        raise SchemaError(f"{what} must be 1-D, has shape {records.shape}")
    return schema.conform(records, what)


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
    feeder = ChannelFeeder(sender, time=time, max_delay=max_delay, watermark_every=watermark_every, lend=True)
    feeder.barriers = barriers
    if resume is None:
        feeder.mark({"records": len(records)})
    else:
        feeder.restore(resume)
        if feeder.cursor is not None and "records" not in feeder.cursor:
            raise another_input(resume.meta.get("step"))
        taken = (feeder.cursor or {}).get("records", len(records))
        if taken != len(records):
            raise SnapshotError(
                f"source {resume.meta.get('step')!r}: the checkpoint was taken of an input of {taken} records, this run's has "
                f"{len(records)}: resume with the input the checkpointed run had (a PerExecutor must be deterministic)"
            )
    await feeder.feed(records[feeder.skip :] if feeder.skip else records)
    await feeder.finish()


def _max_time(times: np.ndarray) -> int:
    """The largest event time of a lent run (a field view: one strided pass, natively for int64)."""
    return int(minmax(times)[1]) if times.dtype == np.int64 else int(times.max())


def another_input(step_id) -> SnapshotError:
    """A position recorded of another kind of input than the one resuming from it."""
    return SnapshotError(
        f"source {step_id!r}: the checkpoint's position was taken of another kind of input (an array, chunks of a "
        "PerExecutor, a FileSource, a RedisStream): resume with the input the checkpointed run had"
    )


class ChannelFeeder:
    """Fills a channel from consecutive arrays of one source (an in-memory input at once, a
    broker's reads one after another): full slots by runs, a watermark every `watermark_every`
    buffers and after each array; the largest event time and the cadence carry across arrays."""

    def __init__(self, sender: Sender, *, time: str | None, max_delay: int, watermark_every: int = 16,
                 lend: bool = False):
        self.sender = sender
        # the arrays fed are the feeder's own until the run ends (nobody changes them): a channel
        # that lends (in this process) gets them lent, not copied (`Sender.lend_run`)
        self.lend = lend and sender.lends
        self.time = time
        self.max_delay = max_delay
        self.watermark_every = watermark_every
        self.max_time: int | None = None
        self.sent = 0  # data buffers posted
        self.fed = 0  # records posted
        self.cursor = None  # the source's position (JSON) that the records fed since `_base` follow
        self._base = 0  # `fed` at `cursor`
        self._barriers = None
        # a control message counted in the position but not posted yet (it waits for a credit):
        # an unaligned checkpoint taken meanwhile holds it in the channel state
        self.unposted: tuple[Control, int] | None = None
        # its position is one a barrier may record: it has begun feeding (before, a reading
        # source may not know its cursor yet, e.g. a bounded read's end)
        self.positioned = False

    @property
    def barriers(self):
        """SourceBarriers: barriers requested by checkpoints, sent between runs (it knows its
        feeder: an unaligned checkpoint reads the position at once)."""
        return self._barriers

    @barriers.setter
    def barriers(self, barriers) -> None:
        self._barriers = barriers
        if barriers is not None:
            barriers.feeder = self

    @property
    def skip(self) -> int:
        """Records fed after `cursor`: what a rewind to it drops (all of `fed` when no cursor was marked)."""
        return self.fed - self._base

    def mark(self, cursor, skip: int = 0) -> None:
        """The records fed from now on follow `cursor` (the source's position, JSON-able), after
        `skip` records past it that were fed already (a rewound read still dropping them)."""
        self.cursor, self._base = cursor, self.fed - skip

    async def finish(self) -> None:
        """End the stream: barriers still due go out after the last records (and later
        checkpoints record the end as the position), then END_OF_STREAM."""
        self.positioned = True
        if self.barriers is not None:
            await self.barriers.replay(self.sender)
            await self.barriers.emit(self)
            self.barriers.end(self)
        await self.sender.aclose()

    async def feed(self, records: np.ndarray) -> None:
        """Send a contiguous structured array (of the channel's record layout) into the channel."""
        self.positioned = True
        if self.barriers is not None:  # a restored unaligned checkpoint's in-flight buffers go first
            await self.barriers.replay(self.sender)
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
            if self.lend:
                run = records[sent * per_slot : sent * per_slot + k * count].reshape(k, count)
                run_max = None if time is None else _max_time(run[time])
                sender.lend_run(run, count=count)
            else:
                run_max = fill(sender.reserve_run(k), sent * per_slot, count)
                sender.post_run(k, nbytes=count * size, count=count)
            if run_max is not None:
                self.max_time = run_max if self.max_time is None else max(self.max_time, run_max)
            sent += k
            self.sent += k
            self.fed += k * count
            end = min(sent * per_slot, n)
            if self.sent % watermark_every == 0 or end == n:
                if self.max_time is not None:
                    self.unposted = (Control.WATERMARK, watermark_of(self.max_time, self.max_delay))
                    await sender.send_control(*self.unposted)
                    self.unposted = None
                await trio.lowlevel.checkpoint()

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    # the kind keeps the name of the array sources it first served; version 2 added cursor and skip
    STATE_KIND, STATE_VERSION = "array_source", 2
    state_bytes = 0  # a few integers

    def snapshot(self, step_id: str = "<source>") -> State:
        """The source's position (see the module doc): restored, feeding on from `cursor` after
        `skip` records continues the same stream and watermarks."""
        return tagged(self.STATE_KIND, self.STATE_VERSION, {}, step=step_id, fed=self.fed, sent=self.sent,
                      max_time=self.max_time, cursor=self.cursor, skip=self.skip)

    def restore(self, state: State, step_id: str = "<source>") -> None:
        meta = check(state, step_id, self.STATE_KIND, self.STATE_VERSION)
        self.fed, self.sent, self.max_time = meta["fed"], meta["sent"], meta["max_time"]
        self.mark(meta.get("cursor"), meta.get("skip", self.fed))  # version 1: an array, no cursor
