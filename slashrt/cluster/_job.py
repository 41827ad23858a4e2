"""What the coordinator sends each executor: its `Job`, as a "job" message built by
`JobMessages`. What every executor's job shares (the flow, the run's settings, the checkpoint
job) is pickled and compressed once per run, and the same bytes go to every executor; each
message adds only the executor's own part: its index, its share of every input
(`slashrt._inputs`: an in-memory array's blocks, a `PerExecutor` function that makes the
executor's own stream, an `Ingest` endpoint) and its host. The agent unpickles both
(`job_of`), importing the user's modules, in a thread while its heartbeats go on.
"""

from __future__ import annotations

import pickle
import zlib

import attrs
import cloudpickle

from slashrt._dataflow import Dataflow
from slashrt.errors import ChannelClosed

__all__ = ["Job", "JobMessages", "MESSAGE_FIELDS", "job_message", "job_of"]

# every "job" message holds these (`job_of`'s input)
MESSAGE_FIELDS = frozenset({"index", "heartbeat_interval", "heartbeat_timeout", "shared", "own"})
_OWN = ("index", "inputs", "host")  # a Job's fields that differ between executors


@attrs.define
class Job:
    """One executor's part of a run."""

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


class JobMessages:
    """The "job" messages of one run: the shared part (every field of `Job` but the index, the
    inputs and the host) pickled and compressed once (`shared`, `shared_raw_bytes` before
    compression), then one small message per executor (`message`)."""

    def __init__(self, heartbeat_interval: float, heartbeat_timeout: float, **shared):
        self.heartbeats = {"heartbeat_interval": heartbeat_interval, "heartbeat_timeout": heartbeat_timeout}
        raw = cloudpickle.dumps(shared, protocol=5)
        self.shared_raw_bytes = len(raw)
        self.shared = zlib.compress(raw, 1)

    def message(self, index: int, inputs: dict, host: str) -> dict:
        return {"index": index, **self.heartbeats, "shared": self.shared,
                "own": cloudpickle.dumps({"inputs": inputs, "host": host}, protocol=5)}


def job_message(job: Job, heartbeat_interval: float, heartbeat_timeout: float) -> dict:
    """The "job" message of `job` alone (a run of one message, e.g. a test's coordinator)."""
    shared = {f.name: getattr(job, f.name) for f in attrs.fields(Job) if f.name not in _OWN}
    return JobMessages(heartbeat_interval, heartbeat_timeout, **shared).message(job.index, job.inputs, job.host)


def job_of(message: dict) -> Job:
    """The `Job` a "job" message holds (its fields checked: `MESSAGE_FIELDS`); ChannelClosed
    if its parts are not what a coordinator sends."""
    try:
        shared = cloudpickle.loads(zlib.decompress(message["shared"]))
        own = cloudpickle.loads(message["own"])
        return Job(index=message["index"], inputs=own["inputs"], host=own["host"], **shared)
    except (zlib.error, pickle.UnpicklingError, TypeError, KeyError, EOFError) as exc:
        raise ChannelClosed(f"the coordinator's job message holds no job: its parts do not unpickle ({exc})") from None
