"""A graph flow's keyed window on the Slash State Backend (`mode="slash"` on several executors).

Every executor folds the records that reach the window into its own *fragments* (a partial
state per window slice, as the SSB's epochs do in a tree flow: `slashrt.ssb.window`), and
ships a fragment to the owners of its keys once no more records can join its earliest
window: when the frontier of the records arriving at the step (at the output of the step
before it: `PointstampProgress` hands it over, `on_upstream`) passes that window's end. The
owner joins the partial states (a CRDT merge) into its window, which fires on the frontier
at the step's input, as a routed window does (`slashrt.ops.route.WindowRoute`).

Pointstamps keep that exact: a fragment is a capability of the step at the time before the
end of the first window it joins, counted at a second input port of the step that no edge
feeds (`progress_graph(flow, fragments)`); shipped, its rows are counted in flight at the
step's input at that time until their owner took them, in the same progress update that
drops the capability. The owner's window fires on the frontier at both ports: no window fires
before every executor's fragment of it arrived, whatever their speeds. (Counted at the input
beside the rows, an owner taking rows before their sender's update reached it would cancel
another executor's capability at the same pointstamp; at the output, beside the windows' own
capabilities, every owner would wait for every other's earliest window: a progress round per
window.) The records' frontier that makes fragments due is read one location upstream, which
their capabilities never hold back.

Lateness is judged where a record is read, by the rule of a plain window (the logical time
of its batch closes the windows ending by it): a record partly late for a sliding window's
slice joins a *tail* of that slice, shipped with the end its windows closed at (`closed`),
and the owner joins it only into later windows (`WindowAggregate.merge_slice`).

Inside loops (`SsbLoopWindow`) every iteration has its fragments and its owner's window, as
a `LoopWindow` has a window per iteration: a fragment is due when the records' frontier at its
iteration passes its window (`iteration_watermark`), and its time, and its rows' hidden
columns, carry the iteration's counters.

A record crosses the network only inside a fragment: one row per key a slice saw on an
executor, not one per record (`EpochStats` per shipment, `RunResult.epochs`).
"""

from __future__ import annotations

import numpy as np

from slashrt._batch import Batch
from slashrt._dataflow import ExchangeSpec, WindowAggSpec
from slashrt.ops.route import ExchangeNode, WindowRoute, time_columns, take_by_time
from slashrt.ssb.window import EpochStats
from slashrt.ops.loop_window import LoopWindow, iteration_watermark
from slashrt.ops.window import NO_TIME, WindowAggregate
from slashrt.progress import Timestamp
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.ssb.partitions import Partitioning

__all__ = ["SsbGraphWindow", "SsbLoopWindow", "SsbRoute", "partial_dtype", "adopt_in_flight"]


def partial_dtype(value_dtype: np.dtype) -> np.dtype:
    """A fragment's row: a key's partial state in one slice, and the end of the last window of
    the slice it must not join (NO_TIME: none)."""
    return np.dtype(
        [("slice", "<i8"), ("key", "<i8"), ("count", "<i8"), ("value", np.dtype(value_dtype).newbyteorder("<")),
         ("closed", "<i8")]
    )


def _pieces(fragments: WindowAggregate) -> list[tuple[int, int, int]]:
    """(slice, closed, end) of every table of `fragments`: the end of the first window it joins
    (a slice's table may be empty: one made for its tail)."""
    out = [(s, NO_TIME, int(fragments._earliest_end(s))) for s in fragments.slices]
    for s, closed in fragments.tails:
        first = int(fragments._earliest_end(s))
        end = first if first > closed else first + ((closed - first) // fragments.slide + 1) * fragments.slide
        out.append((s, closed, end))
    return out


def _held_ends(fragments: WindowAggregate) -> set[int]:
    """The times the tables of `fragments` holding state are held at: their first window's end - 1."""
    tables = fragments.slices, fragments.tails
    return {end - 1 for s, closed, end in _pieces(fragments)
            if len(tables[closed != NO_TIME][s if closed == NO_TIME else (s, closed)])}


def _take_due(fragments: WindowAggregate, until: int | None, value_dtype) -> list[tuple[int, np.ndarray]]:
    """The tables of `fragments` whose first window ends by `until` (None: all), as partial
    rows, each with the time it is held at (its end - 1), removed from the fragments."""
    due = []
    for s, closed, end in _pieces(fragments):
        if until is not None and end > until:
            continue
        table = fragments.slices[s] if closed == NO_TIME else fragments.tails[(s, closed)]
        if fragments.spec.overflow == "error" and table.overflowed:  # (a partial state does not carry the flag)
            fragments._overflowed(f"the slice [{s * fragments.slice_len}, {(s + 1) * fragments.slice_len}) here")
        keys, counts, vals = table.export()
        if closed == NO_TIME:
            fragments._drop_slice(s)
        else:
            del fragments.tails[(s, closed)]
        if not len(keys):
            continue
        rows = np.empty(len(keys), partial_dtype(value_dtype))
        rows["slice"], rows["key"], rows["count"], rows["value"], rows["closed"] = s, keys, counts, vals, closed
        due.append((end - 1, rows))
    return due


def _join(window: WindowAggregate, rows: np.ndarray) -> None:
    """Partial rows of keys this executor owns (a shipment, or its own): into `window`."""
    closed = rows["closed"]
    values = np.unique(closed).tolist()
    for c in values:
        part = rows if len(values) == 1 else rows[closed == c]
        window.merge_partials(part["slice"], part["key"], part["count"], part["value"], c)


async def _join_iteration(loop: LoopWindow, rows: np.ndarray, counters: tuple[int, ...]) -> None:
    """Partial rows of one iteration into that iteration's window of `loop`."""
    window = loop.windows.get(counters)
    if window is None:
        window = loop._window(counters)
        if loop.frontier is not None:  # it starts where the frontier stands (nothing to fire yet)
            await window.on_frontier(iteration_watermark(loop.frontier, counters))
    _join(window, rows)


class _OwnerAndFragments:
    """What both SSB windows of graph flows share: the owner's window is the class itself
    (a `WindowAggregate` or a `LoopWindow`), its fragments one of the same kind (`FRAGMENTS`)
    that never fires, which judges lateness (the owner merges partial states only); and what
    the fragments shipped (`RunResult.epochs`, named after the SSB's epochs)."""

    FRAGMENTS: type

    def __init__(self, spec: WindowAggSpec, late):
        super().__init__(spec, None)  # the owner judges nothing late: the fragments did
        self.fragments = self.FRAGMENTS(spec, late)
        self.epochs: list[EpochStats] = []  # one per shipment
        self._input_bytes = self._records = 0

    @property
    def late_records(self) -> int:
        return self.fragments.late_records if hasattr(self, "fragments") else 0

    @late_records.setter
    def late_records(self, value: int) -> None:
        pass  # (the owner's count stays 0: WindowAggregate's constructor and restore set it)

    def _count_input(self, batch: Batch) -> None:
        self._input_bytes += batch.nbytes
        self._records += len(batch)

    def shipped(self, rows: int, remote: int, nbytes: int, until: int | None) -> None:
        """Count a shipment: `rows` partial rows, `remote` of them (`nbytes`) to other executors."""
        self.epochs.append(EpochStats(
            len(self.epochs) + 1, self._input_bytes, rows, remote, nbytes, NO_TIME if until is None else until,
            self._records,
        ))
        self._input_bytes = self._records = 0


class SsbGraphWindow(_OwnerAndFragments, WindowAggregate):
    """The owner's window (the windows of the keys this executor owns, joined from every
    executor's fragments) and this executor's fragments (`fragments`, a window that never
    fires: its slices and tails are shipped instead)."""

    STATE_KIND, STATE_VERSION = "ssb_graph_window", 1
    FRAGMENTS = WindowAggregate

    async def fold(self, batch: Batch, clock) -> None:
        """Records at `clock.now`: into the fragments, the late ones split off and counted."""
        self.fragments.clock = clock
        await self.fragments.push(batch)
        self._count_input(batch)

    def fragment_holds(self) -> frozenset[Timestamp]:
        """The capabilities of the fragments holding state, each at its first window's end - 1
        (`PointstampProgress` counts them at the step's second input port)."""
        return frozenset(Timestamp(t) for t in _held_ends(self.fragments))

    def take_due(self, frontier) -> list[tuple[Timestamp, np.ndarray]]:
        """The fragments whose first window the records' `frontier` passed, as partial rows at
        their times, removed from the fragments."""
        until = min((t.epoch for t in frontier), default=None)
        return [(Timestamp(t), rows) for t, rows in _take_due(self.fragments, until, self.value_dtype)]

    async def join(self, rows: np.ndarray, counters: tuple[int, ...] = ()) -> None:
        _join(self, rows)

    # -- state: the owner's windows and the fragments ----------------------------------------------
    def snapshot(self) -> State:
        meta = {**self._window_meta(), "fragments": self.fragments._window_meta(),
                "counters": [self._input_bytes, self._records]}
        arrays = {**self._window_arrays(), **self.fragments._window_arrays("fragments.")}
        return tagged(self.STATE_KIND, self.STATE_VERSION, arrays, step=self.step_id, **meta)

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        self._restore_window(state.arrays, meta)
        self.fragments._restore_window(state.arrays, meta["fragments"], "fragments.")
        self._input_bytes, self._records = meta["counters"]


class SsbLoopWindow(_OwnerAndFragments, LoopWindow):
    """Inside loops: the owner's windows, one per iteration (a `LoopWindow`), and this
    executor's fragments, one window per iteration that never fires (`fragments`); a
    fragment's time carries its iteration's counters."""

    STATE_KIND, STATE_VERSION = "ssb_loop_window", 1
    FRAGMENTS = LoopWindow

    async def fold(self, batch: Batch, clock) -> None:
        self.fragments.clock = clock
        await self.fragments.push(batch)
        self._count_input(batch)
        if self.value_dtype is None:
            self.value_dtype = self.fragments.value_dtype

    def fragment_holds(self) -> frozenset[Timestamp]:
        return frozenset(
            Timestamp(t, counters) for counters, window in self.fragments.windows.items() for t in _held_ends(window)
        )

    def take_due(self, frontier) -> list[tuple[Timestamp, np.ndarray]]:
        """Per iteration, the fragments its part of the records' `frontier` passed; an
        iteration nothing can reach any more ships all and is forgotten (its late count kept)."""
        due = []
        for counters in sorted(self.fragments.windows):
            window = self.fragments.windows[counters]
            until = iteration_watermark(frontier, counters)
            due += [(Timestamp(t, counters), rows) for t, rows in _take_due(window, until, self.value_dtype)]
            if until is None:
                self.fragments._forgotten_late += window.late_records
                del self.fragments.windows[counters]
        return due

    async def join(self, rows: np.ndarray, counters: tuple[int, ...] = ()) -> None:
        await _join_iteration(self, rows, counters)

    # -- state: the owner's windows and the fragments, each a loop window's ------------------------
    def snapshot(self) -> State:
        owner, fragments = LoopWindow.snapshot(self), self.fragments.snapshot()
        arrays = {**owner.arrays, **{f"fragments.{k}": v for k, v in fragments.arrays.items()}}
        meta = {**owner.meta, "fragments": fragments.meta, "counters": [self._input_bytes, self._records]}
        return tagged(self.STATE_KIND, self.STATE_VERSION, arrays, **{k: v for k, v in meta.items() if k not in ("kind", "version")})

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        prefix = "fragments."
        owner = {k: v for k, v in state.arrays.items() if not k.startswith(prefix)}
        fragments = {k[len(prefix):]: v for k, v in state.arrays.items() if k.startswith(prefix)}
        LoopWindow.restore(self, State(owner, meta))  # (it checks the kind it is: ours)
        self.fragments.restore(State(fragments, meta["fragments"]))
        self._input_bytes, self._records = meta["counters"]


class SsbRoute(WindowRoute):
    """Stands where a keyed window is in a graph flow on several executors in `mode="slash"`:
    folds its records into fragments, ships them to their keys' owners when due (inside loops
    per iteration, the rows' hidden columns carrying its counters)."""

    def __init__(self, spec: WindowAggSpec, late, *, index: int, partitioning: Partitioning):
        window = SsbLoopWindow(spec, late) if spec.scope else SsbGraphWindow(spec, late)
        self.window = window
        self.upstream = spec.up  # the step whose output frontier says when fragments are due
        dtype = partial_dtype(window.value_dtype if window.value_dtype is not None else np.dtype("<i8"))
        super(WindowRoute, self).__init__(
            ExchangeSpec(spec.step_id, spec.up, "key", dtype, len(spec.scope)), index=index, partitioning=partitioning
        )

    async def push(self, batch: Batch) -> None:
        await self.window.fold(batch, self.clock)

    async def on_upstream(self, frontier) -> None:
        """The frontier of the records reaching this step moved (empty: no record can come any
        more): ship the fragments whose first window it passed."""
        due = self.window.take_due(frontier)
        if not due:
            return
        remote = total = nbytes = 0
        for time, rows in due:
            total += len(rows)
            owners = self.partitioning.owner_of(rows["key"])
            mine = owners == self.index
            if mine.any():
                await self.window.join(rows[mine], time.counters)
            for owner in np.unique(owners[~mine]).tolist():
                part = rows[owners == owner]
                out = np.empty(len(part), self.exchange_dtype)
                for name in part.dtype.names:
                    out[name] = part[name]
                out["__epoch"] = time.epoch
                for i, counter in enumerate(time.counters):
                    out[f"__c{i}"] = counter
                self._enqueue(owner, out, time)
                remote += len(part)
                nbytes += out.nbytes
        self.window.shipped(total, remote, nbytes, min((t.epoch for t in frontier), default=None))

    async def take(self, rows: np.ndarray) -> None:
        await self.window.join(rows, self.clock.now.counters)


async def adopt_in_flight(node, rows: np.ndarray) -> None:
    """After a rescaled restore (`slashrt.snapshot.rescale.graph_in_flight`): rows an old
    executor had in flight to the input of step `node` (shipped, not yet taken) whose keys this
    executor now owns, taken at their times as if they had just arrived, then no longer in
    flight (counted at the restore). Records, or an SSB window's partial rows, into whatever
    this run has at the step: an exchange, a window's route (either mode), or on one executor
    the window itself."""
    times = time_columns(rows)
    rows = rows[np.lexsort(times.T[::-1])]  # (from several old executors: one run per time)
    partial = {"slice", "closed"} <= set(rows.dtype.names)
    window = node.window if isinstance(node, WindowRoute) else node

    async def take(run: np.ndarray, time: Timestamp) -> None:
        if partial:  # a fragment's rows: joined into the owner's window (inside loops, its iteration's)
            if isinstance(window, LoopWindow):
                await _join_iteration(window, run, time.counters)
            else:
                _join(window, run)
        elif isinstance(node, ExchangeNode) and not isinstance(node, SsbRoute):
            await node.take(run)  # on downstream (a route: into its window)
        else:  # records into the fragments (SSB) or the window (one executor)
            names = [n for n in run.dtype.names if not n.startswith("__")]
            out = np.empty(len(run), [(n, run.dtype.fields[n][0]) for n in names])
            for n in names:
                out[n] = run[n]
            await node.push(Batch(out))

    await take_by_time(node, rows, take)
