"""A window step inside a loop: one window per iteration, each firing on its iteration's frontier.

Inside a loop a batch's logical time is ``(epoch, counters)``: the epoch is event time (the
watermark it was read at, or the end of the window that produced it) and the counters are the
loop iterations, innermost last. Timely-dataflow users expect a window there to aggregate
every iteration apart, so `LoopWindow` keeps one `WindowAggregate` per counters, made at the
iteration's first record, and routes each batch by the counters of its time.

Firing. Window ``[s, e)`` of iteration ``c`` fires once no record of event time < e at that
iteration or an earlier one can still arrive: the frontier at the step's input holds no time
``f <= (e - 1, c)`` in the timestamps' order (``f.epoch < e`` and ``f.counters <= c``
lexicographically). For iteration c that is the usual rule (``end <= watermark``) with the
watermark ``E_c = min(f.epoch for f in frontier if f.counters <= c)``; no such f (None) means
nothing can reach iteration c any more: its windows all fire and the iteration is forgotten
(its late count kept). Frontiers only advance, so a forgotten iteration never comes back.

Time of the results. Window ``[s, e)`` of iteration c emits at ``(e, c)``; each iteration's
window holds a capability at ``(end of its earliest window still to fire, c)`` (`holds`), which
is never below the frontier: a window that has not fired has a frontier time ``f <= (e - 1, c)``
at its input. A step after the window inside the loop should give the records it feeds back an
event time of at least e (e.g. `window_end`): a record whose event time lies below its
epoch is behind the watermark, late for the windows ending there.

Lateness is judged as outside loops, by the logical time ``(e, c)`` of the batch carrying a
record (`WindowAggregate.push`, in iteration c's window): it is late for the windows ending at
or before e (counted, sent to the `late` sink, never dropped silently) and still updates the
later ones. While the batch is on its way the frontier holds a time at or below ``(e, c)``, so
``E_c <= e``: no window that should take it has fired (never early), and which records are late
is a function of the input and the loop body, not of batching, the frontier's pace or the
executor count. A new iteration's window starts where the frontier already stands
(`fired_until` from ``E_c``). As outside loops, the value column's type at the step's first
batch decides the accumulators' (every iteration's).

State (`snapshot()` / `restore()`, kind ``loop_window``, `slashrt.snapshot.operators`): every
iteration's tables as two table sets whose ids lead with the iteration's counters
(``slices``: counters + slice, ``tails``: counters + slice + closed_until), per iteration
(``iterations``: counters rows, sorted) its ``next_start`` (``pending``: not None),
``fired_until`` and ``late_records``, the frontier last told (``frontier``: time rows) and in
`meta` the late count of forgotten iterations. The capabilities it holds follow from that
(`holds`): the tracker counts them again after a restore (`PointstampProgress.recount`).
"""

from __future__ import annotations

import numpy as np

from slashrt._batch import Batch
from slashrt._dataflow import WindowAggSpec
from slashrt.errors import SnapshotError
from slashrt.ops._node import Node
from slashrt.ops.window import WindowAggregate
from slashrt.progress.timestamp import Timestamp
from slashrt.snapshot.operators import _packed, array_times, check, pack_tables, tagged, times_array, unpack_tables
from slashrt.snapshot.state_format import State

__all__ = ["LoopWindow", "iteration_watermark", "iteration_states", "loop_window_state"]


def iteration_watermark(frontier, counters: tuple[int, ...]) -> int | None:
    """The least epoch of the frontier's times at iteration `counters` or an earlier one (None:
    nothing can arrive there any more)."""
    return min((f.epoch for f in frontier if f.counters <= counters), default=None)


class LoopWindow(Node):
    """Keyed windowed aggregate inside a loop: a `WindowAggregate` per iteration."""

    def __init__(self, spec: WindowAggSpec, late_node: Node | None = None):
        super().__init__(spec.step_id)
        self.windows: dict[tuple[int, ...], WindowAggregate] = {}  # counters -> that iteration's window
        self._clock = None
        self.spec = spec
        self.size, self.slide = spec.assigner.size, spec.assigner.slide
        self.depth = len(spec.scope)  # loop counters per iteration
        self.late_node = late_node
        self.value_dtype = spec.value_dtype  # every iteration's (decided at the step's first batch if not known)
        self.frontier = None  # the input's frontier as last told (None: not told yet)
        self._forgotten_late = 0  # late records of iterations forgotten

    def window_grid(self) -> tuple[int, int]:
        return self.size, self.slide

    @property
    def clock(self):
        return self._clock

    @clock.setter
    def clock(self, clock) -> None:
        # its windows judge lateness and emit on it: those made before it was told (a restore
        # makes them before an SSB window's fragments are told theirs, at their first batch) too
        if clock is not self._clock:
            self._clock = clock
            for window in self.windows.values():
                window.clock = clock

    @property
    def late_records(self) -> int:
        return self._forgotten_late + sum(w.late_records for w in self.windows.values())

    async def push(self, batch: Batch) -> None:
        counters = self.clock.now.counters
        window = self.windows.get(counters)
        if window is None:
            window = self._window(counters)
            if self.frontier is not None:  # it starts where the frontier stands (nothing to fire yet)
                await window.on_frontier(iteration_watermark(self.frontier, counters))
        await window.push(batch)
        if self.value_dtype is None:
            self.value_dtype = window.value_dtype

    def _window(self, counters: tuple[int, ...]) -> WindowAggregate:
        """A new window for iteration `counters`, emitting to this step's children."""
        window = self.windows[counters] = WindowAggregate(self.spec, self.late_node)
        window.counters, window.clock, window.children = counters, self.clock, self.children
        window.value_dtype = self.value_dtype
        return window

    async def on_frontier(self, frontier) -> None:
        """The input's frontier moved: every iteration fires what its watermark passed, in
        iteration order; an iteration nothing can reach any more fires all and is forgotten."""
        self.frontier = frontier
        for counters in sorted(self.windows):
            window = self.windows[counters]
            watermark = iteration_watermark(frontier, counters)
            await window.on_frontier(watermark)
            if watermark is None and not window.slices:
                self._forgotten_late += window.late_records
                del self.windows[counters]

    def holds(self) -> frozenset[Timestamp]:
        """The capabilities it holds: per iteration with state, the end of its earliest window
        still to fire at that iteration's counters."""
        held = ((w.held(), counters) for counters, w in self.windows.items())
        return frozenset(Timestamp(end, counters) for end, counters in held if end is not None)

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    STATE_KIND, STATE_VERSION = "loop_window", 1

    def snapshot(self) -> State:
        """A copy of every iteration's state (tables exported; nothing shared with live state)."""
        order = sorted(self.windows)
        windows = [self.windows[c] for c in order]
        slices = {(*c, s): t for c, w in zip(order, windows) for s, t in w.slices.items()}
        tails = {(*c, *k): t for c, w in zip(order, windows) for k, t in w.tails.items()}
        frontier = () if self.frontier is None else sorted(self.frontier, key=lambda t: (t.epoch, t.counters))
        arrays = {
            **pack_tables("slices", slices, self.value_dtype),
            **pack_tables("tails", tails, self.value_dtype),
            "iterations": np.array(order, np.int64).reshape(len(order), self.depth),
            "next_start": np.array([w.next_start or 0 for w in windows], np.int64),
            "pending": np.array([w.next_start is not None for w in windows], bool),
            "fired_until": np.array([w.fired_until for w in windows], np.int64),
            "late_records": np.array([w.late_records for w in windows], np.int64),
            "frontier": times_array(frontier).reshape(len(frontier), self.depth + 1),
        }
        return tagged(
            self.STATE_KIND, self.STATE_VERSION, arrays, step=self.step_id, depth=self.depth,
            told=self.frontier is not None, forgotten_late=self._forgotten_late,
            size=self.size, slide=self.slide, slice_len=self.spec.assigner.slice_len, aggregate=self.spec.kind.value,
            value_dtype=None if self.value_dtype is None else np.dtype(self.value_dtype).str,
        )

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        if meta["depth"] != self.depth:
            raise SnapshotError(
                f"step {self.step_id!r}: the state is of a window {meta['depth']} loops deep, this step runs in "
                f"{self.depth}: restore it into the dataflow that wrote it"
            )
        grid = WindowAggregate(self.spec)
        grid._check_grid(meta)  # refuses another grid or aggregate before anything changes
        arrays = state.arrays
        self.value_dtype, self.windows = grid.value_dtype, {}
        iterations = [tuple(c) for c in arrays["iterations"].tolist()]
        columns = zip(iterations, *(arrays[n].tolist() for n in ("next_start", "pending", "fired_until", "late_records")))
        for counters, next_start, pending, fired_until, late in columns:
            window = self._window(counters)
            window.next_start = next_start if pending else None
            window.fired_until, window.late_records = fired_until, late
        d = self.depth
        for table_id, keys, counts, vals, overflowed in unpack_tables("slices", arrays):
            window = self.windows[table_id[:d]]
            window.slices[table_id[d]] = window._restored_table(keys, counts, vals, overflowed)
        for table_id, keys, counts, vals, overflowed in unpack_tables("tails", arrays):
            window = self.windows[table_id[:d]]
            window.tails[table_id[d:]] = window._restored_table(keys, counts, vals, overflowed)
        self.frontier = tuple(array_times(arrays["frontier"])) if meta["told"] else None
        self._forgotten_late = meta["forgotten_late"]

    @property
    def state_bytes(self) -> int:
        """Bytes of every iteration's table rows."""
        return sum(w.state_bytes for w in self.windows.values())


# -- the state's layout cut per iteration and put back (rescaling: slashrt.snapshot.rescale) -------------
_GRID = ("size", "slide", "slice_len", "aggregate", "value_dtype")


def iteration_states(arrays: dict, meta: dict) -> dict[tuple, State]:
    """A `LoopWindow` state's windows (its `arrays` and `meta`), as one plain window's state
    (`WindowAggregate.snapshot`'s layout) per iteration."""
    d = meta["depth"]
    iterations = [tuple(c) for c in arrays["iterations"].tolist()]
    tables = {c: {"slices": {}, "tails": {}} for c in iterations}
    for name in ("slices", "tails"):
        for table_id, keys, counts, vals, overflowed in unpack_tables(name, arrays):
            local = table_id[d] if name == "slices" else tuple(table_id[d:])
            tables[tuple(table_id[:d])][name][local] = [[keys], [counts], [vals], overflowed]
    columns = zip(iterations, *(arrays[n].tolist() for n in ("next_start", "pending", "fired_until", "late_records")))
    return {
        counters: tagged(
            WindowAggregate.STATE_KIND, WindowAggregate.STATE_VERSION,
            {**_packed("slices", tables[counters]["slices"], meta["value_dtype"]),
             **_packed("tails", tables[counters]["tails"], meta["value_dtype"])},
            step=meta["step"], **{k: meta[k] for k in _GRID}, next_start=next_start if pending else None,
            fired_until=fired_until, late_records=late,
        )
        for counters, next_start, pending, fired_until, late in columns
    }


def loop_window_state(step_id: str, grid: dict, depth: int, windows: dict[tuple, State], forgotten_late: int) -> State:
    """A `LoopWindow` state out of one plain window's state per iteration (`iteration_states`
    inverted; `grid`: a state's meta with the window's grid), told no frontier yet (the
    tracker tells it at once)."""
    order = sorted(windows)
    vdt = next((windows[c].meta["value_dtype"] for c in order if windows[c].meta["value_dtype"]), grid["value_dtype"])
    tables: dict[str, dict] = {"slices": {}, "tails": {}}
    for counters in order:
        for name in tables:
            for table_id, keys, counts, vals, overflowed in unpack_tables(name, windows[counters].arrays):
                local = (table_id,) if name == "slices" else table_id
                tables[name][(*counters, *local)] = [[keys], [counts], [vals], overflowed]
    metas = [windows[c].meta for c in order]
    arrays = {
        **_packed("slices", tables["slices"], vdt, width=depth + 1),
        **_packed("tails", tables["tails"], vdt, width=depth + 2),
        "iterations": np.array(order, np.int64).reshape(len(order), depth),
        "next_start": np.array([m["next_start"] or 0 for m in metas], np.int64),
        "pending": np.array([m["next_start"] is not None for m in metas], bool),
        "fired_until": np.array([m["fired_until"] for m in metas], np.int64),
        "late_records": np.array([m["late_records"] for m in metas], np.int64),
        "frontier": np.zeros((0, depth + 1), np.int64),
    }
    return tagged(LoopWindow.STATE_KIND, LoopWindow.STATE_VERSION, arrays, step=step_id, depth=depth, told=False,
                  forgotten_late=forgotten_late, **{**{k: grid[k] for k in _GRID}, "value_dtype": vdt})
