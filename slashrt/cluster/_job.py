"""What the coordinator sends each executor: its `Job`, as a "job" message built by
`JobMessages`, and then the table of every executor's channel port (`port_table`). What every
executor's job shares (the flow, the run's settings, the checkpoint job, the inputs every
executor opens alike: a `PerExecutor` function that makes the executor's own stream, an `Ingest`
endpoint) is pickled and compressed once per run, and the same bytes go to every executor; each
message adds only the executor's own part: its index, its host and its share of the other
inputs (an in-memory array's blocks, a connector's readers: `slashrt._inputs`). The agent
unpickles both (`job_of`), importing the user's modules, in a thread while its heartbeats go
on. (`_execution_plan` says why this keeps a job's descriptors O(N).)
"""

from __future__ import annotations

import lzma
import pickle
import zlib

import attrs
import cloudpickle

from slashrt._dataflow import Dataflow
from slashrt.cluster._blobs import BlobRef, RunBlobs, fetch
from slashrt.errors import ChannelClosed

__all__ = ["Job", "JobMessages", "MESSAGE_FIELDS", "job_message", "job_of", "port_table", "ports_of"]

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
    inputs and the host, and `common_inputs`: the inputs every executor gets alike) pickled and
    compressed once (`shared`, `shared_raw_bytes` before compression), then one small message
    per executor (`message`)."""

    def __init__(self, heartbeat_interval: float, heartbeat_timeout: float, *, common_inputs: dict | None = None,
                 blobs: RunBlobs | None = None, **shared):
        self.heartbeats = {"heartbeat_interval": heartbeat_interval, "heartbeat_timeout": heartbeat_timeout}
        raw = cloudpickle.dumps({**shared, "common_inputs": common_inputs or {}}, protocol=5)
        self.shared_raw_bytes = len(raw)
        compressed = zlib.compress(raw, 1)
        self.shared_bytes = len(compressed)
        # a large one goes to the blob store once, each message refers to it (`_blobs`)
        self.shared = compressed if blobs is None else blobs.offload(compressed)

    def message(self, index: int, inputs: dict, host: str) -> dict:
        """Executor `index`'s message: the shared part, and its own inputs and host."""
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
        shared = cloudpickle.loads(zlib.decompress(fetch(message["shared"])))
        own = cloudpickle.loads(message["own"])
        inputs = {**shared.pop("common_inputs"), **own["inputs"]}
        return Job(index=message["index"], inputs=inputs, host=own["host"], **shared)
    except (zlib.error, pickle.UnpicklingError, TypeError, KeyError, EOFError) as exc:
        raise ChannelClosed(f"the coordinator's job message holds no job: its parts do not unpickle ({exc})") from None


# a port table this large (pickled) is compressed with LZMA: a third smaller than with zlib at
# 10,000 executors (36 ms once, against 10 KB less for each of them; docs/benchmarks.md)
LZMA_FROM = 32 << 10


def port_table(ports: list, blobs: RunBlobs | None = None) -> bytes | BlobRef:
    """The "peers" message: every executor's channel port (`transport._port`), in executor
    order, pickled and compressed once for all of them (a byte says how: z zlib, x LZMA); a
    large one goes to the blob store (`_blobs`)."""
    raw = pickle.dumps(list(ports), protocol=5)
    table = b"x" + lzma.compress(raw) if len(raw) >= LZMA_FROM else b"z" + zlib.compress(raw, 6)
    return table if blobs is None else blobs.offload(table)


def ports_of(table: bytes | BlobRef, executors: int) -> list:
    """The ports a "peers" message holds (read from the blob store if it is there: call it in
    a thread); ChannelClosed if it is not a table of `executors`."""
    table = fetch(table)
    try:
        if table[:1] not in (b"x", b"z"):
            raise ValueError("it starts with neither of the compressions' bytes")
        ports = pickle.loads(lzma.decompress(table[1:]) if table[:1] == b"x" else zlib.decompress(table[1:]))
    except (zlib.error, lzma.LZMAError, pickle.UnpicklingError, TypeError, EOFError, ValueError) as exc:
        raise ChannelClosed(f"the coordinator's table of ports does not unpickle ({exc})") from None
    if not isinstance(ports, list) or len(ports) != executors:
        raise ChannelClosed(f"the coordinator's table of ports is not a list of {executors} addresses")
    return ports
