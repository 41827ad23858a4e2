"""Event-time windows built from slices, with CRDT partial state per (slice, key).

Tumbling and sliding windows share one mechanism. Time is cut into slices of length
``gcd(size, slide)``; every window is a run of whole slices, so a record updates exactly one
slice however many windows overlap it, and a window's result is the CRDT join of its slices'
partials (Slash's window slices; Scotty's stream slicing).

Builder, logic, state: `WindowAggregate` is the logic; `snapshot()` returns its state (slices,
tails, their overflow flags, next_start, fired_until, late_records) as a `State` of plain arrays
and integers and `restore()` takes one back (`slashrt.snapshot.operators`).

Firing (property P1): a window ``[s, s + size)`` fires once the watermark W reaches its end
(W asserts that no later record has an event time below W). A record whose earliest window has
already fired is *late*: it is counted, sent to the `late` sink if one is given, and still
updates the windows that have not fired (as in Flink); nothing is dropped silently. The
source's pipeline root announces the watermark where it closes a window
(`slashrt.ops.event_time`), so lateness follows the input's order, not its batching. A leader
or owner joins records judged late for some windows on another executor into *tails* of their
slices that only the windows still open for them take.
"""

from __future__ import annotations

import numpy as np
import structlog

from slashrt._batch import Batch
from slashrt._dataflow import Sliding, Tumbling, WindowAggSpec  # (the assigners are part of the description)
from slashrt._kernels import HashAgg, gather, minmax
from slashrt.errors import OperatorError, SnapshotError
from slashrt.ops._node import Node
from slashrt.ops.event_time import I64_MAX, I64_MIN, NO_TIME, window_promise
from slashrt.ops.keys import codes, decode, key_problem
from slashrt.snapshot.operators import check, pack_tables, tagged, unpack_tables
from slashrt.snapshot.state_format import State
from slashrt.ssb.crdt import AggKind, finalize

__all__ = ["Tumbling", "Sliding", "WindowAggregate", "InFrontOfWindow", "check_key_type", "check_uint64_values"]

log = structlog.get_logger("slashrt.window")

_SPARE_TABLES = 2


def _flat(a: np.ndarray) -> np.ndarray:
    """1-D: a 2-D field view of a run of slots gathered in one native pass."""
    return gather(a) if a.ndim > 1 else a


def check_key_type(spec: WindowAggSpec, dtype: np.dtype) -> None:
    """A key column whose type was not known when the dataflow was built gives int64 keys in
    the results (a leader elsewhere cannot learn the type): refuse a uint64 one, whose keys at
    or above 2**63 would come back negative."""
    if spec.key_dtype is None and dtype.kind == "u" and dtype.itemsize == 8:
        raise OperatorError(
            spec.step_id,
            f"key column {spec.key!r} is uint64 but its type was not known when the dataflow was built; "
            "give with_column a dtype= so that the results keep it",
        )


def check_uint64_values(spec: WindowAggSpec, values: np.ndarray) -> None:
    """Integer values are aggregated as int64: refuse uint64 values int64 cannot hold (they
    would come back negative) rather than give a wrong result. One vectorised max, only for
    uint64 columns."""
    if values.dtype.kind == "u" and values.dtype.itemsize == 8 and values.size and int(values.max()) >= 2**63:
        raise OperatorError(
            spec.step_id,
            f"column {spec.column!r} holds uint64 values of 2**63 or more, which an int64 {spec.kind.value} cannot "
            "hold; give the column as float64 (with_column(..., dtype='f8'))",
        )


def earliest_end(slice_ids, size: int, slide: int, slice_len: int):
    """End of the first window of the grid (`size`, `slide`, slices of `slice_len`) containing
    each slice (an id or an array of them): also for a state's tables without a window object
    (`slashrt.ssb.partitioned.merge_partitions`)."""
    first_start = -((size - slice_len - slice_ids * slice_len) // slide) * slide
    return first_start + size


class WindowAggregate(Node):
    """Keyed windowed aggregate over slices (count, sum, min, max, mean)."""

    def __init__(self, spec: WindowAggSpec, late_node: Node | None = None):
        super().__init__(spec.step_id)
        self.spec = spec
        self.size, self.slide = spec.assigner.size, spec.assigner.slide
        self.slice_len = spec.assigner.slice_len
        self.kind = spec.kind
        # int64 or float64 accumulators; decided by the value column (at the first batch if its
        # type was not known when the dataflow was built)
        self.value_dtype = spec.value_dtype
        self.slices: dict[int, HashAgg] = {}
        # (slice, closed_until) -> partials of records judged where they were read (another
        # executor) as late for the windows of the slice ending by closed_until: they join
        # only the later ones (a leader or owner whose own watermark may still hold those open)
        self.tails: dict[tuple[int, int], HashAgg] = {}
        self._spare: list[HashAgg] = []
        self.next_start: int | None = None  # start of the next window to fire
        self.fired_until = NO_TIME  # every window ending at or before this has fired
        self.late_records = 0
        self.late_node = late_node
        # False where records were judged late where they were read (an UpPar owner's window)
        self.counts_late = True
        self.counters: tuple[int, ...] = ()  # the loop iteration it aggregates (inside loops)
        self._out_dtype = None
        self._last_slice: int | None = None  # the slice the last batch ended in
        # the event times every window holding them fits in int64: the first window start at
        # or after int64's minimum, the last window end at or before its maximum
        first_start = -(I64_MIN // -self.slide) * self.slide
        self.first_time = first_start + self.size - self.slide
        self.last_time = (I64_MAX - self.size) // self.slide * self.slide + self.slide - 1

    def window_grid(self) -> tuple[int, int]:
        return self.size, self.slide

    # -- slice arithmetic (vectorised: works on ints and int64 arrays) ----------------------------
    def _earliest_end(self, slice_ids):
        """End of the first window containing each slice."""
        return earliest_end(slice_ids, self.size, self.slide, self.slice_len)

    def _latest_end(self, slice_ids):
        return (slice_ids * self.slice_len) // self.slide * self.slide + self.size

    # -- events ------------------------------------------------------------------------------------
    async def push(self, batch: Batch) -> None:
        clock = self.clock
        if clock is not None and self.counts_late:
            # pointstamp progress: a record is late for the windows ending at or before the
            # epoch of the logical time of the batch carrying it (its source's watermark when it
            # was read, or what the step before gave it: the end of the window that made it, a
            # loop's feedback), whoever else still holds the frontier back (another source,
            # another executor, an earlier iteration). Inside a loop that is the window of the
            # batch's iteration. The frontier holds the batch's time, so no window fired past
            # it: the rule is never early, and a function of the input alone.
            closed = self.promise(clock.now.epoch)
            if closed > self.fired_until:
                rest = self._take_in_order(batch, closed)  # records of a slice no window of which closed
                if rest is not None:
                    await self._push_closed(rest, closed)
                return
        await self._push(batch)

    async def _push_closed(self, batch: Batch, closed: int) -> None:
        """Records carried at a time whose windows ending by `closed` have not all fired here
        yet: split off (and count) the late ones, and keep the partly late ones out of the
        closed windows (tails), as if those had fired."""
        tmin, tmax = minmax(batch.view(self.spec.time))
        self._check_times(tmin, tmax)
        if self._earliest_end(tmin // self.slice_len) <= closed:
            batch, _ = await self._split_late(batch, batch[self.spec.time] // self.slice_len, closed)
        await self.push_judged(batch, closed)

    def _take_in_order(self, batch: Batch, closed: int) -> Batch | None:
        """Fast path: the batch falls into the slice the last one fell into (a stream in time
        order), whose windows all end after `closed`. That slice's table takes the longest
        prefix whose times lie in the slice, checking them a segment at a time as it counts (no
        separate pass over the batch), straight from the fields in place (2-D views over a run
        of slots, never gathered). Returns the rest (None: all taken)."""
        s = self._last_slice
        if s is None or s not in self.slices or self._earliest_end(s) <= closed:
            return batch
        times = batch.view(self.spec.time)
        if times.dtype != np.int64:
            return batch
        keys, values = self._fields(batch)
        if times.ndim != keys.ndim:  # a derived column (1-D) beside a field of a run (2-D)
            keys, values, times = _flat(keys), None if values is None else _flat(values), _flat(times)
        first_t = max(s * self.slice_len, I64_MIN)
        last_t = min((s + 1) * self.slice_len - 1, I64_MAX)
        done = self.slices[s].update_within(keys, values, times, first_t, last_t)
        if done == len(batch):
            return None
        return batch.select(slice(done, None)) if done else batch

    async def _push(self, batch: Batch) -> None:
        batch = self._take_in_order(batch, self.fired_until)
        if batch is None:
            return
        # Slice bounds from the min and max event time (floor division is monotone): in the
        # common case the whole batch falls into one slice and no record is divided.
        tmin, tmax = minmax(batch.view(self.spec.time))
        self._check_times(tmin, tmax)
        lo, hi = int(tmin // self.slice_len), int(tmax // self.slice_len)
        slice_ids = None
        if self._earliest_end(lo) <= self.fired_until:
            batch, slice_ids = await self._split_late(batch, batch[self.spec.time] // self.slice_len)
            if not len(batch):
                return
            lo, hi = int(slice_ids.min()), int(slice_ids.max())
        keys, values = self._fields(batch)
        if lo == hi:  # the whole batch falls into one slice
            self._slice(lo).update(keys, values)
        else:
            # a batch spans few slices: one vectorised pass per slice present
            if slice_ids is None:
                slice_ids = batch[self.spec.time] // self.slice_len
            if keys.ndim > 1:  # a run of slots: gather the fields (one native pass each)
                keys, values = gather(keys), None if values is None else gather(values)
            present = range(lo, hi + 1) if hi - lo < 64 else np.unique(slice_ids).tolist()
            for s in present:
                rows = slice_ids == s
                if rows.any():
                    self._slice(s).update(keys[rows], None if values is None else values[rows])
        self._last_slice = hi  # the next batch most likely continues there
        first = int(self._earliest_end(lo)) - self.size
        if self.next_start is None or first < self.next_start:
            self.next_start = max(first, self._first_unfired_start())

    def _fields(self, batch: Batch):
        """The key and value columns of a batch as the tables take them (in place if possible)."""
        keys = batch.view(self.spec.key)
        values = None if self.spec.column is None else batch.view(self.spec.column)
        if self.value_dtype is None:
            kind = "i" if values is None else values.dtype.kind
            self.value_dtype = np.dtype("<f8") if kind == "f" or self.kind is AggKind.MEAN else np.dtype("<i8")
        if keys.dtype != np.int64:
            if (problem := key_problem(keys.dtype)) is not None:  # its type may be known only now (a with_column)
                raise OperatorError(self.step_id, f"key column {self.spec.key!r} {problem}")
            check_key_type(self.spec, keys.dtype)
            keys = codes(keys)  # int64 codes, 1-D (`ops.keys`: a uint64 key keeps its bits)
        if values is not None and values.dtype != self.value_dtype:
            if values.dtype.kind not in "biuf":
                raise OperatorError(self.step_id, f"column {self.spec.column!r} must be numeric, is {values.dtype}")
            if self.value_dtype.kind == "i":
                check_uint64_values(self.spec, values)
            values = values.astype(self.value_dtype)
        if values is not None and values.ndim != keys.ndim:  # a derived column beside a field of a run
            keys, values = _flat(keys), _flat(values)
        return keys, values

    async def on_watermark(self, watermark: int) -> None:
        await self._fire_until(watermark)
        await super().on_watermark(watermark)

    async def on_end(self) -> None:
        # End of a bounded stream: every window with state is complete.
        await self._fire_until(None)
        await super().on_end()

    async def on_frontier(self, epoch: int | None) -> None:
        """Pointstamp progress: fire the windows ending by `epoch`, the least time that may
        still reach the input (None: nothing may, fire them all); no watermark travels on."""
        await self._fire_until(epoch)

    def held(self) -> int | None:
        """The end of the earliest window still to fire (the capability it holds), or None."""
        if self.next_start is None or not self.slices:
            return None
        return max(self.next_start + self.size, int(self._earliest_end(min(self.slices))))

    def merge_partials(
        self, slice_ids: np.ndarray, keys: np.ndarray, counts: np.ndarray, vals: np.ndarray, closed_until: int = NO_TIME
    ) -> int:
        """Join partial states (CRDT merge) into their slices: a leader taking a helper's delta.
        The columns may be fields read in place (2-D for a run of ring slots). Rows come grouped
        by slice (as epochs ship them); rows of one slice (the common case) are joined in place,
        one merge per slot, and mixed slices one merge per run of a slice. `closed_until`: the
        promise of the sender's watermark; its windows ending by it closed for these rows.
        Returns how many keys were new to their slice."""
        if not keys.size:
            return 0
        lo, hi = minmax(slice_ids)
        if lo == hi:
            if keys.ndim == 1:
                return self.merge_slice(lo, keys, counts, vals, closed_until)
            return sum(self.merge_slice(lo, keys[slot], counts[slot], vals[slot], closed_until) for slot in range(len(keys)))
        slice_ids, keys, counts, vals = (_flat(a) for a in (slice_ids, keys, counts, vals))
        cuts = np.flatnonzero(slice_ids[1:] != slice_ids[:-1]) + 1
        bounds = [0, *cuts.tolist(), len(keys)]
        return sum(self.merge_slice(int(slice_ids[a]), keys[a:b], counts[a:b], vals[a:b], closed_until)
                   for a, b in zip(bounds[:-1], bounds[1:]))

    def merge_slice(
        self, slice_id: int, keys: np.ndarray, counts: np.ndarray, vals: np.ndarray, closed_until: int = NO_TIME
    ) -> int:
        """Join partial states of one slice into it (into its windows ending after
        `closed_until`). Returns how many keys were new to the slice."""
        if not len(keys):
            return 0
        if self.value_dtype is None:
            self.value_dtype = vals.dtype.newbyteorder("<")
        agg = self._open_slice(slice_id, "partial state", closed_until)
        before = len(agg)
        agg.merge(keys, counts, vals)
        return len(agg) - before

    def update_slice(self, slice_id: int, keys: np.ndarray, values: np.ndarray | None, closed_until: int = NO_TIME) -> int:
        """Fold records of one slice (their keys and values) into it (into its windows ending
        after `closed_until`, where they were judged): an SSB leader's own records, routed as
        they arrive, or an UpPar owner's. Returns how many keys were new to the slice."""
        agg = self._open_slice(slice_id, "records", closed_until)
        before = len(agg)
        agg.update(keys, values)
        return len(agg) - before

    async def push_judged(self, batch: Batch, closed_until: int) -> None:
        """Records judged late or not where they were read, against a watermark whose windows
        ending by `closed_until` closed: those whose slice has such windows join only the
        later ones (the late split counted them there already)."""
        if len(batch) and closed_until != NO_TIME:
            tmin, tmax = minmax(batch.view(self.spec.time))
            self._check_times(tmin, tmax)
            if self._earliest_end(tmin // self.slice_len) <= closed_until:
                slice_ids = batch[self.spec.time] // self.slice_len
                partly = self._earliest_end(slice_ids) <= closed_until
                keys, values = self._fields(batch.select(partly))
                keys, values = _flat(keys), None if values is None else _flat(values)
                partly_ids = slice_ids[partly]
                for s in np.unique(partly_ids).tolist():
                    rows = partly_ids == s
                    self.update_slice(s, keys[rows], None if values is None else values[rows], closed_until)
                batch = batch.select(~partly)
        if len(batch):
            await self._push(batch)

    def _open_slice(self, slice_id: int, what: str, closed_until: int = NO_TIME) -> HashAgg:
        """The table of a slice about to take state from outside the local stream (its tail if
        windows of it ending by `closed_until` closed for that state); refused once all its
        windows fired."""
        if self._latest_end(slice_id) <= self.fired_until:
            raise OperatorError(
                self.step_id, f"{what} for slice {slice_id} arrived after all its windows fired (up to {self.fired_until})"
            )
        first = int(self._earliest_end(slice_id)) - self.size
        if self.next_start is None or first < self.next_start:
            self.next_start = max(first, self._first_unfired_start())
        agg = self._slice(slice_id)  # (a tail's slice exists too, so that its windows fire)
        if self._earliest_end(slice_id) > closed_until:
            return agg
        tail = self.tails.get((slice_id, closed_until))
        if tail is None:
            tail = self.tails[(slice_id, closed_until)] = self._table()
        return tail

    def promise(self, watermark: int) -> int:
        """The end of the last window complete by `watermark` (every window ending at or before
        it may fire); NO_TIME if that window would start before int64's range."""
        return max(window_promise(watermark, self.size, self.slide), NO_TIME)

    def _check_times(self, tmin: int, tmax: int) -> None:
        """Refuse event times whose windows do not fit in int64 (they cannot be reported)."""
        if tmin < self.first_time or tmax > self.last_time:
            t = tmin if tmin < self.first_time else tmax
            raise OperatorError(
                self.step_id,
                f"event time {t} in column {self.spec.time!r} is too close to the int64 limits: a window of "
                f"size {self.size}, slide {self.slide} holding it would not fit in int64 "
                f"(valid event times: {self.first_time} to {self.last_time})",
            )

    # -- helpers -----------------------------------------------------------------------------------
    def _slice(self, slice_id: int) -> HashAgg:
        agg = self.slices.get(slice_id)
        if agg is None:
            agg = self._spare.pop() if self._spare else self._table()
            self.slices[slice_id] = agg
        return agg

    def _table(self) -> HashAgg:
        # only overflow="error" pays for the check (its tables run loops compiled with it)
        return HashAgg(self.kind.value, self.value_dtype.str[1:], self.spec.overflow == "error")

    def _drop_slice(self, slice_id: int) -> None:
        # Keep a few emptied tables for the next slices: they keep their capacity and memory,
        # so a steady stream refills them without growing (rehashing) or faulting in new pages.
        agg = self.slices.pop(slice_id)
        if len(self._spare) < _SPARE_TABLES:
            agg.reset()
            self._spare.append(agg)

    def _first_unfired_start(self) -> int:
        if self.fired_until == NO_TIME:
            return NO_TIME
        # smallest window start s (multiple of slide) with s + size > fired_until
        return ((self.fired_until - self.size) // self.slide + 1) * self.slide

    async def _split_late(
        self, batch: Batch, slice_ids: np.ndarray, fired_until: int | None = None, *, count: bool | None = None
    ):
        """Count and route the records whose earliest window closed at `fired_until` (this
        operator's by default), unless they were judged upstream (`count` False, by default
        `counts_late`); return the batch of those that still update a window."""
        fired_until = self.fired_until if fired_until is None else fired_until
        late = self._earliest_end(slice_ids) <= fired_until
        if not (self.counts_late if count is None else count):
            keep = self._latest_end(slice_ids) > fired_until
            return batch.select(keep), slice_ids[keep]
        n_late = int(late.sum())
        self.late_records += n_late
        log.debug("late records", step=self.step_id, count=n_late, fired_until=fired_until)
        if self.late_node is not None:
            await self.late_node.push(batch.select(late))
        keep = ~late | (self._latest_end(slice_ids) > fired_until)
        return batch.select(keep), slice_ids[keep]

    async def _fire_until(self, watermark: int | None) -> None:
        """Fire every window whose end <= watermark (None: every window that has state)."""
        while self.next_start is not None and self.slices:
            start = max(self.next_start, int(self._earliest_end(min(self.slices))) - self.size)
            end = start + self.size
            if watermark is not None and end > watermark:
                self.next_start = start
                break
            await self._fire(start, end)
            self.next_start = start + self.slide
            self.fired_until = max(self.fired_until, end)
            for s in [s for s in self.slices if (s + 1) * self.slice_len <= self.next_start]:
                self._drop_slice(s)
            if self.tails:
                self.tails = {k: t for k, t in self.tails.items() if k[0] in self.slices}
        if not self.slices:
            self.next_start = None
        if watermark is not None:
            # Windows ending by the watermark are complete even if they held no state.
            self.fired_until = max(self.fired_until, self.promise(watermark))

    async def _fire(self, start: int, end: int) -> None:
        first, last = start // self.slice_len, end // self.slice_len
        parts = [self.slices[s] for s in range(first, last) if s in self.slices]
        if self.tails:
            parts += [t for (s, closed), t in self.tails.items() if first <= s < last and closed < end]
        if not parts:
            return
        if len(parts) == 1:
            keys, counts, vals = parts[0].export()
        else:
            merged = self._table()
            for p in parts:
                merged.merge_from(p)
            keys, counts, vals = merged.export()
            parts.append(merged)
        if self.spec.overflow == "error" and any(p.overflowed for p in parts):
            self._overflowed(f"window [{start}, {end})")
        # rows come in the table's insertion order: sorting belongs to whoever needs it, not the
        # hot path
        values = finalize(self.kind, counts, vals)
        out = np.empty(len(keys), dtype=self._result_dtype(values.dtype))
        out["window_start"] = start
        out["window_end"] = end
        out[self.spec.key] = keys if self.spec.key_dtype is None else decode(keys, self.spec.key_dtype)
        out[self.spec.output] = values
        await self.emit_at(end, Batch(out), self.counters)

    def _overflowed(self, where: str) -> None:
        raise OperatorError(
            self.step_id,
            f"the int64 sum of column {self.spec.column!r} overflowed in {where} (overflow='error'); "
            "use overflow='wrap' to wrap around, or a float64 column",
        )

    def _result_dtype(self, value_dtype) -> np.dtype:
        if self._out_dtype is None:
            # keys are held as int64 (a uint64 key as its bit pattern): results give them in the
            # key column's type where it was known when the dataflow was built
            key_dtype = "<i8" if self.spec.key_dtype is None else self.spec.key_dtype
            self._out_dtype = np.dtype(
                [("window_start", "<i8"), ("window_end", "<i8"), (self.spec.key, key_dtype), (self.spec.output, value_dtype)]
            )
        return self._out_dtype

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    STATE_KIND, STATE_VERSION = "window", 1

    def snapshot(self) -> State:
        """A copy of the state (every table exported; nothing shared with the live tables)."""
        return tagged(self.STATE_KIND, self.STATE_VERSION, self._window_arrays(), step=self.step_id, **self._window_meta())

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        self._restore_window(state.arrays, meta)

    @property
    def state_bytes(self) -> int:
        """Bytes of the state's rows (key, count, value per key of every slice and tail)."""
        row = 16 + (8 if self.value_dtype is None else self.value_dtype.itemsize)
        return row * self.entries()

    def entries(self) -> int:
        """(slice, key) entries its slices and tails hold."""
        return sum(len(t) for tables in (self.slices, self.tails) for t in tables.values())

    def _window_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {
            **pack_tables(f"{prefix}slices", self.slices, self.value_dtype),
            **pack_tables(f"{prefix}tails", self.tails, self.value_dtype),
        }

    def _window_meta(self) -> dict:
        return {
            "size": self.size, "slide": self.slide, "slice_len": self.slice_len, "aggregate": self.kind.value,
            "value_dtype": None if self.value_dtype is None else self.value_dtype.str,
            "next_start": self.next_start, "fired_until": self.fired_until, "late_records": self.late_records,
        }

    def _restore_window(self, arrays: dict[str, np.ndarray], meta: dict, prefix: str = "") -> None:
        self._check_grid(meta)
        self.slices, self.tails, self._last_slice = {}, {}, None
        for tables in (self.slices, self.tails):
            name = "slices" if tables is self.slices else "tails"
            for table_id, keys, counts, vals, overflowed in unpack_tables(f"{prefix}{name}", arrays):
                tables[table_id] = self._restored_table(keys, counts, vals, overflowed)
        self.next_start, self.fired_until, self.late_records = meta["next_start"], meta["fired_until"], meta["late_records"]

    def _check_grid(self, meta: dict) -> None:
        """Refuse a state of another window grid or aggregate; take its value dtype."""
        if (meta["size"], meta["slide"], meta["aggregate"]) != (self.size, self.slide, self.kind.value):
            raise SnapshotError(
                f"step {self.step_id!r}: the state is of a {meta['aggregate']} over windows of {meta['size']} every "
                f"{meta['slide']}, this step is a {self.kind.value} over windows of {self.size} every {self.slide}: "
                "restore it into the dataflow that wrote it"
            )
        if meta["value_dtype"] is not None:
            self.value_dtype = np.dtype(meta["value_dtype"])

    def _restored_table(self, keys: np.ndarray, counts: np.ndarray, vals: np.ndarray, overflowed: bool) -> HashAgg:
        table = self._table()
        table.merge(keys, counts, vals)  # copies: nothing shared with the state
        table.overflowed = overflowed
        return table


class InFrontOfWindow:
    """A node that stands where a window is in the plan (a router in front of it, `window`):
    the plan walks through to the window, and what is built downstream hangs off the window."""

    window: WindowAggregate

    @property
    def children(self) -> list[Node]:
        return [self.window]

    @children.setter
    def children(self, nodes: list[Node]) -> None:
        self.window.children = nodes
