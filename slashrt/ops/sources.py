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
    times = records[time] if time is not None else None
    n = len(records)
    since_watermark_start = 0
    max_time = None
    buffers = 0
    for start in range(0, n, per_slot):
        end = min(start + per_slot, n)
        if sender.credits() <= 0:
            await sender.wait_credit()
        payload = sender.reserve()
        payload[: (end - start) * size] = raw[start * size : end * size]
        sender.post(nbytes=(end - start) * size, count=end - start)
        buffers += 1
        if buffers % watermark_every == 0 or end == n:
            if times is not None:
                # one vectorised max per watermark interval, not per buffer
                span_max = int(times[since_watermark_start:end].max())
                max_time = span_max if max_time is None else max(max_time, span_max)
                await sender.send_control(Control.WATERMARK, max_time - max_delay)
            since_watermark_start = end
            await trio.lowlevel.checkpoint()
    await sender.aclose()
