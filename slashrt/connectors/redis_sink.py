"""`RedisStreamSink`: a sink that appends packed records to a Redis stream, directly
(at-least-once) or, with `transactional=True`, through the two-phase commit of checkpoints
(`slashrt.snapshot.commit`: exactly-once with a rewinding source).

`RedisTransactions` is that contract in Redis. Keys beside the stream `K`, per executor E (so
several executors can share a stream):

    K:slashrt:open:E         stream: entries written since the last barrier
    K:slashrt:pending:E:N    stream: checkpoint N's entries, pre-committed, not yet visible
    K:slashrt:pending:E      sorted set: the pending checkpoints N
    K:slashrt:committed      hash: executor E -> the last checkpoint committed

`pre_commit(N)` renames the open stream (if there is one) to checkpoint N's pending stream and
lists N, in one script (atomic, in Redis: a process killed after it loses nothing; repeated
after a timeout, or after a first attempt the server ran late, it finds nothing to rename). `commit(N)` appends every
pending checkpoint up to N to K, in order, in one MULTI/EXEC transaction that also records N
as committed and drops them; it WATCHes the marker and the pending set, so two committers
cannot both publish (the loser's EXEC fails, it looks again and finds nothing), and a commit
of N or below after that publishes nothing (idempotent: recovery may repeat it after a crash).
"""

from __future__ import annotations

import numpy as np
import structlog
import trio

from slashrt.connectors._redis import (
    DEFAULT_ENTRY_BYTES,
    DEFAULT_TIMEOUT,
    check_entry_bytes,
    check_timeout,
    connect,
    failure,
    packed_entries,
    shown,
    stream_schema,
)
from slashrt.errors import OptionError
from slashrt.snapshot.commit import NotTransactional

__all__ = ["RedisStreamSink", "RedisTransactions"]

log = structlog.get_logger("slashrt.connectors.redis")


class RedisStreamSink:
    """Append the records reaching the sink to the Redis stream `stream_key` at `url`, packed
    (readable by `RedisStream` and `read_stream`).

    By default every batch is appended as it comes: a run that fails and is run again writes
    again what it had written (at-least-once). With `transactional=True` nothing is visible
    until a checkpoint commits it: `pre_commit(n)` at checkpoint n's barrier, `commit(n)` once
    the checkpoint is complete, `abort(n)` to drop it, `pending()`; after a crash,
    `slashrt.snapshot.recover(sink, n)` settles what checkpoint n covers (see there).
    `executor` tells apart the executors writing one stream (`for_executor`).

    In a run, every call to the server goes from the sink's worker thread, one at a time and in
    the order the calls were made (`awrite`, `apre_commit`, `acommit`, `aabort`, `apending`,
    `aopen`: `_in_worker`): the executor's loop, its heartbeats and channels, goes on while the
    broker answers, and a checkpoint's pre-commit, made at its barrier, comes after the writes
    before the barrier and before those after it. Every call to the broker fails after
    `timeout` seconds: a broker that is down or hung is then named (a `BrokerUnavailable`,
    which `run(restart=)` retries from the last complete checkpoint), before a heartbeat
    timeout (50 s by default; keep `timeout` below yours) could blame the executor."""

    default_name = "redis"

    def __init__(self, url: str, stream_key: str, *, transactional: bool = False, executor: int = 0,
                 entry_bytes: int = DEFAULT_ENTRY_BYTES, timeout: float = DEFAULT_TIMEOUT):
        if not isinstance(stream_key, str) or not stream_key:
            raise OptionError(f"RedisStreamSink needs a stream key (a non-empty string), got {stream_key!r}")
        self.url = url
        self.stream_key = stream_key
        self.transactional = bool(transactional)
        self.executor = executor
        self.entry_bytes = check_entry_bytes(entry_bytes)
        self.timeout = check_timeout(timeout)
        self.written = 0  # records written (appended, or staged for a checkpoint) by this object
        self.record_dtype: np.dtype | None = None  # set by the plan (expect)
        self._connect()

    def _connect(self) -> None:
        self._client = connect(self.url, timeout=self.timeout)
        self._transactions = (
            RedisTransactions(self._client, self.url, self.stream_key, self.executor, self.timeout)
            if self.transactional else NotTransactional(self)
        )
        self._queued = None  # (trio run, the calls queued in the worker and not finished): `_in_worker`

    def __getstate__(self) -> dict:  # to executor processes: the URL, not a client (locks, sockets)
        return {k: v for k, v in self.__dict__.items() if k not in ("_client", "_transactions", "_queued")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._connect()

    def __repr__(self) -> str:
        mode = ", transactional=True" if self.transactional else ""
        return f"RedisStreamSink({shown(self.url)!r}, {self.stream_key!r}{mode})"

    def for_executor(self, index: int) -> RedisStreamSink:
        """Executor `index`'s writer in a multi-executor run: the same stream, its own keys."""
        return type(self)(self.url, self.stream_key, transactional=self.transactional, executor=index,
                          entry_bytes=self.entry_bytes, timeout=self.timeout)

    def expect(self, dtype: np.dtype) -> None:
        """The dtype of the records the plan will send (`record_dtype`: what to read back with)."""
        self.record_dtype = np.dtype(dtype)

    # -- the sink contract (slashrt.ops.sinks) ----------------------------------------------------
    def open(self) -> None:
        """Check the server answers; a transactional sink drops what an earlier run wrote
        after its last barrier (the rewound source writes it again)."""
        with failure(self.url, f"opening sink stream {self.stream_key!r}", timeout=self.timeout):
            self._client.ping()
        if self.transactional:
            self._transactions.open()

    def aopen(self):
        """`open` in the sink's worker thread (an agent's heartbeats go on while it waits)."""
        return self._in_worker(self.open)

    def write(self, records: np.ndarray) -> None:
        if not len(records):
            return
        records, fp = stream_schema(records, f"records for stream {self.stream_key!r}")
        entries = packed_entries(records, fp, self.entry_bytes)
        if self.transactional:
            self._transactions.add(entries)
        else:
            with failure(self.url, f"writing to stream {self.stream_key!r}", timeout=self.timeout):
                pipe = self._client.pipeline(transaction=False)
                for fields in entries:
                    pipe.xadd(self.stream_key, fields)
                pipe.execute()
        self.written += len(records)

    def awrite(self, records: np.ndarray):
        """`write` in the sink's worker thread, after every call made before it: the executor's
        loop is never blocked by the broker, only this step waits, at most `timeout` a call."""
        return self._in_worker(self.write, records)

    def close(self) -> None:
        if self.transactional and self._transactions.open_entries:
            log.warning("records written after the last barrier: no checkpoint publishes them",
                        stream=self.stream_key, executor=self.executor, entries=self._transactions.open_entries)
        self._client.connection_pool.disconnect()

    # -- two-phase commit (transactional=True): see slashrt.snapshot.commit -----------------------
    def pre_commit(self, checkpoint: int) -> None:
        self._transactions.pre_commit(checkpoint)

    def apre_commit(self, checkpoint: int):
        """`pre_commit` in the sink's worker thread, queued when called (at the barrier): after
        the writes before the barrier, before the writes after it (`slashrt.snapshot.commit.begin`)."""
        return self._in_worker(self.pre_commit, checkpoint)

    def commit(self, checkpoint: int) -> int:
        """Publish every pending checkpoint up to `checkpoint`; returns the entries published."""
        return self._transactions.commit(checkpoint)

    def acommit(self, checkpoint: int):
        """`commit` in the sink's worker thread: it reads back and appends every entry of the
        checkpoints it publishes, the heaviest call to the broker."""
        return self._in_worker(self.commit, checkpoint)

    def abort(self, checkpoint: int) -> None:
        self._transactions.abort(checkpoint)

    def aabort(self, checkpoint: int):
        return self._in_worker(self.abort, checkpoint)

    def pending(self) -> list[int]:
        return self._transactions.pending()

    def apending(self):
        return self._in_worker(self.pending)

    def _in_worker(self, fn, *args):
        """`fn(*args)` in a worker thread, after every call queued before this one (in this trio
        run) and before every call queued after it: its place is taken now, when called, and
        the awaitable returned waits for it and returns its result (or raises its error). The
        calls of one sink are never concurrent (its client's connection is used by one at a
        time) and keep the order the executor made them in, whichever task awaits them."""
        run = trio.lowlevel.current_trio_token()
        earlier = [] if self._queued is None or self._queued[0] is not run else [e for e in self._queued[1] if not e.is_set()]
        done = trio.Event()
        self._queued = (run, [*earlier, done])
        return _after(earlier, done, fn, args)

    def last_committed(self) -> int | None:
        """The last checkpoint this executor's writer committed (None before the first)."""
        return self._transactions.last_committed() if self.transactional else None

    def published(self) -> int | None:
        """The highest checkpoint any executor's writer of the stream committed (None before the
        first): what a resume must not publish again (`slashrt.snapshot.published`)."""
        return self._transactions.published() if self.transactional else None


async def _after(earlier: list[trio.Event], done: trio.Event, fn, args):
    """`fn(*args)` in a worker thread once every earlier call finished. Each waits for all the
    earlier ones still unfinished, not only the last: one cancelled while it waited lets the
    next go on only after those before it."""
    try:
        for call in earlier:
            await call.wait()
        return await trio.to_thread.run_sync(fn, *args)
    finally:  # (failed or cancelled: the next call goes on)
        done.set()


class RedisTransactions:
    """The two-phase commit of one executor's writer of stream `key` (see the module doc)."""

    def __init__(self, client, url: str, key: str, executor: int, timeout: float = DEFAULT_TIMEOUT):
        self._client, self.url, self.key, self.executor = client, url, key, str(executor)
        self.timeout = timeout
        base = f"{key}:slashrt"
        self._open = f"{base}:open:{self.executor}"
        self._pending_set = f"{base}:pending:{self.executor}"
        self._committed = f"{base}:committed"
        self.open_entries = 0  # entries written since the last barrier, by this object

    def _pending(self, checkpoint: int) -> str:
        return f"{self._pending_set}:{checkpoint}"

    def open(self) -> None:
        """Drop the output an earlier run wrote after its last barrier."""
        with failure(self.url, f"opening sink stream {self.key!r}", timeout=self.timeout):
            self._client.delete(self._open)
        self.open_entries = 0

    def add(self, entries) -> None:
        with failure(self.url, f"writing to stream {self._open!r}", timeout=self.timeout):
            pipe = self._client.pipeline(transaction=False)
            for fields in entries:
                pipe.xadd(self._open, fields)
                self.open_entries += 1
            pipe.execute()

    def pre_commit(self, checkpoint: int) -> None:
        checkpoint = _checkpoint_number(checkpoint)
        with failure(self.url, f"pre-committing checkpoint {checkpoint} of stream {self.key!r}", timeout=self.timeout):
            # one script, atomic: the open stream is renamed if the server has one, not if this
            # object wrote entries (a pre-commit that timed out may have been done after all: a
            # hung server runs what it had received once it goes on)
            self._client.eval(_PRE_COMMIT, 3, self._open, self._pending(checkpoint), self._pending_set, checkpoint)
        self.open_entries = 0

    def commit(self, checkpoint: int) -> int:
        import redis

        checkpoint = _checkpoint_number(checkpoint)
        with failure(self.url, f"committing checkpoint {checkpoint} of stream {self.key!r}", timeout=self.timeout):
            with self._client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        return self._commit(pipe, checkpoint)
                    except redis.WatchError:  # another committer moved first: look again
                        continue

    def _commit(self, pipe, checkpoint: int) -> int:
        # only the committed marks: another committer of this executor's checkpoints (an attempt
        # that outlived its failure) moves them first. Not the pending set: this executor's own
        # pre-commits add newer checkpoints to it from the loop while this runs in the sink's
        # thread, and retrying on each of them livelocked a busy run (its due set, <= checkpoint,
        # is theirs to leave alone)
        pipe.watch(self._committed)
        last = pipe.hget(self._committed, self.executor)
        last = -1 if last is None else int(last)
        due = [int(n) for n in pipe.zrangebyscore(self._pending_set, "-inf", checkpoint)]
        publish = [(n, pipe.xrange(self._pending(n))) for n in due if n > last]
        pipe.multi()
        published = 0
        for _, entries in publish:
            for _, fields in entries:
                pipe.xadd(self.key, fields)
                published += 1
        for n in due:
            pipe.delete(self._pending(n))
        if due:
            pipe.zrem(self._pending_set, *due)
        if checkpoint > last:
            pipe.hset(self._committed, self.executor, checkpoint)
        pipe.execute()
        if published:
            log.debug("checkpoint committed", stream=self.key, executor=self.executor, checkpoint=checkpoint,
                      checkpoints=[n for n, _ in publish], entries=published)
        return published

    def abort(self, checkpoint: int) -> None:
        checkpoint = _checkpoint_number(checkpoint)
        with failure(self.url, f"aborting checkpoint {checkpoint} of stream {self.key!r}", timeout=self.timeout):
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self._pending(checkpoint))
            pipe.zrem(self._pending_set, checkpoint)
            pipe.execute()

    def pending(self) -> list[int]:
        with failure(self.url, f"listing pending checkpoints of stream {self.key!r}", timeout=self.timeout):
            return [int(n) for n in self._client.zrange(self._pending_set, 0, -1)]

    def published(self) -> int | None:
        with failure(self.url, f"reading the commit markers of stream {self.key!r}", timeout=self.timeout):
            marks = self._client.hvals(self._committed)
        return max(map(int, marks), default=None)

    def last_committed(self) -> int | None:
        with failure(self.url, f"reading the commit marker of stream {self.key!r}", timeout=self.timeout):
            last = self._client.hget(self._committed, self.executor)
        return None if last is None else int(last)


_PRE_COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
"""


def _checkpoint_number(checkpoint) -> int:
    if isinstance(checkpoint, bool) or not isinstance(checkpoint, (int, np.integer)) or checkpoint < 0:
        raise OptionError(f"a checkpoint is a whole number >= 0, got {checkpoint!r}")
    return int(checkpoint)
