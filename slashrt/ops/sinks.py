"""Sinks: where a stream's batches end up (memory, a callback, CSV or Parquet files).

A sink object is what the user holds; `SinkNode` is the runtime operator that feeds it.
Every sink has `open()`, `write(records)` with a structured numpy array, and `close()`; a sink
with `expect(dtype)` learns from the plan the dtype of the records it will see (so `Collect`
returns an empty array of it when none came).

With `transactional=True`, `CsvFile` / `ParquetFile` (a directory of part files) and `Collect`
take part in checkpoints with two-phase commit (`slashrt.snapshot.commit`): output is visible
only once the checkpoint covering it is committed.

In files, fixed-size bytes columns are written as numpy shows their values: `S<n>` columns
are text (UTF-8 strings, the NUL padding dropped), `V<n>` columns are raw bytes (Parquet:
fixed_size_binary, CSV: hex).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from slashrt._batch import Batch
from slashrt._latency import LatencyHistogram
from slashrt.errors import OperatorError, SchemaError
from slashrt.ops._node import Node
from slashrt.snapshot.commit import NotTransactional, PartFiles, PendingRecords, call_async
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State

__all__ = ["Collect", "Callback", "CsvFile", "ParquetFile", "SinkNode", "to_arrow"]


class Collect:
    """Keep every record in memory; after the run, `records` holds them as one array.

    Batches are kept as they come and joined into one array when `records` is first read,
    so collecting costs one copy at most (none for batches the runtime made for the sink).
    With `transactional=True`, records show in `records` only once committed (two-phase commit);
    on an executor of a cluster run, committed records go to the coordinator instead
    (`hand_commits_to`), which fills the user's Collect with them."""

    default_name = "collect"

    def __init__(self, *, transactional: bool = False):
        self.transactional = transactional
        self._transactions = PendingRecords() if transactional else NotTransactional(self)
        self._parts: list[np.ndarray] = []
        self._records: np.ndarray | None = None
        self._expected: np.dtype | None = None  # the dtype of the stream, from the plan
        self._opened = False  # a run delivered to it (else: no result at all, not an empty one)
        self._hand = None  # fn(checkpoint, batches) taking committed records instead of `records`
        self.step_id: str | None = None

    def __repr__(self) -> str:
        return "Collect(transactional=True)" if self.transactional else "Collect()"

    def bind(self, step_id: str) -> None:
        self.step_id = step_id

    def expect(self, dtype: np.dtype) -> None:
        self._expected = dtype

    def open(self) -> None:
        self._parts = []
        self._records = None
        self._opened = True
        if self.transactional:
            self._transactions = PendingRecords()

    def write(self, records: np.ndarray) -> None:
        # a batch of raw input is a view into a channel slot that is reused once released
        owned = records if records.flags.owndata else records.copy()
        (self._transactions.add if self.transactional else self._parts.append)(owned)

    def hand_commits_to(self, hand) -> None:
        """From now on, each commit calls `hand(checkpoint, batches)` per committed checkpoint
        (in checkpoint order) instead of keeping its records (an agent sends them on)."""
        self._hand = hand

    def publish(self, records: np.ndarray) -> None:
        """Records committed elsewhere (by an executor of a cluster run): shown at once."""
        self._parts.append(records)

    # two-phase commit (transactional=True): see slashrt.snapshot.commit
    def pre_commit(self, checkpoint: int) -> None:
        self._transactions.pre_commit(checkpoint)

    def commit(self, checkpoint: int) -> None:
        for n, batches in self._transactions.commit(checkpoint).items():
            self._hand(n, batches) if self._hand is not None else self._parts.extend(batches)

    def abort(self, checkpoint: int) -> None:
        self._transactions.abort(checkpoint)

    def pending(self) -> list[int]:
        return self._transactions.pending()

    def close(self) -> None:
        pass

    @property
    def records(self) -> np.ndarray | None:
        """Everything collected, as one structured array: after a run where nothing arrived,
        an empty one of the stream's dtype (None if a column's type was never declared, and
        before any run or after a failed cluster run: no result)."""
        if self._records is None and not self._parts and self._expected is not None and self._opened:
            return np.empty(0, self._expected)
        if self._parts:
            joined = self._parts if self._records is None else [self._records, *self._parts]
            self._records = joined[0] if len(joined) == 1 else np.concatenate(joined)
            self._parts = []
        return self._records


class Callback:
    """Call `fn(records)` with each structured array that reaches the sink.

    In a multi-executor run `fn` runs in your process, not the executors': each executor
    collects what reaches its sink (`for_executor`), and the coordinator calls `fn` once per
    executor with those records (`deliver`). A checkpointed one collects transactionally: `fn`
    gets exactly the committed records, so a recovery neither loses nor repeats any."""

    default_name = "callback"

    def __init__(self, fn: Callable[[np.ndarray], object]):
        self.fn = fn

    def for_executor(self, index: int, *, transactional: bool = False) -> Collect:
        return Collect(transactional=transactional)

    def deliver(self, step_id: str, parts) -> None:
        """Call `fn` with each executor's records (in executor order; none for an executor
        that had none), as the coordinator does after a multi-executor run."""
        for records in parts:
            if records is None or not len(records):
                continue
            try:
                self.fn(records)
            except Exception as exc:
                raise OperatorError(step_id, f"sink failed: {type(exc).__name__}: {exc}") from exc

    def open(self) -> None:
        pass

    def write(self, records: np.ndarray) -> None:
        self.fn(records)

    def close(self) -> None:
        pass


def to_arrow(records: np.ndarray, *, hex_bytes: bool = False) -> pa.Table:
    """A structured array as an Arrow table, column by column: `S<n>` columns as UTF-8 strings
    without their NUL padding (as numpy shows them), `V<n>` columns as fixed-size binary, or
    with `hex_bytes` as hex strings (for text formats)."""
    columns = {}
    for name in records.dtype.names:
        col = records[name]
        if col.dtype.kind == "S":
            columns[name] = _text(name, col)
        elif col.dtype.kind == "V":
            columns[name] = _hex(col) if hex_bytes else _binary(col)
        elif col.dtype.kind in "iufb":
            columns[name] = _number(col)
        else:
            columns[name] = pa.array(np.ascontiguousarray(col))
    return pa.table(columns)


def _number(col: np.ndarray) -> pa.Array:
    """A numeric or bool column as an Arrow array over its buffer (bools packed to bits). Not
    `pa.array`: it imports pandas (to check for its categoricals), about 0.5 s of CPU in every
    executor process at its first write."""
    col = np.ascontiguousarray(col, col.dtype.newbyteorder("="))
    if col.dtype.kind == "b":
        return pa.Array.from_buffers(pa.bool_(), len(col), [None, pa.py_buffer(np.packbits(col, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(col.dtype), len(col), [None, pa.py_buffer(col)])


def _bytes_matrix(col: np.ndarray) -> np.ndarray:
    """A fixed-size bytes column as an (rows, width) uint8 matrix."""
    return np.ascontiguousarray(col).view(np.uint8).reshape(len(col), col.dtype.itemsize)


def _binary(col: np.ndarray) -> pa.Array:
    data = _bytes_matrix(col)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(col.dtype.itemsize), len(col), [None, pa.py_buffer(data)])


def _strings(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data)))


_HEX = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), np.uint8).reshape(256, 2)


def _hex(col: np.ndarray) -> pa.Array:
    """Raw bytes as hex text, two digits a byte (vectorised through a table of 256 pairs)."""
    raw = _bytes_matrix(col)
    return _strings(np.full(len(col), 2 * raw.shape[1]), _HEX[raw].reshape(-1))


def _text(name: str, col: np.ndarray) -> pa.Array:
    """`S<n>` values as strings, as numpy shows them: up to the last byte that is not NUL."""
    raw = _bytes_matrix(col)
    used = raw != 0
    width = raw.shape[1]
    lengths = np.where(used.any(axis=1), width - np.argmax(used[:, ::-1], axis=1), 0)
    strings = _strings(lengths, raw[np.arange(width) < lengths[:, None]])  # row-major: each value in order
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        row = next(i for i, value in enumerate(col) if not _is_utf8(value))  # the error path only
        raise SchemaError(
            f"column {name!r} ({col.dtype.str}) holds bytes that are not UTF-8 text, e.g. row {row}: {col[row]!r}; "
            f"'S' columns are written as text: declare the field 'V{width}' to write raw bytes"
        ) from None
    return strings


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True


class _ArrowFile:
    """A file, or with `transactional=True` a directory of part files that checkpoints publish
    (`part-<checkpoint>-<executor><suffix>`, see `slashrt.snapshot.commit.PartFiles`)."""

    hex_bytes = False  # how V<n> columns are written: raw binary, or hex text
    suffix = ""

    def __init__(self, path, *, transactional: bool = False, executor: int = 0):
        self.path = Path(path)
        self.transactional = transactional
        self._transactions = PartFiles(self.path, executor, self.suffix) if transactional else NotTransactional(self)
        self._writer = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}{', transactional=True' if self.transactional else ''})"

    def for_executor(self, index: int):
        """Executor `index`'s part file in a multi-executor run: out.csv -> out-1.csv (a
        transactional sink: the same directory, the index in the part files' names)."""
        if self.transactional:
            return type(self)(self.path, transactional=True, executor=index)
        return type(self)(self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}"))

    def open(self) -> None:
        self._writer = None
        if self.transactional:
            self._transactions.open()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, records: np.ndarray) -> None:
        table = to_arrow(records, hex_bytes=self.hex_bytes)
        if self._writer is None:
            path = self._transactions.open_path if self.transactional else self.path
            self._writer = self._make_writer(str(path), table.schema)
        self._writer.write_table(table)

    # two-phase commit (transactional=True): see slashrt.snapshot.commit
    def pre_commit(self, checkpoint: int) -> None:
        self.close()  # a Parquet file is whole only with its footer
        self._transactions.pre_commit(checkpoint)

    def commit(self, checkpoint: int) -> None:
        self._transactions.commit(checkpoint)

    def abort(self, checkpoint: int) -> None:
        self._transactions.abort(checkpoint)

    def pending(self) -> list[int]:
        return self._transactions.pending()

    def published(self) -> int | None:
        """The highest checkpoint published in the directory (`slashrt.snapshot.published`)."""
        return self._transactions.published() if self.transactional else None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class CsvFile(_ArrowFile):
    """Write records to a CSV file with a header line (`S<n>` columns as text, `V<n>` as hex)."""

    default_name = "csv"
    hex_bytes = True
    suffix = ".csv"

    def _make_writer(self, path: str, schema):
        import pyarrow.csv

        return pyarrow.csv.CSVWriter(path, schema)


class ParquetFile(_ArrowFile):
    """Write records to a Parquet file (`S<n>` columns as strings, `V<n>` as fixed-size binary)."""

    default_name = "parquet"
    suffix = ".parquet"

    def _make_writer(self, path: str, schema):
        import pyarrow.parquet

        return pyarrow.parquet.ParquetWriter(path, schema)


class SinkNode(Node):
    """Feeds one sink; errors raised by the sink name its step.

    A sink may also be asynchronous and stream-aware (see `slashrt.ops.exchange.ChannelSink`):
    then `awrite(records)` replaces `write`, and `awatermark(w)` / `aend()` receive the
    stream's watermarks and its end."""

    def __init__(self, step_id: str, sink, dtype: np.dtype | None = None):
        super().__init__(step_id)
        self.sink = sink
        if dtype is not None and callable(getattr(sink, "expect", None)):
            sink.expect(dtype)  # the dtype of the stream, so an empty result has it
        for method in ("open", "close"):
            if not callable(getattr(sink, method, None)):
                raise TypeError(f"step {step_id!r}: sink {sink!r} has no {method}() method")
        if getattr(sink, "awrite", None) is None and not callable(getattr(sink, "write", None)):
            raise TypeError(f"step {step_id!r}: sink {sink!r} has no write() or awrite() method")
        self._dtype = getattr(sink, "dtype", None)  # the record layout the sink wants, if any
        self.latency: LatencyHistogram | None = None  # its rows' latency, when the run measures it
        self._time: tuple[str, float] | None = None

    def measure_latency(self, time: str, ms_per_unit: float) -> None:
        """Count every row's latency from now on: the wall clock minus its event time (column
        `time`, in units of `ms_per_unit` milliseconds), see `slashrt._latency`."""
        self.latency, self._time = LatencyHistogram(), (time, ms_per_unit)

    @property
    def forwards_watermarks(self) -> bool:
        """Does the sink pass the stream's watermarks on (`awatermark`)? Then each is news."""
        return getattr(self.sink, "awatermark", None) is not None

    def open(self) -> None:
        self.sink.open()

    async def aopen(self) -> None:
        """`open` from the executor's loop: a broker's sink opens from its worker thread."""
        await call_async(self.sink, "open")

    async def push(self, batch: Batch) -> None:
        try:
            records = batch.to_numpy(self._dtype)
            if self._time is not None and self._time[0] in (records.dtype.names or ()):
                self.latency.record_times(records[self._time[0]], self._time[1])
            # looked up now: an agent replaces the sink by its executor's (`for_executor`)
            if (awrite := getattr(self.sink, "awrite", None)) is not None:
                await awrite(records)
            else:
                self.sink.write(records)
        except OperatorError:
            raise
        except Exception as exc:
            raise OperatorError(self.step_id, f"sink failed: {type(exc).__name__}: {exc}") from exc

    async def on_watermark(self, watermark: int) -> None:
        if (forward := getattr(self.sink, "awatermark", None)) is not None:
            await forward(watermark)

    async def on_end(self) -> None:
        if (end := getattr(self.sink, "aend", None)) is not None:
            await end()

    def close(self) -> None:
        self.sink.close()

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    # What a sink has written is not state: output since the last barrier is replayed after a
    # recovery, and a two-phase-commit sink's committed output is published for good. Its state
    # is its pending transactions (pre-committed, not yet committed): their checkpoint numbers,
    # and for a transactional Collect, whose pending records only memory holds, the records.
    # (File sinks keep pending output in durable part files; `recover` settles them on restore.)
    STATE_KIND, STATE_VERSION = "sink", 1

    def _pending_records(self):
        transactions = getattr(self.sink, "_transactions", None)
        return transactions if isinstance(transactions, PendingRecords) else None

    def snapshot(self) -> State:
        pending = list(getattr(self.sink, "pending", lambda: [])())
        memory = self._pending_records()
        arrays = {}
        if memory is not None:
            batches = memory.pending_records()
            parts = [np.concatenate(batches[n]) if batches[n] else np.empty(0, self._dtype) for n in pending]
            if parts:
                arrays["pending.records"] = np.concatenate(parts)
                arrays["pending.bounds"] = np.cumsum([0, *map(len, parts)]).astype(np.int64)
        return tagged(self.STATE_KIND, self.STATE_VERSION, arrays, step=self.step_id, pending=pending)

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        memory = self._pending_records()
        if memory is not None:
            records, bounds = state.arrays.get("pending.records"), state.arrays.get("pending.bounds")
            memory.restore_pending({
                n: [np.array(records[bounds[i] : bounds[i + 1]])] for i, n in enumerate(meta["pending"])
            } if records is not None else {})

    @property
    def state_bytes(self) -> int:
        memory = self._pending_records()
        if memory is None:
            return 0
        return sum(b.nbytes for parts in memory.pending_records().values() for b in parts)
