"""Large parts of a job's messages, offloaded to a store the agents read (Flink's blob server,
seed 001).

A part every executor's message shares (the job's shared part: a flow whose functions capture
a large table; the table of N ports of a very large job) would otherwise be sent N times by
the coordinator, and held until the last message is out. From `offload_min_bytes` (1 MiB, as
Flink's `blob.offload.minsize`) on, the coordinator writes it once to a blob store (a directory
or an fsspec URL every agent can read) under the SHA-256 of its bytes, in a directory of the
run's own, and the message carries a `BlobRef` instead. An agent reads a blob once and keeps it
in `CACHE`, bounded in bytes and evicting the least recently used, so an agent that serves job
after job (`slashrt executor`) reads a part that did not change once. A blob whose bytes do not
hash to its name, or that cannot be read, fails the job in one sentence naming it. The
coordinator removes the run's directory when the run ends; a local run with no store given uses
a temporary directory (local agents share its file system), and a run on agents at addresses
with no store sends every part inline.
"""

from __future__ import annotations

import collections
import hashlib
import os
import secrets
import shutil
import tempfile
import threading

import attrs
import structlog

from slashrt.errors import ChannelClosed, DataflowError

__all__ = ["BlobCache", "BlobRef", "CACHE", "OFFLOAD_MIN_BYTES", "RunBlobs", "fetch"]

log = structlog.get_logger("slashrt.cluster.blobs")

OFFLOAD_MIN_BYTES = 1 << 20
CACHE_BYTES = 256 << 20  # an agent's cache of blobs


@attrs.frozen
class BlobRef:
    """Where a part of a message is: `url` (a file path or fsspec URL), the SHA-256 of its
    bytes (`key`) and their count."""

    url: str
    key: str
    size: int


def _is_url(location: str) -> bool:
    return "://" in location


def _read(url: str) -> bytes:
    if not _is_url(url) or url.startswith("file://"):
        with open(url.removeprefix("file://"), "rb") as f:
            return f.read()
    import fsspec

    with fsspec.open(url, "rb") as f:
        return f.read()


class RunBlobs:
    """The blobs one run writes: a directory of its own in `store` (None: a temporary one),
    removed by `remove()`."""

    def __init__(self, store: str | os.PathLike | None, offload_min_bytes: int = OFFLOAD_MIN_BYTES):
        if offload_min_bytes < 1:
            raise DataflowError(f"run(): offload_min_bytes={offload_min_bytes} must be positive")
        self.offload_min_bytes = offload_min_bytes
        self.offloaded = 0  # bytes written
        self._store = None if store is None else os.fspath(store).rstrip("/")
        self.location: str | None = None  # the run's directory, made with its first blob
        self._fs = None

    def _open(self) -> None:
        try:
            if self._store is None:
                self.location = tempfile.mkdtemp(prefix="slashrt-blobs-")
                return
            self.location = f"{self._store}/run-{secrets.token_hex(8)}"
            if _is_url(self.location) and not self.location.startswith("file://"):
                import fsspec

                self._fs, _ = fsspec.core.url_to_fs(self.location)
                self._fs.makedirs(self.location, exist_ok=True)
            else:
                os.makedirs(self.location.removeprefix("file://"))
        except (OSError, ValueError, ImportError) as exc:
            raise DataflowError(f"run(): cannot make a directory in the blob store {self._store}: {exc}") from None

    def offload(self, data: bytes) -> bytes | BlobRef:
        """`data` itself if it is small, else a reference to it, written once to the store."""
        if len(data) < self.offload_min_bytes:
            return data
        if self.location is None:
            self._open()
        key = hashlib.sha256(data).hexdigest()
        url = f"{self.location}/{key}"
        try:
            if self._fs is not None:
                self._fs.pipe_file(url, data)
            else:
                path = url.removeprefix("file://")
                with open(path + ".part", "wb") as f:
                    f.write(data)
                os.replace(path + ".part", path)  # a reader never sees half a blob
        except OSError as exc:
            raise DataflowError(f"run(): cannot write to the blob store {self.location}: {exc}") from None
        self.offloaded += len(data)
        return BlobRef(url, key, len(data))

    def remove(self) -> None:
        """Remove the run's directory, if it made one (what an agent cached stays cached)."""
        if self.location is None:
            return
        try:
            if self._fs is not None:
                self._fs.rm(self.location, recursive=True)
            else:
                shutil.rmtree(self.location.removeprefix("file://"))
        except OSError as exc:
            log.warning("cannot remove the run's blobs", location=self.location, reason=str(exc))


class BlobCache:
    """Blobs an agent read, by key, at most `max_bytes` of them (least recently used first out)."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        self.max_bytes = max_bytes
        self._blobs: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # (jobs are unpickled in threads)
        self.reads = 0  # blobs read from a store

    def get(self, ref: BlobRef) -> bytes:
        with self._lock:
            if ref.key in self._blobs:
                self._blobs.move_to_end(ref.key)
                return self._blobs[ref.key]
        try:
            data = _read(ref.url)
        except (OSError, ValueError, ImportError) as exc:
            raise ChannelClosed(f"cannot read the job's blob {ref.url}: {exc}") from None
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.key:
            raise ChannelClosed(f"the job's blob {ref.url} is damaged: its {len(data)} bytes do not hash to its name")
        with self._lock:
            self.reads += 1
            if ref.key not in self._blobs and len(data) <= self.max_bytes:
                self._blobs[ref.key] = data
                self._bytes += len(data)
                while self._bytes > self.max_bytes:
                    _, old = self._blobs.popitem(last=False)
                    self._bytes -= len(old)
        return data

    def __len__(self) -> int:
        return len(self._blobs)


CACHE = BlobCache()  # this process's (an agent's, across its jobs)


def fetch(part: bytes | BlobRef) -> bytes:
    """A message's part: itself, or the blob it refers to (read once per agent: `CACHE`)."""
    return CACHE.get(part) if isinstance(part, BlobRef) else part
