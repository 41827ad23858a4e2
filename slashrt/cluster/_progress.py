"""The progress bus: one executor's end of the distributed progress protocol, over real channels.

`ProgressExchange` (slashrt.progress.exchange) decides what to broadcast and when; this module
moves its messages. Every executor has a dedicated progress channel to every other one (one
per ordered pair, a ring of small slots, never shared with data, so progress never waits
behind a data buffer) of any network medium (shm, tcp, verbs)::

    executor i                                                executor j
    record(updates) ─> exchange.record ─> messages            receive task (one per peer):
                         │                                      poll, decode (wire.py),
                         └─ encode once ─> outbox[j] ─> ring ─>  exchange.receive(message) ─┐
                                           (posted now if a      messages it returns ──> broadcast
                                            credit is free, else  view.propagate() ─> wake waiters
                                            by the send task)     release the slot (a credit)

Messages are posted in the order the exchange returns them, on FIFO channels, and are applied
whole: a message larger than a slot travels as several frames and is applied when its last
frame has arrived. `record` and `flush` never block: a message waits in the peer's outbox when
its ring is full, and that peer's send task posts it as credits return. So two executors whose
rings are full of each other's messages cannot deadlock: receiving (which returns credits)
never waits for sending. `poll()` does the receive tasks' work at once, without waiting (`_drain`
per peer): an executor too busy to yield to them calls it between events.

`open_progress_bus` listens, swaps addresses through the caller (the agent's control
connection, a test harness's pipes), connects every channel both ways through an
`open_channels` owner (dialling through the caller's `dial` if it gives one: the agent's
names a partition as its exchanges' do), and runs the bus's tasks until the block ends; then
it flushes, ends its channels after everything queued, and waits for every peer to end
theirs (a closed bus records nothing more, and receiving with an empty buffer never produces
a message, so the close needs no further round). A peer that vanishes fails the bus with one
ChannelClosed in the cluster's words ("executor 2 lost its progress channel: ..."); a
malformed message is a MalformedBuffer naming its sender.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import attrs
import trio

from slashrt._buffer import Control
from slashrt.errors import ChannelClosed, MalformedBuffer, unwrap_groups
from slashrt.progress.antichain import Antichain
from slashrt.progress.exchange import Message, ProgressExchange
from slashrt.progress.reachability import Location, Reachability
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Pointstamp
from slashrt.progress.wire import ProgressCodec
from slashrt.transport._channel import Receiver, RingSpec, Sender
from slashrt.transport._channel import Liveness
from slashrt.transport._port import ChannelPort, channel_name
from slashrt.transport._registry import Channels, open_channels

__all__ = ["ProgressBus", "ProgressStats", "open_progress_bus", "PROGRESS_RING"]

PROGRESS_RING = RingSpec(slots=16, slot_size=4096)  # a slot holds ~170 updates outside loops


@attrs.define
class ProgressStats:
    """What this executor's bus moved: updates recorded, messages and frames broadcast (a
    message counts once however many peers it goes to), bytes posted to all peers together."""

    updates: int = 0
    messages: int = 0
    frames: int = 0
    bytes: int = 0
    received: int = 0


class ProgressBus:
    """A `ProgressExchange` and its channels: `record`, `flush`, and the view's frontiers."""

    def __init__(
        self,
        index: int,
        exchange: ProgressExchange,
        codec: ProgressCodec,
        senders: dict[int, Sender],
        receivers: dict[int, Receiver],
        *,
        history: bool = False,
    ):
        self.index = index
        self.exchange = exchange
        self.codec = codec
        self.stats = ProgressStats()
        self.version = 0  # counts the view's changes (`wait_changed`)
        # called with the view's frontier changes, [(location, timestamp, +1 | -1)], as they
        # happen (a runtime scheduling notifications per location sets it)
        self.on_frontier_change: Callable[[list[tuple[Location, Timestamp, int]]], None] | None = None
        # (monotonic ns, "record" | "flush" | "receive", peer or None, updates, messages sent):
        # every event in the order it was applied, for tests and diagnostics
        self.history: list | None = [] if history else None
        self._senders = senders
        self._receivers = receivers
        # each channel end -> the executor at its other end (to name a partition)
        self.peer_of = {**{end: p for p, end in senders.items()}, **{end: p for p, end in receivers.items()}}
        self._outbox: dict[int, deque[bytes]] = {peer: deque() for peer in senders}
        self._queued = {peer: trio.lowlevel.ParkingLot() for peer in senders}
        self._partial: dict[int, list] = {peer: [] for peer in receivers}  # frames of a message yet to end
        self._changed = trio.lowlevel.ParkingLot()
        self._closed = False
        self._frame_bytes = min((s.spec.payload_capacity for s in senders.values()), default=PROGRESS_RING.payload_capacity)

    # --- the executor's side -----------------------------------------------------------------
    def record(self, updates: Iterable[tuple[Pointstamp, int]]) -> None:
        """Local events (projected pointstamps and deltas, the exchange's caller contract);
        what the exchange releases is broadcast now (or as soon as rings have room)."""
        if self._closed:
            raise ChannelClosed(f"executor {self.index}'s progress bus is closed: nothing more can be recorded")
        updates = list(updates)
        self.stats.updates += len(updates)
        self._after("record", None, updates, self.exchange.record(updates))

    def flush(self) -> None:
        """Broadcast whatever the exchange holds back (call it when the executor goes idle)."""
        messages = self.exchange.flush()
        if messages:  # (nothing held: the view did not change, no one to tell)
            self._after("flush", None, (), messages)

    def frontier(self, location: Location) -> Antichain:
        return self.exchange.view.frontier(location)

    def is_complete(self, location: Location, time: Timestamp) -> bool:
        return self.exchange.view.is_complete(location, time)

    async def wait_complete(self, location: Location, time: Timestamp) -> None:
        """Return once nothing at or before `time` can still reach `location` (as this
        executor's view knows, which is never ahead of the truth)."""
        while not self.is_complete(location, time):
            await self._changed.park()

    async def next_frontier(self, location: Location, than: Antichain | None = None) -> Antichain:
        """Wait until the frontier at `location` differs from `than` (default: the current
        one) and return it."""
        than = self.frontier(location) if than is None else than
        while (now := self.frontier(location)) == than:
            await self._changed.park()
        return now

    async def wait_changed(self, since: int | None = None) -> int:
        """Wait until the view has changed (a message applied, a local record) since it was at
        `version` `since` (default: now); returns the version it is at. Reading `version`
        before deciding to wait, and passing it, loses no change made in between."""
        since = self.version if since is None else since
        while self.version == since:
            await self._changed.park()
        return self.version

    # --- moving messages ---------------------------------------------------------------------
    def _after(self, event: str, peer: int | None, updates, messages: list[Message]) -> None:
        if self.history is not None and (messages or event != "flush"):
            self.history.append((time.monotonic_ns(), event, peer, tuple(updates), tuple(messages)))
        if messages and self._closed:
            raise RuntimeError(f"executor {self.index}'s closed progress bus was asked to send {messages}")
        for message in messages:
            frames = self.codec.encode(message, self._frame_bytes)  # once, for every peer
            self.stats.messages += 1
            self.stats.frames += len(frames)
            for peer, outbox in self._outbox.items():
                outbox.extend(frames)
                self._post(peer)
        changes = self.exchange.view.propagate()
        if changes and self.on_frontier_change is not None:
            self.on_frontier_change(changes)
        self.version += 1
        self._changed.unpark_all()  # whoever waits on the view rechecks

    def _post(self, peer: int) -> None:
        """Post the peer's queued frames while its ring has credits, as many per slot as fit;
        the peer's send task posts the rest when credits return."""
        sender, outbox = self._senders[peer], self._outbox[peer]
        capacity = sender.spec.payload_capacity
        try:
            while outbox and sender.credits() > 0:
                payload = sender.reserve()
                used = 0
                while outbox and used + len(outbox[0]) <= capacity:
                    frame = outbox.popleft()
                    payload[used : used + len(frame)] = memoryview(frame)
                    used += len(frame)
                sender.post(nbytes=used, count=0)
                self.stats.bytes += used
        except ChannelClosed as exc:
            raise self._lost(peer, exc) from None
        if outbox:
            self._queued[peer].unpark_all()

    def _lost(self, peer: int, exc: BaseException) -> ChannelClosed:
        return ChannelClosed(f"executor {peer} lost its progress channel to executor {self.index}: {exc}")

    async def _send_task(self, peer: int) -> None:
        sender, outbox = self._senders[peer], self._outbox[peer]
        while True:
            while not outbox:
                await self._queued[peer].park()
            try:
                await sender.wait_credit()
            except ChannelClosed as exc:
                raise self._lost(peer, exc) from None
            self._post(peer)

    def poll(self) -> bool:
        """Apply every peer message that has arrived, without waiting; True if any was. A busy
        executor calls it between events, so a peer's news does not wait for its next yield
        (the receive tasks run only then)."""
        got = False
        for peer in self._receivers:
            got |= self._drain(peer)
        return got

    async def _receive_task(self, peer: int) -> None:
        """Apply the peer's messages in its order until it ends its channel."""
        receiver = self._receivers[peer]
        while not receiver.finished:
            try:
                await receiver.wait_readable()
            except ChannelClosed as exc:
                raise self._lost(peer, exc) from None
            self._drain(peer)

    def _drain(self, peer: int) -> bool:
        """Apply what the peer's channel holds now, in its order (a message split over frames
        waits in `_partial` for its last frame); True if anything was polled."""
        receiver, got = self._receivers[peer], False
        while True:
            try:
                buffer = receiver.poll()
            except ChannelClosed as exc:
                raise self._lost(peer, exc) from None
            if buffer is None:
                return got
            got = True
            if buffer.is_control:
                ctype = buffer.control()[0]
                if ctype is not Control.END_OF_STREAM:
                    raise MalformedBuffer(f"from executor {peer}: a {ctype.name} control message on a progress channel")
            else:
                offset, payload = 0, buffer.payload
                while offset < len(payload):
                    try:
                        part, more, offset = self.codec.decode_frame(payload, offset)
                    except MalformedBuffer as exc:
                        raise MalformedBuffer(f"from executor {peer}: {exc}") from None
                    self._partial[peer] += part
                    if not more:
                        message, self._partial[peer] = tuple(self._partial[peer]), []
                        self.stats.received += 1
                        self._after("receive", peer, message, self.exchange.receive(message))
            receiver.release()  # after decoding: the payload is a view of the slot

    async def _flushed(self) -> None:
        """Wait until every queued frame is posted."""
        for peer, outbox in self._outbox.items():
            while outbox:
                try:
                    await self._senders[peer].wait_credit()
                except ChannelClosed as exc:
                    raise self._lost(peer, exc) from None
                self._post(peer)

    async def _close(self, stop_sending: Callable[[], Awaitable[None]]) -> None:
        """Flush, stop the send tasks, then end every channel after what is queued (the owner
        then waits for every peer's end)."""
        self.flush()
        self._closed = True
        await self._flushed()
        await stop_sending()  # none may be parked on a sender that is being closed
        for peer, sender in self._senders.items():
            try:
                await sender.aclose()
            except ChannelClosed as exc:
                raise self._lost(peer, exc) from None


SwapAddresses = Callable[[dict[int, object]], Awaitable[dict[int, object]]]
# (channels, peer, address of the peer's listener, spec) -> a sender connected to it
Dial = Callable[[Channels, int, object, RingSpec], Awaitable[Sender]]


@contextlib.asynccontextmanager
async def open_progress_bus(
    index: int,
    executors: int,
    graph: Reachability,
    *,
    transport: str,
    secret: bytes,
    swap_addresses: SwapAddresses,
    initial: Iterable[tuple[Pointstamp, int]] = (),
    spec: RingSpec = PROGRESS_RING,
    history: bool = False,
    connect_timeout: float = math.inf,
    dial: Dial | None = None,
    liveness: Liveness | None = None,
    port: ChannelPort | None = None,
    **where,
) -> AsyncIterator[ProgressBus]:
    """Executor `index`'s progress bus among `executors`, over medium `transport`.

    It opens a listener per peer (bound where `where` says, e.g. host= for tcp) and calls
    `await swap_addresses({peer: address peer must connect to})`, which must return {peer:
    address of the peer's listener for this executor}; then it connects every channel, by
    `await dial(channels, peer, address, spec)` if given (default: a plain connect), and
    accepts every peer's within `connect_timeout` (PeersMissing names the missing ones; the
    default waits, as `Channels.accept_each` does: the caller bounds it). `initial`: the
    pointstamps every executor starts with (e.g. each source instance's first capability). On
    leaving the block the bus flushes, ends its channels and waits until every peer has ended
    its own. With `liveness`, its channels are watched as the exchanges' are
    (`transport._channel.Liveness`): a silent one raises `ChannelSilent` out of the block.
    With a `port` (`transport._port`: the executor's, shared with its exchanges), its
    listeners are the port's channels named `channel_name("progress", peer)`."""
    peers = [p for p in range(executors) if p != index]
    async with open_channels(liveness) as channels:
        # no spin before parking over shm: a receiver spins without yielding, so a waiter it
        # just woke would wait out the spin (100 us a hop, measured), and progress is sparse
        options = {"spin_us": where.pop("spin_us", 0)} if transport == "shm" else {}
        if port is not None:
            listeners = {peer: port.listener(channel_name("progress", peer), spec, **options) for peer in peers}
        else:
            listeners = {peer: await channels.listen(transport, spec, secret, **where, **options) for peer in peers}
        directory = await swap_addresses({peer: lst.address for peer, lst in listeners.items()})
        senders: dict[int, Sender] = {}
        receivers: dict[int, Receiver] = {}

        async def connect(channels: Channels, peer: int, address, spec: RingSpec) -> Sender:
            return await channels.connect(transport, address, spec, secret)

        async def dial_peer(peer: int) -> None:
            senders[peer] = await (dial or connect)(channels, peer, directory[peer], spec)

        async def accept() -> None:
            describe = lambda peer: f"executor {peer}'s progress channel"  # noqa: E731
            receivers.update(await channels.accept_each(listeners, timeout=connect_timeout, describe=describe))

        with trio.fail_after(connect_timeout + 5):
            async with unwrap_groups(), trio.open_nursery() as nursery:
                nursery.start_soon(accept)
                for peer in peers:
                    nursery.start_soon(dial_peer, peer)
        bus = ProgressBus(
            index, ProgressExchange(graph, initial), ProgressCodec(graph), senders, receivers, history=history
        )
        async with unwrap_groups(), trio.open_nursery() as nursery:
            peers_ended = trio.Event()

            async def receive_all() -> None:
                async with trio.open_nursery() as receiving:
                    for peer in peers:
                        receiving.start_soon(bus._receive_task, peer, name=f"progress-receive:{peer}")
                peers_ended.set()

            sending, sent = trio.CancelScope(), trio.Event()

            async def send_all() -> None:
                with sending:
                    async with trio.open_nursery() as senders_nursery:
                        for peer in peers:
                            senders_nursery.start_soon(bus._send_task, peer, name=f"progress-send:{peer}")
                sent.set()

            async def stop_sending() -> None:
                sending.cancel()
                await sent.wait()

            nursery.start_soon(send_all)
            nursery.start_soon(receive_all)
            yield bus
            await bus._close(stop_sending)
            await peers_ended.wait()
