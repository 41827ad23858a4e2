"""The dataflow data model: a graph of named steps, built with a fluent API, run elsewhere.

Nothing here executes anything. `Dataflow` records step specifications; `slashrt._plan`
turns them into runtime operators. Every step has a dotted step id (``"ysb.views"``) that
appears in errors, logs, metrics and snapshot keys.

    flow = Dataflow("ysb")
    events = flow.source("events", YSB_SCHEMA, time="event_time", max_delay=1000)
    counts = (events.filter(lambda b: b["event_type"] == 0)
                    .with_column("campaign_id", lambda b: ads[b["ad_id"]])
                    .window(Tumbling(seconds=10))
                    .count(key="campaign_id"))
    counts.sink(sinks.Collect())
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import attrs
import numpy as np

from slashrt._schema import Schema
from slashrt.errors import DataflowError, SchemaError
from slashrt.ssb.crdt import AggKind, result_dtype

__all__ = ["Dataflow", "Stream", "WindowedStream", "OVERFLOWS", "TIME_UNITS"]

OVERFLOWS = ("wrap", "error")  # what sum(overflow=) accepts
# units of event-time columns a source may declare, with the words its messages use for them
TIME_UNITS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")

Fields = dict[str, "np.dtype | None"]  # column name -> dtype (None: known only at run time)

# the largest out-of-orderness bound: event time (int64 ms) minus it stays an int64
MAX_DELAY = 2**62


def packed_dtype(fields: Fields) -> np.dtype | None:
    """The packed record dtype of a stream with these columns (None while a column's type is
    known only at run time)."""
    if any(dt is None for dt in fields.values()):
        return None
    return np.dtype([(name, dt) for name, dt in fields.items()])


@attrs.frozen
class SourceSpec:
    step_id: str
    schema: Schema
    time: str | None
    max_delay: int


@attrs.frozen
class ApplySpec:
    step_id: str
    up: str
    fn: Callable
    fields: Fields  # what the function promises to return


@attrs.frozen
class FilterSpec:
    step_id: str
    up: str
    predicate: Callable


@attrs.frozen
class WithColumnSpec:
    step_id: str
    up: str
    name: str
    fn: Callable
    dtype: np.dtype | None


@attrs.frozen
class ProjectSpec:
    step_id: str
    up: str
    names: tuple[str, ...]


@attrs.frozen
class WindowAggSpec:
    step_id: str
    up: str
    assigner: object  # slashrt.ops.window.Tumbling | Sliding
    time: str
    key: str
    column: str | None
    kind: AggKind
    output: str
    late: object | None  # a sink for late records, or None
    value_dtype: np.dtype | None  # accumulator type (int64 or float64); None: decided at run time
    late_dtype: np.dtype | None = None  # the records the late sink sees (the window's input)
    key_dtype: np.dtype | None = None  # the key column's type, kept in the result; None: int64
    overflow: str = "wrap"  # an int64 sum leaving the range: "wrap" or "error"


@attrs.frozen
class SinkSpec:
    step_id: str
    up: str
    sink: object
    dtype: np.dtype | None = None  # the records the sink sees, when every column's type is known


class Dataflow:
    """A named graph of steps. Build it with `source` and the `Stream` methods, then `slashrt.run`."""

    def __init__(self, name: str):
        if not _NAME.match(name):
            raise DataflowError(f"dataflow name {name!r} must be an identifier-like string")
        self.name = name
        self.steps: dict[str, object] = {}
        self._counter = 0

    def _step_id(self, name: str | None, default: str) -> str:
        if name is None:
            self._counter += 1
            name = f"{default}_{self._counter}"
        if not _NAME.match(name):
            raise DataflowError(f"step name {name!r} must be an identifier-like string")
        step_id = f"{self.name}.{name}"
        if step_id in self.steps:
            raise DataflowError(f"step id {step_id!r} is used twice")
        return step_id

    def _add(self, spec) -> str:
        self.steps[spec.step_id] = spec
        return spec.step_id

    def source(
        self,
        name: str,
        schema: Schema | np.dtype | dict,
        *,
        time: str | None = None,
        max_delay: int = 0,
        time_unit: str = "ms",
    ) -> Stream:
        """An input stream of records of `schema`.

        `time` names the event-time column (integers of `time_unit`: "s", "ms" (the default),
        "us" or "ns"); the source's watermark is the largest event time seen minus `max_delay`
        (in the same unit), the declared bound on out-of-orderness. Records later than that are
        counted as late by windows, never dropped silently. Window lengths are given in
        milliseconds (or seconds) and apply in `time_unit`.
        """
        if time_unit not in TIME_UNITS:
            raise DataflowError(f"source {name!r}: time_unit must be one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
        schema = schema if isinstance(schema, Schema) else (
            Schema.from_dtype(schema) if isinstance(schema, np.dtype) else Schema(schema)
        )
        if time is not None and time not in schema:
            raise SchemaError(f"source {name!r}: time column {time!r} is not in {list(schema.names)}")
        if time is not None and schema.field(time).kind == "M":
            raise SchemaError(
                f"source {name!r}: time column {time!r} is {schema.field(time)}; declare it 'i8' (milliseconds "
                "since the epoch): datetime64 inputs are converted to it"
            )
        if time is not None and schema.field(time).kind not in "iu":
            raise SchemaError(f"source {name!r}: time column {time!r} must be an integer field")
        if isinstance(max_delay, bool) or not isinstance(max_delay, (int, np.integer)) or not 0 <= max_delay <= MAX_DELAY:
            raise DataflowError(
                f"source {name!r}: max_delay must be a whole number of {TIME_UNITS[time_unit]} (the source's "
                f"time_unit) from 0 to 2**62, got {max_delay!r}"
            )
        step_id = self._add(SourceSpec(self._step_id(name, "source"), schema, time, int(max_delay)))
        fields = {n: schema.field(n) for n in schema.names}
        return Stream(self, step_id, fields, time, time_unit)

    def sources(self) -> list[SourceSpec]:
        return [s for s in self.steps.values() if isinstance(s, SourceSpec)]

    def downstream(self, step_id: str) -> list:
        return [s for s in self.steps.values() if getattr(s, "up", None) == step_id]


@attrs.define(frozen=True)
class Stream:
    """A stream of batches leaving one step."""

    flow: Dataflow
    step_id: str
    fields: Fields
    time: str | None  # event-time column carried from the source, if any
    time_unit: str = "ms"  # the unit of the source's event times

    def _need(self, *names: str, what: str) -> None:
        for n in names:
            if n not in self.fields:
                raise SchemaError(f"{what}: unknown column {n!r}; the stream from {self.step_id!r} has {list(self.fields)}")

    def _next(self, spec, fields: Fields | None = None, time: str | None = ...) -> Stream:
        self.flow._add(spec)
        fields = self.fields if fields is None else fields
        return Stream(self.flow, spec.step_id, fields, self.time if time is ... else time, self.time_unit)

    def apply(self, fn: Callable, *, name: str | None = None, schema: Schema | dict | None = None) -> Stream:
        """Run a user operator, `async def fn(batch) -> batch` (a plain function works too).

        It may return a Batch, a structured numpy array, or None to drop the batch. `schema`
        declares the columns it returns when they differ from its input's.
        """
        if not callable(fn):
            raise DataflowError(f"apply() needs a callable, got {fn!r}")
        default = getattr(fn, "__name__", None)
        if not (isinstance(default, str) and _NAME.match(default)) or f"{self.flow.name}.{default}" in self.flow.steps:
            # a lambda's "<lambda>" is no step name, and one function applied twice needs two
            # ids: number it instead
            default = None
        step_id = self.flow._step_id(name or default, "apply")
        if schema is None:
            fields = dict(self.fields)
        else:
            schema = schema if isinstance(schema, Schema) else Schema(schema)
            fields = {n: schema.field(n) for n in schema.names}
        time = self.time if self.time in fields else None
        return self._next(ApplySpec(step_id, self.step_id, fn, fields), fields, time)

    def filter(self, predicate: Callable, *, name: str | None = None) -> Stream:
        """Keep the rows where `predicate(batch)` (a boolean array) is True."""
        return self._next(FilterSpec(self.flow._step_id(name, "filter"), self.step_id, predicate))

    def with_column(self, column: str, fn: Callable, *, dtype=None, name: str | None = None) -> Stream:
        """Add or replace `column` with `fn(batch)`, an array of one value per row."""
        if not _NAME.match(column):
            raise SchemaError(f"column name {column!r} must be an identifier-like string")
        try:
            dt = None if dtype is None else np.dtype(dtype)
        except TypeError:
            raise SchemaError(f"with_column({column!r}): dtype {dtype!r} is not a numpy dtype") from None
        fields = dict(self.fields)
        fields.pop(column, None)  # a replaced column comes last, as in the batches (Batch.with_columns)
        fields[column] = dt
        spec = WithColumnSpec(self.flow._step_id(name, f"with_{column}"), self.step_id, column, fn, dt)
        return self._next(spec, fields)

    def project(self, *columns: str, name: str | None = None) -> Stream:
        """Keep only these columns, in this order."""
        if not columns:
            raise DataflowError("project() needs at least one column")
        self._need(*columns, what="project")
        fields = {c: self.fields[c] for c in columns}
        time = self.time if self.time in fields else None
        return self._next(ProjectSpec(self.flow._step_id(name, "project"), self.step_id, tuple(columns)), fields, time)

    def window(self, assigner, *, time: str | None = None, late=None) -> WindowedStream:
        """Group the stream into event-time windows (`Tumbling` or `Sliding`).

        `late` is an optional sink that receives records that arrive after their window fired.
        """
        from slashrt.ops.window import Sliding  # (that module builds on this one)

        if not isinstance(assigner, Sliding):
            raise DataflowError(
                f"window() after {self.step_id!r}: {assigner!r} is no window assigner; give slashrt.Tumbling(...) "
                "or slashrt.Sliding(...)"
            )
        time = time or self.time
        if time is None:
            raise DataflowError("window(): no event-time column; name one with time= or on the source")
        self._need(time, what="window")
        return WindowedStream(self, assigner.in_unit(self.time_unit), time, late)

    def sink(self, sink, *, name: str | None = None) -> str:
        """Send the stream to a sink (`slashrt.sinks.Collect()`, `CsvFile`, `ParquetFile`, `Callback`)."""
        default = getattr(sink, "default_name", "sink")
        step_id = self.flow._step_id(name, default)
        self.flow._add(SinkSpec(step_id, self.step_id, sink, packed_dtype(self.fields)))
        if hasattr(sink, "bind"):
            sink.bind(step_id)
        return step_id


@attrs.define(frozen=True)
class WindowedStream:
    """A stream grouped into windows; finish it with an aggregate."""

    stream: Stream
    assigner: object
    time: str
    late: object | None

    def _agg(
        self, kind: AggKind, key: str, column: str | None, name: str | None, output: str | None, overflow: str = "wrap"
    ) -> Stream:
        s = self.stream
        s._need(key, what=f"{kind.value}(key=...)")
        if column is not None:
            s._need(column, what=f"{kind.value}({column!r})")
        key_dtype = s.fields[key]
        if key_dtype is not None:
            if key_dtype.kind not in "iu":
                raise SchemaError(f"{kind.value}: key column {key!r} must be an integer column, is {key_dtype}")
            key_dtype = key_dtype.newbyteorder("<")
        if overflow not in OVERFLOWS:
            raise DataflowError(f"{kind.value}: overflow must be one of {', '.join(OVERFLOWS)}, got {overflow!r}")
        value_dtype = np.dtype("<i8") if column is None else None
        if column is not None and s.fields[column] is not None:
            col = s.fields[column]
            if col.kind not in "iuf":
                raise SchemaError(f"{kind.value}: column {column!r} must be numeric, is {col}")
            value_dtype = np.dtype("<f8") if col.kind == "f" else np.dtype("<i8")
        if kind is AggKind.MEAN:
            value_dtype = np.dtype("<f8")  # a float64 sum: an int64 one would wrap
        output = output or (kind.value if column is None else f"{kind.value}_{column}")
        names = ["window_start", "window_end", key, output]
        if len(set(names)) < len(names):
            raise SchemaError(f"{kind.value}: the result columns {names} must have distinct names; rename with output=")
        step_id = s.flow._step_id(name, f"{kind.value}_window")
        spec = WindowAggSpec(
            step_id, s.step_id, self.assigner, self.time, key, column, kind, output, self.late, value_dtype,
            late_dtype=packed_dtype(s.fields), key_dtype=key_dtype, overflow=overflow,
        )
        fields = {
            "window_start": np.dtype("<i8"),
            "window_end": np.dtype("<i8"),
            key: np.dtype("<i8") if key_dtype is None else key_dtype,
            output: None if value_dtype is None else result_dtype(kind, value_dtype),
        }
        return s._next(spec, fields, "window_end")

    # Every aggregate gives rows (window_start, window_end, <key>, <output>): window bounds int64
    # milliseconds, the key in the key column's type (int64 when that type is not known when
    # the dataflow is built), one row per key seen in the window.

    def count(self, key: str, *, name: str | None = None, output: str | None = None) -> Stream:
        """Records per key and window, as int64 column `output` (default ``count``). Every
        record counts, whatever its values (NaN included)."""
        return self._agg(AggKind.COUNT, key, None, name, output)

    def sum(
        self, column: str, key: str, *, name: str | None = None, output: str | None = None, overflow: str = "wrap"
    ) -> Stream:
        """Sum of `column` per key and window, as column `output` (default ``sum_<column>``):
        float64 for a float column, else int64.

        NaN values are skipped (a key whose values are all NaN sums to 0.0). An int64 sum that
        leaves the int64 range wraps modulo 2**64 with ``overflow="wrap"`` (the default, as
        numpy, Flink and Spark without ANSI mode), or fails the run with an OperatorError
        naming the step and the window with ``overflow="error"`` (checked in the native loops
        of that step only). A float64 sum never wraps (it grows to inf).
        """
        return self._agg(AggKind.SUM, key, column, name, output, overflow)

    def min(self, column: str, key: str, *, name: str | None = None, output: str | None = None) -> Stream:
        """Smallest value of `column` per key and window, as column `output` (default
        ``min_<column>``): float64 for a float column, else int64. NaN values are skipped (a
        key whose values are all NaN gives NaN)."""
        return self._agg(AggKind.MIN, key, column, name, output)

    def max(self, column: str, key: str, *, name: str | None = None, output: str | None = None) -> Stream:
        """Largest value of `column` per key and window, as column `output` (default
        ``max_<column>``): float64 for a float column, else int64. NaN values are skipped (a
        key whose values are all NaN gives NaN)."""
        return self._agg(AggKind.MAX, key, column, name, output)

    def mean(self, column: str, key: str, *, name: str | None = None, output: str | None = None) -> Stream:
        """Mean of `column` per key and window, as float64 column `output` (default
        ``mean_<column>``): a float64 sum divided by the number of non-NaN values, so it never
        wraps; int64 values are exact up to 2**53 in magnitude and the mean of n values is
        within about n * 2**-53 of the exact one (relative), as in pandas. NaN values are
        skipped (a key whose values are all NaN gives NaN)."""
        return self._agg(AggKind.MEAN, key, column, name, output)


def is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
