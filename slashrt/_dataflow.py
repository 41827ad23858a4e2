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
import math
import re
from collections.abc import Callable
from fractions import Fraction

import attrs
import numpy as np

from slashrt._operator import Operator
from slashrt._schema import Schema
from slashrt.errors import DataflowError, SchemaError
from slashrt.ops.keys import key_problem
from slashrt.ssb.crdt import AggKind, result_dtype

__all__ = ["Dataflow", "Stream", "WindowedStream", "ConnectedStreams", "Loop", "OVERFLOWS", "TIME_UNITS", "inputs_of"]

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


# -- window assigners: what `Stream.window` takes (the windows themselves: slashrt.ops.window) --

_UNITS_PER_MS = {"s": Fraction(1, 1000), "ms": 1, "us": 1000, "ns": 1_000_000}


def ms_per_unit(unit: str) -> float:
    """Milliseconds in one `unit` of event time ("s", "ms", "us" or "ns")."""
    return float(1 / _UNITS_PER_MS[unit])


def _length(ms, seconds, what: str) -> int:
    if (ms is None) == (seconds is None):
        raise DataflowError(f"{what}: give exactly one of ms= or seconds=")
    value = ms if ms is not None else seconds * 1000
    if value != int(value) or value <= 0:
        raise DataflowError(f"{what}: length must be a positive whole number of milliseconds, got {value}")
    return int(value)


@attrs.frozen(init=False)
class Sliding:
    """Overlapping windows ``[s, s + size)`` starting every `slide`, at every multiple of it.

    Lengths are given in milliseconds, positionally or as ``size_ms=`` and ``slide_ms=``, or in
    seconds as ``seconds=`` and ``every_seconds=`` (``Sliding(60_000, 10_000)`` equals
    ``Sliding(seconds=60, every_seconds=10)``), and apply in the unit of the source's event
    times (``time_unit``, milliseconds by default). A record belongs to ``size / slide`` windows
    (rounded up); the slide may not exceed the size (no gaps between windows).
    """

    size: int
    slide: int

    def __init__(self, size_ms=None, slide_ms=None, *, seconds=None, every_seconds=None):
        size = _length(size_ms, seconds, "window size")
        slide = _length(slide_ms, every_seconds, "window slide")
        if slide > size:
            raise DataflowError(f"slide {slide} ms is longer than the window size {size} ms (gaps between windows)")
        self.__attrs_init__(size, slide)

    @property
    def slice_len(self) -> int:
        return math.gcd(self.size, self.slide)

    def in_unit(self, unit: str) -> Sliding:
        """These windows with their lengths in `unit` ("s", "ms", "us" or "ns": an event-time
        column's) instead of milliseconds."""
        per_ms = _UNITS_PER_MS[unit]
        size, slide = self.size * per_ms, self.slide * per_ms
        if size != int(size) or slide != int(slide):
            raise DataflowError(
                f"window of {self.size} ms every {self.slide} ms is not a whole number of {unit}, the unit of its "
                "event times (time_unit of the source)"
            )
        windows = object.__new__(type(self))
        windows.__attrs_init__(int(size), int(slide))
        return windows


@attrs.frozen(init=False)
class Tumbling(Sliding):
    """Back-to-back windows ``[s, s + size)`` at every multiple of `size`.

    The size is given in milliseconds, positionally or as ``ms=``, or in seconds as
    ``seconds=`` (``Tumbling(10_000)`` equals ``Tumbling(seconds=10)``), and applies in the
    unit of the source's event times (``time_unit``, milliseconds by default). Every record belongs to exactly one window.
    """

    def __init__(self, ms=None, *, seconds=None):
        size = _length(ms, seconds, "window size")
        self.__attrs_init__(size, size)


@attrs.frozen
class SourceSpec:
    step_id: str
    schema: Schema
    time: str | None
    max_delay: int
    time_unit: str = "ms"  # the unit of its event times


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
    scope: tuple[str, ...] = ()  # the loops it runs in (one window per iteration: ops/loop_window.py)

    def shared_value_dtype(self, steps: dict | None = None) -> np.dtype:
        """The accumulator type, for a window whose rows or partial states executors exchange
        (fixed-size rows: it must be known when the dataflow is built, not guessed). Unknown (a
        column computed without a declared type): refused in one sentence, naming the
        with_column to give a dtype= when the flow's `steps` are given to find it."""
        if self.value_dtype is not None:
            return self.value_dtype
        made = steps.get(self.up) if steps else None
        while made is not None and not (isinstance(made, WithColumnSpec) and made.name == self.column):
            made = steps.get(getattr(made, "up", None))
        fix = (
            f"give with_column({self.column!r}, ..., dtype=...) in step {made.step_id!r} a dtype"
            if made is not None
            else "declare its type where it is made (with_column's dtype=, apply's or operator's schema=)"
        )
        raise DataflowError(
            f"step {self.step_id!r}: a multi-executor run needs the type of the aggregated column {self.column!r} "
            f"when the dataflow is built: {fix}"
        )


@attrs.frozen
class UnionSpec:
    step_id: str
    ups: tuple[str, ...]  # input port i reads ups[i]


@attrs.frozen
class OperatorSpec:
    step_id: str
    ups: tuple[str, ...]  # input port i reads ups[i]
    op: object  # a slashrt.Operator
    fields: Fields  # what it promises to emit


@attrs.frozen
class EnterSpec:
    """A loop's ingress (input 0, from outside: counter 0 appended) where its feedbacks join
    (input 1: their batches, already at the advanced time)."""

    step_id: str
    up: str
    loop: str  # the loop's id


@attrs.frozen
class FeedbackSpec:
    step_id: str
    up: str
    into: str  # the EnterSpec its batches go back to, one iteration later
    loop: str
    max_iterations: int | None


@attrs.frozen
class LeaveSpec:
    step_id: str
    up: str
    loop: str


@attrs.frozen
class ExchangeSpec:
    step_id: str
    up: str
    key: str  # an integer column: its owner executor gets the record
    dtype: np.dtype | None  # the records, when every column's type is known (they cross channels)
    depth: int  # loop counters of its timestamps (they cross with the records)


def inputs_of(spec) -> tuple[str, ...]:
    """The step ids a step reads, in input-port order (a feedback's way back is not listed)."""
    ups = getattr(spec, "ups", None)
    if ups is not None:
        return ups
    up = getattr(spec, "up", None)
    return () if up is None else (up,)


@attrs.frozen
class SinkSpec:
    step_id: str
    up: str
    sink: object
    dtype: np.dtype | None = None  # the records the sink sees, when every column's type is known
    time: str | None = None  # the stream's event-time column (a window's: window_end), and its unit
    time_unit: str = "ms"


class Dataflow:
    """A named graph of steps. Build it with `source` and the `Stream` methods, then `slashrt.run`."""

    def __init__(self, name: str):
        if not _NAME.match(name):
            raise DataflowError(f"dataflow name {name!r} must be an identifier-like string")
        self.name = name
        self.steps: dict[str, object] = {}
        self._counter = 0
        self._loops: list[Loop] = []

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
        step_id = self._add(SourceSpec(self._step_id(name, "source"), schema, time, int(max_delay), time_unit))
        fields = {n: schema.field(n) for n in schema.names}
        return Stream(self, step_id, fields, time, time_unit)

    def sources(self) -> list[SourceSpec]:
        return [s for s in self.steps.values() if isinstance(s, SourceSpec)]

    def downstream(self, step_id: str) -> list:
        return [spec for spec, _ in self.consumers(step_id)]

    def consumers(self, step_id: str) -> list[tuple[object, int]]:
        """(step, input port) of every step reading `step_id`'s output; a feedback's output
        goes to port 1 of the loop entry it feeds."""
        out = [(s, port) for s in self.steps.values() for port, up in enumerate(inputs_of(s)) if up == step_id]
        spec = self.steps.get(step_id)
        if isinstance(spec, FeedbackSpec):
            out.append((self.steps[spec.into], 1))
        return out

    def loop(self, name: str, max_iterations: int | None = None) -> Loop:
        """A loop scope (a context manager): `enter` streams, `feed_back` results into them one
        iteration later, `leave` with results. `max_iterations` bounds the loop counter: a
        feedback beyond it fails the run with an OperatorError (never a silent stop)."""
        return Loop(self, name, (), max_iterations)


@attrs.define(frozen=True)
class Stream:
    """A stream of batches leaving one step."""

    flow: Dataflow
    step_id: str
    fields: Fields
    time: str | None  # event-time column carried from the source, if any
    time_unit: str = "ms"  # the unit of the source's event times
    scope: tuple[str, ...] = ()  # the loops it runs in, outermost first (their ids)

    def _need(self, *names: str, what: str) -> None:
        for n in names:
            if n not in self.fields:
                raise SchemaError(f"{what}: unknown column {n!r}; the stream from {self.step_id!r} has {list(self.fields)}")

    def _next(self, spec, fields: Fields | None = None, time: str | None = ...) -> Stream:
        self.flow._add(spec)
        fields = self.fields if fields is None else fields
        return Stream(self.flow, spec.step_id, fields, self.time if time is ... else time, self.time_unit, self.scope)

    def _same_scope(self, others, what: str) -> None:
        for other in others:
            if not isinstance(other, Stream) or other.flow is not self.flow:
                raise DataflowError(f"{what}: {other!r} is no stream of dataflow {self.flow.name!r}")
            if other.scope != self.scope:
                raise DataflowError(
                    f"{what}: steps {self.step_id!r} (loops {list(self.scope)}) and {other.step_id!r} (loops "
                    f"{list(other.scope)}) are in different loop scopes; bring a stream in with loop.enter() or out "
                    "with loop.leave()"
                )

    def union(self, other: Stream, *more: Stream, name: str | None = None) -> Stream:
        """The batches of this stream and the others, as one stream; every stream must have the
        same columns (names and dtypes) and be in the same loop scope."""
        streams = (other, *more)
        self._same_scope(streams, "union")
        for s in streams:
            mismatch = list(s.fields) != list(self.fields) or any(
                a is not None and b is not None and a != b for a, b in zip(s.fields.values(), self.fields.values())
            )
            if mismatch:
                raise SchemaError(
                    f"union: step {s.step_id!r} has columns {_show(s.fields)} but {self.step_id!r} has "
                    f"{_show(self.fields)}; make them equal (project, with_column) first"
                )
        step_id = self.flow._step_id(name, "union")
        ups = (self.step_id, *(s.step_id for s in streams))
        time = self.time if all(s.time == self.time for s in streams) else None
        return self._next(UnionSpec(step_id, ups), time=time)

    def connect(self, other: Stream) -> ConnectedStreams:
        """Two streams into one two-input step: `.apply(fn)` or `.operator(op)`; port 0 is this
        stream, port 1 the other."""
        self._same_scope((other,), "connect")
        return ConnectedStreams(self, other)

    def operator(self, op, *, name: str | None = None, schema: Schema | dict | None = None) -> Stream:
        """Run a user operator (a `slashrt.Operator` instance) on this stream; `schema`
        declares the columns it emits when they differ from its input's."""
        return _operator((self,), op, name, schema)

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

    def exchange(self, key: str, *, name: str | None = None) -> Stream:
        """On several executors, send every record to the executor owning its `key` (a column of
        any fixed-width type up to 8 bytes, `slashrt.ops.keys`; the key partitioning windows
        use), so that one executor sees all records of a key; on one executor the stream as it
        is. Notifications downstream wait for records still on their way (pointstamp progress)."""
        self._need(key, what="exchange(key=...)")
        kind = self.fields[key]
        if kind is not None and (problem := key_problem(np.dtype(kind))) is not None:
            raise SchemaError(f"exchange(key={key!r}): column {key!r} {problem}")
        spec = ExchangeSpec(self.flow._step_id(name, "exchange"), self.step_id, key, packed_dtype(self.fields), len(self.scope))
        return self._next(spec)

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
        Inside a loop every iteration has windows of its own, each firing once no record of
        its iteration or an earlier one can still reach it (`slashrt.ops.loop_window`).
        """
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
        self.flow._add(SinkSpec(step_id, self.step_id, sink, packed_dtype(self.fields), self.time, self.time_unit))
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
            if (problem := key_problem(key_dtype)) is not None:
                raise SchemaError(f"{kind.value}: key column {key!r} {problem}")
            key_dtype = key_dtype.newbyteorder("<") if key_dtype.kind in "iuf" else key_dtype
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
            late_dtype=packed_dtype(s.fields), key_dtype=key_dtype, overflow=overflow, scope=s.scope,
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


def _show(fields: Fields) -> list[str]:
    return [f"{n}:{'?' if dt is None else dt.str}" for n, dt in fields.items()]


_apply_both: list = []  # connect(...).apply(fn)'s operator class: `slashrt.ops.operator.ApplyBoth`


def register_apply_both(cls) -> None:
    """`slashrt.ops.operator` (which builds on this module) registers `ApplyBoth`, the operator
    `ConnectedStreams.apply` runs its function in, when it is imported (importing slashrt does)."""
    _apply_both[:] = [cls]


def _operator(streams: tuple[Stream, ...], op, name: str | None, schema) -> Stream:
    first = streams[0]
    if isinstance(op, type) or not isinstance(op, Operator):
        raise DataflowError(
            f"operator() after {first.step_id!r}: {op!r} is no slashrt.Operator instance; subclass slashrt.Operator "
            "and pass an instance, e.g. .operator(MyOperator())"
        )
    used = [s.step_id for s in first.flow.steps.values() if isinstance(s, OperatorSpec) and s.op is op]
    if used:
        raise DataflowError(
            f"operator() after {first.step_id!r}: this {type(op).__name__} instance already runs step {used[0]!r}; "
            "give every step an instance of its own (its state is the step's)"
        )
    default = type(op).__name__.lower()
    if not _NAME.match(default) or f"{first.flow.name}.{default}" in first.flow.steps:
        default = None
    step_id = first.flow._step_id(name or default, "operator")
    if schema is None:
        fields = dict(first.fields)
    else:
        schema = schema if isinstance(schema, Schema) else Schema(schema)
        fields = {n: schema.field(n) for n in schema.names}
    time = first.time if first.time in fields and all(s.time == first.time for s in streams) else None
    spec = OperatorSpec(step_id, tuple(s.step_id for s in streams), op, fields)
    return first._next(spec, fields, time)


@attrs.define(frozen=True)
class ConnectedStreams:
    """Two streams of one loop scope, about to enter one two-input step (port 0, port 1)."""

    first: Stream
    second: Stream

    def apply(self, fn: Callable, *, name: str | None = None, schema: Schema | dict | None = None) -> Stream:
        """Run `fn(batch, port)` on the batches of both streams (port 0: the first, 1: the
        second); sync or async, it returns a Batch, a structured array or None."""
        if not callable(fn):
            raise DataflowError(f"connect(...).apply() needs a callable, got {fn!r}")
        default = getattr(fn, "__name__", None)
        if not (isinstance(default, str) and _NAME.match(default)):
            default = None
        if default is not None and f"{self.first.flow.name}.{default}" in self.first.flow.steps:
            default = None
        return _operator((self.first, self.second), _apply_both[0](fn), name or default or None, schema)

    def operator(self, op, *, name: str | None = None, schema: Schema | dict | None = None) -> Stream:
        """Run a two-input user operator; `on_batch(ctx, port, batch)` gets port 0 or 1."""
        return _operator((self.first, self.second), op, name, schema)


class Loop:
    """A loop scope of a dataflow; see `Dataflow.loop`. Nest one with `loop.loop(name)`."""

    def __init__(self, flow: Dataflow, name: str, outer: tuple[str, ...], max_iterations: int | None):
        if not _NAME.match(name):
            raise DataflowError(f"loop name {name!r} must be an identifier-like string")
        if max_iterations is not None and (
            isinstance(max_iterations, bool) or not isinstance(max_iterations, (int, np.integer)) or max_iterations < 0
        ):
            raise DataflowError(f"loop {name!r}: max_iterations must be None or a whole number >= 0, got {max_iterations!r}")
        self.flow = flow
        self.name = name
        self.loop_id = f"{flow.name}.{name}" if not outer else f"{outer[-1]}.{name}"
        if self.loop_id in {s for scope in _scopes(flow) for s in scope}:
            raise DataflowError(f"loop id {self.loop_id!r} is used twice")
        self.outer = outer
        self.scope = (*outer, self.loop_id)
        self.max_iterations = None if max_iterations is None else int(max_iterations)
        self.entered: list[Stream] = []
        flow._loops.append(self)

    def __enter__(self) -> Loop:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def loop(self, name: str, max_iterations: int | None = None) -> Loop:
        """A loop nested in this one (its streams carry one more loop counter)."""
        return Loop(self.flow, name, self.scope, max_iterations)

    def enter(self, stream: Stream, *, name: str | None = None) -> Stream:
        """`stream` inside the loop (its batches get loop counter 0); feedbacks join it here."""
        if stream.scope != self.outer:
            raise DataflowError(
                f"loop {self.loop_id!r}: enter() takes a stream of the scope around the loop ({list(self.outer)}), "
                f"but step {stream.step_id!r} is in {list(stream.scope)}"
            )
        step_id = self.flow._step_id(name, f"{self.name}_enter")
        self.flow._add(EnterSpec(step_id, stream.step_id, self.loop_id))
        entered = Stream(self.flow, step_id, dict(stream.fields), stream.time, stream.time_unit, self.scope)
        self.entered.append(entered)
        return entered

    def feed_back(self, stream: Stream, into: Stream | None = None, *, name: str | None = None) -> str:
        """Send `stream`'s batches back to the entered stream `into` (may be left out when one
        stream was entered), one iteration later (the innermost loop counter + 1)."""
        self._of_loop(stream, "feed_back")
        if into is None:
            if len(self.entered) != 1:
                raise DataflowError(
                    f"loop {self.loop_id!r}: {len(self.entered)} streams were entered; say which one the feedback of "
                    f"{stream.step_id!r} goes to with into="
                )
            into = self.entered[0]
        if not any(into is e or into.step_id == e.step_id for e in self.entered):
            raise DataflowError(
                f"loop {self.loop_id!r}: into= must be a stream entered with this loop's enter(), not step "
                f"{getattr(into, 'step_id', into)!r}"
            )
        if list(stream.fields) != list(into.fields):
            raise SchemaError(
                f"loop {self.loop_id!r}: the feedback of {stream.step_id!r} has columns {_show(stream.fields)} but "
                f"the stream it goes back to ({into.step_id!r}) has {_show(into.fields)}"
            )
        step_id = self.flow._step_id(name, f"{self.name}_feedback")
        self.flow._add(FeedbackSpec(step_id, stream.step_id, into.step_id, self.loop_id, self.max_iterations))
        return step_id

    def _of_loop(self, stream: Stream, method: str) -> None:
        if stream.scope != self.scope:
            raise DataflowError(
                f"loop {self.loop_id!r}: {method}() takes a stream of the loop, but step {stream.step_id!r} is in "
                f"{list(stream.scope)}"
            )

    def leave(self, stream: Stream, *, name: str | None = None) -> Stream:
        """`stream` outside the loop (its innermost loop counter dropped)."""
        self._of_loop(stream, "leave")
        step_id = self.flow._step_id(name, f"{self.name}_leave")
        self.flow._add(LeaveSpec(step_id, stream.step_id, self.loop_id))
        return Stream(self.flow, step_id, dict(stream.fields), stream.time, stream.time_unit, self.outer)


def _scopes(flow: Dataflow):
    return [loop.scope for loop in flow._loops]


def is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
