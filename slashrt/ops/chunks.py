"""A stream made chunk by chunk while the run goes: a `PerExecutor` whose `make` returns an
iterable of structured arrays (chunks) rather than one array (`per_executor_input`).

`ChunkStream` feeds the chunks through `slashrt.ops.reads.feed_reads` (full slots, watermarks
in band, the checkpoints' barriers), as one array would be fed: the largest event time and the
watermark cadence carry across chunks, and the pipeline judges lateness by the stream's order.
A worker thread makes the next chunk only when the feed needs it (one read ahead), so a long or
unbounded stream runs in bounded memory: the chunk being fed, one waiting, one being made.
Each chunk is checked against the source's schema (`validate_input`); a bad one fails the run
in one sentence naming the source and the chunk, once the chunks before it are computed.

Its position is the number of chunks fed whole, `{"chunks": c}` (the cursor), plus the records
of chunk c fed after it (the feeder's `skip`). A resume (of a deterministic `make`, called
again) starts at chunk c and drops `skip` records of it. The chunks before c are not made at
all where `make` returned a sequence (`__len__` and `__getitem__`: a list, or an object making
chunk i on demand); from any other iterable they are drawn and dropped (made, neither checked
nor copied).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import trio

from slashrt._schema import Schema
from slashrt.errors import SchemaError, SlashError, SnapshotError
from slashrt.ops.reads import feed_reads
from slashrt.ops.sources import validate_input

__all__ = ["ChunkStream", "per_executor_input"]

_END = object()


def per_executor_input(source: str, made):
    """What a `PerExecutor`'s `make` returned for `source`: an array as it is (fed whole), an
    iterable of arrays as a `ChunkStream`; anything else is refused in one sentence."""
    if isinstance(made, np.ndarray):
        return made
    if (isinstance(made, Iterable) or _sequence(made)) and not isinstance(made, (str, bytes, Mapping)):
        return ChunkStream(source, made)
    raise SchemaError(
        f"the PerExecutor input for source {source!r}: make returned {type(made).__name__}, not a numpy structured "
        "array nor an iterable of them (chunks)"
    )


def _sequence(chunks) -> bool:
    """Chunk i can be had without making the ones before it."""
    return hasattr(chunks, "__len__") and hasattr(chunks, "__getitem__")


class ChunkStream:
    """One executor's stream of a chunked `PerExecutor` input (see the module doc); the input
    hook of `slashrt._runtime.local_inputs` (`feed`). `made` counts the chunks made so far."""

    rewinds = True  # a checkpointed run takes PerExecutor inputs declared deterministic only (check_rewindable)

    def __init__(self, source: str, chunks: Iterable):
        self.source = source
        self.chunks = chunks
        self.next = 0  # chunks fed whole: the cursor
        self.made = 0
        self.fed = 0  # records fed

    def _what(self, index: int) -> str:
        return f"chunk {index} of the PerExecutor input for source {self.source!r}"

    async def feed(self, sender, spec, *, watermark_every: int, resume=None, barriers=None) -> None:
        """Feed the chunks into `sender`'s channel for source `spec`, then close it; with `resume`
        (a feeder state), from the position it recorded."""
        await feed_reads(sender, spec, watermark_every=watermark_every, read=lambda reads: self._read(reads, spec.schema),
                         advance=self._advance, resume_hint=self._resume_hint, cursor=lambda: {"chunks": self.next},
                         rewind=self._rewind, resume=resume, barriers=barriers)

    def _rewind(self, cursor: dict) -> None:
        start = cursor["chunks"]  # KeyError: a position of another kind of input (feed_reads says so)
        if not isinstance(start, int) or start < 0:
            raise TypeError(start)
        self.next = start

    def _advance(self, position: int, count: int) -> None:
        self.next = position
        self.fed += count

    def _resume_hint(self, delivered: int) -> str:
        return f"it came after {self.next} whole chunks ({delivered} records) were fed"

    def _from(self, start: int) -> Iterator[tuple[int, object]]:
        """(index, chunk) from chunk `start` on."""
        chunks = self.chunks
        if _sequence(chunks):
            count = len(chunks)
            if start > count:
                raise self._shorter(start, count)
            for index in range(start, count):
                yield index, chunks[index]
            return
        chunks = iter(chunks)
        try:
            for skipped in range(start):
                if next(chunks, _END) is _END:
                    raise self._shorter(start, skipped)
            yield from enumerate(chunks, start)
        finally:
            close = getattr(chunks, "close", None)  # a generator: its finally blocks run now
            if close is not None:
                close()

    def _shorter(self, start: int, count: int) -> SnapshotError:
        return SnapshotError(
            f"the PerExecutor input for source {self.source!r}: the checkpoint was taken after chunk {start}, this run's "
            f"make gives {count}: resume with a make returning the same chunks (declared deterministic)"
        )

    def _next(self, chunks: Iterator, schema: Schema):
        """The next chunk, checked (in the worker thread): (records, position after them), or None at the end."""
        item = next(chunks, None)
        if item is None:
            return None
        index, chunk = item
        self.made += 1
        if not isinstance(chunk, np.ndarray):
            raise SchemaError(f"{self._what(index)} is {type(chunk).__name__}, not a numpy structured array")
        return validate_input(self.source, schema, chunk, what=self._what(index)), index + 1

    async def _read(self, reads, schema: Schema) -> None:
        """Make the chunks one ahead of the feed, in a worker thread; send them, or the error."""
        async with reads:
            chunks = self._from(self.next)
            try:
                while (item := await trio.to_thread.run_sync(self._next, chunks, schema)) is not None:
                    await reads.send(item)
            except SlashError as exc:
                await reads.send(exc)
            finally:
                chunks.close()
