"""UpPar: the repartitioning baseline. Records go to the executor owning their key's partition.

Where the dataflow has a keyed window, each executor routes the rows the window needs (time,
key, value) by the owner of the key's partition (the same `Partitioning` the SSB uses):
its own rows go straight into its local window, the others through a transport channel to
their owner, whose window takes them from an `Inbound` pipeline in its stage's lane. Every
executor's watermark travels in band with its rows; the window sees the minimum over all of
them (a `FrontierGate`) and ends when every executor's stream has ended. This is the strawman
the Slash paper measures against, built on the same channels so that the comparison is fair:
every record crosses a channel once unless its owner is the executor that read it.
"""

from __future__ import annotations

import numpy as np

from slashrt._batch import Batch
from slashrt._buffer import Control
from slashrt._dataflow import WindowAggSpec
from slashrt._kernels import minmax
from slashrt.errors import SnapshotError
from slashrt.ops._node import Node
from slashrt.ops.event_time import NO_TIME
from slashrt.ops.exchange import FrontierGate, Inbound
from slashrt.ops.window import InFrontOfWindow, WindowAggregate, check_key_type, check_uint64_values, in_flight_keys
from slashrt.progress import make_frontier
from slashrt.progress.frontier import END_TIME
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.ssb.partitions import Partitioning
from slashrt.transport import Sender

__all__ = ["RouteByOwner", "routed_dtype"]


def routed_dtype(spec: WindowAggSpec) -> np.dtype:
    """The rows that cross the network: only the fields the window reads."""
    value_dtype = spec.shared_value_dtype()
    fields = [(spec.time, "<i8"), (spec.key, "<i8" if spec.key_dtype is None else spec.key_dtype)]
    if spec.column is not None:
        fields.append((spec.column, value_dtype))
    return np.dtype(fields)


class RouteByOwner(InFrontOfWindow, Node):
    """Stands where the window is in the local pipeline: routes rows to their owners."""

    lane = 1  # the executor's lane computing the rows peers route here: its stage (`_plan`)

    def __init__(
        self, spec: WindowAggSpec, window: WindowAggregate, *, index: int, partitioning: Partitioning,
        progress: str = "watermark",
    ):
        self.window = window
        window.counts_late = False  # records are judged here, where they are read
        super().__init__(f"{spec.step_id}.route")
        self.spec = spec
        self.index = index
        self.partitioning = partitioning
        self.exchange_dtype = routed_dtype(spec)
        self._progress = progress
        self.gate = FrontierGate(window, make_frontier(progress, partitioning.executors))
        self.senders: dict[int, Sender] = {}  # owner executor -> channel to it
        self.fired_until = NO_TIME  # windows ending at or before this are closed for this executor's records
        self._ended = False  # its outgoing channels are closed
        self.shipped_bytes = 0  # bytes of rows sent to their owners so far

    def add_peer(self, peer: int, sender: Sender) -> None:
        """The channel carrying rows owned by executor `peer`."""
        self.senders[peer] = sender

    def background(self) -> list:
        return []  # rows are sent by compute itself: backpressure reaches the sources

    def inbound(self, source: int) -> Inbound:
        """The root node for the channel of rows arriving from executor `source`."""
        return Inbound(self.spec.step_id, source, self._from_peer, self.gate)

    async def _from_peer(self, source: int, batch: Batch) -> None:
        # judged by the sender against its watermark, which arrived before them
        await self.window.push_judged(batch, self.window.promise(self.gate.frontier.entries[source]))

    async def adopt_in_flight(self, rows: np.ndarray, watermark: int) -> None:
        """Rescaled: rows in flight between the old executors, of the keys this one owns."""
        mine = self.partitioning.owner_of(in_flight_keys(rows, self.spec.key)) == self.index
        await self.window.adopt_in_flight(rows[mine], watermark)

    async def push(self, batch: Batch) -> None:
        # Late records are judged here, against this executor's own watermark (the one of the
        # input's order), not at the owner, whose watermark is the least of every executor's.
        window = self.window
        times = batch.view(self.spec.time)
        tmin, tmax = minmax(times)
        window._check_times(tmin, tmax)
        if window._earliest_end(tmin // window.slice_len) <= self.fired_until:
            batch, _ = await window._split_late(
                batch, batch[self.spec.time] // window.slice_len, self.fired_until, count=True
            )
            if not len(batch):
                return
        keys = batch[self.spec.key]
        check_key_type(self.spec, keys.dtype)
        if self.spec.column is not None and self.spec.value_dtype.kind == "i":
            check_uint64_values(self.spec, batch[self.spec.column])
        owners = self.partitioning.owner_of(keys)
        columns = [(name, batch[name]) for name in self.exchange_dtype.names]
        for owner in range(self.partitioning.executors):
            take = np.flatnonzero(owners == owner)
            if not len(take):
                continue
            rows = np.empty(len(take), self.exchange_dtype)
            for name, column in columns:
                rows[name] = column[take]
            if owner == self.index:
                await self.window.push_judged(Batch(rows), self.fired_until)
            else:
                await self.senders[owner].send_records(rows)
                self.shipped_bytes += rows.nbytes

    async def on_watermark(self, watermark: int) -> None:
        self.fired_until = max(self.fired_until, self.window.promise(watermark))
        for sender in self.senders.values():
            await sender.send_control(Control.WATERMARK, watermark)
        await self.gate.advance(self.index, watermark)

    async def forward_barrier(self, n: int) -> None:
        """Checkpoint barrier n on every outgoing channel, after every row this executor's
        stream sent before it (an ended channel delivers every barrier without one)."""
        if not self._ended:
            for sender in self.senders.values():
                await sender.send_control(Control.BARRIER, n)

    async def on_end(self) -> None:
        self._ended = True
        for sender in self.senders.values():
            await sender.aclose()
        await self.gate.advance(self.index, END_TIME)

    # -- state (the shape: slashrt.snapshot.operators) -------------------------------------------------
    # The owner's window is a step of its own in the plan (`spec.step_id`) with its own state;
    # the router holds where its own records are judged and the watermarks its window has seen.
    STATE_KIND, STATE_VERSION = "route_by_owner", 1
    state_bytes = 0  # a few integers

    def snapshot(self) -> State:
        return tagged(
            self.STATE_KIND, self.STATE_VERSION, {}, step=self.step_id, fired_until=self.fired_until,
            executors=self.partitioning.executors, frontier=list(self.gate.frontier.entries),
        )

    def restore(self, state: State) -> None:
        meta = check(state, self.step_id, self.STATE_KIND, self.STATE_VERSION)
        if meta["executors"] != self.partitioning.executors:
            raise SnapshotError(
                f"step {self.step_id!r}: the state is of {meta['executors']} executors, this run has "
                f"{self.partitioning.executors}: reassign it by key partition first (slashrt.snapshot.rescale.reassigned)"
            )
        self.fired_until = meta["fired_until"]
        frontier = make_frontier(self._progress, self.partitioning.executors)
        for source, watermark in enumerate(meta["frontier"]):
            if watermark != NO_TIME:
                frontier.advance(source, watermark)
        self.gate.frontier = frontier
