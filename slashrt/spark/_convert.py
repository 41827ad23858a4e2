"""Arrow record batches to slashrt records, vectorised with numpy (no Python per row).

`ArrowConverter(plan)` turns each Arrow batch (columns in the order of `plan.columns`) into
packed records of the source's schema, in a staging array it keeps and reuses: each field is
one numpy assignment from the Arrow column's value buffer (read in place, no copy) into the
records' strided field; constants are written once, when the staging array is made, and never
again. Big batches are converted in blocks that stay in cache. Every batch is checked as it is
converted (nulls, integer ranges, string lengths) and a violation raises IngestSchemaError
naming the column, the field and the values, before the block is handed on.

The result views are valid until the next call (the staging array is reused).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slashrt import _kernels as kernels
from slashrt.spark._mapping import ColumnPlan, FieldPlan, IngestSchemaError, constant_bytes

__all__ = ["ArrowConverter"]

BLOCK_ROWS = 16384  # rows converted at once: ~1.3 MB of YSB records, about the size of L2

_TIME_TO_MS = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}


class ArrowConverter:
    def __init__(self, plan: ColumnPlan, *, block_rows: int = BLOCK_ROWS):
        self.plan = plan
        self.dtype = plan.schema.dtype
        self.block_rows = block_rows
        self._stage = np.zeros(0, self.dtype)
        self._columns = plan.columns
        self._writers = [self._writer(f) for f in self._columns]

    # -- staging ---------------------------------------------------------------------------------
    def _staging(self, rows: int) -> np.ndarray:
        if len(self._stage) < rows:
            stage = np.zeros(max(rows, self.block_rows), self.dtype)
            defaults = dict(self.plan.defaults)
            for f in self.plan.fields:
                if f.column is None:
                    dt = np.dtype(f.dtype)
                    value = constant_bytes(dt, defaults[f.field]) if dt.kind in "SV" else defaults[f.field]
                    if dt.kind == "V":
                        stage[f.field] = np.void(value)
                    else:
                        stage[f.field] = value
            self._stage = stage
        return self._stage[:rows]

    def convert(self, batch: pa.RecordBatch) -> Iterator[np.ndarray]:
        """Packed records of `batch`, block by block (views into the staging array)."""
        if batch.num_columns != len(self._columns):
            raise IngestSchemaError(
                f"an Arrow batch with {batch.num_columns} columns for a mapping of {len(self._columns)}"
            )
        n = batch.num_rows
        step = self.block_rows
        for start in range(0, n, step):
            part = batch if (start == 0 and n <= step) else batch.slice(start, min(step, n - start))
            out = self._staging(part.num_rows)
            for i, write in enumerate(self._writers):
                write(part.column(i), out)
            yield out

    def convert_all(self, batch: pa.RecordBatch) -> np.ndarray:
        """The whole batch as one new array (for tests and small inputs)."""
        blocks = [block.copy() for block in self.convert(batch)]
        return np.concatenate(blocks) if blocks else np.zeros(0, self.dtype)

    # -- one writer per field ------------------------------------------------------------------------
    def _writer(self, f: FieldPlan):
        dtype = np.dtype(f.dtype)
        name = f.field
        nulls = _null_guard(f)
        if f.kind == "bytes":
            return _bytes_writer(f, dtype, nulls)
        if f.kind == "bool":

            def write_bool(arr, out):
                arr = nulls(arr)
                out[name] = arr.to_numpy(zero_copy_only=False)

            return write_bool
        if f.kind == "timestamp":

            def write_time(arr, out):
                arr = nulls(arr)
                mul, div = _TIME_TO_MS[arr.type.unit]
                v = _values(arr, np.int64)
                if div == 1:
                    np.multiply(v, mul, out=out[name], casting="unsafe")
                else:
                    np.floor_divide(v, div, out=out[name], casting="unsafe")

            return write_time
        rng = f.range
        offset = self.dtype.fields[name][1]
        size = dtype.itemsize
        record = self.dtype.itemsize
        void = np.dtype(f"V{size}")

        def write_number(arr, out):
            arr = nulls(arr)
            v = _values(arr, None)
            n = len(v)
            if rng is not None and n:
                lo, hi = kernels.minmax(v) if v.dtype == np.int64 else (v.min(), v.max())
                if lo < rng[0] or hi > rng[1]:
                    raise IngestSchemaError(
                        f"{f.describe()}: values from {lo} to {hi} do not fit (the field holds {rng[0]}..{rng[1]})"
                    )
            if v.dtype.itemsize >= size and v.dtype.kind == dtype.kind or (
                rng is not None and v.dtype.itemsize >= size
            ):
                # the same type, or an integer known to fit: the field is the value's low bytes
                # (little-endian two's complement), so copy bytes, which numpy does twice as
                # fast as a typed copy into an unaligned strided field
                src = np.ndarray((n,), void, buffer=v, strides=(v.dtype.itemsize,))
                dst = np.ndarray((n,), void, buffer=out, offset=offset, strides=(record,))
                np.copyto(dst, src)
            else:  # widening: a real cast (sign extension, int to float)
                np.copyto(out[name], v, casting="unsafe")

        return write_number


def _values(arr: pa.Array, dtype) -> np.ndarray:
    """The value buffer of a primitive Arrow array without nulls, as numpy, in place."""
    if dtype is None:
        dtype = arr.type.to_pandas_dtype() if not pa.types.is_date32(arr.type) else np.int32
    dtype = np.dtype(dtype)
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _null_guard(f: FieldPlan):
    """Replace nulls by the field's fill value, or raise naming the column."""
    fill = f.fill
    if fill is None:

        def no_nulls(arr):
            if arr.null_count:
                raise IngestSchemaError(
                    f"{f.describe()}: {arr.null_count} null(s) in a batch, and slashrt fields hold no nulls "
                    f"(give fill_nulls={{{f.field!r}: VALUE}} to replace them)"
                )
            return arr

        return no_nulls
    if f.kind == "bytes":
        fill = fill.encode() if isinstance(fill, str) else bytes(fill) if fill != 0 else b""

    def filled(arr):
        if arr.null_count:
            scalar = pa.scalar(fill, type=arr.type) if f.kind != "bool" else pa.scalar(bool(fill))
            return pc.fill_null(arr, scalar)
        return arr

    return filled


def _bytes_writer(f: FieldPlan, dtype: np.dtype, nulls):
    name, width = f.field, dtype.itemsize

    def write_bytes(arr, out):
        arr = nulls(arr)
        n = len(arr)
        large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if large else np.int32, count=n + 1, offset=arr.offset * (8 if large else 4))
        lengths = np.diff(offsets)
        dest = out.view(np.uint8).reshape(n, out.dtype.itemsize)
        start = out.dtype.fields[name][1]
        dest = dest[:, start : start + width]
        if n == 0:
            return
        longest = int(lengths.max())
        if longest > width:
            row = int(np.argmax(lengths))
            raise IngestSchemaError(
                f"{f.describe()}: a value of {longest} bytes (row {row} of a batch) is longer than the field's {width}"
            )
        first, last = int(offsets[0]), int(offsets[-1])
        data = arr.buffers()[2]
        data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        data = data[first:last]
        if last - first == n * width:  # every value fills the field exactly
            dest[:] = data.reshape(n, width)
            return
        dest[:] = 0
        rows = np.repeat(np.arange(n), lengths)
        cols = np.arange(last - first) - np.repeat(offsets[:-1] - first, lengths)
        dest[rows, cols] = data

    return write_bytes
