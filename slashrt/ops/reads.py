"""Feeding a source whose records come in reads into its channel: the loop the Redis and file
sources (`slashrt.connectors`) and chunked `PerExecutor` inputs (`slashrt.ops.chunks`) share.

A reader task reads ahead in a worker thread and sends, through a memory channel of one (one
read ahead: bounded), either `(records, position after them)` or the `SlashError` that ended
the read. Records go through `ChannelFeeder` (full slots, watermarks in band); the source's
position moves only once they are in the channel. An error comes after the good records read
before it: the task waits until the executor has returned every credit (computed everything
it was given), then fails the run, saying where to resume when records were delivered.

In a checkpointed run the feeder carries the checkpoints' barriers: at barrier n it records
the source's position (`ChannelFeeder.snapshot`: the source's `cursor` at the last read
boundary, plus the records fed after it), so a barrier may fall inside a read. Resuming, the
source is rewound to the recorded cursor and the first `skip` records read again are dropped.
A read without records (a followed stream with nothing new) lets due barriers through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from slashrt.errors import SlashError
from slashrt.ops.sources import ChannelFeeder, another_input

__all__ = ["feed_reads"]


async def feed_reads(
    sender,
    spec,
    *,
    watermark_every: int,
    read: Callable[[trio.MemorySendChannel], Awaitable[None]],
    advance: Callable[[object, int], None],
    resume_hint: Callable[[int], str],
    cursor: Callable[[], object],
    rewind: Callable[[object], None],
    resume=None,
    barriers=None,
    lend: bool = False,
) -> int:
    """Run `read(send_channel)` beside a task that feeds what it sends into `sender`'s channel
    (for source `spec`), calling `advance(position, count)` after each read's records are in;
    then close the channel. `resume_hint(delivered)` ends the message of an error that came
    after records were delivered. `cursor()` is the source's position as JSON (what a checkpoint
    records); with `resume` (a feeder state, see `slashrt.ops.sources`), `rewind(cursor)` first
    puts the source back at the recorded cursor. `barriers`: the checkpoints' `SourceBarriers`.
    `lend`: the reads' arrays are fresh and nobody changes them (a connector's decoding, not a
    user's chunks, which may reuse one array): an in-process channel gets them lent, not
    copied (`ChannelFeeder`). Returns the number of records delivered."""
    feeder = ChannelFeeder(sender, time=spec.time, max_delay=spec.max_delay, watermark_every=watermark_every, lend=lend)
    feeder.barriers = barriers
    if resume is None:
        feeder.mark(cursor())
    else:
        feeder.restore(resume, spec.step_id)
        try:
            rewind(feeder.cursor)
        except (KeyError, TypeError):
            raise another_input(spec.step_id) from None
    skip = feeder.skip  # records read again that were fed before the checkpoint
    reads_in, reads_out = trio.open_memory_channel(1)
    delivered = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, reads_in)
        async with reads_out:
            async for item in reads_out:
                if isinstance(item, SlashError):
                    # the records read before it go through the dataflow first: the executor
                    # has computed a buffer once its credit is back
                    await sender.wait_credit(sender.spec.slots)
                    if not delivered:
                        raise item
                    raise type(item)(f"{item}; {resume_hint(delivered)}") from None
                records, position = item
                if skip:
                    dropped = min(skip, len(records))
                    records, skip = records[dropped:], skip - dropped
                await feeder.feed(records)
                advance(position, len(records))
                delivered += len(records)
                feeder.mark(cursor(), skip)
                if barriers is not None and barriers.due:
                    await barriers.emit(feeder)
    await feeder.finish()
    return delivered
