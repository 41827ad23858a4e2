"""A graph flow's keyed window on the Slash State Backend (`mode="slash"` on several executors).

Every executor folds the records that reach the window into its own *fragments* (a partial
state per window slice, as the SSB's epochs do in a tree flow: `slashrt.ops.ssb_window`), and
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

A record crosses the network only inside a fragment: one row per key a slice saw on an
executor, not one per record (`EpochStats` per shipment, `RunResult.epochs`).
"""

from __future__ import annotations

import numpy as np

from slashrt._batch import Batch
from slashrt._dataflow import ExchangeSpec, WindowAggSpec
from slashrt.errors import DataflowError
from slashrt.ops.route import WindowRoute
from slashrt.ops.ssb_window import EpochStats
from slashrt.ops.window import NO_TIME, WindowAggregate
from slashrt.progress import Timestamp
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.ssb.partitions import Partitioning

__all__ = ["SsbGraphWindow", "SsbRoute", "partial_dtype"]


def partial_dtype(value_dtype: np.dtype) -> np.dtype:
    """A fragment's row: a key's partial state in one slice, and the end of the last window of
    the slice it must not join (NO_TIME: none)."""
    return np.dtype(
        [("slice", "<i8"), ("key", "<i8"), ("count", "<i8"), ("value", np.dtype(value_dtype).newbyteorder("<")),
         ("closed", "<i8")]
    )


class SsbGraphWindow(WindowAggregate):
    """The owner's window (the windows of the keys this executor owns, joined from every
    executor's fragments) and this executor's fragments (`fragments`, a window that never
    fires: its slices and tails are shipped instead)."""

    STATE_KIND, STATE_VERSION = "ssb_graph_window", 1

    def __init__(self, spec: WindowAggSpec, late):
        super().__init__(spec, None)  # the owner judges nothing late: the fragments did
        self.fragments = WindowAggregate(spec, late)
        self.epochs: list[EpochStats] = []  # one per shipment (named after the SSB's epochs)
        self._input_bytes = self._records = 0

    @property
    def late_records(self) -> int:
        return self.fragments.late_records if hasattr(self, "fragments") else 0

    @late_records.setter
    def late_records(self, value: int) -> None:
        pass  # (the owner's count stays 0: WindowAggregate's constructor and restore set it)

    async def fold(self, batch: Batch, clock) -> None:
        """Records at `clock.now`: into the fragments, the late ones split off and counted."""
        self.fragments.clock = clock
        await self.fragments.push(batch)
        self._input_bytes += batch.nbytes
        self._records += len(batch)

    def pieces(self) -> list[tuple[int, int, int]]:
        """(slice, closed, end) of every fragment table: the end of the first window it joins
        (a slice's table may be empty: one made for its tail)."""
        out = [(s, NO_TIME, int(self._earliest_end(s))) for s in self.fragments.slices]
        for s, closed in self.fragments.tails:
            first = int(self._earliest_end(s))
            end = first if first > closed else first + ((closed - first) // self.slide + 1) * self.slide
            out.append((s, closed, end))
        return out

    def fragment_holds(self) -> frozenset[Timestamp]:
        """The capabilities of the fragments holding state, each at its first window's end - 1
        (`PointstampProgress` counts them at the step's second input port)."""
        tables = self.fragments.slices, self.fragments.tails
        return frozenset(Timestamp(end - 1) for s, closed, end in self.pieces()
                         if len(tables[closed != NO_TIME][s if closed == NO_TIME else (s, closed)]))

    def take_due(self, until: int | None) -> list[tuple[int, np.ndarray]]:
        """The fragment tables whose first window ends by `until` (None: all), as partial rows,
        each with the time it is held at (its end - 1), removed from the fragments."""
        due = []
        for s, closed, end in self.pieces():
            if until is not None and end > until:
                continue
            table = self.fragments.slices[s] if closed == NO_TIME else self.fragments.tails[(s, closed)]
            if self.spec.overflow == "error" and table.overflowed:  # (a partial state does not carry the flag)
                self._overflowed(f"the slice [{s * self.slice_len}, {(s + 1) * self.slice_len}) of this executor")
            keys, counts, vals = table.export()
            if closed == NO_TIME:
                self.fragments._drop_slice(s)
            else:
                del self.fragments.tails[(s, closed)]
            if not len(keys):
                continue
            rows = np.empty(len(keys), partial_dtype(self.value_dtype))
            rows["slice"], rows["key"], rows["count"], rows["value"], rows["closed"] = s, keys, counts, vals, closed
            due.append((end - 1, rows))
        return due

    def join(self, rows: np.ndarray) -> None:
        """Partial rows of keys this executor owns (one shipment or its own): into its windows."""
        closed = rows["closed"]
        values = np.unique(closed).tolist()
        for c in values:
            part = rows if len(values) == 1 else rows[closed == c]
            self.merge_partials(part["slice"], part["key"], part["count"], part["value"], c)

    def shipped(self, rows: int, remote: int, nbytes: int, until: int | None) -> None:
        """Count a shipment: `rows` partial rows, `remote` of them (`nbytes`) to other executors."""
        self.epochs.append(EpochStats(
            len(self.epochs) + 1, self._input_bytes, rows, remote, nbytes, NO_TIME if until is None else until,
            self._records,
        ))
        self._input_bytes = self._records = 0

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


class SsbRoute(WindowRoute):
    """Stands where a keyed window is in a graph flow on several executors in `mode="slash"`:
    folds its records into fragments, ships them to their keys' owners when due."""

    def __init__(self, spec: WindowAggSpec, late, *, index: int, partitioning: Partitioning):
        if spec.scope:
            raise DataflowError(
                f"step {spec.step_id!r}: a keyed window inside a loop routes its records by key (mode='uppar'); "
                "mode='slash' runs the windows outside loops on the Slash State Backend"
            )
        window = SsbGraphWindow(spec, late)
        self.window = window
        self.upstream = spec.up  # the step whose output frontier says when fragments are due
        dtype = partial_dtype(window.value_dtype if window.value_dtype is not None else np.dtype("<i8"))
        super(WindowRoute, self).__init__(
            ExchangeSpec(spec.step_id, spec.up, "key", dtype, 0), index=index, partitioning=partitioning
        )

    async def push(self, batch: Batch) -> None:
        await self.window.fold(batch, self.clock)

    async def on_upstream(self, epoch: int | None) -> None:
        """The frontier of the records reaching this step moved (its least epoch; None: no
        record can come any more): ship the fragments whose first window it passed."""
        await self._ship_due(epoch)

    async def _ship_due(self, until: int | None) -> None:
        due = self.window.take_due(until)
        if not due:
            return
        remote = total = nbytes = 0
        for held, rows in due:
            total += len(rows)
            owners = self.partitioning.owner_of(rows["key"])
            mine = owners == self.index
            if mine.any():
                self.window.join(rows[mine])
            time = Timestamp(held)
            for owner in np.unique(owners[~mine]).tolist():
                part = rows[owners == owner]
                out = np.empty(len(part), self.exchange_dtype)
                for name in part.dtype.names:
                    out[name] = part[name]
                out["__epoch"] = held
                self._enqueue(owner, out, time)
                remote += len(part)
                nbytes += out.nbytes
        self.window.shipped(total, remote, nbytes, until)

    async def take(self, rows: np.ndarray) -> None:
        self.window.join(rows)
