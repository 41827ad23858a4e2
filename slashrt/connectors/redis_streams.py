"""A Redis stream as a dataflow input (`RedisStream`), and writing or reading a whole stream
of packed records (`write_stream`, `end_stream`, `read_stream`).

The source reads entries (see `slashrt.connectors._redis` for their format) in a worker
thread, one XRANGE or XREAD of up to `count` entries at a time, one read ahead of the
channel, and feeds their records through `slashrt.ops.reads.feed_reads` (full slots,
watermarks in band). Its `position` is the id of the last entry whose records
are in the channel; `resume_from(id)` makes the next run read the entries after `id`. A
checkpointed run records it (and a bounded read's end) at every barrier and rewinds to it.

On N executors the stream is shared by a stable rule over its entries: executor i keeps the
entries whose id's CRC-32 is i mod N (`owner`), and every executor sees the end entry
(`for_executor`). Each executor reads the whole stream (one XRANGE or XREAD per `count`
entries, others' entries dropped before decoding) and records its own position, the id of the
last entry it read, its own or not: rewinding executor i to it reads again exactly the
entries of i after it, whatever the others did; each executor's watermark is made from the
records it kept. A rule over ids, not consumer groups (XREADGROUP): which consumer gets an
entry there depends on timing, so a rewound executor would not get the same entries again.
Ids, not entry numbers: an id does not change when older entries are trimmed. The cost: every
executor transfers every entry (N times the reads of one). The start ('$') and a bounded
read's end are fixed once, in the caller's process, so every executor reads the same range.

Resumed on another number of executors (`rescaled`): entry e was processed before a checkpoint
taken on N iff its id <= the position of its owner under N (a position inside a read is first
made exact: the records fed after it are walked to the last whole entry, and the one entry fed
in part keeps its count). Each new executor reads from the least old position and keeps the
entries it owns under the new count that no old owner processed (`_kept`, per read with numpy;
the part of a partly fed entry is dropped). Those old positions (a stage) and the partly fed
entries are in its cursor, so its checkpoints resume exactly, on any count again; a stage goes
once the executor's own position passes all of it.
"""

from __future__ import annotations

import copy
import re
import zlib
from typing import NamedTuple

import numpy as np
import structlog
import trio

from slashrt._schema import Schema
from slashrt.connectors._redis import (
    DEFAULT_COUNT,
    DEFAULT_ENTRY_BYTES,
    DEFAULT_TIMEOUT,
    END_FIELD,
    EntryDecoder,
    check_entry_bytes,
    check_timeout,
    connect,
    failure,
    packed_entries,
    shown,
    stream_schema,
)
from slashrt.ops.reads import feed_reads
from slashrt.ops.sources import another_input
from slashrt.errors import ConnectorError, OptionError, SlashError

__all__ = ["RedisStream", "write_stream", "end_stream", "read_stream"]

log = structlog.get_logger("slashrt.connectors.redis")

_ID = re.compile(r"\d+(-\d+)?")
_PIPELINE_BYTES = 16 * 1024 * 1024  # entries per round trip when writing: about this much


def _stream_id(value, what: str) -> str:
    """A complete stream id 'ms-seq' ('5' is '5-0'), or '$' (the stream's end when read)."""
    if isinstance(value, bytes):
        value = value.decode()
    if value == "$":
        return value
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise OptionError(f"{what} must be a stream id such as '0-0' or '1700000000000-3' (or '$'), got {value!r}")
    return value if "-" in value else f"{value}-0"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Read(NamedTuple):
    """Where a read leaves the source: the last entry's id, whether it was the end entry, and
    how many entries it used (up to and with that one)."""

    last: str
    ended: bool
    entries: int


def _order(stream_id: str) -> tuple[int, int]:
    ms, seq = stream_id.split("-")
    return int(ms), int(seq)


def owner(entry_id: bytes, executors: int) -> int:
    """The executor (of `executors`) that reads the entry `entry_id` of a shared stream."""
    return zlib.crc32(entry_id) % executors


class RedisStream:
    """Input of a source: the records packed in the Redis stream `stream_key` at `url`.

    Reads the entries after `start` (an id: '0-0' is the whole stream, '$' its current end).
    With `stop_at_end` (the default) the read is bounded: it ends at the stream's last entry
    as of the run's start; a stream that does not exist is an error (it is most likely a
    misspelt key; an existing empty stream is an empty input). With `stop_at_end=False` it
    follows the stream, waiting up to `block_ms` per read, until an entry with the field `end`
    arrives (`end_stream`; it ends a bounded read too); a stream that does not exist yet is
    waited for. Each read takes up to `count` entries. An entry written with another schema, or malformed, fails the run
    naming its id; so does a server that goes away, after the records read before it were
    delivered. On several executors the entries are shared among them by their ids (`owner`,
    `for_executor`); the object's own `position` then stays put (each executor's is in the
    checkpoints). Every call to the server fails after `timeout` seconds (a followed read's
    after `block_ms` more): a broker that is down or hung is named (a `BrokerUnavailable`,
    which `run(restart=)` retries from the last complete checkpoint). Reads run in a worker
    thread: the executor's loop goes on meanwhile.
    """

    def __init__(self, url: str, stream_key: str, *, start: str = "0-0", block_ms: int = 500,
                 count: int = DEFAULT_COUNT, stop_at_end: bool = True, timeout: float = DEFAULT_TIMEOUT):
        if not isinstance(stream_key, (str, bytes)) or not stream_key:
            raise OptionError(f"RedisStream needs a stream key (a non-empty string), got {stream_key!r}")
        for name, value in (("block_ms", block_ms), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise OptionError(f"RedisStream {name} must be a positive whole number, got {value!r}")
        self.url = url
        self.stream_key = stream_key.decode() if isinstance(stream_key, bytes) else stream_key
        self.block_ms = int(block_ms)
        self.count = int(count)
        self.stop_at_end = bool(stop_at_end)
        self.timeout = check_timeout(timeout)
        self._client = self._connect()
        self._position = _stream_id(start, "RedisStream start")
        self._end: str | None = None  # a bounded read's last id: fixed at its first run's start
        self._ended = False  # the end entry was read
        self._entries: int | None = None  # entries ever added up to the position (None: not known)
        self._rewound = False  # at a checkpoint's position: entries deleted after it are missing input
        self.delivered = 0  # records put into the channel by the runs so far
        self.executor, self.executors = 0, 1  # this reader keeps the entries `owner` gives `executor`
        self._fixed_end: str | None = None  # a shared bounded read's end, fixed for every executor
        self._range: tuple[str, str | None] | None = None  # (start, end) fixed for a run on several executors
        self._start: dict | None = None  # a rescaled resume's cursor: where this reader starts (`rescaled`)
        self._stages: list = []  # earlier counts' positions: an entry no old owner processed is kept (`_kept`)
        self._partial: dict = {}  # entry id -> its first records, processed before a rescaling

    def __getstate__(self) -> dict:  # to executor processes: the URL, not a client (locks, sockets)
        return {k: v for k, v in self.__dict__.items() if k != "_client"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._client = self._connect()

    def _connect(self):
        return connect(self.url, timeout=self.timeout, read_timeout=self._within)

    @property
    def _within(self) -> float:
        """Seconds an answer may take: a followed read's XREAD blocks up to block_ms first."""
        return self.timeout if self.stop_at_end else self.block_ms / 1000 + self.timeout

    def for_executor(self, index: int, executors: int) -> RedisStream:
        """Executor `index`'s reader in a run on `executors`: the entries `owner` gives it,
        from this source's position on. The start ('$' resolved) and a bounded read's end are
        fixed at the first call, here, so that every executor (and every restart) reads the same
        range; a stream that is not there, or not a stream, is refused now."""
        if self._range is None:
            self._range = self._begin()
            self._client.connection_pool.disconnect()  # (the readers connect in their own processes)
        share = copy.copy(self)
        share.executor, share.executors = int(index), int(executors)
        share._position, share._fixed_end = self._range
        share.delivered = 0
        return share

    def __repr__(self) -> str:
        share = f", executor {self.executor} of {self.executors}" if self.executors > 1 else ""
        return f"RedisStream({shown(self.url)!r}, {self.stream_key!r}, position={self._position!r}{share})"

    @property
    def position(self) -> str:
        """Id of the last entry whose records were delivered (the start before any was)."""
        return self._position

    def resume_from(self, stream_id: str) -> RedisStream:
        """Read the entries after `stream_id` in the next run (a recorded `position`)."""
        self._position = _stream_id(stream_id, "resume_from")
        return self

    rewinds = True  # a checkpointed run records its position and rewinds it (slashrt._runtime)

    async def feed(self, sender, spec, *, watermark_every: int, resume=None, barriers=None) -> None:
        """Stream the entries into `sender`'s channel for source `spec`, then close it; in a
        checkpointed run, with the checkpoints' `barriers`, from the position `resume` recorded.

        The input hook of `slashrt._runtime.local_inputs`."""
        decoder = EntryDecoder(self.url, self.stream_key, spec.schema.dtype, f"source {spec.step_id!r}")
        # a run of its own: the end as of its start, and on after an end entry read before (unless rewound)
        self._end, self._ended, self._rewound, self._entries = self._fixed_end, False, False, None
        if resume is None and self._start is not None:  # a rescaled resume: from the least old position
            self._rewind(self._start)
        try:
            await feed_reads(sender, spec, watermark_every=watermark_every, read=lambda reads: self._read(reads, decoder),
                             advance=self._advance, resume_hint=self._resume_hint, cursor=self._cursor,
                             rewind=self._rewind, resume=resume, barriers=barriers, lend=True)
        finally:
            self._client.connection_pool.disconnect()
        log.info("redis stream read", stream=self.stream_key, position=self._position, records=self.delivered)

    def _cursor(self) -> dict:
        """The position as a checkpoint records it: the last id fed, a bounded read's end,
        whether the stream's end entry was read (a resume then reads nothing more), and how many
        entries were ever added up to the last id (to tell a stream trimmed past it)."""
        cursor = {"after": self._position, "end": self._end, "ended": self._ended, "entries": self._entries,
                  "executors": self.executors}
        if self._stages or self._partial:  # what a rescaled resume still needs of the counts before
            cursor.update(stages=self._stages, partial=self._partial)
        return cursor

    def _rewind(self, cursor: dict) -> None:
        """Back to a recorded cursor; a bounded read ends where the checkpointed run's would have."""
        if cursor.get("executors", 1) != self.executors:  # (the coordinator refuses it before: one sentence there)
            raise ConnectorError(
                f"stream {self.stream_key!r}: the checkpoint shared its entries among {cursor.get('executors', 1)} "
                f"executor(s), this run among {self.executors}: resume it on as many executors"
            )
        self.resume_from(cursor["after"])
        self._end, self._ended, self._rewound = cursor["end"], cursor["ended"], True
        self._entries = cursor.get("entries")
        self._stages, self._partial = list(cursor.get("stages", [])), dict(cursor.get("partial", {}))

    def rescaled(self, positions: list[dict], executors: int) -> list[RedisStream]:
        """The readers of a run on `executors` resuming a checkpoint taken on another count,
        whose positions (feeder states, one per old executor) are `positions`: each starts at
        the least old position and keeps its own entries that no old owner processed (see the
        module doc). Called in the caller's process (it reads the stream to make a position
        inside a read exact)."""
        old = len(positions)
        cursors = [p.get("cursor") for p in positions]
        if not all(isinstance(c, dict) and "after" in c for c in cursors):
            raise another_input(positions[0].get("step"))
        stages, partial, after = [], {}, []
        for i, (position, cursor) in enumerate(zip(positions, cursors)):
            for stage in cursor.get("stages", []):
                if stage not in stages:
                    stages.append(stage)
            for entry_id, taken in cursor.get("partial", {}).items():
                partial[entry_id] = max(partial.get(entry_id, 0), taken)
            last, part = self._consumed(i, old, cursor, position.get("skip", 0))
            after.append(last)
            partial.update({e: max(partial.get(e, 0), n) for e, n in part.items()})
        stages.append({"executors": old, "after": after})
        start = max((min(stage["after"], key=_order) for stage in stages), key=_order)
        # a stage all at or before the start rules out no entry read from there
        stages = [stage for stage in stages if _order(max(stage["after"], key=_order)) > _order(start)]
        partial = {e: n for e, n in partial.items() if _order(e) > _order(start)}
        entries = next((c.get("entries") for c in cursors if c["after"] == start), None)
        begin = {"after": start, "end": cursors[0]["end"], "ended": all(c["ended"] for c in cursors),
                 "entries": entries, "executors": executors, "stages": stages, "partial": partial}
        readers = []
        for j in range(executors):
            reader = self.for_executor(j, executors)
            reader._start = begin
            readers.append(reader)
        return readers

    def _consumed(self, index: int, executors: int, cursor: dict, skip: int) -> tuple[str, dict]:
        """Old executor `index`'s position made exact: (the id up to which its entries were
        processed, {id of an entry processed in part: its records processed}), walking the
        `skip` records it fed after its `cursor` (one read at most)."""
        reader = self.for_executor(index, executors)
        reader._rewind(cursor)
        last = scan = cursor["after"]
        while skip > 0:
            with failure(self.url, f"reading stream {self.stream_key!r} after id {scan}", timeout=self._within):
                entries = self._client.xrange(self.stream_key, min=f"({scan}", count=self.count)
            if not entries:
                raise ConnectorError(
                    f"stream {self.stream_key!r} at {shown(self.url)} holds fewer records after id {cursor['after']} "
                    f"than executor {index} of {executors} had fed from there: entries were deleted; keep a stream's "
                    "entries until the checkpoints past them complete"
                )
            for (entry_id, fields), keep in zip(entries, reader._kept(entries)):
                scan = entry_id.decode()
                if not keep or END_FIELD in fields:
                    continue
                dropped = reader._partial.get(scan, 0)
                left = int(fields[b"n"]) - dropped
                if skip < left:
                    return last, {scan: dropped + skip}
                skip -= left
                last = scan
                if not skip:
                    break
        return last, {}

    def _kept(self, entries: list) -> np.ndarray:
        """Which of `entries` this reader keeps: the end entry, and its own (`owner`) that no
        old owner processed before a rescaling (`_stages`); per read, compared with numpy."""
        ids = [entry_id for entry_id, _ in entries]
        crc = np.fromiter(map(zlib.crc32, ids), np.int64, len(ids))
        keep = crc % self.executors == self.executor
        if self._stages:
            ms, seq = np.array([_order(i.decode()) for i in ids], np.uint64).reshape(-1, 2).T
            for stage in self._stages:
                before = np.array([_order(a) for a in stage["after"]], np.uint64).reshape(-1, 2)
                was = before[crc % stage["executors"]]
                keep &= (ms > was[:, 0]) | ((ms == was[:, 0]) & (seq > was[:, 1]))
        return keep | np.fromiter((END_FIELD in fields for _, fields in entries), bool, len(entries))

    def _advance(self, read: _Read, count: int) -> None:
        self._position = read.last
        if self._stages or self._partial:  # stages and parts at or before the position rule out nothing more
            at = _order(self._position)
            self._stages = [s for s in self._stages if _order(max(s["after"], key=_order)) > at]
            self._partial = {e: n for e, n in self._partial.items() if _order(e) > at}
        self._ended = self._ended or read.ended
        if self._entries is not None:
            self._entries += read.entries
        self.delivered += count

    def _resume_hint(self, delivered: int) -> str:
        if self.executors > 1:  # a position of one executor's share: checkpoints rewind each by itself
            return (f"executor {self.executor} of {self.executors} had delivered {delivered} records (up to stream id "
                    f"{self._position}): run it with checkpoint_dir= to resume every executor where it was")
        return (f"the {delivered} records before it were delivered (up to stream id {self._position}): "
                f"resume_from({self._position!r}) reads on from there")

    async def _read(self, reads, decoder: EntryDecoder) -> None:
        """Read ahead in a worker thread; send (records, `_Read`) per read, or the error. The
        first send holds no records: the start resolved ('$' is an id from then on) and the end
        fixed. A followed read with nothing new sends no records either (barriers pass).
        Rewound past the end entry, nothing is read."""
        async with reads:
            try:
                cursor, self._end = await trio.to_thread.run_sync(self._begin)
                end = self._end
                await reads.send((np.empty(0, decoder.dtype), _Read(cursor, False, 0)))
                while not self._ended and (end is None or _order(cursor) < _order(end)):
                    records, last, ended, error, entries = await trio.to_thread.run_sync(self._next, decoder, cursor, end)
                    if error is not None:
                        if last is not None:  # the good entries before the bad one
                            await reads.send((records, _Read(last.decode(), False, entries)))
                        raise error
                    if last is None:
                        if end is not None:  # nothing up to the end: it was trimmed away
                            break
                        await reads.send((records, _Read(cursor, False, 0)))  # following: nothing new within block_ms
                        continue
                    await reads.send((records, _Read(last.decode(), ended, entries)))
                    cursor = last.decode()
                    if ended:
                        break
            except SlashError as exc:
                await reads.send(exc)

    def _begin(self) -> tuple[str, str | None]:
        """(The id to read after, the last id to read or None to follow), in the thread."""
        key, cursor = self.stream_key, self._position
        with failure(self.url, f"opening stream {key!r}", timeout=self._within):
            kind = self._client.type(key)
            if kind not in (b"stream", b"none"):
                raise ConnectorError(
                    f"key {key!r} at {shown(self.url)} holds a {kind.decode()}, not a stream: give RedisStream a stream's key"
                )
            if kind == b"none" and self.stop_at_end:
                raise ConnectorError(
                    f"stream {key!r} does not exist at {shown(self.url)}: write to it first (write_stream, RedisStreamSink) "
                    "or read it with stop_at_end=False to wait for it"
                )
            top = self._client.xrevrange(key, count=1) if kind == b"stream" else []
            info = self._client.xinfo_stream(key) if kind == b"stream" else {}
        last = top[0][0].decode() if top else "0-0"
        added = info.get("entries-added", 0 if kind == b"none" else None)  # Redis >= 7
        if self._rewound:
            self._check_kept(cursor, info)
        elif cursor == "0-0" and added is not None:  # entries removed so far: before it (trimmed)
            self._entries = added - info.get("length", 0)
        elif cursor == "$":  # every entry so far is before it
            self._entries, last = added, _text(info.get("last-generated-id", last))
        if cursor == "$":
            cursor = last
        if not self.stop_at_end:
            return cursor, None
        return cursor, self._end or last

    def _check_kept(self, cursor: str, info: dict) -> None:
        """A rewound read needs every entry after its cursor: refuse a stream with entries
        deleted (XDEL) after it, or trimmed (XTRIM, MAXLEN) past it: more entries removed than
        were ever added up to it."""
        deleted = _text(info.get("max-deleted-entry-id", "0-0"))
        removed = info["entries-added"] - info["length"] if "entries-added" in info else None
        if _order(deleted) > _order(cursor):
            how = f"XDEL, up to id {deleted}"
        elif removed is not None and self._entries is not None and removed > self._entries:
            how = f"trimmed: {removed} entries removed, of which {self._entries} were added up to it"
        else:
            return
        raise ConnectorError(
            f"stream {self.stream_key!r} at {shown(self.url)} had entries deleted after id {cursor}, where the "
            f"checkpoint resumes ({how}): they cannot be read again, so the resume would lose them; keep a "
            "stream's entries until the checkpoints past them complete"
        )

    def _next(self, decoder: EntryDecoder, cursor: str, end: str | None):
        """One read after `cursor` (up to `end`, or following): decoded, in the thread."""
        key = self.stream_key
        with failure(self.url, f"reading stream {key!r} after id {cursor}", timeout=self._within):
            if end is not None:
                entries = self._client.xrange(key, min=f"({cursor}", max=end, count=self.count)
            else:
                got = self._client.xread({key: cursor}, count=self.count, block=self.block_ms)
                entries = got[0][1] if got else []
        mine = entries
        if self.executors > 1 or self._stages:  # per entry (a batch of records each): the others' are not decoded
            mine = [e for e, keep in zip(entries, self._kept(entries)) if keep]
        if self._partial:  # an entry fed in part before a rescaling: the rest of it
            payloads, last, ended, error = decoder.payloads(mine)
            size = decoder.dtype.itemsize
            payloads = [p[self._partial.get(e.decode(), 0) * size:] for (e, _), p in zip(mine, payloads)]
            records = decoder.records(payloads)
        else:
            records, last, ended, error = decoder.decode(mine)
        if error is None and not ended and entries:  # read up to the last entry, its own or another's
            last = entries[-1][0]
        used = 0 if last is None else next(i for i, (entry_id, _) in enumerate(entries, 1) if entry_id == last)
        return records, last, ended, error, used


def write_stream(url: str, stream_key: str, records: np.ndarray, *, entry_bytes: int = DEFAULT_ENTRY_BYTES,
                 end: bool = False) -> list[str]:
    """Append `records` (a structured array) to the stream, packed, up to `entry_bytes` of
    records an entry; with `end`, then an end entry (`end_stream`). Returns the ids written."""
    records, fp = stream_schema(records, f"records for stream {stream_key!r}")
    entry_bytes = check_entry_bytes(entry_bytes)
    client = connect(url)
    ids = []
    per_round = max(1, _PIPELINE_BYTES // entry_bytes)
    try:
        with failure(url, f"writing to stream {stream_key!r}", timeout=DEFAULT_TIMEOUT):
            pipe = client.pipeline(transaction=False)
            for i, fields in enumerate(packed_entries(records, fp, entry_bytes), 1):
                pipe.xadd(stream_key, fields)
                if i % per_round == 0:
                    ids += pipe.execute()
            if end:
                pipe.xadd(stream_key, {END_FIELD: 1})
            ids += pipe.execute()
    finally:
        client.close()
    return [i.decode() for i in ids]


def end_stream(url: str, stream_key: str) -> str:
    """Append the end entry (field `end`) that stops a source following the stream."""
    client = connect(url)
    try:
        with failure(url, f"ending stream {stream_key!r}", timeout=DEFAULT_TIMEOUT):
            return client.xadd(stream_key, {END_FIELD: 1}).decode()
    finally:
        client.close()


def read_stream(url: str, stream_key: str, schema, *, after: str = "0-0") -> np.ndarray:
    """Every record in the stream after id `after` (up to an end entry) as one array of
    `schema` (a Schema or a structured dtype); an empty array if the stream does not exist."""
    dtype = schema.dtype if isinstance(schema, Schema) else Schema.from_dtype(schema).dtype
    decoder = EntryDecoder(url, stream_key, dtype, "read_stream")
    client = connect(url)
    cursor = _stream_id(after, "read_stream after")
    payloads = []
    try:
        with failure(url, f"reading stream {stream_key!r}", timeout=DEFAULT_TIMEOUT):
            while True:
                entries = client.xrange(stream_key, min=f"({cursor}", count=DEFAULT_COUNT)
                got, last, ended, error = decoder.payloads(entries)
                if error is not None:
                    raise error
                payloads += got
                if ended or last is None:
                    break
                cursor = last.decode()
    finally:
        client.close()
    return decoder.records(payloads, writable=True)
