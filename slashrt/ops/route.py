"""`stream.exchange(key=...)`: records go to the executor owning their key.

On one executor the step passes batches on. On several, a batch at logical time t is split
by the owner of each record's key (`Partitioning.owner_of`, the map windows use): its own
records go on downstream in the same call, the others to their owners over the job's
channels, with t in hidden columns (`__epoch`, `__c0`...). Pointstamp accounting keeps
notifications honest across executors: the sender counts +n at (this step's input, t) for n
records it ships (covered by the capability it holds while pushing), the receiver -n once it
has pushed them downstream at t, so the frontier behind the step cannot pass t while records
at t are on their way. The receiver reads them in the channel's slots (`take_by_time`): a run
of slots whose rows are all at one time as one 2-D view, which an SSB owner joins in place
(`slashrt.ssb.graph_window`); records going downstream are copied once, out of the ring.

Records to ship wait in a queue per peer that a background task drains, a slot at a time (no
backpressure into compute: the exchange channels are read by the same compute
coroutine that sends, so waiting for a peer's credits there could deadlock two executors
sending to each other). The queues are bounded from further up instead: while an exchange
holds more than two rings' worth of rows a peer (`backlogged`), the executor polls its sources
no more (`RoomForSources`, its sources' rings fill and their feeders wait), and goes on
computing its peers' channels, which is what empties the queues elsewhere; a checkpoint
requested and not yet taken lifts it, so that no barrier waits behind it.
When the step's input frontier is empty (nothing anywhere can send more), the queues end with
END_OF_STREAM, which ends the peers' inputs. A checkpoint's barrier goes into every queue behind
the records before it (`forward_barrier`, `slashrt.snapshot.cluster`) and out in band.

`WindowRoute` is a keyed window on several executors in mode "uppar" (the repartitioning
baseline the Slash paper measures against: every record crosses a channel once unless its
key's owner read it): the same exchange, keyed
by the window's key and shipping only the columns the window reads, in front of a plain
window on each key's owner, which fires on the frontier at its input (the records on their
way hold it back) and judges lateness by the logical time each batch carries. Inside a loop
the window is a `LoopWindow` and the hidden columns carry the loop counters too, so the owner
takes each row at its iteration and fires each iteration on its part of the frontier.
"""

from __future__ import annotations

import collections

import numpy as np
import trio

from slashrt._batch import Batch
from slashrt._buffer import Control
from slashrt._dataflow import ExchangeSpec, WindowAggSpec
from slashrt._kernels import minmax
from slashrt.errors import DataflowError, OperatorError
from slashrt.ops._node import Node
from slashrt.ops.keys import codes, key_problem
from slashrt.ops.loop_window import LoopWindow
from slashrt.ops.window import InFrontOfWindow
from slashrt.progress import Timestamp
from slashrt.ssb.partitions import Partitioning

__all__ = ["ExchangeNode", "RoomForSources", "WindowRoute", "routed_dtype", "shipped_times", "take_by_time", "time_columns"]

_END = None


def routed_dtype(spec: WindowAggSpec) -> np.dtype:
    """The rows of a keyed window that cross the network: only the fields the window reads."""
    value_dtype = spec.shared_value_dtype()
    fields = [(spec.time, "<i8"), (spec.key, "<i8" if spec.key_dtype is None else spec.key_dtype)]
    if spec.column is not None:
        fields.append((spec.column, value_dtype))
    return np.dtype(fields)


class ExchangeNode(Node):
    # each record's own time (`Batch.times`) travels in `__t`, for user operators below
    # (shipped rows are counted at the batch's time, `__epoch`, the least of them)
    carries_times = True

    def __init__(self, spec, *, index: int = 0, partitioning: Partitioning | None = None):
        super().__init__(spec.step_id)
        self.spec = spec
        self.index = index
        self.partitioning = partitioning if partitioning is not None and partitioning.executors > 1 else None
        self.senders: dict = {}
        self._queues: dict[int, collections.deque] = {}
        self._lots: dict[int, trio.lowlevel.ParkingLot] = {}
        self._ended = False
        self.outbox: list | None = None  # (owner, rows) shipped since the last barrier, while a checkpoint logs them
        self.queued = 0  # rows in the queues, not yet handed to a channel
        self.queued_peak = 0  # the most rows queued at once since whoever reads it reset it
        self.shipped_bytes = 0  # bytes of rows queued for peers so far
        self.bound = 0  # more than this queued: backlogged (two rings' worth of rows a peer)
        self._room = trio.lowlevel.ParkingLot()
        self._times = ["__epoch", *(f"__c{i}" for i in range(spec.depth))]
        if self.partitioning is not None and spec.dtype is None:
            raise DataflowError(
                f"step {spec.step_id!r}: a multi-executor run ships its records, so every column's type must be "
                "known when the dataflow is built (give apply/operator a schema=, with_column a dtype=)"
            )
        if spec.dtype is not None:
            hidden = self._times + (["__t"] if self.carries_times else [])
            self.exchange_dtype = np.dtype(spec.dtype.descr + [(n, "<i8") for n in hidden])

    # --- the agent's wiring (like the windows' exchanges) -----------------------------------
    def add_peer(self, peer: int, sender) -> None:
        self.senders[peer] = sender
        self._queues[peer] = collections.deque()
        self._lots[peer] = trio.lowlevel.ParkingLot()
        if sender is not None:
            self.bound += 2 * sender.spec.slots * self._rows_per_slot(sender)

    def _rows_per_slot(self, sender) -> int:
        return max(1, sender.spec.payload_capacity // self.exchange_dtype.itemsize)

    def backlogged(self) -> bool:
        return self.queued > self.bound and not self._ended

    async def room(self) -> None:
        """Until the queues shrank back to `bound` (or the exchange ended)."""
        while self.backlogged():
            await self._room.park()

    def background(self) -> list:
        return [lambda peer=peer: self._ship(peer) for peer in self.senders]

    def inbound(self, source: int) -> Node:
        return _Inbound(self, source)

    # --- data -----------------------------------------------------------------------------------
    async def push(self, batch: Batch) -> None:
        if self.partitioning is None:
            await self.emit(batch)
            return
        keys = batch.column(self.spec.key)
        if (problem := key_problem(keys.dtype)) is not None:  # a column typed only at run time
            raise OperatorError(self.step_id, f"key column {self.spec.key!r} {problem}")
        owners = self.partitioning.owner_of(codes(keys))  # (`ops.keys`: any key as its int64 code)
        clock = self.clock
        now: Timestamp = clock.now
        order = np.argsort(owners, kind="stable")
        bounds = np.searchsorted(owners[order], np.arange(self.partitioning.executors + 1))
        mine = None
        for owner in range(self.partitioning.executors):
            take = order[bounds[owner] : bounds[owner + 1]]
            if not len(take):
                continue
            if owner == self.index:
                mine = take
                continue
            rows = np.empty(len(take), self.exchange_dtype)
            for name in self.spec.dtype.names:
                rows[name] = batch.column(name)[take]
            rows["__epoch"] = now.epoch
            if self.carries_times:
                rows["__t"] = now.epoch if batch.times is None else batch.times[take]
            for i, counter in enumerate(now.counters):
                rows[f"__c{i}"] = counter
            self._enqueue(owner, rows, now)
        if mine is not None:
            await self.emit(batch if len(mine) == len(batch) else batch.select(np.sort(mine)))

    def _enqueue(self, owner: int, rows: np.ndarray, time: Timestamp) -> None:
        """Queue `rows` (at logical `time`, in their hidden columns) for executor `owner`:
        counted in flight at `time` until it takes them (`arrived`), logged while a checkpoint
        logs what ships."""
        self.clock.in_flight(self, time, len(rows))
        self._queues[owner].append(rows)
        self.queued += len(rows)
        self.queued_peak = max(self.queued_peak, self.queued)
        self.shipped_bytes += rows.nbytes
        if self.outbox is not None:
            self.outbox.append((owner, rows))
        self._lots[owner].unpark_all()

    async def on_watermark(self, watermark: int) -> None:
        pass  # under pointstamp progress, the counts say what may still come

    async def on_end(self) -> None:
        """Nothing anywhere can send more to this step: end the peers' streams."""
        self._ended = True  # (its consumers learn the end from the tracker, not from here)
        for lot in self._lots.values():
            lot.unpark_all()
        self._room.unpark_all()

    def forward_barrier(self, n: int, log: bool = False) -> None:
        """Checkpoint barrier n to every peer, behind every record queued for it so far (an
        ended exchange's peers count it delivered: their input ended). `log`: keep what ships
        after it in `outbox` until `take_outbox` (loops: records in flight at the snapshot)."""
        if self._ended:
            return
        for peer, queue in self._queues.items():
            queue.append(n)
            self._lots[peer].unpark_all()
        self.outbox = [] if log else None

    def overtake(self, n: int) -> int:
        """Unaligned checkpoint n: barrier n, still queued for a peer, goes ahead of the rows
        queued since the barrier before it (never past another barrier); those rows now ship
        after it, computed before the snapshot: they are logged in `outbox` (from now on, with
        what ships until `take_outbox`), records in flight at the cut. Returns the rows moved."""
        if self.outbox is None:
            self.outbox = []
        moved = 0
        for peer, queue in self._queues.items():
            items = list(queue)
            at = next((i for i, item in enumerate(items) if isinstance(item, int) and item == n), None)
            if at is None:  # sent already (or never queued: the exchange ended)
                continue
            since = max((i for i in range(at) if isinstance(items[i], int)), default=-1) + 1
            rows = items[since:at]
            if not rows:
                continue
            queue.clear()
            queue.extend(items[:since] + [n] + rows + items[at + 1:])
            self.outbox[:0] = [(peer, r) for r in rows]
            moved += sum(len(r) for r in rows)
        return moved

    def queued_times(self) -> dict[Timestamp, int]:
        """The logical times of the rows queued for peers and not yet handed to a channel,
        and how many rows are at each (a progress report: the records this executor holds)."""
        rows = [item for queue in self._queues.values() for item in queue if not isinstance(item, int)]
        return shipped_times(np.concatenate(rows)) if rows else {}

    def take_outbox(self) -> tuple[np.ndarray, np.ndarray]:
        """(owners, rows) shipped since the last barrier, and stop logging."""
        logged, self.outbox = self.outbox or [], None
        owners = np.concatenate([np.full(len(rows), owner, np.int64) for owner, rows in logged]) if logged else np.zeros(0, np.int64)
        rows = np.concatenate([rows for _, rows in logged]) if logged else np.zeros(0, self.exchange_dtype)
        return owners, rows

    def reship(self, owners: np.ndarray, rows: np.ndarray) -> None:
        """After a restore: ship again what a checkpoint's outbox holds, counted in flight at each row's time
        (rows a checkpoint holds in an older layout, with columns this one's rows lost, in this one)."""
        if rows.dtype != self.exchange_dtype:
            rows = Batch(rows).to_numpy(self.exchange_dtype)
        self.count_in_flight(rows)
        for owner in np.unique(owners).tolist():
            self._queues[owner].append(rows[owners == owner])
            self._lots[owner].unpark_all()
        self.queued += len(rows)

    def requeue(self, channel: str, segments: list) -> bool:
        """After a restore: the rows an unaligned checkpoint logged for peer j (its part
        `<exchange>.to<j>.channel`: shipped after the barrier, computed before the snapshot)
        ship again, counted in flight; False if `channel` is not one of this exchange's."""
        prefix = f"{self.step_id}.to"
        if not channel.startswith(prefix) or not channel[len(prefix):].isdigit():
            return False
        rows = [records for _, records in segments if len(records)]
        if rows:
            rows = np.concatenate(rows)
            self.reship(np.full(len(rows), int(channel[len(prefix):]), np.int64), rows)
        return True

    def count_in_flight(self, rows: np.ndarray) -> None:
        """Count `rows` (shipped rows, their times in the hidden columns) in flight at their times:
        after a restore, records on their way, which their receiver takes off again (`arrived`)."""
        for time, count in shipped_times(rows).items():
            self.clock.in_flight(self, time, count)

    async def _ship(self, peer: int) -> None:
        queue, lot, sender = self._queues[peer], self._lots[peer], self.senders[peer]
        per_slot = self._rows_per_slot(sender)
        while True:
            while queue:
                # what queued meanwhile goes as one slot at a time (fuller slots, fewer batches
                # at the peer), up to a checkpoint barrier (an int), which goes in band after
                # it; the rest waits in the queue, where a late barrier can overtake it
                rows, count = [], 0
                while queue and not isinstance(queue[0], int) and count < per_slot:
                    piece = queue.popleft()
                    if count + len(piece) > per_slot:
                        queue.appendleft(piece[per_slot - count:])
                        piece = piece[:per_slot - count]
                    rows.append(piece)
                    count += len(piece)
                self.queued -= count
                if not self.backlogged():
                    self._room.unpark_all()
                if rows:
                    await sender.send_records(rows[0] if len(rows) == 1 else np.concatenate(rows))
                elif queue:  # (rows may have queued while the send above waited)
                    await sender.send_control(Control.BARRIER, queue.popleft())
            if self._ended:
                await sender.aclose()
                return
            await lot.park()

    async def arrived(self, rows: np.ndarray) -> None:
        """Rows from a peer (one or more of its shipments, read in the channel's slots: 2-D for
        a run of them): taken at their times (`take`), then no longer in flight."""
        await take_by_time(self, rows, lambda run, time: self.take(run))

    async def take(self, rows: np.ndarray) -> None:
        """Shipped records of one logical time (`clock.now`): on downstream."""
        rows = rows.reshape(-1)  # (a run of slots: in one copy)
        out = np.empty(len(rows), self.spec.dtype)
        for name in self.spec.dtype.names:
            out[name] = rows[name]
        piece = Batch(out)
        if self.carries_times:
            piece.times = rows["__t"].copy()  # (rows: a view into a channel slot)
        await self.emit(piece)


def _time_names(dtype: np.dtype) -> list[str]:
    """The hidden columns of shipped rows that hold their logical time: `__epoch`, `__c0`..."""
    return [n for n in dtype.names if n == "__epoch" or n.startswith("__c")]


def time_columns(rows: np.ndarray) -> np.ndarray:
    """Shipped rows' logical times, from their hidden columns `__epoch`, `__c0`...: a row each."""
    return np.stack([rows[n] for n in _time_names(rows.dtype)], axis=1)


def shipped_times(rows: np.ndarray) -> dict[Timestamp, int]:
    """Shipped rows' logical times -> how many rows are at each."""
    keys, counts = np.unique(time_columns(rows), axis=0, return_counts=True)
    return {Timestamp(k[0], tuple(k[1:])): c for k, c in zip(keys.tolist(), counts.tolist())}


async def take_by_time(node: Node, rows: np.ndarray, take) -> None:
    """Shipped `rows` that arrived at `node`'s input: each run of one logical time handed to
    `await take(run, time)` with the clock's `now` at that time, then no longer in flight.
    Rows of a run of channel slots (2-D, slots x rows) all at one time go as they are, read in
    place; others are cut by time in one copy."""
    clock = node.clock
    if rows.ndim > 1:
        first, names = rows[0, 0], _time_names(rows.dtype)
        if all(minmax(rows[n]) == (first[n], first[n]) for n in names):
            runs = [(rows, Timestamp(int(first["__epoch"]), tuple(int(first[n]) for n in names[1:])))]
        else:
            rows = rows.reshape(-1)
    if rows.ndim == 1:
        times = time_columns(rows)
        cuts = [0, *(np.flatnonzero((times[1:] != times[:-1]).any(axis=1)) + 1).tolist(), len(rows)]
        runs = [(rows[a:b], Timestamp(int(times[a, 0]), tuple(int(c) for c in times[a, 1:])))
                for a, b in zip(cuts[:-1], cuts[1:])]
    for run, time in runs:
        before, clock.now = clock.now, time
        try:
            await take(run, time)
        finally:
            clock.now = before
        clock.in_flight(node, time, -run.size)


RECHECK_S = 0.01  # a source waiting for room looks again this often whether a checkpoint lifted the bound


class RoomForSources:
    """What an executor's source inputs wait for before each poll (`Input.throttle`): room in
    every exchange's queues, unless `exempt()` (a checkpoint requested and not taken: its
    barriers must not wait behind the bound). `full()` is the poller's check, on every poll:
    plain attribute reads, no coroutine."""

    def __init__(self, exchanges, exempt=lambda: False):
        self.exchanges = tuple(exchanges)
        self.exempt = exempt

    def full(self) -> bool:
        return self._backlogged() is not None and not self.exempt()

    async def wait(self) -> None:
        """Until every queue has room (or the exemption holds), looking again every RECHECK_S."""
        while (full := self._backlogged()) is not None and not self.exempt():
            with trio.move_on_after(RECHECK_S):
                await full.room()

    def _backlogged(self):
        """The first exchange holding more than its bound, or None."""
        for x in self.exchanges:
            if x.backlogged():
                return x
        return None


class WindowRoute(InFrontOfWindow, ExchangeNode):
    """Stands where a keyed window is on several executors in mode "uppar": its rows go to
    their key's owner, whose `window` (a plain one) takes them at their logical time."""

    carries_times = False  # a window reads none

    def __init__(self, spec: WindowAggSpec, window, *, index: int, partitioning: Partitioning):
        self.window = window  # it gets the columns the window reads (time, key, value)
        # inside loops the rows' times carry a counter per loop (`__c0`...): the owner's
        # LoopWindow takes them at their iteration
        super().__init__(
            ExchangeSpec(spec.step_id, spec.up, spec.key, routed_dtype(spec), len(spec.scope)),
            index=index, partitioning=partitioning,
        )

    async def on_frontier(self, at) -> None:
        """The frontier at the window's input moved (`at`: the least epoch it holds for a plain
        window, the frontier itself for a LoopWindow): it fires what it passed; once empty,
        nothing can send more and the channels to the peers end."""
        await self.window.on_frontier(at)
        if at is None or (isinstance(self.window, LoopWindow) and not at):
            await self.on_end()


class _Inbound(Node):
    """The root of the pipeline a peer's exchange channel feeds."""

    def __init__(self, exchange: ExchangeNode, source: int):
        super().__init__(f"{exchange.step_id}.from{source}")
        self.exchange = exchange

    async def push(self, batch: Batch) -> None:
        await self.exchange.arrived(batch.as_records(self.exchange.exchange_dtype))

    async def on_watermark(self, watermark: int) -> None:
        pass

    async def on_end(self) -> None:
        pass  # the tracker's counts end the step's consumers, not a channel

