"""Windowed aggregates on the Slash State Backend: aggregate locally, merge lazily at leaders.

Every executor runs the whole pipeline on the streams it receives and folds them into its own
window slices (its *fragments* of every partition, a log-structured HashAgg per slice): no
record crosses the network. An epoch ends every `epoch_bytes` of the operator's input, and
early when the watermark completes a window. At an epoch's end the executor

1. ships each slice's content (`HashAgg.ship()`: the delta since the last epoch, after which
   the fragment restarts from the zero value) as delta rows (epoch, slice, key, count, value),
   split by the leader of each key's partition;
2. merges the rows of the partitions it leads into its own leader state at once, and queues the
   others, followed by its low watermark, for the shippers of its outgoing channels (a task per
   peer, so compute does not wait for a peer's credits until more than `SHIP_QUEUE_BYTES` are
   queued for it: then it does, and a stalled leader holds its helpers' memory flat);
3. advances its own entry of the vector clock.

A leader merges the deltas it receives (CRDT join, in epoch order per helper: the channel is
FIFO and the epoch column is checked) and fires a window of its partitions only when every
executor's watermark passed the window's end (property P1, a `FrontierGate` over a
`VectorClock`). Results are the CRDT join of every fragment, so they equal a sequential run
(property P2) whatever the split of the input.

Where most records of an epoch carry keys new to it (a large key space), folding them into
fragments first saves nothing: every record would be inserted twice, once into the fragment and
once, shipped, into its leader's state. The operator then routes records as they arrive
(*direct* routing): records of partitions it leads go straight into its leader state, the
others become delta rows of one record each (count 1), streamed to their leaders batch by
batch as parts of the epoch's delta, which the epoch's watermark closes as it closes a
fragment's. Under `routing="auto"` (the default) an epoch whose delta held at least
`DIRECT_AT` rows per input record switches the next epochs to direct routing, and direct
routing returns to fragments once fewer than `COMBINE_BELOW` of the own records it routed in
an epoch were keys new to their slice (an epoch of fewer than `JUDGED_FROM` records, cut
short by a window's end, keeps the routing; a folding epoch ends early once `SAMPLE_RECORDS`
records showed that keys do not repeat: `keys_unrepeated`). The epoch protocol, the order of
deltas and the CRDT join are the same either way, so results do not depend on the routing.

Records arriving at an executor below the watermark it already shipped are late *here*: the
windows they belong to may have fired at their leader. They are counted and sent to the late
sink, as in a single executor.
"""

from __future__ import annotations

import collections

import attrs
import numpy as np
import structlog
import trio

from slashrt import _kernels as kernels
from slashrt._batch import Batch
from slashrt._buffer import Control
from slashrt._dataflow import WindowAggSpec
from slashrt.errors import DataflowError, OperatorError, SnapshotError
from slashrt.ops._node import Node
from slashrt.ops.exchange import FrontierGate, Inbound
from slashrt.ops.window import NO_TIME, WindowAggregate, _flat, earliest_end, in_flight_keys
from slashrt.progress import make_frontier
from slashrt.progress.frontier import END_TIME
from slashrt.snapshot.channel_state import DATA, WATERMARK
from slashrt.snapshot.operators import _packed, check, tagged, unpack_tables
from slashrt.snapshot.state_format import State
from slashrt.ssb.crdt import records_as_partials
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import Sender

__all__ = ["SsbWindowAggregate", "SSB_STATE", "SSB_STATE_VERSION", "delta_dtype", "DEFAULT_EPOCH_BYTES", "ROUTINGS", "check_routing", "routes_directly", "Shipper", "EpochStats",
           "split_partitions", "merge_partitions"]

log = structlog.get_logger("slashrt.ssb")

DEFAULT_EPOCH_BYTES = 64 << 20  # as in the paper
ROUTINGS = ("auto", "fragments", "direct")
DIRECT_AT = 0.5  # auto: delta rows per input record from which the next epoch routes directly
COMBINE_BELOW = 0.25  # auto: share of new keys among direct own records below which fragments return
JUDGED_FROM = 256  # auto: an epoch of fewer input records keeps the routing (too few to tell whether keys repeat)
# auto: a folding epoch this long whose fragments hold DIRECT_AT entries per record ends
SAMPLE_RECORDS = 1 << 16
SHIP_QUEUE_BYTES = 4 << 20  # compute waits while more than this is queued for one peer
SSB_STATE, SSB_STATE_VERSION = "ssb_window", 1  # the kind and layout of its snapshot


def check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise DataflowError(f"unknown SSB routing {routing!r}; choose one of {', '.join(ROUTINGS)}")
    return routing


def routes_directly(direct: bool, rows: int, records: int, own_records: int, own_new: int) -> bool:
    """`routing="auto"`: does the next epoch route records as they arrive, after an epoch of
    `records` input records that shipped `rows` partial rows (`direct`: routed them), of which
    `own_records` were of keys this executor owns, `own_new` of them new to their slice there?
    Fragments turn direct once an epoch's delta held at least `DIRECT_AT` rows per record;
    direct routing returns to fragments once fewer than `COMBINE_BELOW` of its own records
    were new keys. An epoch of fewer than `JUDGED_FROM` records (one a window's end cut short)
    changes nothing: 90 records of 50 keys would read as mostly new keys."""
    if records < JUDGED_FROM:
        return direct
    if direct:
        return not (own_records and own_new < COMBINE_BELOW * own_records)
    return rows >= DIRECT_AT * records


def keys_unrepeated(routing: str, direct: bool, records: int, entries) -> bool:
    """`routing="auto"`: does a folding epoch end now, at `records` input records whose
    fragments hold `entries()` (slice, key) entries (asked only past the sample)? Once it read
    `SAMPLE_RECORDS` of which at least `DIRECT_AT` per record were new entries, folding more
    saves nothing (the keys do not repeat): the epoch ends, and `routes_directly` turns the
    next one direct, instead of folding a whole window (a million records of distinct keys)
    first."""
    return routing == "auto" and not direct and records >= SAMPLE_RECORDS and entries() >= DIRECT_AT * records


def delta_dtype(value_dtype: np.dtype) -> np.dtype:
    """One row of an epoch delta: a key's partial state in one slice (40 bytes)."""
    return np.dtype(
        [("epoch", "<i8"), ("slice", "<i8"), ("key", "<i8"), ("count", "<i8"), ("value", np.dtype(value_dtype).newbyteorder("<"))]
    )


@attrs.define
class EpochStats:
    """What one executor's operator did in one epoch."""

    epoch: int
    input_bytes: int  # bytes of the operator's input folded in this epoch
    keys_touched: int  # (slice, key) pairs changed in this epoch: the delta's rows (direct: rows routed)
    shipped_rows: int  # of them, rows sent to other leaders
    shipped_bytes: int
    watermark: int
    records: int = 0  # input records of this epoch
    direct: bool = False  # routed as they arrived, not folded into fragments first
    queued_peak: int = 0  # the most bytes of rows queued for one peer at once during the epoch


class Shipper:
    """The outgoing channel to one peer: a FIFO of deltas and watermarks, drained into the
    channel by `run()`. The FIFO is bounded: `rows()` waits while more than `limit` bytes of
    rows are queued, so a slow or stalled leader slows the compute of its helpers instead of
    piling up their deltas (the channel's credits reach back through it to the compute that
    fills it). A watermark queued behind another replaces it (the later promise covers the
    earlier one), so watermarks cannot pile up either."""

    def __init__(self, peer: int, sender: Sender, limit: int = SHIP_QUEUE_BYTES):
        self.peer = peer
        self.sender = sender
        self.limit = limit
        self._fifo: collections.deque = collections.deque()
        self._queued = 0  # bytes of rows queued, not yet in the channel
        self.peak_bytes = 0  # the most bytes of rows queued at once (reset by whoever reads it)
        self._more = trio.lowlevel.ParkingLot()  # run() waits here for the next item
        self._sent = trio.lowlevel.ParkingLot()  # rows() waits here for room
        self.ended = False
        self._barrier = -1  # the newest checkpoint barrier queued

    @property
    def queued_bytes(self) -> int:
        return self._queued

    def _put(self, kind, value) -> None:
        self._fifo.append((kind, value))
        if self._more:
            self._more.unpark_all()

    async def rows(self, rows: np.ndarray) -> None:
        """Queue delta rows, in FIFO order with what was queued before; wait for room."""
        self._queue_rows(rows)
        while self._queued > self.limit:
            await self._sent.park()

    def _queue_rows(self, rows: np.ndarray) -> None:
        self._queued += rows.nbytes
        self.peak_bytes = max(self.peak_bytes, self._queued)
        self._put(None, rows)

    def watermark(self, watermark: int) -> None:
        if self._fifo and self._fifo[-1][0] is Control.WATERMARK:
            self._fifo[-1] = (Control.WATERMARK, watermark)
        else:
            self._put(Control.WATERMARK, watermark)

    def end(self) -> None:
        self.ended = True
        self._put(Control.END_OF_STREAM, None)

    def barrier(self, n: int) -> None:
        """Checkpoint barrier n, behind every delta and watermark queued before it (an ended
        channel delivers every barrier without one; one that `overtake` queued is not queued
        again)."""
        if not self.ended and n > self._barrier:
            self._barrier = n
            self._put(Control.BARRIER, n)

    def overtake(self, n: int) -> list:
        """Unaligned checkpoint n (FLIP-76's output buffers): barrier n goes ahead of the deltas
        and watermarks queued since the barrier before it (never ahead of a barrier: their
        numbers increase on a channel), or moves there if it was queued behind them and is not
        sent yet. Those are in flight: returned as channel-state segments
        (`slashrt.snapshot.channel_state`, kept with the sender's snapshot, which `requeue`s
        them first on a resume) and still sent, after the barrier."""
        items = list(self._fifo)
        queued = (Control.BARRIER, n) in items  # queued already (aligned), not sent yet: moved ahead
        if self.ended or (n <= self._barrier and not queued):
            return []
        if queued:
            at = items.index((Control.BARRIER, n))
            items, after = items[:at], items[at + 1:]
        else:
            after = []
        cut = max((i + 1 for i, (kind, _) in enumerate(items) if kind is Control.BARRIER), default=0)
        flying = items[cut:]
        self._fifo = collections.deque([*items[:cut], (Control.BARRIER, n), *flying, *after])
        self._barrier = max(self._barrier, n)
        if self._more:
            self._more.unpark_all()
        return [(DATA, value) if kind is None else (WATERMARK, value) for kind, value in flying]

    def requeue(self, segments: list) -> None:
        """A restored unaligned checkpoint's segments in flight on this channel, queued before
        anything new."""
        for kind, value in segments:
            if kind == DATA:
                self._queue_rows(value)
            else:
                self._put(Control.WATERMARK, value)

    async def run(self) -> None:
        while True:
            while not self._fifo:
                await self._more.park()
            kind, value = self._fifo.popleft()
            if kind is None:
                await self.sender.send_records(value)
                self._queued -= value.nbytes
                if self._sent:
                    self._sent.unpark_all()
            elif kind is not Control.END_OF_STREAM:  # a watermark or a barrier
                await self.sender.send_control(kind, value)
            else:
                await self.sender.aclose()
                return


class SsbWindowAggregate(WindowAggregate):
    """A keyed window aggregate whose state is shared across executors through the SSB."""

    lane = 1  # the executor's lane merging the deltas peers ship here: its stage (`_plan`)

    def __init__(
        self,
        spec: WindowAggSpec,
        late_node: Node | None,
        *,
        index: int,
        partitioning: Partitioning,
        epoch_bytes: int,
        routing: str = "auto",
        progress: str = "watermark",
    ):
        spec.shared_value_dtype()  # the deltas' rows are of a fixed size: refused here if not known
        if epoch_bytes < 1:
            raise DataflowError(f"epoch size must be at least one byte, got {epoch_bytes}")
        check_routing(routing)
        # the leader state: windows of the partitions this executor leads, fired by the gate
        self.merged = WindowAggregate(spec)
        super().__init__(spec, late_node)
        self.index = index
        self.partitioning = partitioning
        self.epoch_bytes = epoch_bytes
        self._progress = progress
        self.gate = FrontierGate(self.merged, make_frontier(progress, partitioning.executors))
        self.shippers: dict[int, Shipper] = {}  # peer executor -> its outgoing channel
        self.exchange_dtype = delta_dtype(self.value_dtype)
        self.epoch = 0
        self.epochs: list[EpochStats] = []
        self._bytes = 0
        self._watermark = NO_TIME
        self._shipped_promise = NO_TIME
        self._helper_epoch = [0] * partitioning.executors  # the last epoch merged from each helper
        self.routing = routing
        self.direct = routing == "direct"  # this epoch routes records as they arrive
        self._records = 0
        self._own_records = self._own_new = self._routed = self._shipped = 0  # direct routing in this epoch

    # the merged state emits to this operator's children (assigned after construction)
    @property
    def children(self) -> list[Node]:
        return self.merged.children

    @children.setter
    def children(self, nodes: list[Node]) -> None:
        self.merged.children = nodes

    def add_peer(self, peer: int, sender: Sender) -> None:
        """The channel carrying deltas to executor `peer` (the leader of some partitions)."""
        self.shippers[peer] = Shipper(peer, sender)

    def background(self) -> list:
        """Tasks to run beside the executor: one shipper per outgoing channel."""
        return [s.run for s in self.shippers.values()]

    async def forward_barrier(self, n: int) -> None:
        """Checkpoint barrier n on every outgoing channel, behind every delta queued so far: taken
        once every lane feeding this stage handled its barriers (between two of its batches), so
        every epoch's shipment is whole before it (`_end_epoch` runs within one batch of such a
        lane, which is blocked behind its barrier meanwhile) or whole after it; direct routing's
        rows are one record each."""
        for shipper in self.shippers.values():
            shipper.barrier(n)

    def overtake_queued(self, n: int) -> dict[str, list]:
        """Unaligned checkpoint n: barrier n ahead of what every shipper queued (`Shipper.overtake`);
        the segments in flight, by outgoing channel (`channel_to`)."""
        flying = {self.channel_to(peer): shipper.overtake(n) for peer, shipper in self.shippers.items()}
        return {name: segments for name, segments in flying.items() if segments}

    def requeue(self, name: str, segments: list) -> bool:
        """Queue a restored checkpoint's segments in flight on outgoing channel `name` first;
        False if it is none of this exchange's."""
        for peer, shipper in self.shippers.items():
            if self.channel_to(peer) == name:
                shipper.requeue(segments)
                return True
        return False

    async def adopt_in_flight(self, rows: np.ndarray, watermark: int) -> None:
        """Rescaled: rows in flight between the old executors, of the partitions this one leads."""
        mine = self.partitioning.owner_of(in_flight_keys(rows, self.spec.key)) == self.index
        await self.merged.adopt_in_flight(rows[mine], watermark)

    def channel_to(self, peer: int) -> str:
        """The name of the outgoing channel to executor `peer` (in a checkpoint's channel state)."""
        return f"{self.step_id}.to{peer}"

    def inbound(self, source: int) -> Inbound:
        """The root node for the delta channel arriving from executor `source`."""
        return Inbound(self.step_id, source, self._merge_delta, self.gate)

    # -- events of the local stream ------------------------------------------------------------------
    async def push(self, batch: Batch) -> None:
        if self.direct:
            await self._route(batch)
        else:
            await super().push(batch)
        self._bytes += batch.nbytes
        self._records += len(batch)
        if self._bytes >= self.epoch_bytes or keys_unrepeated(self.routing, self.direct, self._records, self.entries):
            await self._end_epoch()

    async def _route(self, batch: Batch) -> None:
        """Direct routing: own partitions' records into the leader state, the others' into
        this epoch's delta rows for their leaders (one row per record)."""
        times = _flat(batch.view(self.spec.time))
        self._check_times(*kernels.minmax(times))
        slice_ids = times // self.slice_len
        if self._earliest_end(int(kernels.minmax(slice_ids)[0])) <= self.fired_until:
            batch, slice_ids = await self._split_late(batch, slice_ids)
            if not len(batch):
                return
        keys, values = self._fields(batch)
        keys = _flat(keys)
        values = None if values is None else _flat(values)
        counted = values is not None
        # split by leader straight into this epoch's delta rows (one row per record, count 1);
        # count aggregates carry no value, and route the keys as dummy values, zeroed after
        rows = np.empty(len(keys), self.exchange_dtype)
        parts = self.partitioning.route(
            keys, slice_ids, values if counted else keys, (rows["key"], rows["slice"], rows["value"])
        )
        rows["epoch"] = self.epoch + 1  # the epoch these rows belong to; it ends with the watermark
        rows["count"] = 1
        if not counted:
            rows["value"] = 0
        for owner, part in enumerate(parts):
            mine = rows[part]
            if not len(mine):
                continue
            if owner == self.index:
                self._own_records += len(mine)
                self._own_new += self._update_own(mine["key"], mine["slice"], mine["value"] if counted else None)
                continue
            # streamed as they come, the epoch's delta in pieces, in FIFO order with what was queued
            # before; records become partials under the NaN policy, as HashAgg.update makes them
            records_as_partials(self.kind, mine["count"], mine["value"])
            await self.shippers[owner].rows(mine)
            self._shipped += len(mine)
        self._routed += len(keys)

    def _update_own(self, keys: np.ndarray, slice_ids: np.ndarray, values: np.ndarray | None) -> int:
        lo, hi = kernels.minmax(slice_ids)
        if lo == hi:  # the common case: one slice
            return self.merged.update_slice(int(lo), keys, values, self.fired_until)
        new = 0
        for s in np.unique(slice_ids).tolist():
            rows = slice_ids == s
            new += self.merged.update_slice(s, keys[rows], None if values is None else values[rows], self.fired_until)
        return new

    async def on_watermark(self, watermark: int) -> None:
        # Not fired here: the watermark is a promise shipped to the leaders with the epoch.
        self._watermark = watermark
        promise = self.promise(watermark)
        self.fired_until = max(self.fired_until, promise)  # records below it are late from now on
        if promise > self._shipped_promise:
            await self._end_epoch()  # a window may fire: end the epoch early

    async def on_end(self) -> None:
        await self._end_epoch(final=True)

    # -- the epoch protocol -------------------------------------------------------------------------
    async def _end_epoch(self, *, final: bool = False) -> None:
        self.epoch += 1
        executors = self.partitioning.executors
        touched = self._routed
        shipped = self._shipped  # direct routing streamed its rows already
        for s in sorted(self.slices):
            if self.spec.overflow == "error" and self.slices[s].overflowed:
                self._overflowed(f"the slice [{s * self.slice_len}, {(s + 1) * self.slice_len}) of executor {self.index}")
            keys, counts, vals = self.slices[s].ship()  # the fragment restarts from zero
            self._drop_slice(s)
            touched += len(keys)
            if executors == 1:
                self.merged.merge_slice(s, keys, counts, vals, self._shipped_promise)
                continue
            rows = np.empty(len(keys), self.exchange_dtype)
            parts = self.partitioning.route(keys, counts, vals, (rows["key"], rows["count"], rows["value"]))
            rows["epoch"] = self.epoch
            rows["slice"] = s
            for owner, part in enumerate(parts):
                mine = rows[part]
                if owner == self.index:
                    # folded while the last watermark shipped held (the epoch ends where it moves)
                    self.merged.merge_slice(s, mine["key"], mine["count"], mine["value"], self._shipped_promise)
                elif len(mine):
                    await self.shippers[owner].rows(mine)  # slice by slice, in FIFO order
                    shipped += len(mine)
        watermark = END_TIME if final else self._watermark
        for shipper in self.shippers.values():
            shipper.end() if final else shipper.watermark(watermark)
        queued_peak = max((s.peak_bytes for s in self.shippers.values()), default=0)
        for shipper in self.shippers.values():
            shipper.peak_bytes = shipper.queued_bytes
        stats = EpochStats(
            self.epoch, self._bytes, touched, shipped, shipped * self.exchange_dtype.itemsize, watermark,
            self._records, self.direct, queued_peak,
        )
        self.epochs.append(stats)
        log.debug("epoch shipped", step=self.step_id, executor=self.index, stats=stats)
        if self.routing == "auto" and self._records:
            self.direct = routes_directly(self.direct, touched, self._records, self._own_records, self._own_new)
        self._bytes = self._records = 0
        self._own_records = self._own_new = self._routed = self._shipped = 0
        self._shipped_promise = self.promise(watermark) if not final else END_TIME
        await self.gate.advance(self.index, watermark)

    async def _merge_delta(self, source: int, batch: Batch) -> None:
        """A helper's delta for partitions this executor leads: join it, in epoch order, its
        fields read in place."""
        epochs = batch.view("epoch")
        first, last = kernels.minmax(epochs)
        if first < self._helper_epoch[source] or (first != last and np.any(np.diff(_flat(epochs)) < 0)):
            raise OperatorError(
                self.step_id,
                f"executor {source} sent epoch {first} after epoch {self._helper_epoch[source]}: deltas out of order",
            )
        self._helper_epoch[source] = last
        # the helper folded these rows under its last watermark: windows it closed stay closed to them
        closed_until = self.promise(self.gate.frontier.entries[source])
        self.merged.merge_partials(
            batch.view("slice"), batch.view("key"), batch.view("count"), batch.view("value"), closed_until
        )

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    # Taken between two batches, which the checkpoint barrier is: every delta an epoch end made
    # is already whole in a shipper's FIFO, ahead of the barrier that follows it into the
    # channel, so it belongs to the leader's snapshot, not this one; nothing is half shipped.
    # The epoch in progress is state: its fragments (the slices not yet shipped) and counters.
    STATE_KIND, STATE_VERSION = SSB_STATE, SSB_STATE_VERSION

    def snapshot(self) -> State:
        """Own fragments, the leader state (`leader.` arrays and meta), the epoch number, the
        last epoch merged from each helper, the watermark shipped and its promise, and the
        frontier of the executors' watermarks (a copy; the shippers' queues are not state)."""
        meta = {
            **self._window_meta(),
            "leader": self.merged._window_meta(),
            "partitions": self.partitioning.partitions,
            "executors": self.partitioning.executors,
            "index": self.index,
            "epoch": self.epoch,
            "helper_epoch": list(self._helper_epoch),
            "frontier": list(self.gate.frontier.entries),
            "watermark": self._watermark,
            "shipped_promise": self._shipped_promise,
            "direct": self.direct,
            "epoch_counters": [
                self._bytes, self._records, self._own_records, self._own_new, self._routed, self._shipped
            ],
        }
        arrays = {**self._window_arrays(), **self.merged._window_arrays("leader.")}
        return tagged(self.STATE_KIND, self.STATE_VERSION, arrays, step=self.step_id, **meta)

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        if (meta["partitions"], meta["executors"]) != (self.partitioning.partitions, self.partitioning.executors):
            raise SnapshotError(
                f"step {self.step_id!r}: the state is of {meta['executors']} executors over {meta['partitions']} "
                f"partitions, this run has {self.partitioning.executors} over {self.partitioning.partitions}: cut it "
                "by partition and reassign (slashrt.snapshot.rescale.reassigned)"
            )
        self._restore_window(state.arrays, meta)
        self.merged._restore_window(state.arrays, meta["leader"], "leader.")
        self.epoch, self._helper_epoch = meta["epoch"], list(meta["helper_epoch"])
        self._watermark, self._shipped_promise, self.direct = meta["watermark"], meta["shipped_promise"], meta["direct"]
        (self._bytes, self._records, self._own_records, self._own_new, self._routed, self._shipped) = meta["epoch_counters"]
        frontier = make_frontier(self._progress, self.partitioning.executors)
        for source, watermark in enumerate(meta["frontier"]):
            if watermark != NO_TIME:
                frontier.advance(source, watermark)
        self.gate.frontier = frontier

    @property
    def state_bytes(self) -> int:
        return super().state_bytes + self.merged.state_bytes

    @property
    def shipped_bytes(self) -> int:
        """Bytes of delta rows sent to other leaders so far."""
        return sum(e.shipped_bytes for e in self.epochs)


# -- SSB partitions: the unit of state when the executor count changes ------------------------------
_TABLE_SETS = ("slices", "tails", "leader.slices", "leader.tails")


def split_partitions(state: State, partitioning) -> dict[int, State]:
    """Cut one executor's SSB state (`SsbWindowAggregate.snapshot()`) by the partition of each
    key: partition -> the rows of its keys in every table (leader state and fragments alike),
    with the executor's meta. One vectorised pass per table set."""
    parts = {p: {} for p in range(partitioning.partitions)}
    for prefix in _TABLE_SETS:
        keys = state.arrays[f"{prefix}.keys"]
        owner = partitioning.partition_of(np.ascontiguousarray(keys, np.int64))
        bounds = state.arrays[f"{prefix}.bounds"]
        table_of_row = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        order = np.lexsort((table_of_row, owner))  # by partition, tables in order within one
        cuts = np.searchsorted(owner[order], np.arange(partitioning.partitions + 1))
        for p in range(partitioning.partitions):
            rows = order[cuts[p] : cuts[p + 1]]
            tables = table_of_row[rows]
            counts = np.bincount(tables, minlength=len(bounds) - 1)
            part_bounds = np.zeros(len(bounds), np.int64)
            np.cumsum(counts, out=part_bounds[1:])
            parts[p].update({
                f"{prefix}.ids": state.arrays[f"{prefix}.ids"],
                f"{prefix}.bounds": part_bounds,
                f"{prefix}.overflowed": state.arrays[f"{prefix}.overflowed"],
                **{f"{prefix}.{c}": state.arrays[f"{prefix}.{c}"][rows] for c in ("keys", "counts", "vals")},
            })
    return {p: State(arrays, dict(state.meta)) for p, arrays in parts.items()}


def merge_partitions(parts: list[State], partitioning, index: int) -> State:
    """The SSB state of executor `index` under `partitioning` (a new executor count), from the
    partition states (`split_partitions`) of the partitions it now leads, from every old executor.

    Old fragments join the leader state as their deltas would have at their epoch's end: under
    the promise of the watermark their executor shipped last (windows closed there stay closed
    to them, as tails). Old leaders may have fired up to different times (an unaligned
    checkpoint's watermarks in flight to some; a graph flow's owners, each on the progress it
    had heard of): the merged windows have fired up to the least of them, and the tables of a
    leader that had fired further join as tails closed at its time, so that the windows up to
    it fire again with the other leaders' keys only (its own were emitted). Epochs restart from
    0 on every new executor (they all restart together); the late-record count carries over to
    executor 0 only."""
    if not parts:
        raise SnapshotError(f"no partition state to give executor {index}: pass the states of the partitions it leads")
    metas = [check(part, part.meta.get("step", "?") if isinstance(part.meta, dict) else "?", SSB_STATE,
                   SSB_STATE_VERSION) for part in parts]
    first = metas[0]
    size, slide, slice_len = first["size"], first["slide"], first["slice_len"]
    leader_fired = min(m["leader"]["fired_until"] for m in metas)
    unfired = NO_TIME if leader_fired == NO_TIME else ((leader_fired - size) // slide + 1) * slide
    starts = [m["leader"]["next_start"] for m in metas if m["leader"]["next_start"] is not None]
    tables: dict[str, dict] = {"leader.slices": {}, "leader.tails": {}}
    for part, meta in zip(parts, metas):
        fired = meta["leader"]["fired_until"]
        past = fired if fired > leader_fired else NO_TIME  # its leader fired the windows up to it
        for prefix in _TABLE_SETS:
            leader = prefix.startswith("leader.")
            for table_id, keys, counts, vals, overflowed in unpack_tables(prefix, part.arrays):
                empty = not len(keys) and not overflowed
                if empty and not leader:  # (a leader's are kept: a tail's windows fire with its slice)
                    continue
                # the end of the last window it must not join: a leader's table, the windows its
                # leader fired past the merged ones; a fragment, those closed when it was folded
                s, closed = (table_id, NO_TIME) if prefix.endswith("slices") else table_id
                closed = max(closed, past if leader else meta["shipped_promise"])
                earliest = earliest_end(s, size, slide, slice_len)
                target, tid = ("leader.slices", s) if earliest > closed else ("leader.tails", (s, closed))
                if not leader:
                    starts.append(max(earliest - size, unfired))
                if target == "leader.tails":
                    tables["leader.slices"].setdefault(s, [[], [], [], False])  # so its windows fire
                    if empty:
                        continue
                got = tables[target].setdefault(tid, [[], [], [], False])
                got[0].append(keys), got[1].append(counts), got[2].append(vals)
                got[3] = got[3] or overflowed
    vdt = first["value_dtype"]
    arrays = {**_packed("slices", {}, vdt), **_packed("tails", {}, vdt)}
    for prefix, by_id in tables.items():
        arrays.update(_packed(prefix, by_id, vdt))
    # Every new executor starts where the least advanced old one whose stream had not ended
    # stood (the records left were all read after one's watermark): it has shipped that
    # watermark, and the gates hold each executor there, so a leader closes to a helper's delta
    # the windows the helper closed (whatever watermarks were in flight to the old leaders).
    live = [m for m in metas if END_TIME not in (m["watermark"], m["shipped_promise"])] or metas
    meta = {
        **first,
        "epoch": 0,
        "helper_epoch": [0] * partitioning.executors,
        "frontier": [min(m["watermark"] for m in live)] * partitioning.executors,
        "watermark": min(m["watermark"] for m in live),
        "shipped_promise": min(m["shipped_promise"] for m in live),
        "fired_until": min(m["fired_until"] for m in live),
        # each old executor's late count once (its meta is in every partition cut from it)
        "late_records": sum({m["index"]: m["late_records"] for m in metas}.values()) if index == 0 else 0,
        "next_start": None,
        "direct": False,
        "epoch_counters": [0] * len(first["epoch_counters"]),
        "leader": {**first["leader"], "next_start": min(starts, default=None), "fired_until": leader_fired,
                   "late_records": 0},
        "partitions": partitioning.partitions,
        "executors": partitioning.executors,
        "index": index,
    }
    return State(arrays, meta)
