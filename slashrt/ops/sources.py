"""Sources: feed records into a channel as full buffers, with watermarks in-band.

`feed_array` is the in-memory source: it copies a structured array slot by slot into a
channel (payload, then footer) and, every `watermark_every` buffers, sends a watermark
control buffer: the largest event time seen so far minus the declared out-of-orderness bound.
At the end it closes the channel (END_OF_STREAM), which completes every window downstream.
"""

from __future__ import annotations

import numpy as np
import trio

from slashrt._buffer import Control
from slashrt._schema import Schema
from slashrt.transport import Sender

__all__ = ["feed_array", "validate_input"]


def validate_input(step_id: str, schema: Schema, records) -> np.ndarray:
    """Check an input array against its source's schema; return it as a contiguous array."""
    if not isinstance(records, np.ndarray):
        raise TypeError(f"input for source {step_id!r} must be a numpy structured array, got {type(records).__name__}")
    schema.check_compatible(records.dtype, f"input for source {step_id!r}")
    if records.ndim != 1:
        raise ValueError(f"input for source {step_id!r} must be 1-D, has shape {records.shape}")
    return np.ascontiguousarray(records)


async def feed_array(
    sender: Sender,
    records: np.ndarray,
    *,
    time: str | None,
    max_delay: int,
    watermark_every: int = 16,
) -> None:
    size = records.dtype.itemsize
    per_slot = sender.spec.payload_capacity // size
    raw = records.view(np.uint8).reshape(-1)
    n = len(records)
    full_slots, tail = divmod(n, per_slot)
    max_time = None
    sent = 0  # data buffers posted
    while sent < full_slots + (tail > 0):
        want = min(max(1, sender.spec.slots // 2), full_slots + (tail > 0) - sent)
        if sender.credits() < want:
            # wait for half a ring of credits, not one: writing (and so computing) runs of
            # buffers amortises the fixed cost per step; cf. silly-window avoidance in TCP
            await sender.wait_credit(want)
        # as many full slots as one copy can fill: up to the credits, the ring's end, the input's
        # last full slot and the next watermark
        k = min(sender.contiguous_credits(), full_slots - sent, watermark_every - sent % watermark_every)
        if k > 0:
            start = sent * per_slot
            view = sender.reserve_run(k)
            run = view[:, : per_slot * size]
            run[...] = raw[start * size : (start + k * per_slot) * size].reshape(k, per_slot * size)
            if time is not None:
                # the watermark's max is read from the slots just written (in cache), before
                # they are posted, not from the input (another pass over main memory)
                run_max = int(run.view(records.dtype)[time].max())
                max_time = run_max if max_time is None else max(max_time, run_max)
            for _ in range(k):
                sender.post(nbytes=per_slot * size, count=per_slot)
        else:  # the last, partial slot
            k, start = 1, sent * per_slot
            payload = sender.reserve()[: tail * size]
            payload[...] = raw[start * size :]
            if time is not None:
                run_max = int(payload.view(records.dtype)[time].max())
                max_time = run_max if max_time is None else max(max_time, run_max)
            sender.post(nbytes=tail * size, count=tail)
        sent += k
        end = min(sent * per_slot, n)
        if sent % watermark_every == 0 or end == n:
            if max_time is not None:
                await sender.send_control(Control.WATERMARK, max_time - max_delay)
            await trio.lowlevel.checkpoint()
    await sender.aclose()
