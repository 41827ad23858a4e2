"""What the coordinator sends each executor: the job, and this executor's share of the input.

Inputs are split into disjoint physical streams, never by key: executor i of N gets blocks
i, i + N, i + 2N, ... of `SPLIT_BLOCK` records of every in-memory input (so every executor's
stream covers the whole event-time range, as parallel readers of one log would), or
generates its own stream where the input is a `PerExecutor` function.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from slashrt._dataflow import Dataflow

__all__ = ["Job", "PerExecutor", "share", "SPLIT_BLOCK"]

SPLIT_BLOCK = 4096  # records per block when splitting an array across executors


@attrs.frozen
class PerExecutor:
    """An input each executor makes for itself: `make(index, executors)` returns its stream
    (a structured array), e.g. generated data or the executor's own files. It runs in the
    executor's process before the job starts, so it is not part of the measured run."""

    make: Callable[[int, int], np.ndarray]


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
