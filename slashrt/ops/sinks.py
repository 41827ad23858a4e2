"""Sinks: where a stream's batches end up (memory, a callback, CSV or Parquet files).

A sink object is what the user holds; `SinkNode` is the runtime operator that feeds it.
Every sink has `open()`, `write(records)` with a structured numpy array, and `close()`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from slashrt._batch import Batch
from slashrt.errors import OperatorError
from slashrt.ops._node import Node

__all__ = ["Collect", "Callback", "CsvFile", "ParquetFile", "SinkNode", "to_arrow"]


class Collect:
    """Keep every record in memory; after the run, `records` holds them as one array.

    Batches are kept as they come and joined into one array when `records` is first read,
    so collecting costs one copy at most (none for batches the runtime made for the sink)."""

    default_name = "collect"

    def __init__(self):
        self._parts: list[np.ndarray] = []
        self._records: np.ndarray | None = None
        self.step_id: str | None = None

    def bind(self, step_id: str) -> None:
        self.step_id = step_id

    def open(self) -> None:
        self._parts = []
        self._records = None

    def write(self, records: np.ndarray) -> None:
        # a batch of raw input is a view into a channel slot that is reused once released
        self._parts.append(records if records.flags.owndata else records.copy())

    def close(self) -> None:
        pass

    @property
    def records(self) -> np.ndarray | None:
        """Everything collected, as one structured array (None if nothing arrived)."""
        if self._parts:
            joined = self._parts if self._records is None else [self._records, *self._parts]
            self._records = joined[0] if len(joined) == 1 else np.concatenate(joined)
            self._parts = []
        return self._records


class Callback:
    """Call `fn(records)` with each structured array that reaches the sink."""

    default_name = "callback"

    def __init__(self, fn: Callable[[np.ndarray], object]):
        self.fn = fn

    def open(self) -> None:
        pass

    def write(self, records: np.ndarray) -> None:
        self.fn(records)

    def close(self) -> None:
        pass


def to_arrow(records: np.ndarray) -> pa.Table:
    """A structured array as an Arrow table, column by column (fixed-size bytes stay binary)."""
    columns = {}
    for name in records.dtype.names:
        col = records[name]
        if col.dtype.kind in "SV":
            width = col.dtype.itemsize
            data = np.ascontiguousarray(col).view(np.uint8)
            columns[name] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(col), [None, pa.py_buffer(data)])
        else:
            columns[name] = pa.array(np.ascontiguousarray(col))
    return pa.table(columns)


class _ArrowFile:
    def __init__(self, path):
        self.path = Path(path)
        self._writer = None

    def for_executor(self, index: int):
        """Executor `index`'s part file in a multi-executor run: out.csv -> out-1.csv."""
        return type(self)(self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}"))

    def open(self) -> None:
        self._writer = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, records: np.ndarray) -> None:
        table = to_arrow(records)
        if self._writer is None:
            self._writer = self._make_writer(table.schema)
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class CsvFile(_ArrowFile):
    """Write records to a CSV file with a header line."""

    default_name = "csv"

    def _make_writer(self, schema):
        import pyarrow.csv

        return pyarrow.csv.CSVWriter(str(self.path), schema)


class ParquetFile(_ArrowFile):
    """Write records to a Parquet file."""

    default_name = "parquet"

    def _make_writer(self, schema):
        import pyarrow.parquet

        return pyarrow.parquet.ParquetWriter(str(self.path), schema)


class SinkNode(Node):
    """Feeds one sink; errors raised by the sink name its step.

    A sink may also be asynchronous and stream-aware (see `slashrt.ops.exchange.ChannelSink`):
    then `awrite(records)` replaces `write`, and `awatermark(w)` / `aend()` receive the
    stream's watermarks and its end."""

    def __init__(self, step_id: str, sink):
        super().__init__(step_id)
        self.sink = sink
        for method in ("open", "close"):
            if not callable(getattr(sink, method, None)):
                raise TypeError(f"step {step_id!r}: sink {sink!r} has no {method}() method")
        self._awrite = getattr(sink, "awrite", None)
        if self._awrite is None and not callable(getattr(sink, "write", None)):
            raise TypeError(f"step {step_id!r}: sink {sink!r} has no write() or awrite() method")
        self._dtype = getattr(sink, "dtype", None)  # the record layout the sink wants, if any

    def open(self) -> None:
        self.sink.open()

    async def push(self, batch: Batch) -> None:
        try:
            records = batch.to_numpy(self._dtype)
            if self._awrite is not None:
                await self._awrite(records)
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
