"""Schema: named fixed-size fields mapped to a packed, little-endian numpy structured dtype.

Records are fixed-size and laid back to back in buffers, so a schema is nothing more than an
ordered list of (name, dtype) pairs with no padding between fields. `Schema.conform` brings
an input array to that layout (or says, naming the field, why it cannot).
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
    if dt.kind == "U":
        raise SchemaError(
            f"field {name!r}: {spec!r} is a str (unicode) type; records hold bytes: use a fixed-size bytes type "
            f"such as 'S{max(dt.itemsize // 4, 1) if dt.itemsize else 16}' and encode the text"
        )
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
        """Raise SchemaError unless records of `dtype` can be read as this schema's as they are:
        its fields at the same offsets, with the same sizes and kinds, little-endian."""
        dtype = np.dtype(dtype)
        self._check_fields(dtype, what)
        for name in self.names:
            got, off = dtype.fields[name][:2]
            want_off = self.dtype.fields[name][1]
            if off != want_off:
                raise SchemaError(
                    f"{what}: field {name!r} is at byte offset {off}, expected {want_off}: the fields are in another "
                    f"order or packed differently ({_layout(dtype)}; the schema is {_layout(self.dtype)})"
                )
            if got.byteorder == ">" or (got.byteorder == "=" and not _LITTLE):
                raise SchemaError(f"{what}: field {name!r} is big-endian ({got.str}); records are little-endian")
        if dtype.itemsize != self.record_size:
            raise SchemaError(
                f"{what}: records are {dtype.itemsize} bytes, the schema's {self.record_size}: the input has bytes "
                f"beyond the schema's fields ({_layout(dtype)})"
            )

    def conform(self, records: np.ndarray, what: str) -> np.ndarray:
        """`records` as a contiguous array of this schema's layout.

        An array that already has it is returned as it is (no copy). One whose fields have the
        right names and kinds but another order, packing or byte order (big-endian) is gathered
        field by field into a new array, once; a datetime64 field for an integer one becomes
        milliseconds since the epoch. Anything else raises SchemaError naming the field."""
        dtype = records.dtype
        if dtype.names is None:
            raise SchemaError(f"{what}: expected a structured array with fields {list(self.names)}, got dtype {dtype}")
        try:
            self.check_compatible(dtype, what)
            return np.ascontiguousarray(records)
        except SchemaError:
            self._check_fields(dtype, what, convert=True)
        extra = [n for n in dtype.names if n not in self.dtype.fields]
        if extra:
            raise SchemaError(
                f"{what}: fields {extra} are not in the schema {list(self.names)}; pass records[{list(self.names)}] "
                "to leave them out"
            )
        out = np.empty(records.shape, self.dtype)
        for name in self.names:
            got, want = dtype.fields[name][0], self.dtype.fields[name][0]
            column = records[name]
            if got.kind == "M":
                column = column.astype("M8[ms]").view("<i8")
            elif got.kind in "SV" and got.kind != want.kind:
                column = column.view(want)
            out[name] = column
        return out

    def _check_fields(self, dtype: np.dtype, what: str, *, convert: bool = False) -> None:
        """Every field of the schema is in `dtype` with a kind and size that fit; with `convert`,
        a datetime64 field also fits an int64 one (its milliseconds)."""
        if dtype.names is None:
            raise SchemaError(f"{what}: expected a structured array with fields {list(self.names)}, got dtype {dtype}")
        for name in self.names:
            if name not in dtype.fields:
                raise SchemaError(f"{what}: missing field {name!r} (has {list(dtype.names)}; the schema is {_layout(self.dtype)})")
            got, want = dtype.fields[name][0], self.dtype.fields[name][0]
            if got.kind == "U":
                raise SchemaError(
                    f"{what}: field {name!r} is a str array ({got.str}), the schema's is {want.str}: encode it, "
                    f"e.g. records[{name!r}].astype({want.str!r})"
                )
            if got.kind == "M" and (not convert or want.kind != "i" or want.itemsize != 8):
                raise SchemaError(
                    f"{what}: field {name!r} is {got} and the schema's is {want.str}: datetime64 fields are read as "
                    "milliseconds since the epoch into an 'i8' field; declare the field 'i8'"
                )
            if got.kind == "M":
                continue
            if got.kind != want.kind and not (got.kind in "SV" and want.kind in "SV"):
                raise SchemaError(f"{what}: field {name!r} has type {got.str}, expected {want.str}")
            if got.itemsize != want.itemsize:
                raise SchemaError(
                    f"{what}: field {name!r} is {got.str} ({got.itemsize} bytes), expected {want.str} ({want.itemsize} bytes)"
                )


_LITTLE = np.little_endian


def _layout(dtype: np.dtype) -> str:
    """The fields of a structured dtype as 'name: type @offset', for messages."""
    return "[" + ", ".join(f"{n}: {dtype.fields[n][0].str} @{dtype.fields[n][1]}" for n in dtype.names) + "]"
