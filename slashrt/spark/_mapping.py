"""Spark columns to slashrt fields: the explicit type table and the checks made before sending.

Every field of the target source gets exactly one DataFrame column (or a constant default).
The Spark type of that column decides how it converts; anything not in the table below is
refused with an error naming the column, its Spark type and what the field accepts:

    Spark type                slashrt field                     notes
    ------------------------  --------------------------------  -----------------------------------
    byte, short, int, long    any integer (i1..i8, u1..u8)      values checked to fit when the field
                                                                is narrower or unsigned
    float                     f4, f8
    double                    f8
    boolean                   b1, u1, i1                        true -> 1
    timestamp, timestamp_ntz  i8                                milliseconds since the epoch (floor)
    date                      i4, i8                            days since the epoch
    string, binary            S<n>, V<n>                        bytes (UTF-8 for strings), zero-padded
                                                                to n; longer is an error

Nulls: slashrt records have no nulls. A null in a column is an error unless the mapping gives
a value for it (`fill_nulls={field: value}`).

`plan_columns` makes the static checks (missing columns, types) from the DataFrame's schema
alone, on the driver, at once. `data_checks` lists what depends on the data (nulls in nullable
columns, string lengths, integer ranges); `ingest` evaluates them in one Spark aggregation
before any task connects, so bad input is reported before anything is sent. The tasks repeat
the same checks per Arrow batch (vectorised), as a second line of defence.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from slashrt._schema import Schema
from slashrt.errors import SchemaError

__all__ = ["IngestSchemaError", "FieldPlan", "ColumnPlan", "plan_columns", "SPARK_TYPES"]


class IngestSchemaError(SchemaError):
    """A DataFrame does not fit the target source (missing column, wrong type, bad value)."""


INTEGRAL = {"byte": np.int8, "short": np.int16, "integer": np.int32, "long": np.int64}

# Spark type name -> (conversion kind, numpy kinds of the fields it may fill, what to say)
SPARK_TYPES = {
    **{name: ("int", "iu", "any integer field") for name in INTEGRAL},
    "float": ("float", "f", "f4 or f8"),
    "double": ("float", "f", "f8"),
    "boolean": ("bool", "biu", "b1, u1 or i1"),
    "timestamp": ("timestamp", "i", "i8 (milliseconds)"),
    "timestamp_ntz": ("timestamp", "i", "i8 (milliseconds)"),
    "date": ("date", "i", "i4 or i8 (days)"),
    "string": ("bytes", "SV", "S<n> or V<n>"),
    "binary": ("bytes", "SV", "S<n> or V<n>"),
}


@attrs.frozen
class FieldPlan:
    """How one field of the source is filled."""

    field: str
    dtype: str  # the field's numpy type string
    column: str | None  # the DataFrame column, None for a constant
    spark_type: str  # Spark's type name of the column ("const" for a constant)
    kind: str  # int | float | bool | timestamp | date | bytes | const
    nullable: bool  # Spark says the column may hold nulls
    fill: object = None  # the value that replaces nulls; None: a null is an error
    range: tuple[int, int] | None = None  # integers: the field's bounds, when narrower than the column's

    @property
    def width(self) -> int:
        return np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        return f"column {self.column!r} ({self.spark_type}) -> field {self.field!r} ({np.dtype(self.dtype)})"


@attrs.frozen
class ColumnPlan:
    """The whole mapping: one FieldPlan per source field, in the source's field order."""

    fields: tuple[FieldPlan, ...]
    record_fields: tuple[tuple[str, str], ...]  # the source schema as (name, type) pairs
    source: str
    defaults: tuple[tuple[str, object], ...] = ()

    @property
    def schema(self) -> Schema:
        return Schema(list(self.record_fields))

    @property
    def columns(self) -> list[FieldPlan]:
        """The fields filled from a column, in the order of the UDF's input columns."""
        return [f for f in self.fields if f.column is not None]

    def data_checks(self) -> list[tuple[str, FieldPlan]]:
        """What only the data can tell: ("nulls" | "length" | "range", field plan) pairs."""
        checks = []
        for f in self.columns:
            if f.nullable and f.fill is None:
                checks.append(("nulls", f))
            if f.kind == "bytes":
                checks.append(("length", f))
            if f.range is not None:
                checks.append(("range", f))
        return checks


def _spark_type_name(data_type) -> str:
    name = data_type.typeName()
    return "timestamp_ntz" if name in ("timestamp_ntz", "timestampntz") else name


def plan_columns(
    spark_schema,
    schema: Schema,
    columns: Mapping[str, str] | None = None,
    *,
    defaults: Mapping[str, object] | None = None,
    fill_nulls: Mapping[str, object] | None = None,
    source: str = "events",
) -> ColumnPlan:
    """Map a DataFrame's columns (its Spark StructType) onto `schema`, or raise
    IngestSchemaError saying what does not fit.

    `columns` maps DataFrame column -> source field; fields it does not mention take the
    column of the same name. `defaults` gives a constant for fields no column fills;
    `fill_nulls` a value for nulls in a field's column."""
    columns = dict(columns or {})
    defaults = dict(defaults or {})
    fill_nulls = dict(fill_nulls or {})
    spark_fields = {f.name: f for f in spark_schema.fields}
    names = list(spark_fields)
    where = f"source {source!r}"

    for what, mapping in (("defaults", defaults), ("fill_nulls", fill_nulls)):
        for field in mapping:
            if field not in schema:
                raise IngestSchemaError(f"{what} names field {field!r}, which {where} does not have (fields: {list(schema.names)})")
    by_field: dict[str, str] = {}
    for column, field in columns.items():
        if column not in spark_fields:
            raise IngestSchemaError(f"the DataFrame has no column {column!r} (its columns: {names})")
        if field not in schema:
            raise IngestSchemaError(
                f"column {column!r} is mapped to field {field!r}, which {where} does not have (fields: {list(schema.names)})"
            )
        if field in by_field:
            raise IngestSchemaError(f"field {field!r} is mapped from two columns: {by_field[field]!r} and {column!r}")
        if field in defaults:
            raise IngestSchemaError(f"field {field!r} has both a column ({column!r}) and a default")
        by_field[field] = column

    plans = []
    for field in schema.names:
        dtype = schema.field(field)
        column = by_field.get(field)
        if column is None and field not in defaults:
            if field in spark_fields:
                column = field
            else:
                raise IngestSchemaError(
                    f"the DataFrame has no column for field {field!r} of {where}: no column {field!r} "
                    f"and none mapped to it (its columns: {names}); map one with columns={{COLUMN: {field!r}}} "
                    f"or give defaults={{{field!r}: VALUE}}"
                )
        if column is None:
            _check_constant(field, dtype, defaults[field])
            plans.append(FieldPlan(field, dtype.str, None, "const", "const", False))
            continue
        sf = spark_fields[column]
        spark_type = _spark_type_name(sf.dataType)
        entry = SPARK_TYPES.get(spark_type)
        if entry is None:
            raise IngestSchemaError(
                f"column {column!r} has Spark type {sf.dataType.simpleString()}, which slashrt does not convert "
                f"(field {field!r} is {dtype}); convertible types: {sorted(SPARK_TYPES)}"
            )
        kind, field_kinds, accepts = entry
        if not _accepts(kind, spark_type, dtype, field_kinds):
            raise IngestSchemaError(
                f"column {column!r} has Spark type {sf.dataType.simpleString()}, which cannot fill field {field!r} "
                f"of type {dtype} ({spark_type} fills {accepts})"
            )
        fill = fill_nulls.get(field)
        if fill is not None:
            _check_constant(field, dtype, fill)
        rng = None
        if kind == "int":
            info, src = np.iinfo(dtype), np.iinfo(INTEGRAL[spark_type])
            if info.min > src.min or info.max < src.max:
                rng = (int(info.min), int(info.max))
        plans.append(FieldPlan(field, dtype.str, column, spark_type, kind, bool(sf.nullable), fill, rng))
    return ColumnPlan(tuple(plans), tuple((n, schema.field(n).str) for n in schema.names), source,
                      tuple(sorted(defaults.items())))


def _accepts(kind: str, spark_type: str, dtype: np.dtype, field_kinds: str) -> bool:
    if dtype.kind not in field_kinds:
        return False
    if kind == "float":
        return dtype.itemsize == 8 or spark_type == "float"
    if kind == "bool":
        return dtype.itemsize == 1
    if kind == "timestamp":
        return dtype.itemsize == 8
    if kind == "date":
        return dtype.itemsize >= 4
    return True


def constant_bytes(dtype: np.dtype, value) -> bytes | None:
    """A bytes field's constant as zero-padded bytes (None if it is not bytes-like or 0)."""
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, (bytes, bytearray)) and len(value) <= dtype.itemsize:
        return bytes(value).ljust(dtype.itemsize, b"\0")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value == 0:
        return bytes(dtype.itemsize)
    return None


def _check_constant(field: str, dtype: np.dtype, value) -> None:
    if dtype.kind in "SV":
        if constant_bytes(dtype, value) is None:
            raise IngestSchemaError(f"value {value!r} does not fit field {field!r} of type {dtype}: give bytes of at most {dtype.itemsize}")
        return
    try:
        arr = np.array(value)
        if dtype.kind in "iu" and (arr.dtype.kind not in "iub" or not np.can_cast(np.min_scalar_type(value), dtype)):
            raise ValueError
        np.array([value], dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        raise IngestSchemaError(f"value {value!r} does not fit field {field!r} of type {dtype}") from None
