"""Arrow columns into a structured array of a record dtype: the inverse of
`slashrt.ops.sinks.to_arrow`, so files our sinks write read back alike.

Column by column, vectorised (Arrow casts, or numpy over the values' offsets and bytes):

    integer, float, bool fields   Arrow numbers, cast safely (an overflow is a bad value);
                                  an 'i8' field also takes a timestamp, as milliseconds since
                                  the epoch (as `Schema.conform` reads datetime64)
    S<n>                          strings or binary of up to n bytes, padded with NUL
    V<n>                          fixed-size binary of n bytes (or binary values of n bytes);
                                  in text formats, hex (two digits a byte)

A text format (CSV) has every column read as text: numbers are parsed by the Arrow cast.
`unconvertible` says why a column's type cannot fill a field (checked once per file);
`to_records` raises `BadValue` naming the first row that cannot be converted.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["BadValue", "to_records", "unconvertible"]


class BadValue(Exception):
    """Row `row` of a batch (the rows before it are good) holds a value its field cannot take;
    the message names the column and the value, the caller the place."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row = row


def _binary_like(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def unconvertible(arrow_type: pa.DataType, field: np.dtype, *, text: bool) -> str | None:
    """None if a column of `arrow_type` can fill a field of dtype `field`, else what it needs."""
    if text:  # every column is read as text and parsed by an Arrow cast
        if field.kind in "biufSV":
            return None
        return f"is text, the field is {field.str}: text is read into number, bool or bytes fields only (declare it 'i8')"
    if pa.types.is_dictionary(arrow_type):  # dictionary-encoded (a pandas categorical): its values
        arrow_type = arrow_type.value_type
    kind = field.kind
    if kind == "b":
        ok = pa.types.is_boolean(arrow_type)
    elif kind in "iu":
        ok = pa.types.is_integer(arrow_type) or (pa.types.is_timestamp(arrow_type) and field == np.dtype("<i8"))
    elif kind == "f":
        ok = pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
    elif kind == "S":
        ok = _binary_like(arrow_type) or pa.types.is_fixed_size_binary(arrow_type)
    elif kind == "V":
        ok = _binary_like(arrow_type) and not pa.types.is_string(arrow_type) and not pa.types.is_large_string(arrow_type)
        ok = ok or (pa.types.is_fixed_size_binary(arrow_type) and arrow_type.byte_width == field.itemsize)
    elif kind == "M":
        ok = pa.types.is_timestamp(arrow_type)
    else:
        ok = False
    if ok:
        return None
    wants = {
        "b": "a boolean column",
        "i": "an integer column" + (" (or a timestamp, read as milliseconds)" if field == np.dtype("<i8") else ""),
        "u": "an integer column",
        "f": "an integer or floating-point column",
        "S": f"a string or binary column of values up to {field.itemsize} bytes",
        "V": f"a binary column of {field.itemsize}-byte values",
        "M": "a timestamp column",
    }.get(kind, "a column type slashrt does not read")
    return f"is {arrow_type}, the field is {field.str}: it needs {wants}"


def to_records(batch, dtype: np.dtype, *, text: bool) -> np.ndarray:
    """`batch` (an Arrow RecordBatch or Table holding at least `dtype`'s fields, of types that
    `unconvertible` accepts) as a new contiguous array of `dtype`."""
    out = np.empty(batch.num_rows, dtype)
    for name in dtype.names:
        column = batch.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        out[name] = _column(name, column, dtype.fields[name][0], text)
    return out


def _column(name: str, array: pa.Array, field: np.dtype, text: bool) -> np.ndarray:
    if array.null_count:
        row = int(np.argmax(array.is_null().to_numpy(zero_copy_only=False)))
        raise BadValue(row, f"column {name!r} has no value (records have no nulls)")
    if field.kind == "S":
        return _fixed(name, array, field, pad=True)
    if field.kind == "V":
        return _unhex(name, array, field) if text else _fixed(name, array, field, pad=False)
    if pa.types.is_timestamp(array.type) and field.kind in "iu":
        array = array.cast(pa.timestamp("ms", tz=array.type.tz), safe=False).cast(pa.int64())
    native = field.newbyteorder("=")
    target = pa.from_numpy_dtype(native)
    if array.type != target:
        try:
            array = array.cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            row = _first_failing(array, target)  # the error path only
            raise BadValue(row, f"column {name!r} has {_shown(array[row])}, not a {field.str} value") from None
    return _numbers(array, native)


def _numbers(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """A numeric or boolean Arrow array without nulls, of `dtype`'s type, as numpy, read from
    its data buffer (a view for numbers). Not `Array.to_numpy`: its first call in a process
    imports pandas, 0.15 s that every freshly forked executor reading a file would spend
    inside its run."""
    data = array.buffers()[1]
    if data is None:  # (an empty array may have none)
        return np.empty(0, dtype)
    if pa.types.is_boolean(array.type):  # (bit-packed, least significant bit first)
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        return bits[array.offset : array.offset + len(array)].view(np.bool_)
    return np.frombuffer(data, dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _first_failing(array: pa.Array, target: pa.DataType) -> int:
    """The first row whose value does not cast (bisecting on casts of halves)."""
    lo, hi = 0, len(array)  # the failure is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            array.slice(lo, mid - lo).cast(target, safe=True)
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
    return lo


def _shown(scalar: pa.Scalar) -> str:
    value = scalar.as_py()
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            pass
    return repr(value)


def _values(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, concatenated bytes) of a string or binary array without nulls."""
    if pa.types.is_fixed_size_binary(array.type):
        width = array.type.byte_width
        data = np.frombuffer(array.buffers()[1], np.uint8)[array.offset * width : (array.offset + len(array)) * width]
        return np.full(len(array), width, np.int64), data
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], np.int64 if large else np.int32)[array.offset : array.offset + len(array) + 1]
    buffer = array.buffers()[2]
    data = np.frombuffer(buffer, np.uint8) if buffer is not None else np.empty(0, np.uint8)
    return np.diff(offsets).astype(np.int64), data[offsets[0] : offsets[-1]]


def _fixed(name: str, array: pa.Array, field: np.dtype, *, pad: bool) -> np.ndarray:
    """String or binary values as n-byte values: padded with NUL up to n (`pad`, for S<n>) or
    exactly n bytes each (V<n>)."""
    width = field.itemsize
    lengths, data = _values(array)
    bad = lengths > width if pad else lengths != width
    if bad.any():
        row = int(np.argmax(bad))
        raise BadValue(row, f"column {name!r} has a value of {lengths[row]} bytes, the field is "
                            f"{field.str} ({width} bytes{'' if pad else ' each'})")
    if len(data) == width * len(lengths):  # every value n bytes (fixed-size binary): as they are
        return data.view(field)
    matrix = np.zeros((len(lengths), width), np.uint8)
    matrix[np.arange(width) < lengths[:, None]] = data  # row-major: each value's bytes in order
    return matrix.view(field).reshape(len(lengths))


def _pair_table() -> np.ndarray:
    """Two hex digits, read as one little-endian uint16, -> their byte; 256 for anything else."""
    digit = np.full(256, -1, np.int16)
    for chars, first in ((b"0123456789", 0), (b"abcdef", 10), (b"ABCDEF", 10)):
        digit[np.frombuffer(chars, np.uint8)] = np.arange(first, first + len(chars))
    high, low = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    ok = (digit[high] >= 0) & (digit[low] >= 0)
    table = np.full(65536, 256, np.uint16)
    table[(high | low << 8)[ok]] = (digit[high] * 16 + digit[low])[ok]
    return table


_HEX_PAIR = _pair_table()


def _unhex(name: str, array: pa.Array, field: np.dtype) -> np.ndarray:
    """Hex text (two digits a byte, as `to_arrow` writes V<n>) as n-byte values: one table
    lookup per pair of digits."""
    width = field.itemsize
    lengths, data = _values(array)
    bad = lengths != 2 * width
    if not bad.any():
        raw = _HEX_PAIR[data.view("<u2")]
        if (raw > 255).any():
            bad = (raw.reshape(len(lengths), width) > 255).any(axis=1)
    if bad.any():
        row = int(np.argmax(bad))
        raise BadValue(row, f"column {name!r} has {_shown(array[row])}, not {width} bytes in hex "
                            f"({2 * width} hex digits) for its field {field.str}")
    return raw.astype(np.uint8).view(field)
