"""A keyed window on the Slash State Backend (`mode="slash"` on several executors).

Every executor folds the records that reach the window into its own *fragments* (a partial
state per window slice), and
ships a fragment to the owners of its keys once no more records can join its earliest
window: when the frontier of the records arriving at the step (at the output of the step
before it: `PointstampProgress` hands it over, `on_upstream`) passes that window's end. The
owner joins the partial states (a CRDT merge) into its window, which fires on the frontier
at the step's input, as a routed window does (`slashrt.ops.route.WindowRoute`).

Epochs and routing (`epoch_bytes`, `ssb_routing`: `slashrt.ssb.epochs`). An epoch ends every
`epoch_bytes` of the window's input (checked after each batch): every fragment then ships
what it holds, due or not (`take_all`: the delta since its last shipment, after which it
restarts from the zero value), so a long window's fragments stay small. An epoch also ends at each shipment of due fragments. Routed *directly*, a record is
judged late or not where it is read, as the fragments would judge it, and goes to its key's
owner at once as a partial row of its own (count 1, under the NaN policy:
`records_as_partials`), at the time its fragment would have been held at (`_as_partials`);
such an epoch ends at `epoch_bytes` too, or once the records' frontier passed a window its
rows joined. `routing="auto"` switches from epoch to epoch
(`routes_directly`: `DIRECT_AT`, `COMBINE_BELOW`; `keys_unrepeated` ends a folding epoch
early). `EpochStats` counts each epoch's input, its rows shipped (joined here or sent) and
their bytes (`RunResult.epochs`).

Pointstamps keep that exact: a fragment is a capability of the step at the time before the
end of the first window it joins, counted at a second input port of the step that no edge
feeds (`progress_graph(flow, fragments)`); shipped, its rows are counted in flight at the
step's input at that time until their owner took them, in the same progress update that
drops the capability. A fragment shipped at an epoch's end before it is due keeps its
capability (`kept`, a checkpoint keeps it too) until the records' frontier passes its window,
its last shipment: whatever joins it meanwhile ships at that time too. The owner's window
fires on the frontier at both ports: no window fires before every executor's fragment of it
arrived, whatever their speeds. (Counted at the input beside the rows, an owner taking rows
before their sender's update reached it would cancel another executor's capability at the
same pointstamp; at the output, beside the windows' own capabilities, every owner would wait
for every other's earliest window: a progress round per window.) The records' frontier that
makes fragments due is read one location upstream, which their capabilities never hold back.

Deltas of one slice, from one executor (its epochs, in order on the channel) or several,
before or after a checkpoint's restore, join in any order: partial states are CRDTs and each
delta is shipped, and joined, once (a fragment restarts from the zero value after it).

Lateness is judged where a record is read, by the rule of a plain window (the logical time
of its batch closes the windows ending by it): a record partly late for a sliding window's
slice joins a *tail* of that slice, kept apart by the end its windows closed at. A partial row
carries no such end: its time says it. A piece is shipped at the time before the end of the
first window it joins (`_held_end`: a slice's first, a tail's the first after the closed
ones), so the owner joins a row at time t into the windows of its slice ending after t
(`_join`; `WindowAggregate.merge_slice`): for a tail the windows after those closed, there
being no window end in between; for a slice all of them. A row is 40 bytes (slice, key,
count, value and its time).

Inside loops (`SsbLoopWindow`) every iteration has its fragments and its owner's window, as
a `LoopWindow` has a window per iteration: a fragment is due when the records' frontier at its
iteration passes its window (`iteration_watermark`), and its time, and its rows' hidden
columns, carry the iteration's counters.

Folded, a record crosses the network only inside a fragment: one row per key a slice saw on
an executor in an epoch, not one per record.
"""

from __future__ import annotations

import attrs
import numpy as np

from slashrt._batch import Batch
from slashrt._dataflow import ExchangeSpec, WindowAggSpec
from slashrt._kernels import minmax
from slashrt.ops.route import ExchangeNode, WindowRoute, time_columns, take_by_time
from slashrt.ops.loop_window import LoopWindow, iteration_watermark
from slashrt.ops.window import NO_TIME, WindowAggregate, _flat
from slashrt.progress import Timestamp
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.ssb.crdt import records_as_partials
from slashrt.ssb.partitions import Partitioning
from slashrt.ssb.epochs import DEFAULT_EPOCH_BYTES, EpochStats, check_routing, keys_unrepeated, routes_directly

__all__ = ["SsbGraphWindow", "SsbLoopWindow", "SsbRoute", "partial_dtype", "is_partial", "adopt_in_flight"]


PARTIAL_FIELDS = ("slice", "key", "count", "value")


def partial_dtype(value_dtype: np.dtype) -> np.dtype:
    """A fragment's row: a key's partial state in one slice (the windows of the slice it joins
    follow from the time it ships at: `_join`)."""
    return np.dtype(
        [("slice", "<i8"), ("key", "<i8"), ("count", "<i8"), ("value", np.dtype(value_dtype).newbyteorder("<"))]
    )


def is_partial(rows: np.ndarray) -> bool:
    """Are `rows` (shipped to a window's step, or in flight there in a checkpoint) partial rows
    of fragments (`partial_dtype`), not records? Routed records carry at most three columns of
    their own (`routed_dtype`), an exchange's their times (`__t`). Partial rows of checkpoints
    taken before rows lost their `closed` column (its end of the windows a tail must not join,
    which their time always said too) are partial rows: read by name, the column left aside."""
    names = [n for n in rows.dtype.names if not n.startswith("__")]
    return "__t" not in rows.dtype.names and names in (list(PARTIAL_FIELDS), [*PARTIAL_FIELDS, "closed"])


def _held_end(fragments: WindowAggregate, slice_ids, closed: int):
    """The end of the first window a piece of each slice (in `slice_ids`) joins: a slice's first
    window's end, or for a tail, whose windows ending by `closed` closed, the first after it."""
    first = fragments._earliest_end(slice_ids)
    # (one expression for a slice id and an array of them)
    return np.where(first > closed, first, first + ((closed - first) // fragments.slide + 1) * fragments.slide)


def _pieces(fragments: WindowAggregate) -> list[tuple[int, int, int]]:
    """(slice, closed, end) of every table of `fragments`: the end of the first window it joins
    (a slice's table may be empty: one made for its tail)."""
    out = [(s, NO_TIME, int(fragments._earliest_end(s))) for s in fragments.slices]
    out += [(s, closed, int(_held_end(fragments, s, closed))) for s, closed in fragments.tails]
    return out


def _held_ends(fragments: WindowAggregate) -> set[int]:
    """The times the tables of `fragments` holding state are held at: their first window's end - 1."""
    tables = fragments.slices, fragments.tails
    return {end - 1 for s, closed, end in _pieces(fragments)
            if len(tables[closed != NO_TIME][s if closed == NO_TIME else (s, closed)])}


@attrs.frozen
class _Piece:
    """Partial states to ship at one logical `time`, the end of the first window they join - 1
    (a fragment's table, or records routed directly): their slices (one id, or one per row),
    keys, counts (None: records, one each) and values (None: a count's records carry none)."""

    time: Timestamp
    slices: int | np.ndarray
    keys: np.ndarray
    counts: np.ndarray | None
    vals: np.ndarray | None


def _take_due(fragments: WindowAggregate, until: int | None, counters: tuple[int, ...] = ()) -> list[_Piece]:
    """The tables of `fragments` whose first window ends by `until` (None: all), as pieces at
    the time each is held at (its end - 1, in the iteration of `counters`), removed from the
    fragments (a table restarts from the zero value when a record joins its piece again)."""
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
        if len(keys):
            due.append(_Piece(Timestamp(end - 1, counters), s, keys, counts, vals))
    return due


async def _as_partials(fragments: WindowAggregate, batch: Batch, epoch: int, counters: tuple[int, ...] = ()) -> list[_Piece]:
    """Direct routing: the records of `batch`, carried at `epoch` (in the iteration of
    `counters`), judged as `fragments` judges the records it folds (`WindowAggregate.push`:
    the late ones counted and sent to its late sink, the partly late ones kept out of the
    windows that closed), in pieces of the time their table would be held at (`_take_due`)."""
    times = _flat(batch.view(fragments.spec.time))
    if not len(times):
        return []
    fragments._check_times(*minmax(times))
    closed = fragments.promise(epoch)
    slice_ids = times // fragments.slice_len
    if fragments._earliest_end(int(minmax(slice_ids)[0])) <= closed:
        batch, slice_ids = await fragments._split_late(batch, slice_ids, closed)
        if not len(batch):
            return []
    keys, values = fragments._fields(batch)
    keys, values = _flat(keys), None if values is None else _flat(values)
    lo, hi = minmax(slice_ids)
    if lo == hi:  # the common case: one slice
        end = int(_held_end(fragments, int(lo), closed))
        return [_Piece(Timestamp(end - 1, counters), slice_ids, keys, None, values)]
    ends = _held_end(fragments, slice_ids, closed)  # (a partly late slice's: after the closed windows)
    order = np.lexsort((slice_ids, ends))  # (a piece's slices in runs: one merge each at the owner)
    ends = ends[order]
    cuts = [0, *(np.flatnonzero(ends[1:] != ends[:-1]) + 1).tolist(), len(order)]
    return [
        _Piece(Timestamp(int(ends[a]) - 1, counters), slice_ids[order[a:b]], keys[order[a:b]], None,
               None if values is None else values[order[a:b]])
        for a, b in zip(cuts[:-1], cuts[1:])
    ]


def _join(window: WindowAggregate, rows: np.ndarray, held: int) -> int:
    """Partial rows of keys this executor owns, shipped at time `held` (in the iteration
    `window` aggregates), into `window`: into their slices' windows ending after `held`, the
    end of the first window they join - 1 (a tail's windows ending by it closed where it was
    judged; a slice has none ending by it). `rows` arrived in a run of channel slots are 2-D
    (slots x rows), their fields read in place (`WindowAggregate.merge_partials`). Returns how
    many keys were new to their slice."""
    return window.merge_partials(rows["slice"], rows["key"], rows["count"], rows["value"], held)


async def _iteration_window(loop: LoopWindow, counters: tuple[int, ...]) -> WindowAggregate:
    """The window of `loop` of the iteration of `counters` (made if new)."""
    window = loop.windows.get(counters)
    if window is None:
        window = loop._window(counters)
        if loop.frontier is not None:  # it starts where the frontier stands (nothing to fire yet)
            await window.on_frontier(iteration_watermark(loop.frontier, counters))
    return window


def _passed(frontier, times) -> set[Timestamp]:
    """The `times` (pieces held at their first window's end - 1) the records' `frontier` passed
    at their iteration: no record can join their windows any more."""
    out = set()
    for t in times:
        until = iteration_watermark(frontier, t.counters)
        if until is None or t.epoch < until:
            out.add(t)
    return out


@attrs.define
class _OpenEpoch:
    """What the open epoch did so far (`EpochStats` once it ends)."""

    input_bytes: int = 0  # of input read
    records: int = 0
    rows: int = 0  # partial rows shipped (joined here or sent)
    remote: int = 0  # of them, sent to other executors
    nbytes: int = 0  # their bytes
    own_records: int = 0  # direct: records of keys this executor owns, joined here
    own_new: int = 0  # of them, keys new to their slice here
    routed: set = attrs.Factory(set)  # direct: the times of the rows routed


class _OwnerAndFragments:
    """What both SSB windows share: the owner's window is the class itself
    (a `WindowAggregate` or a `LoopWindow`), its fragments one of the same kind (`FRAGMENTS`)
    that never fires, which judges lateness (the owner merges partial states only); the
    epochs and their routing (`epoch_bytes`, `routing`); and what they shipped
    (`RunResult.epochs`)."""

    FRAGMENTS: type

    def __init__(self, spec: WindowAggSpec, late, *, epoch_bytes: int = DEFAULT_EPOCH_BYTES, routing: str = "auto"):
        super().__init__(spec, None)  # the owner judges nothing late: the fragments did
        self.fragments = self.FRAGMENTS(spec, late)
        self.epoch_bytes = epoch_bytes
        self.routing = check_routing(routing)
        self.direct = routing == "direct"  # the open epoch routes records as they are read
        # capabilities of fragments that shipped at an epoch's end before they were due: held
        # until the records' frontier passes their windows (their last shipment)
        self.kept: set[Timestamp] = set()
        self.epochs: list[EpochStats] = []  # one per epoch
        self._open = _OpenEpoch()

    @property
    def late_records(self) -> int:
        return self.fragments.late_records if hasattr(self, "fragments") else 0

    @late_records.setter
    def late_records(self, value: int) -> None:
        pass  # (the owner's count stays 0: WindowAggregate's constructor and restore set it)

    def _count_input(self, batch: Batch) -> None:
        self._open.input_bytes += batch.nbytes
        self._open.records += len(batch)

    # -- epochs ---------------------------------------------------------------------------------------
    def epoch_full(self) -> bool:
        """Has the open epoch read `epoch_bytes` of input, or (`auto`, folding) shown that its
        keys do not repeat (`keys_unrepeated`)?"""
        e = self._open
        return e.input_bytes >= self.epoch_bytes or keys_unrepeated(
            self.routing, self.direct, e.records, self._fragment_entries
        )

    def take_due(self, frontier) -> list[_Piece]:
        """The fragments whose first window the records' `frontier` passed, as pieces at their
        times, removed from the fragments; those shipped before stop holding their capability."""
        self.kept -= _passed(frontier, self.kept)
        return self._due_pieces(frontier)

    def take_all(self) -> list[_Piece]:
        """An epoch's end: every fragment's content (its delta since its last shipment) as
        pieces at their times; each restarts from the zero value and keeps its capability
        until it is due."""
        pieces = self._all_pieces()
        self.kept.update(piece.time for piece in pieces)
        return pieces

    def shipped(self, rows: int, remote: int, nbytes: int) -> None:
        """Count a shipment in the open epoch: `rows` partial rows, `remote` of them (`nbytes`)
        to other executors."""
        self._open.rows += rows
        self._open.remote += remote
        self._open.nbytes += nbytes

    def routed_own(self, records: int, new: int) -> None:
        """Direct routing joined `records` of keys this executor owns, `new` of them new to their slice."""
        self._open.own_records += records
        self._open.own_new += new

    def epoch_ends(self, frontier) -> bool:
        """Does the open epoch end at the records' `frontier` without a shipment of fragments?
        A direct one once it passed a window its rows joined, any once it is empty (the last)."""
        if not frontier:
            return bool(self._open.records or self._open.rows)
        return bool(_passed(frontier, self._open.routed))

    def end_epoch(self, watermark: int | None, queued_peak: int = 0) -> None:
        """Close the open epoch (`RunResult.epochs`: `watermark`, the records' frontier or the
        batch's time where it ended; `queued_peak`, the most bytes its route held queued for
        the peers at once); under "auto" its ratios choose the next one's routing."""
        e = self._open
        watermark = NO_TIME if watermark is None else watermark
        self.epochs.append(EpochStats(
            len(self.epochs) + 1, e.input_bytes, e.rows, e.remote, e.nbytes, watermark, e.records, self.direct,
            queued_peak,
        ))
        if self.routing == "auto" and e.records:
            self.direct = routes_directly(self.direct, e.rows, e.records, e.own_records, e.own_new)
        self._open = _OpenEpoch()

    # -- state: the epoch's, beside the owner's windows and the fragments -------------------------------
    def _epoch_meta(self) -> dict:
        e = self._open
        return {
            "counters": [e.input_bytes, e.records],
            "open_epoch": [e.rows, e.remote, e.nbytes, e.own_records, e.own_new],
            "routed": sorted([t.epoch, *t.counters] for t in e.routed), "direct": self.direct,
            "kept": sorted([t.epoch, *t.counters] for t in self.kept),
        }

    def _restore_epoch(self, meta: dict) -> None:
        # (a rescaled state has only the counters, zeros: its old fragments joined their owners;
        # routing then starts anew as the run's option says)
        self._open = _OpenEpoch(*meta["counters"], *meta.get("open_epoch", ()),
                                routed={Timestamp(t[0], tuple(t[1:])) for t in meta.get("routed", ())})
        self.direct = meta.get("direct", False) if self.routing == "auto" else self.routing == "direct"
        self.kept = {Timestamp(t[0], tuple(t[1:])) for t in meta.get("kept", ())}


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

    async def route(self, batch: Batch, clock) -> list[_Piece]:
        """Direct routing: records at `clock.now` in pieces to ship as they are (`_as_partials`)."""
        pieces = await _as_partials(self.fragments, batch, clock.now.epoch)
        self._count_input(batch)
        self._open.routed.update(piece.time for piece in pieces)
        return pieces

    def _fragment_entries(self) -> int:
        return self.fragments.entries()

    def fragment_holds(self) -> frozenset[Timestamp]:
        """The capabilities of the fragments holding state, each at its first window's end - 1,
        and of those shipped before they were due (`PointstampProgress` counts them at the
        step's second input port)."""
        return frozenset(Timestamp(t) for t in _held_ends(self.fragments)) | self.kept

    def _due_pieces(self, frontier) -> list[_Piece]:
        return _take_due(self.fragments, min((t.epoch for t in frontier), default=None))

    def _all_pieces(self) -> list[_Piece]:
        return _take_due(self.fragments, None)

    async def owner_window(self, counters: tuple[int, ...] = ()) -> WindowAggregate:
        """The window joining what this executor owns (of the iteration of `counters`)."""
        return self

    # -- state: the owner's windows, the fragments and the open epoch ----------------------------
    def snapshot(self) -> State:
        meta = {**self._window_meta(), "fragments": self.fragments._window_meta(), **self._epoch_meta()}
        arrays = {**self._window_arrays(), **self.fragments._window_arrays("fragments.")}
        return tagged(self.STATE_KIND, self.STATE_VERSION, arrays, step=self.step_id, **meta)

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        self._restore_window(state.arrays, meta)
        self.fragments._restore_window(state.arrays, meta["fragments"], "fragments.")
        self._restore_epoch(meta)


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

    async def route(self, batch: Batch, clock) -> list[_Piece]:
        """Direct routing: records at `clock.now` in pieces to ship as they are, judged by the
        fragments of their iteration (`_as_partials`)."""
        self.fragments.clock = clock
        counters = clock.now.counters
        window = self.fragments.windows.get(counters)
        if window is None:
            window = self.fragments._window(counters)
        pieces = await _as_partials(window, batch, clock.now.epoch, counters)
        self._count_input(batch)
        if self.value_dtype is None:  # (every iteration's, as `LoopWindow.push` decides it)
            self.value_dtype = self.fragments.value_dtype = window.value_dtype
        self._open.routed.update(piece.time for piece in pieces)
        return pieces

    def _fragment_entries(self) -> int:
        return sum(window.entries() for window in self.fragments.windows.values())

    def fragment_holds(self) -> frozenset[Timestamp]:
        return frozenset(
            Timestamp(t, counters) for counters, window in self.fragments.windows.items() for t in _held_ends(window)
        ) | self.kept

    def _due_pieces(self, frontier) -> list[_Piece]:
        """Per iteration, the fragments its part of the records' `frontier` passed; an
        iteration nothing can reach any more ships all and is forgotten (its late count kept)."""
        due = []
        for counters in sorted(self.fragments.windows):
            window = self.fragments.windows[counters]
            until = iteration_watermark(frontier, counters)
            due += _take_due(window, until, counters)
            if until is None:
                self.fragments._forgotten_late += window.late_records
                del self.fragments.windows[counters]
        return due

    def _all_pieces(self) -> list[_Piece]:
        return [piece for counters in sorted(self.fragments.windows)
                for piece in _take_due(self.fragments.windows[counters], None, counters)]

    async def owner_window(self, counters: tuple[int, ...] = ()) -> WindowAggregate:
        return await _iteration_window(self, counters)

    # -- state: the owner's windows and the fragments, each a loop window's, and the open epoch ----
    def snapshot(self) -> State:
        owner, fragments = LoopWindow.snapshot(self), self.fragments.snapshot()
        arrays = {**owner.arrays, **{f"fragments.{k}": v for k, v in fragments.arrays.items()}}
        meta = {**owner.meta, "fragments": fragments.meta, **self._epoch_meta()}
        return tagged(self.STATE_KIND, self.STATE_VERSION, arrays, **{k: v for k, v in meta.items() if k not in ("kind", "version")})

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        prefix = "fragments."
        owner = {k: v for k, v in state.arrays.items() if not k.startswith(prefix)}
        fragments = {k[len(prefix):]: v for k, v in state.arrays.items() if k.startswith(prefix)}
        LoopWindow.restore(self, State(owner, meta))  # (it checks the kind it is: ours)
        self.fragments.restore(State(fragments, meta["fragments"]))
        self._restore_epoch(meta)


class SsbRoute(WindowRoute):
    """Stands where a keyed window is on several executors in `mode="slash"`:
    folds its records into fragments (or routes them directly), ships them to their keys'
    owners when due and at each epoch's end (inside loops per iteration, the rows' hidden
    columns carrying its counters)."""

    def __init__(self, spec: WindowAggSpec, late, *, index: int, partitioning: Partitioning,
                 epoch_bytes: int = DEFAULT_EPOCH_BYTES, routing: str = "auto"):
        dtype = partial_dtype(spec.shared_value_dtype())  # rows of a fixed size: refused if not known
        kind = SsbLoopWindow if spec.scope else SsbGraphWindow
        window = kind(spec, late, epoch_bytes=epoch_bytes, routing=routing)
        self.window = window
        self.upstream = spec.up  # the step whose output frontier says when fragments are due
        super(WindowRoute, self).__init__(
            ExchangeSpec(spec.step_id, spec.up, "key", dtype, len(spec.scope)), index=index, partitioning=partitioning
        )

    async def push(self, batch: Batch) -> None:
        window = self.window
        if window.direct:
            await self._ship_pieces(await window.route(batch, self.clock), direct=True)
        else:
            await window.fold(batch, self.clock)
        if window.epoch_full():
            await self._ship_pieces(window.take_all())
            self._end_epoch(self.clock.now.epoch)

    async def on_upstream(self, frontier) -> None:
        """The frontier of the records reaching this step moved (empty: no record can come any
        more): ship the fragments whose first window it passed."""
        window = self.window
        due = window.take_due(frontier)
        if due:
            await self._ship_pieces(due)
        if due or window.epoch_ends(frontier):
            self._end_epoch(min((t.epoch for t in frontier), default=None))

    def _end_epoch(self, watermark: int | None) -> None:
        self.window.end_epoch(watermark, self.queued_peak * self.exchange_dtype.itemsize)
        self.queued_peak = self.queued  # (the next epoch's peak starts from what is still queued)

    async def _ship_pieces(self, pieces: list[_Piece], direct: bool = False) -> None:
        """Pieces of one time each to their keys' owners: their own joined at once, the others
        queued for their owners, counted in flight at the step's input at that time
        (`_enqueue`). `direct`: records routed as they were read."""
        total = remote = nbytes = own = new = 0
        for piece in pieces:
            rows, parts = self._rows(piece)
            total += len(rows)
            for owner, part in enumerate(parts):
                those = rows[part]
                if not len(those):
                    continue
                if owner != self.index:
                    self._enqueue(owner, those, piece.time)
                    remote += len(those)
                    nbytes += those.nbytes
                    continue
                own += len(those)
                new += _join(await self.window.owner_window(piece.time.counters), those, piece.time.epoch)
        self.window.shipped(total, remote, nbytes)
        if direct:
            self.window.routed_own(own, new)

    def _rows(self, piece: _Piece) -> tuple[np.ndarray, list[slice]]:
        """`piece` as rows to ship, grouped by their keys' owners in one native pass
        (`Partitioning.route`), and the slice of each owner's rows; records become partial
        states of one record each (count 1, under the NaN policy)."""
        rows = np.empty(len(piece.keys), self.exchange_dtype)
        value = rows.dtype["value"]
        if piece.counts is None:  # records: their slice ids are routed in the count's place
            vals = piece.keys if piece.vals is None else piece.vals.astype(value, copy=False)  # (a count's: dummies)
            parts = self.partitioning.route(piece.keys, piece.slices, vals, (rows["key"], rows["slice"], rows["value"]))
            rows["count"] = 1
            if piece.vals is None:
                rows["value"] = 0
            else:
                records_as_partials(self.window.spec.kind, rows["count"], rows["value"])
        else:
            parts = self.partitioning.route(piece.keys, piece.counts, piece.vals.astype(value, copy=False),
                                            (rows["key"], rows["count"], rows["value"]))
            rows["slice"] = piece.slices
        rows["__epoch"] = piece.time.epoch
        for i, counter in enumerate(piece.time.counters):
            rows[f"__c{i}"] = counter
        return rows, parts

    async def take(self, rows: np.ndarray) -> None:
        now = self.clock.now
        _join(await self.window.owner_window(now.counters), rows, now.epoch)


async def adopt_in_flight(node, rows: np.ndarray) -> None:
    """After a rescaled restore (`slashrt.snapshot.rescale.graph_in_flight`): rows an old
    executor had in flight to the input of step `node` (shipped, not yet taken) whose keys this
    executor now owns, taken at their times as if they had just arrived, then no longer in
    flight (counted at the restore). Records, or an SSB window's partial rows, into whatever
    this run has at the step: an exchange, a window's route (either mode), or on one executor
    the window itself."""
    times = time_columns(rows)
    rows = rows[np.lexsort(times.T[::-1])]  # (from several old executors: one run per time)
    partial = is_partial(rows)
    window = node.window if isinstance(node, WindowRoute) else node

    async def take(run: np.ndarray, time: Timestamp) -> None:
        if partial:  # a fragment's rows: joined into the owner's window (inside loops, its iteration's)
            owner = await _iteration_window(window, time.counters) if isinstance(window, LoopWindow) else window
            _join(owner, run, time.epoch)
        elif isinstance(node, ExchangeNode) and not isinstance(node, SsbRoute):
            await node.take(run)  # on downstream (a route: into its window)
        else:  # records into the fragments (SSB) or the window (one executor)
            names = [n for n in run.dtype.names if not n.startswith("__")]
            out = np.empty(len(run), [(n, run.dtype.fields[n][0]) for n in names])
            for n in names:
                out[n] = run[n]
            await node.push(Batch(out))

    await take_by_time(node, rows, take)
