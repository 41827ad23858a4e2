"""`RedisStreamSink`: a sink that appends packed records to a Redis stream, directly
(at-least-once) or through a two-phase commit per checkpoint (exactly-once).

Keys beside the stream `K` (one set per writer, so several executors can share a stream):

    K:slashrt:staging:W      stream: entries written since the last pre-commit
    K:slashrt:pending:W:N    stream: checkpoint N's entries, pre-committed, not yet visible
    K:slashrt:pending:W      sorted set: the pending checkpoints N
    K:slashrt:committed      hash: writer W -> the last checkpoint committed

`pre_commit(N)` renames the staging stream to checkpoint N's pending stream (durable in Redis,
so a process killed after it loses nothing). `commit(N)` appends every pending checkpoint up to
N to K, in order, in one MULTI/EXEC transaction that also records N as committed and drops
them; it watches the marker and the pending set, so two committers cannot both publish, and a
commit of N or below after that is a no-op (idempotent: recovery may repeat it after a crash).
"""

from __future__ import annotations

import numpy as np
import structlog

from slashrt.connectors._redis import (
    DEFAULT_ENTRY_BYTES,
    check_entry_bytes,
    connect,
    failure,
    packed_entries,
    shown,
    stream_schema,
)
from slashrt.errors import OptionError

__all__ = ["RedisStreamSink"]

log = structlog.get_logger("slashrt.connectors.redis")


class RedisStreamSink:
    """Append the records reaching the sink to the Redis stream `stream_key` at `url`, packed
    (readable by `RedisStream` and `read_stream`).

    By default every batch is appended as it comes: a run that fails and is run again writes
    again what it had written (at-least-once). With `transactional=True` nothing is visible
    until a checkpoint commits it: `pre_commit(n)` at checkpoint n's barrier, `commit(n)` once
    the checkpoint is complete, `abort(n)` to drop it, `recover(n)` after restoring checkpoint
    n (commits what n covered, drops the rest): exactly-once with a rewinding source.
    `writer` tells apart the executors writing one stream (`for_executor`)."""

    default_name = "redis"

    def __init__(self, url: str, stream_key: str, *, transactional: bool = False, writer: str = "0",
                 entry_bytes: int = DEFAULT_ENTRY_BYTES):
        if not isinstance(stream_key, str) or not stream_key:
            raise OptionError(f"RedisStreamSink needs a stream key (a non-empty string), got {stream_key!r}")
        self.url = url
        self.stream_key = stream_key
        self.transactional = bool(transactional)
        self.writer = str(writer)
        self.entry_bytes = check_entry_bytes(entry_bytes)
        self._client = connect(url)
        self._staged = 0  # entries staged since the last pre-commit
        self.written = 0  # records written (appended, or staged) by this object
        self.record_dtype: np.dtype | None = None  # set by the plan (expect)
        base = f"{stream_key}:slashrt"
        self._staging = f"{base}:staging:{self.writer}"
        self._pending_set = f"{base}:pending:{self.writer}"
        self._committed = f"{base}:committed"

    def __getstate__(self) -> dict:  # to executor processes: the URL, not a client (locks, sockets)
        return {k: v for k, v in self.__dict__.items() if k != "_client"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._client = connect(self.url)

    def __repr__(self) -> str:
        mode = ", transactional=True" if self.transactional else ""
        return f"RedisStreamSink({shown(self.url)!r}, {self.stream_key!r}{mode})"

    def for_executor(self, index: int) -> RedisStreamSink:
        """Executor `index`'s writer in a multi-executor run: the same stream, its own keys."""
        return type(self)(self.url, self.stream_key, transactional=self.transactional, writer=str(index),
                          entry_bytes=self.entry_bytes)

    def expect(self, dtype: np.dtype) -> None:
        """The dtype of the records the plan will send (`record_dtype`: what to read back with)."""
        self.record_dtype = np.dtype(dtype)

    def _pending(self, checkpoint: int) -> str:
        return f"{self._pending_set}:{checkpoint}"

    # -- the sink contract (slashrt.ops.sinks) ----------------------------------------------------
    def open(self) -> None:
        """Check the server answers; a transactional sink drops what an earlier attempt staged
        after its last pre-commit (a rewound source writes it again)."""
        with failure(self.url, f"opening sink stream {self.stream_key!r}"):
            self._client.ping()
            if self.transactional:
                self._client.delete(self._staging)
        self._staged = 0

    def write(self, records: np.ndarray) -> None:
        if not len(records):
            return
        records, fp = stream_schema(records, f"records for stream {self.stream_key!r}")
        target = self._staging if self.transactional else self.stream_key
        with failure(self.url, f"writing to stream {target!r}"):
            pipe = self._client.pipeline(transaction=False)
            for fields in packed_entries(records, fp, self.entry_bytes):
                pipe.xadd(target, fields)
                self._staged += 1
            pipe.execute()
        self.written += len(records)

    def close(self) -> None:
        if self.transactional and self._staged:
            log.warning("records staged but not pre-committed: a checkpoint after them would publish them",
                        stream=self.stream_key, writer=self.writer, entries=self._staged)
        self._client.connection_pool.disconnect()

    # -- two-phase commit per checkpoint ----------------------------------------------------------
    def pre_commit(self, checkpoint: int) -> None:
        """Make what was written since the last pre-commit checkpoint `checkpoint`'s pending
        output: durable in Redis, not yet in the stream."""
        checkpoint = _checkpoint_number(checkpoint)
        with failure(self.url, f"pre-committing checkpoint {checkpoint} of stream {self.stream_key!r}"):
            pipe = self._client.pipeline(transaction=True)
            if self._staged:
                pipe.rename(self._staging, self._pending(checkpoint))
            pipe.zadd(self._pending_set, {checkpoint: checkpoint})
            pipe.execute()
        self._staged = 0

    def commit(self, checkpoint: int) -> int:
        """Publish every pending checkpoint up to `checkpoint`, in order, and record it as the
        last committed, in one transaction. Returns the entries published (0 for a repeat)."""
        import redis

        checkpoint = _checkpoint_number(checkpoint)
        with failure(self.url, f"committing checkpoint {checkpoint} of stream {self.stream_key!r}"):
            with self._client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        return self._commit(pipe, checkpoint)
                    except redis.WatchError:  # another committer moved first: look again
                        continue

    def _commit(self, pipe, checkpoint: int) -> int:
        pipe.watch(self._committed, self._pending_set)
        last = pipe.hget(self._committed, self.writer)
        last = -1 if last is None else int(last)
        due = [int(n) for n in pipe.zrangebyscore(self._pending_set, "-inf", checkpoint)]
        publish = [(n, pipe.xrange(self._pending(n))) for n in due if n > last]
        pipe.multi()
        published = 0
        for _, entries in publish:
            for _, fields in entries:
                pipe.xadd(self.stream_key, fields)
                published += 1
        for n in due:
            pipe.delete(self._pending(n))
        if due:
            pipe.zrem(self._pending_set, *due)
        if checkpoint > last:
            pipe.hset(self._committed, self.writer, checkpoint)
        pipe.execute()
        if published or checkpoint > last:
            log.debug("checkpoint committed", stream=self.stream_key, writer=self.writer, checkpoint=checkpoint,
                      checkpoints=[n for n, _ in publish], entries=published)
        return published

    def abort(self, checkpoint: int) -> None:
        """Drop checkpoint `checkpoint`'s pending output (nothing of it becomes visible)."""
        checkpoint = _checkpoint_number(checkpoint)
        with failure(self.url, f"aborting checkpoint {checkpoint} of stream {self.stream_key!r}"):
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self._pending(checkpoint))
            pipe.zrem(self._pending_set, checkpoint)
            pipe.execute()

    def pending(self) -> list[int]:
        """The checkpoints pre-committed and neither committed nor aborted, in order."""
        with failure(self.url, f"listing pending checkpoints of stream {self.stream_key!r}"):
            return [int(n) for n in self._client.zrange(self._pending_set, 0, -1)]

    def last_committed(self) -> int | None:
        """The last checkpoint committed by this writer (None before the first)."""
        with failure(self.url, f"reading the commit marker of stream {self.stream_key!r}"):
            last = self._client.hget(self._committed, self.writer)
        return None if last is None else int(last)

    def recover(self, restored: int | None) -> None:
        """After restoring checkpoint `restored` (None: none, start over): publish the pending
        output it covers (it completed, its commit may not have run), drop every later one and
        whatever was staged after them."""
        if restored is not None:
            self.commit(restored)
        for n in self.pending():
            self.abort(n)
        with failure(self.url, f"recovering stream {self.stream_key!r}"):
            self._client.delete(self._staging)
        self._staged = 0


def _checkpoint_number(checkpoint) -> int:
    if isinstance(checkpoint, bool) or not isinstance(checkpoint, (int, np.integer)) or checkpoint < 0:
        raise OptionError(f"a checkpoint is a whole number >= 0, got {checkpoint!r}")
    return int(checkpoint)
