"""What the coordinator sends each executor: the job, pickled on its own (`job_message`), with
this executor's share of every input (`slashrt._inputs`: an in-memory array's blocks, a
`PerExecutor` function that makes the executor's own stream, an `Ingest` endpoint).
"""

from __future__ import annotations

import attrs
import cloudpickle

from slashrt._dataflow import Dataflow

__all__ = ["Job", "job_message"]


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
