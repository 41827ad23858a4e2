"""Per-executor counters, readable by the user and logged through structlog."""

from __future__ import annotations

import attrs

__all__ = ["ExecutorStats"]


@attrs.define
class ExecutorStats:
    executor: int = 0
    buffers: int = 0  # data buffers processed
    records: int = 0  # records in those buffers
    control: int = 0  # control buffers (watermarks, end of stream, barriers)
    empty_polls: int = 0  # polls that found nothing and yielded at once
    parks: int = 0  # times a poller parked on its channel's notification
    waits: int = 0  # times a poller waited for compute to take a turn (it had work)
    compute_s: float = 0.0  # seconds running operator pipelines
    poll_s: float = 0.0  # seconds reading footers
    parked_s: float = 0.0  # seconds parked waiting for data
    # CPU seconds its process used during the run (every thread: a transport's, and on one
    # executor the caller's): unlike the wall-clock seconds, barely moved by a loaded machine
    cpu_s: float = 0.0
    failed_channels: int = 0
    progress_bytes: int = 0  # on several executors: bytes its progress bus posted (to all peers)
    progress_messages: int = 0  # and the messages it broadcast
    shipped_bytes: int = 0  # several executors: bytes of rows its exchanges sent peers (records or partial states)
    channel_bytes: int = 0  # several executors: bytes of the rings its channels hold (`slashrt.cluster._ring_budget`)
    floating_peak: int = 0  # several executors over shm or tcp: the most floating slots its exchanges' pools lent at once

    def as_dict(self) -> dict:
        return attrs.asdict(self)
