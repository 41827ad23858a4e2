"""Schema: named fixed-size fields mapped to a packed, little-endian numpy structured dtype.

Records are fixed-size and laid back to back in buffers, so a schema is nothing more than an
ordered list of (name, dtype) pairs with no padding between fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from slashrt.errors import SchemaError

__all__ = ["Schema"]


def _field_dtype(name: str, spec) -> np.dtype:
    try:
        dt = np.dtype(spec)
    except TypeError as exc:
        raise SchemaError(f"field {name!r}: {spec!r} is not a numpy dtype") from exc
    if dt.hasobject or dt.itemsize == 0 or dt.fields is not None or dt.subdtype is not None:
        raise SchemaError(f"field {name!r}: {dt} is not a fixed-size scalar type")
    # Fixed little-endian layout on the wire, whatever the host order.
    return dt.newbyteorder("<") if dt.byteorder not in ("|", "<", "=") else dt


class Schema:
    """An ordered set of fixed-size fields.

    >>> s = Schema({"t": "i8", "key": "i8", "flag": "u1"})
    >>> s.record_size
    17
    """

    def __init__(self, fields: Mapping[str, object] | Iterable[tuple[str, object]]):
        items = list(fields.items() if isinstance(fields, Mapping) else fields)
        if not items:
            raise SchemaError("a schema needs at least one field")
        names = [name for name, _ in items]
        if len(set(names)) != len(names):
            raise SchemaError(f"duplicate field names in {names}")
        for name in names:
            if not isinstance(name, str) or not name:
                raise SchemaError(f"field names must be non-empty strings, got {name!r}")
        self.dtype = np.dtype([(name, _field_dtype(name, spec)) for name, spec in items], align=False)

    @classmethod
    def from_dtype(cls, dtype: np.dtype) -> Schema:
        dtype = np.dtype(dtype)
        if dtype.names is None:
            raise SchemaError(f"{dtype} is not a structured dtype")
        schema = cls([(n, dtype.fields[n][0]) for n in dtype.names])
        return schema

    @property
    def names(self) -> tuple[str, ...]:
        return self.dtype.names

    @property
    def record_size(self) -> int:
        return self.dtype.itemsize

    def __contains__(self, name: str) -> bool:
        return name in self.dtype.names

    def field(self, name: str) -> np.dtype:
        try:
            return self.dtype.fields[name][0]
        except KeyError:
            raise SchemaError(f"no field {name!r} in schema with fields {list(self.names)}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash(self.dtype)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {self.dtype.fields[n][0].str}" for n in self.names)
        return f"Schema({{{inner}}})"

    def check_compatible(self, dtype: np.dtype, what: str) -> None:
        """Raise SchemaError unless `dtype` has this schema's fields at the same offsets and sizes."""
        dtype = np.dtype(dtype)
        if dtype.names is None:
            raise SchemaError(f"{what}: expected a structured array with fields {list(self.names)}, got dtype {dtype}")
        if dtype.itemsize != self.record_size:
            raise SchemaError(f"{what}: record size is {dtype.itemsize} bytes, expected {self.record_size}")
        for name in self.names:
            if name not in dtype.fields:
                raise SchemaError(f"{what}: missing field {name!r} (has {list(dtype.names)})")
            got, off = dtype.fields[name][:2]
            want, want_off = self.dtype.fields[name][:2]
            if off != want_off or got.itemsize != want.itemsize:
                raise SchemaError(
                    f"{what}: field {name!r} is {got.str} at offset {off}, expected {want.str} at offset {want_off}"
                )
            if got.kind != want.kind and not (got.kind in "SV" and want.kind in "SV"):
                raise SchemaError(f"{what}: field {name!r} has type {got.str}, expected {want.str}")
