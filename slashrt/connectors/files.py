"""A directory, a file or a glob of Parquet, CSV or .npy files as a dataflow input (`FileSource`).

The files are listed once, when the source is made, and read in order of their names
(numbers in names by value: part-2 before part-10), each batch by batch in a worker thread,
one batch ahead of the channel (`slashrt.ops.reads.feed_reads`: full slots, watermarks in band):

    .parquet   pyarrow, a row group at a time, `batch_records` rows a batch
    .csv       pyarrow's streaming reader, every column read as text and parsed by the
               field's type (`_columns`); blocks of about `batch_records` lines
    .npy       np.load with mmap, `batch_records` records a batch, copied out of the map

Each batch becomes an array of the source's record dtype column by column (`_columns`, the
inverse of `slashrt.ops.sinks.to_arrow`; `Schema.conform` for .npy). The position is a
`FilePosition(file, offset)`: the index of a listed file and how many of its records were
delivered; a run starts from it and moves it as records enter the channel, and
`resume_from(position)` rewinds exactly (Parquet seeks to the row group, .npy to the record,
CSV skips lines). A checkpointed run records the position at its barriers, with the number of
files listed and a checksum of their names, and a resume rewinds to it over those files
(`_cursor`, `_rewind`).

On N executors the unit of assignment is the file: file k of the listing (name order, made
once, when the source is made, in the caller's process) is read by executor k mod N, whole
(`for_executor`). The rule depends only on the listing and N, so a restart or a resume on N
executors gives every executor the same files and rewinds each to its own recorded position
(a position's `file` stays an index into the whole listing); each executor's watermark is
made from what it read. A file is the unit (as a Kafka partition is Flink's) because a
position inside a CSV file is a line count, not a byte offset another reader could seek to;
many files (at least one per executor) spread the work, one file is read by executor 0 alone.

Resumed on another number of executors (rescaling, `slashrt.snapshot.rescale`), the files are
splits with offsets, as Flink's file and Kafka splits: every old executor's recorded position
(file, offset, and `skip` records fed past it) says of each of its files whether it was read
whole, up to an offset, or not at all (`rescaled_starts`); each new executor reads its files
(k mod M) from those starting points (`restarted`). The starts go into the checkpoints of the
rescaled run (its meta `reshared`), so a resume from one makes the same readers again.
"""

from __future__ import annotations

import copy
import csv
import glob
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import structlog
import trio

from slashrt._schema import Schema
from slashrt.connectors._columns import BadValue, to_records, unconvertible
from slashrt.ops.reads import feed_reads
from slashrt.errors import ConnectorError, OptionError, SchemaError, SlashError

__all__ = ["FilePosition", "FileSource"]

log = structlog.get_logger("slashrt.connectors.files")

SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".npy": "npy"}
DONE = -1  # a file's start in a rescaled reader: it was read whole before the rescaling
CSV_LINE_BYTES = 32  # a guess at a CSV line's length, to size blocks of about batch_records lines


class FilePosition(NamedTuple):
    """Where a `FileSource` reads on: record `offset` of its listed file `file` (0-based; the
    records before it, and every earlier file, were delivered). (len(files), 0) is the end."""

    file: int
    offset: int


def _listing(files) -> str:
    """A checksum of the listed files' names, in order: what a recorded position indexes."""
    return f"{zlib.crc32(chr(0).join(p.name for p, _ in files).encode()):08x}"


def _natural(path: Path) -> list:
    """Sort key: names compared with their numbers by value (part-2 before part-10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _visible(path: Path) -> bool:
    """Not a hidden file ('.x', '_SUCCESS') nor a transactional sink's unpublished part."""
    return path.is_file() and not path.name.startswith((".", "_")) and not path.name.endswith(".inprogress")


def list_files(path, fmt: str | None) -> tuple[tuple[Path, str], ...]:
    """The files a FileSource for `path` reads, in order, each with its format."""
    given = str(path)
    where = Path(path)
    if where.is_file():
        found = [where]
    elif where.is_dir():
        found = [p for p in where.iterdir() if _visible(p)]  # none: an empty input
    elif glob.has_magic(given):
        found = [p for p in map(Path, glob.glob(given, recursive=True)) if _visible(p)]
        if not found:
            raise ConnectorError(f"no files match {given!r}: check the pattern, or give FileSource the directory")
    else:
        raise ConnectorError(
            f"{given!r} does not exist: give FileSource a directory, a file or a glob pattern of .parquet, .csv or .npy files"
        )
    listed = []
    for p in sorted(found, key=_natural):
        kind = fmt or SUFFIXES.get(p.suffix.lower())
        if kind is None:
            raise ConnectorError(
                f"file {str(p)!r} has the suffix {p.suffix!r}, which FileSource does not read: name the files .parquet, "
                ".csv or .npy, or say how to read them with format='parquet', 'csv' or 'npy'"
            )
        listed.append((p, kind))
    return tuple(listed)


class FileSource:
    """Input of a source: the records in the files at `path` (a directory, a file or a glob).

    A directory is read in full except hidden files (names starting with '.' or '_') and
    unpublished part files (`.inprogress`); an empty directory is an empty input, a glob
    that matches nothing is an error. Each file's format comes from its suffix (.parquet,
    .csv, .npy) unless `format` names one for all. The files are listed when the source is
    made: files that appear later are not read (make another FileSource for them, e.g.
    `FileSource(path, start=old.position)` when they sort after the others). Columns are
    found by the schema's field names (others are ignored). `start` (a `FilePosition`, or
    (file, offset)) skips what was delivered before. In a checkpointed run its position is
    recorded at every barrier and a resume rewinds to it. On several executors file k is
    read by executor k mod N (`for_executor`); the object's own `position` then stays put
    (each executor's is in the checkpoints). A checkpoint taken on N executors resumes on
    another number too: each file goes on from where its old reader stopped in it
    (`rescaled_starts`, `restarted`).
    """

    def __init__(self, path, *, format: str | None = None, start=None, batch_records: int = 65_536):
        if format is not None and format not in SUFFIXES.values():
            raise OptionError(f"FileSource format must be 'parquet', 'csv' or 'npy' (or None: by suffix), got {format!r}")
        if isinstance(batch_records, bool) or not isinstance(batch_records, (int, np.integer)) or batch_records < 1:
            raise OptionError(f"FileSource batch_records must be a positive whole number, got {batch_records!r}")
        self.path = str(path)
        self.format = format
        self.batch_records = int(batch_records)
        self._files = list_files(path, format)
        self._listing = _listing(self._files)  # what a checkpointed position indexes
        self._position = FilePosition(0, 0)
        self.executor, self.executors = 0, 1  # this reader reads files k with k % executors == executor
        self._starts: list[int] | None = None  # after a rescaling: each file's first record, or DONE
        if start is not None:
            self.resume_from(start)
        self.delivered = 0  # records put into the channel by the runs so far

    def __repr__(self) -> str:
        share = f", executor {self.executor} of {self.executors}" if self.executors > 1 else ""
        return f"FileSource({self.path!r}, {len(self._files)} files, position={tuple(self._position)}{share})"

    def for_executor(self, index: int, executors: int) -> FileSource:
        """Executor `index`'s reader in a run on `executors`: the files k with k % executors ==
        index, from this source's position on (the same listing: positions index it)."""
        share = copy.copy(self)
        share.executor, share.executors = int(index), int(executors)
        share.delivered = 0
        return share

    def rescaled_starts(self, positions: list, was: int, starts: list | None) -> dict:
        """Each listed file's starting point after a rescaling, from `positions` (old executor
        i's feeder state meta, of `was` executors, each reader started at `starts`: None, or
        a rescaled run's starts): DONE (read whole), or its first record not yet fed. As a
        rescaled run's checkpoint meta keeps it: {"files", "listing", "starts"}."""
        cursors = [p["cursor"] for p in positions]
        count, listing = cursors[0]["files"], cursors[0]["listing"]
        if any((c["files"], c["listing"], c.get("executors", 1)) != (count, listing, was) for c in cursors):
            raise ConnectorError(
                f"FileSource {self.path!r}: the checkpoint's positions index different listings of the files: it was "
                "not written by this slashrt; resume it with the executor count it was taken on"
            )
        self._check_listing(count, listing)
        out = list(starts) if starts is not None else [0] * count
        for i, (cursor, position) in enumerate(zip(cursors, positions)):
            file, offset, skip = cursor["file"], cursor["offset"], position.get("skip", 0)
            mine = [k for k in range(i, count, was) if out[k] != DONE]
            for k in mine:
                if k < file:  # the reader moved past it
                    out[k] = DONE
                elif k == file:
                    out[k] = max(out[k], offset)
            # records fed past the cursor came from the next file the reader would open
            ahead = [k for k in mine if k >= file]
            if skip and ahead:
                out[ahead[0]] += skip
        return {"files": count, "listing": listing, "starts": out}

    def restarted(self, stage: dict, index: int, executors: int) -> FileSource:
        """Executor `index`'s reader of `executors` after a rescaling: its files (k mod
        executors) of the checkpointed listing, each from `stage`'s starts
        (`rescaled_starts`)."""
        self._check_listing(stage["files"], stage["listing"])
        share = self.for_executor(index, executors)
        share._files, share._listing = self._files[: stage["files"]], stage["listing"]
        share._position, share._starts = FilePosition(0, 0), list(stage["starts"])
        return share

    def _check_listing(self, count: int, listing: str) -> None:
        """Refuse (one sentence) files listed now that are not the checkpointed run's first `count`."""
        if count > len(self._files) or _listing(self._files[:count]) != listing:
            raise ConnectorError(
                f"FileSource {self.path!r}: the checkpoint was taken over {count} files, which are not the first {count} "
                f"listed now ({len(self._files)}): files were removed, renamed or added among them; restore them to "
                "resume exactly"
            )

    @property
    def files(self) -> tuple[Path, ...]:
        """The files this source reads, in order; a position's `file` indexes them."""
        return tuple(p for p, _ in self._files)

    @property
    def position(self) -> FilePosition:
        """Where the next run reads on: after a run, the end; after a failure, the first record
        not delivered."""
        return self._position

    def resume_from(self, position) -> FileSource:
        """Read from `position` (a `FilePosition` or (file, offset), as `position` gave) on."""
        try:
            file, offset = position
            ok = all(not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 0 for v in (file, offset))
        except (TypeError, ValueError):
            ok = False
        if not ok or file > len(self._files) or (file == len(self._files) and offset):
            raise OptionError(
                f"FileSource position must be (file index, record offset) of whole numbers >= 0 with a file index up to "
                f"{len(self._files)} (its files), got {position!r}"
            )
        self._position = FilePosition(int(file), int(offset))
        return self

    rewinds = True  # a checkpointed run records its position and rewinds it (slashrt._runtime)

    async def feed(self, sender, spec, *, watermark_every: int, resume=None, barriers=None) -> None:
        """Stream the files into `sender`'s channel for source `spec`, then close it; in a
        checkpointed run, with the checkpoints' `barriers`, from the position `resume` recorded.

        The input hook of `slashrt._runtime.local_inputs`."""
        await feed_reads(sender, spec, watermark_every=watermark_every, read=lambda reads: self._read(reads, spec.schema),
                         advance=self._advance, resume_hint=self._resume_hint, cursor=self._cursor,
                         rewind=self._rewind, resume=resume, barriers=barriers, lend=True)
        log.info("files read", path=self.path, position=tuple(self._position), records=self.delivered)

    def _cursor(self) -> dict:
        """The position as a checkpoint records it, with the listing it indexes (how many files,
        and a checksum of their names)."""
        return {"file": self._position.file, "offset": self._position.offset, "files": len(self._files),
                "listing": self._listing, "executors": self.executors}

    def _rewind(self, cursor: dict) -> None:
        """Back to a recorded cursor, over the files listed then: files added since (sorting
        after them) are left for a next source, as the checkpointed run never saw them."""
        count = cursor["files"]
        if cursor.get("executors", 1) != self.executors:  # (a resume on another count is rescaled before: `restarted`)
            raise ConnectorError(
                f"FileSource {self.path!r}: the checkpoint shared its files among {cursor.get('executors', 1)} "
                f"executor(s), this run among {self.executors}: resume it on as many executors"
            )
        self._check_listing(count, cursor["listing"])
        self._files, self._listing = self._files[:count], cursor["listing"]
        self.resume_from((cursor["file"], cursor["offset"]))

    def _advance(self, position: FilePosition, count: int) -> None:
        self._position = position
        self.delivered += count

    def _resume_hint(self, delivered: int) -> str:
        file, offset = self._position
        if self.executors > 1:  # a position of one executor's share: checkpoints rewind each by itself
            return (f"executor {self.executor} of {self.executors} had delivered {delivered} records (up to record "
                    f"{offset} of file {file}): run it with checkpoint_dir= to resume every executor where it was")
        return (f"the {delivered} records before it were delivered (up to record {offset} of file {file}): "
                f"resume_from({tuple(self._position)}) reads on from there")

    async def _read(self, reads, schema: Schema) -> None:
        """Read ahead in a worker thread: send (records, position after them), or the error."""
        async with reads:
            batches = self._batches(schema, self._position)
            try:
                while (item := await trio.to_thread.run_sync(next, batches, None)) is not None:
                    await reads.send(item)
            except SlashError as exc:
                await reads.send(exc)
            finally:
                batches.close()

    def _batches(self, schema: Schema, start: FilePosition) -> Iterator[tuple[np.ndarray, FilePosition]]:
        for index in range(start.file, len(self._files)):
            if index % self.executors != self.executor:  # another executor's file
                continue
            first = 0 if self._starts is None else self._starts[index]  # after a rescaling
            if first == DONE:
                continue
            path, kind = self._files[index]
            offset = max(start.offset if index == start.file else 0, first)
            for records in _READERS[kind](path, schema, offset, self.batch_records, index):
                offset += len(records)
                yield records, FilePosition(index, offset)
            yield np.empty(0, schema.dtype), FilePosition(index + 1, 0)  # the file is done


def _named(path: Path) -> str:
    return f"file {str(path)!r}"


def _said(exc: BaseException) -> str:
    """A library's message on one line (Arrow's can span several)."""
    return " ".join(str(exc).split())


def _gone(path: Path) -> ConnectorError:
    return ConnectorError(f"{_named(path)} is gone: it was there when the FileSource was made; make a new FileSource")


def _open(path: Path, opener, kind: str, broken: tuple):
    """`opener(path)`; a file gone, unreadable or not of its format (`broken`) is named."""
    try:
        return opener(path)
    except FileNotFoundError:
        raise _gone(path) from None
    except PermissionError as exc:
        raise ConnectorError(f"{_named(path)} cannot be opened ({exc.strerror}): let this process read it") from None
    except broken as exc:
        raise ConnectorError(f"{_named(path)} is not a readable {kind} file ({_said(exc)}): it is truncated or corrupt") from None


def _past_end(path: Path, index: int, offset: int, count: int | None) -> ConnectorError:
    holds = f"holds {count} records" if count is not None else f"holds fewer than {offset} records"
    return ConnectorError(
        f"{_named(path)} {holds}, so position ({index}, {offset}) is past its end: the files changed since the "
        "position was taken"
    )


# -- .npy -------------------------------------------------------------------------------------------
def _npy(path: Path, schema: Schema, start: int, batch: int, index: int) -> Iterator[np.ndarray]:
    what = _named(path)
    array = _open(path, lambda p: np.load(p, mmap_mode="r", allow_pickle=False), ".npy", (ValueError, EOFError, OSError))
    if array.ndim != 1 or array.dtype.names is None:
        raise SchemaError(
            f"{what} holds an array of shape {array.shape} and dtype {array.dtype}: a FileSource reads 1-D structured "
            "arrays (np.save(path, records))"
        )
    if set(array.dtype.names) > set(schema.names):  # only the schema's fields (a view: nothing copied)
        array = array[list(schema.names)]
    schema.conform(array[:0], what)  # a missing field or another type: this names it
    if start > len(array):
        raise _past_end(path, index, start, len(array))
    for lo in range(start, len(array), batch):
        records = schema.conform(array[lo : lo + batch], what)
        yield records if records.flags.owndata else records.copy()  # out of the map, in this thread


# -- Arrow formats ----------------------------------------------------------------------------------
def _check_columns(what: str, arrow_schema: pa.Schema, schema: Schema, *, text: bool) -> None:
    for name in schema.names:
        if name not in arrow_schema.names:
            raise SchemaError(f"{what} has no column {name!r} (its columns: {', '.join(arrow_schema.names)}; "
                              f"the source's fields: {', '.join(schema.names)})")
        reason = unconvertible(arrow_schema.field(name).type, schema.field(name), text=text)
        if reason is not None:
            raise SchemaError(f"{what}: column {name!r} {reason}")


def _records(batches, dtype: np.dtype, *, text: bool, first: int, where) -> Iterator[np.ndarray]:
    """Arrow batches (record `first` of the file on) as records; at a bad value, the rows before
    it, then an error naming its place (`where(record)`)."""
    offset = first
    for batch in batches:
        try:
            records = to_records(batch, dtype, text=text)
        except BadValue as bad:
            if bad.row:
                yield to_records(batch.slice(0, bad.row), dtype, text=text)
            raise ConnectorError(f"{where(offset + bad.row)}: {bad}") from None
        offset += len(records)
        yield records


def _parquet(path: Path, schema: Schema, start: int, batch: int, index: int) -> Iterator[np.ndarray]:
    import pyarrow.parquet as pq

    what = _named(path)
    file = _open(path, pq.ParquetFile, "Parquet", (pa.ArrowException, OSError))
    with file:
        _check_columns(what, file.schema_arrow, schema, text=False)
        sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
        ends = np.cumsum(sizes, dtype=np.int64)
        total = int(ends[-1]) if sizes else 0
        if start > total:
            raise _past_end(path, index, start, total)
        first_group = int(np.searchsorted(ends, start, side="right"))

        def batches():
            skip = start - (int(ends[first_group - 1]) if first_group else 0)
            for g in range(first_group, len(sizes)):
                try:
                    for b in file.iter_batches(batch_size=batch, row_groups=[g], columns=list(schema.names),
                                               use_threads=False):
                        if skip:
                            b, skip = b.slice(min(skip, b.num_rows)), max(0, skip - b.num_rows)
                        if b.num_rows:
                            yield b
                except (pa.ArrowException, OSError) as exc:
                    raise ConnectorError(f"{what}, row group {g}, cannot be read ({_said(exc)}): the file is corrupt") from None

        def where(record: int) -> str:
            return f"{what}, row group {int(np.searchsorted(ends, record, side='right'))}, record {record}"

        yield from _records(batches(), schema.dtype, text=False, first=start, where=where)


def _csv(path: Path, schema: Schema, start: int, batch: int, index: int) -> Iterator[np.ndarray]:
    import pyarrow.csv as pcsv

    what = _named(path)
    try:
        if path.stat().st_size == 0:  # not even a header: no records
            if start:
                raise _past_end(path, index, start, 0)
            return
    except FileNotFoundError:
        raise _gone(path) from None
    names = list(schema.names)
    # from a record r > 0 on: skip r - 1 rows and drop the one read, so that a position past the
    # file's end shows (no row at all) rather than reading nothing
    read = pcsv.ReadOptions(block_size=max(4096, batch * CSV_LINE_BYTES), skip_rows_after_names=max(0, start - 1))
    parse = pcsv.ParseOptions(newlines_in_values=True)  # our CsvFile quotes text with line breaks
    convert = pcsv.ConvertOptions(column_types={n: pa.binary() for n in names}, include_columns=names)
    try:
        reader = pcsv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert)
    except FileNotFoundError:
        raise _gone(path) from None
    except KeyError:  # a missing column (ArrowKeyError): name what the header has (and raise)
        header = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=read.block_size), parse_options=parse).schema
        _check_columns(what, header, schema, text=True)
        raise
    except (pa.ArrowException, OSError) as exc:
        raise ConnectorError(f"{what} cannot be read as CSV ({_said(exc)})") from None
    _check_columns(what, reader.schema, schema, text=True)

    def batches():
        done = start  # records of the file read or skipped so far
        drop = start > 0
        with reader:
            while True:
                try:
                    b = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowException, OSError) as exc:
                    raise ConnectorError(
                        f"{what} cannot be read as CSV after record {done} (line {_csv_line(path, done)}): {_said(exc)}"
                    ) from None
                if drop and b.num_rows:
                    b, drop = b.slice(1), False
                done += b.num_rows
                if b.num_rows:
                    yield b
        if drop:
            raise _past_end(path, index, start, None)

    def where(record: int) -> str:
        return f"{what}, line {_csv_line(path, record)} (record {record})"

    yield from _records(batches(), schema.dtype, text=True, first=start, where=where)


def _csv_line(path: Path, record: int) -> int:
    """The line where CSV record `record` (0-based, after the header) starts, counting values
    that span lines and skipping blank lines as pyarrow does: for messages only (a scan)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = csv.reader(f)
        line, seen = 1, -1  # the header is row -1
        for row in rows:
            if row:
                if seen == record:
                    return line
                seen += 1
            line = rows.line_num + 1
    return line


_READERS = {"npy": _npy, "parquet": _parquet, "csv": _csv}
