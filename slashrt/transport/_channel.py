"""The channel protocol every transport implements.

A channel is a ring of `slots` slots of `slot_size` bytes with credit-based flow control::

    sender                                   receiver
    ------                                   --------
    credits = slots - (posted - released)
    write payload, then footer, flag last  ->  poll: read the next slot's flag, validate footer
    post (seq = posted)                        process ...
                                           <-  release: clear flag, released += 1 (a credit)

Invariants (checked by the property tests and the conformance kit in slashrt.testing):
FIFO (buffers arrive in post order, seq numbers consecutive), the sender never writes a slot
that has not been released (0 <= posted - released <= slots), and nothing posted is lost.

Buffer `seq` goes to slot `seq % slots` of the ring, and may be posted while `seq` is below
the *limit*, released + slots. A channel of a receiver's slot pool (`_pool`: exclusive slots
per channel and floating ones lent to the channels that have a backlog, as Flink's credit-based
network stack) overrides the three hooks that say so (`_slot_of`, `_limit`, `_consecutive`):
there buffer `seq` goes to the slot its receiver granted it, and the limit is the receiver's
grant counter.

Backends supply only memory and signalling through the hooks of `Sender` and `Receiver`:
where slot bytes live, how a posted slot becomes visible, where the credit counter lives,
and how an idle end parks. All protocol logic (sequence numbers, footers, credit arithmetic,
validation) lives here, once.
"""

from __future__ import annotations

import abc

import attrs
import numpy as np
import trio

from slashrt._buffer import (
    CONTROL_DTYPE,
    DEFAULT_SLOT_SIZE,
    EMPTY,
    FOOTER_SIZE,
    FULL,
    Control,
    Footer,
    Kind,
    decode_control,
    encode_control,
    read_footer,
    write_footer,
)
from slashrt import _kernels as kernels
from slashrt._logging import fault_level
from slashrt.errors import ChannelClosed, MalformedBuffer

__all__ = ["RingSpec", "Buffer", "DataRun", "Sender", "Receiver", "NoCredit", "RunningDrive", "ChannelSilent", "Liveness"]


class NoCredit(RuntimeError):
    """reserve() was called without a credit; await wait_credit() first."""


@attrs.frozen
class Liveness:
    """How a network channel knows its peer is there while no data moves: the receiving end
    sends a keepalive every `interval` seconds (its credit counter, even unchanged, so a slow
    consumer whose ring is full still answers), and the sending end fails the channel with
    `ChannelSilent` after `timeout` seconds without a byte from it (a partition, a peer host
    gone). The owner of the channels chooses it (`open_channels(liveness=)`); None: no watch."""

    interval: float
    timeout: float


class ChannelSilent(ChannelClosed):
    """No traffic from a channel's peer, not even a keepalive, for the channel's timeout."""

    def __init__(self, peer: str, seconds: float, what: str = "no traffic"):
        super().__init__(f"{what} from {peer} for {seconds:g} s")
        self.what = what
        self.peer = peer
        self.seconds = seconds
        self.end = None  # the channel end that noticed (set by its owner, `open_channels`)


@attrs.frozen
class RingSpec:
    """Shape of a channel's ring, agreed by both ends."""

    slots: int = 16
    slot_size: int = DEFAULT_SLOT_SIZE
    record_size: int | None = None  # when set, data footers are checked against it

    def __attrs_post_init__(self):
        if self.slots < 1:
            raise ValueError(f"a ring needs at least one slot, got {self.slots}")
        if self.slot_size < FOOTER_SIZE + CONTROL_DTYPE.itemsize:
            raise ValueError(f"slot size {self.slot_size} is too small for a footer and a control message")
        if self.record_size is not None and self.record_size > self.payload_capacity:
            raise ValueError(f"record of {self.record_size} bytes does not fit a {self.slot_size}-byte slot")

    @property
    def payload_capacity(self) -> int:
        return self.slot_size - FOOTER_SIZE

    @property
    def records_per_slot(self) -> int:
        if self.record_size is None:
            raise ValueError("ring spec has no record size")
        return self.payload_capacity // self.record_size

    @property
    def ring_bytes(self) -> int:
        return self.slots * self.slot_size


@attrs.define(slots=True)
class Buffer:
    """A polled buffer: its decoded footer and a read-only view of its payload bytes."""

    footer: Footer
    payload: np.ndarray

    @property
    def is_control(self) -> bool:
        return self.footer.kind is Kind.CONTROL

    def control(self) -> tuple[Control, int, int]:
        return decode_control(self.payload)

    def records(self, dtype: np.dtype) -> np.ndarray:
        """Zero-copy structured view of the payload's records."""
        return self.payload.view(dtype)


@attrs.define(slots=True)
class DataRun:
    """`n` polled data buffers of `count` records each, in consecutive slots from `first_slot`."""

    first_slot: int
    n: int
    count: int

    is_control = False


class Sender(abc.ABC):
    """Producer end of a channel. Subclasses implement the four backend hooks."""

    def __init__(self, spec: RingSpec):
        self.spec = spec
        self._posted = 0
        self._closed = False
        self.error: BaseException | None = None  # set by a backend when its channel failed
        self.peer = "its peer"  # backends name the other end, for error messages
        self.liveness: Liveness | None = None  # set by the owner before driving (network media watch it)

    def _check_open(self) -> None:
        """Refuse to write on a failed or closed channel, naming why."""
        if self.error is not None:
            raise self._failure()
        if self._closed:
            raise ChannelClosed("channel is closed for sending")

    def _failure(self) -> ChannelClosed:
        exc = ChannelClosed(f"channel to {self.peer} failed: {self.error}")
        exc.__cause__ = self.error
        return exc

    # -- backend hooks -------------------------------------------------------------------------
    @abc.abstractmethod
    def _slot(self, index: int) -> np.ndarray:
        """Writable uint8 view of slot `index` (local memory; for RDMA, a staging slot)."""

    @abc.abstractmethod
    def _publish(self, index: int) -> None:
        """Make the written slot visible to the receiver and wake it if it is parked."""

    @abc.abstractmethod
    def _released(self) -> int:
        """The receiver's released counter as last seen (the credit word)."""

    @abc.abstractmethod
    async def _park_for_credit(self) -> None:
        """Block until the credit word may have changed (or the channel closed)."""

    async def drive(self) -> None:
        """The coroutine that moves this end's bytes, for media that need one (a socket to
        write posted slots to and read credits from, a completion queue to poll). Whoever
        opens the channel runs it (`slashrt.transport._registry.open_channels` does, for every
        end it hands out), so no code that posts can forget it; memory backends return at once.
        A second call while one runs waits for it. It does not raise for a failed or vanished
        peer: it records the failure (later calls raise ChannelClosed naming it) and wakes
        whoever is parked."""

    # -- protocol --------------------------------------------------------------------------------
    @property
    def posted(self) -> int:
        return self._posted

    @property
    def closed(self) -> bool:
        """The sending side is closed (by aclose() or abort()): nothing more is posted."""
        return self._closed

    # -- where buffers go: a ring, unless a pooled channel says otherwise (the module doc) ------------
    def _slot_of(self, seq: int) -> int:
        """The slot buffer `seq` goes to."""
        return seq % self.spec.slots

    def _limit(self) -> int:
        """Buffers below this sequence number may be posted."""
        return self._released() + self.spec.slots

    def _consecutive(self, seq: int, n: int) -> int:
        """How many of the slots of buffers seq .. seq + n - 1 follow one another in memory."""
        return min(n, self.spec.slots - seq % self.spec.slots)

    def credits(self) -> int:
        return self._limit() - self._posted

    def reserve(self) -> np.ndarray:
        """Writable view of the next slot's payload area; needs a credit."""
        self._check_open()
        if self.credits() <= 0:
            raise NoCredit("no credit: the receiver has not released the next slot yet")
        return self._slot(self._slot_of(self._posted))[: self.spec.payload_capacity]

    def _ring(self) -> np.ndarray | None:
        """The whole local (or staging) ring as one contiguous uint8 array, if there is one."""
        return None

    def contiguous_credits(self) -> int:
        """Credits usable by one `reserve_run`: held credits up to the end of the ring."""
        if self._ring() is None:
            return min(self.credits(), 1)
        return self._consecutive(self._posted, self.credits())

    def reserve_run(self, k: int) -> np.ndarray:
        """Writable 2-D view (k x payload capacity) of the next k slots' payload areas, so a
        source can fill several slots with one copy; publish them with `post_run` after.
        Needs k <= contiguous_credits()."""
        self._check_open()
        if k > self.contiguous_credits():
            raise NoCredit(f"reserve_run({k}) with only {self.contiguous_credits()} contiguous credits")
        ring = self._ring()
        if ring is None:
            return self.reserve()[None, :]
        return np.ndarray(
            (k, self.spec.payload_capacity),
            dtype=np.uint8,
            buffer=ring,
            offset=self._slot_of(self._posted) * self.spec.slot_size,
            strides=(self.spec.slot_size, 1),
        )

    def post(self, *, nbytes: int, count: int, kind: Kind = Kind.DATA, epoch: int = 0) -> None:
        """Publish the reserved slot: footer after payload, flag byte last."""
        # Same guards as reserve(): posting without a credit would overwrite an unread slot.
        self._check_open()
        if self.credits() <= 0:
            raise NoCredit("no credit: the receiver has not released the next slot yet")
        if not 0 <= nbytes <= self.spec.payload_capacity:
            raise MalformedBuffer(f"payload of {nbytes} bytes does not fit a {self.spec.slot_size}-byte slot")
        index = self._slot_of(self._posted)
        ring = self._ring()
        if ring is not None:  # native: the flag stored last with release ordering
            kernels.ring_post(ring, self.spec.slot_size, index, 1, count, nbytes, self._posted, epoch, int(kind))
        else:
            write_footer(self._slot(index), count=count, nbytes=nbytes, seq=self._posted, epoch=epoch, kind=kind)
        self._posted += 1
        self._publish(index)

    def post_run(self, k: int, *, nbytes: int, count: int, epoch: int = 0) -> None:
        """Publish the next k slots (filled through `reserve_run`) as data buffers of `count`
        records each: one native call writes their footers, each flag last (release order)."""
        self._check_open()
        if k > self.contiguous_credits():
            raise NoCredit(f"post_run({k}) with only {self.contiguous_credits()} contiguous credits")
        ring = self._ring()
        if ring is None:
            for _ in range(k):
                self.post(nbytes=nbytes, count=count, epoch=epoch)
            return
        first = self._slot_of(self._posted)
        kernels.ring_post(ring, self.spec.slot_size, first, k, count, nbytes, self._posted, epoch, Kind.DATA)
        self._posted += k
        self._publish_run(first, k)

    # Can this end lend records instead of copying them (`lend_run`)? Only a receiver in the
    # same process can read what a sender lends.
    lends = False

    def lend_run(self, records: np.ndarray, *, count: int, epoch: int = 0) -> None:
        """Publish the next k slots as data buffers of `count` records each whose records are
        `records` (k x count of the channel's layout, read-only, contiguous), lent instead of
        copied: the receiver reads them in place until it releases the slots. Only for
        backends that lend (`lends`); the caller must not change `records` meanwhile."""
        raise NotImplementedError(f"{type(self).__name__} cannot lend records: copy them (reserve_run, post_run)")

    def _publish_run(self, first: int, k: int) -> None:
        """Make k consecutive written slots visible; backends may do it at once (one RDMA WRITE)."""
        for index in range(first, first + k):
            self._publish(index)

    async def wait_credit(self, n: int = 1) -> None:
        """Park until at least `n` credits are held (n <= slots)."""
        n = min(n, self.spec.slots)
        while self.credits() < n:
            if self._closed:
                raise ChannelClosed("channel closed while waiting for credit")
            await self._park_for_credit()

    async def send_records(self, records: np.ndarray, *, epoch: int = 0) -> int:
        """Copy a contiguous structured array into as many slots as it needs; return buffers sent."""
        per_slot = self.spec.payload_capacity // records.dtype.itemsize
        raw = np.ascontiguousarray(records).view(np.uint8)
        size = records.dtype.itemsize
        sent = 0
        for start in range(0, len(records), per_slot):
            n = min(per_slot, len(records) - start)
            await self.wait_credit()
            payload = self.reserve()
            payload[: n * size] = raw[start * size : (start + n) * size]
            self.post(nbytes=n * size, count=n, epoch=epoch)
            sent += 1
        return sent

    async def send_control(self, ctype: Control, value: int = 0, aux: int = 0, *, epoch: int = 0) -> None:
        await self.wait_credit()
        nbytes = encode_control(self.reserve(), ctype, value, aux)
        self.post(nbytes=nbytes, count=0, kind=Kind.CONTROL, epoch=epoch)

    async def aclose(self) -> None:
        """Send END_OF_STREAM and close the sending side."""
        if not self._closed:
            await self.send_control(Control.END_OF_STREAM)
            self._closed = True

    def abort(self) -> None:
        """Close *without* END_OF_STREAM, for a stream that is incomplete (its producer failed):
        a receiver in another process sees the channel fail after what was posted, never a
        normal end. Backends with a connection override this to drop it."""
        self._closed = True


class Receiver(abc.ABC):
    """Consumer end of a channel. Subclasses implement the three backend hooks."""

    def __init__(self, spec: RingSpec):
        self.spec = spec
        self._polled = 0
        self._released_count = 0
        self.finished = False  # END_OF_STREAM seen
        self.error: BaseException | None = None
        # A fault a backend's drive() found (a vanished peer, a bad frame): poll() raises it once
        # the buffers that landed before it are consumed, so nothing accepted is lost.
        self._peer_error: BaseException | None = None
        self.liveness: Liveness | None = None  # set by the owner before driving (network media keep alive)

    # -- backend hooks -------------------------------------------------------------------------
    @abc.abstractmethod
    def _slot(self, index: int) -> np.ndarray:
        """uint8 view of local ring slot `index` (written by the sender)."""

    @abc.abstractmethod
    def _return_credits(self, released: int) -> None:
        """Publish the released counter (a pooled channel's backend: the grant counter,
        `_limit()`) to the sender and wake it if it is parked."""

    @abc.abstractmethod
    async def _park_for_data(self) -> None:
        """Block until the next slot may have been posted (or the peer vanished)."""

    def _ring(self) -> np.ndarray | None:
        """The whole local ring as one contiguous uint8 array, if the backend has one."""
        return None

    # -- where buffers come: a ring, unless a pooled channel says otherwise (the module doc) ---------
    # a pooled channel's grants (`_pool.Grants`, set by its backend); None: the slots are a ring
    grants = None

    def _slot_of(self, seq: int) -> int:
        """The slot buffer `seq` comes in."""
        return seq % self.spec.slots if self.grants is None else self.grants.slot_of(seq)

    def _limit(self) -> int:
        """Buffers below this sequence number may have been posted: released + slots, or the
        grant counter."""
        return self._released_count + self.spec.slots if self.grants is None else self.grants.granted

    def _consecutive(self, seq: int, n: int) -> int:
        """How many of the slots of buffers seq .. seq + n - 1 follow one another in memory."""
        if self.grants is None:
            return min(n, self.spec.slots - seq % self.spec.slots)
        return self.grants.consecutive(seq, n)

    def _regrant(self, first: int, n: int) -> None:
        """Buffers first .. first + n - 1 were released (their slots' flags cleared): a pooled
        channel grants their slots again, or others (`_pool`); a ring's come back by themselves.
        A channel whose sender used every credit granted (the last grant's buffer has landed)
        is backlogged: it keeps its floating slots and may take more."""
        grants = self.grants
        if grants is None:
            return
        last = grants.granted - 1
        backlogged = self._polled > last or self._slot(grants.slot_of(last))[-1] == FULL
        grants.regrant(first, n, backlogged)

    def _end_grants(self) -> None:
        """A pooled channel whose END_OF_STREAM was polled gives its floating slots back (its
        backend calls this when it closes)."""
        if self.grants is not None and self.finished:
            self.grants.close(self._released_count)

    async def drive(self) -> None:
        """The coroutine that moves this end's bytes, for media that need one (reading frames
        from a socket into the ring, returning credits). Whoever opens the channel runs it
        (`open_channels` does); the executor starts it too for the inputs it is handed, which
        joins a running drive: a second call while one runs waits for it. Memory backends
        return at once. A failed or vanished peer is recorded in `error` (poll then raises
        ChannelClosed naming it) and wakes the poller; it does not raise."""

    def run_records(self, run: DataRun, dtype: np.dtype) -> np.ndarray:
        """Zero-copy view of a polled run's records: 1-D for one buffer, else 2-D (buffers x
        records per buffer). The slots stay the receiver's until released as usual."""
        ring = self._ring()
        if run.n == 1:
            return np.ndarray((run.count,), dtype=dtype, buffer=ring, offset=run.first_slot * self.spec.slot_size)
        return np.ndarray(
            (run.n, run.count),
            dtype=dtype,
            buffer=ring,
            offset=run.first_slot * self.spec.slot_size,
            strides=(self.spec.slot_size, dtype.itemsize),
        )

    # -- protocol --------------------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Buffers polled but not yet released."""
        return self._polled - self._released_count

    def ready(self) -> bool:
        """Is the next slot posted? (Non-blocking, does not consume it.)"""
        if self.finished or self.error is not None or self._polled >= self._limit():
            return False
        return bool(self._slot(self._slot_of(self._polled))[-1] == FULL)

    def poll(self) -> Buffer | None:
        """Return the next posted buffer in FIFO order, or None if none is ready.

        Raises MalformedBuffer (and marks the channel failed) if the footer breaks the format.
        """
        if self.error is not None:
            raise ChannelClosed(f"channel failed earlier: {self.error}") from self.error
        if not self.ready():
            if self._peer_error is not None and not self.finished and not self._next_landed():
                self.error = self._peer_error
                raise self._peer_error
            return None
        slot = self._slot(self._slot_of(self._polled))
        try:
            footer = read_footer(slot, expected_seq=self._polled, record_size=self.spec.record_size)
            # Decode control messages here too: an unknown type is malformed, and must fail the
            # channel before the buffer counts as polled.
            ctype = decode_control(slot[: footer.nbytes])[0] if footer.kind is Kind.CONTROL else None
        except MalformedBuffer as exc:
            self.error = exc
            raise
        self._polled += 1
        if ctype is Control.END_OF_STREAM:
            self.finished = True
        return Buffer(footer, slot[: footer.nbytes])

    def poll_run(self, max_buffers: int) -> DataRun | None:
        """Poll up to `max_buffers` posted data buffers that hold the same number of records and
        sit in consecutive slots, in one native pass over their footers (acquire loads).

        Returns None when the next slot is not such a buffer (not posted, a control buffer, a
        malformed one): `poll` then takes it on its own and reports what is wrong with it.
        Needs a ring that is one contiguous array and a spec with a record size.
        """
        ring = self._ring()
        if ring is None or self.spec.record_size is None or self.finished or self.error is not None:
            return None
        available = self._limit() - self._polled
        if available <= 0 or max_buffers <= 0:
            return None
        first = self._slot_of(self._polled)
        limit = self._consecutive(self._polled, min(max_buffers, available))
        n, count = kernels.ring_poll_data(ring, self.spec.slot_size, first, limit, self._polled, self.spec.record_size)
        if n == 0:
            return None
        self._polled += n
        return DataRun(first, n, count)

    def release(self, n: int = 1) -> None:
        """Hand the `n` oldest polled slots back to the sender (one credit each)."""
        if not 0 <= n <= self.outstanding:
            raise ValueError(f"release({n}) with only {self.outstanding} buffers outstanding")
        ring = self._ring()
        first = self._released_count
        if ring is None:
            for seq in range(first, first + n):
                self._slot(self._slot_of(seq))[-1] = EMPTY
        else:
            seq, end = first, first + n
            while seq < end:  # by runs of consecutive slots (a ring: up to its end, then from its start)
                k = self._consecutive(seq, end - seq)
                kernels.ring_release(ring, self.spec.slot_size, self._slot_of(seq), k)
                seq += k
        self._released_count += n
        self._regrant(first, n)
        self._return_credits(self._released_count)

    def posted_unpolled(self) -> list[Buffer]:
        """The buffers posted and not yet polled, in order, left where they are (an unaligned
        checkpoint copies them as in-flight channel state): views of their slots, valid until
        they are polled and released."""
        found = []
        for i in range(self._limit() - self._polled):
            slot = self._slot(self._slot_of(self._polled + i))
            if slot[-1] != FULL:
                break
            footer = read_footer(slot, expected_seq=self._polled + i, record_size=self.spec.record_size)
            found.append(Buffer(footer, slot[: footer.nbytes]))
        return found

    def _next_landed(self) -> bool:
        """Has the next slot landed (its flag set), whether or not it may be polled yet?"""
        return self._polled < self._limit() and self._slot(self._slot_of(self._polled))[-1] == FULL

    async def wait_readable(self) -> None:
        """Park until the next slot may be ready; returns at once if it already is, or if a
        fault is pending (the next poll raises it)."""
        while not self.ready() and not self.finished and self.error is None and self._peer_error is None:
            if self._polled >= self._limit():
                raise RuntimeError("every slot is polled and unreleased: release before waiting")
            await self._park_for_data()


@attrs.define(eq=False)
class RunningDrive:
    """A network end's drive() while it runs (the end's `_drive`, None otherwise): cancelling
    `scope` stops it, `ended` is set when it returns (a second drive() or aclose() waits)."""

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    ended: trio.Event = attrs.Factory(trio.Event)


class DrivenReceiver(Receiver):
    """A receiver whose bytes a drive() coroutine moves (the network media). The subclass's
    __init__ sets `_data_lot` (where the poller parks), `_drive` (the `RunningDrive`, or None)
    and `_log`; `medium` and `_progress()` name it in log lines."""

    medium = "channel"

    def _progress(self) -> dict:
        """How far the stream got, for the log line of a fault."""
        return {"polled": self._polled}

    def _fail(self, exc: BaseException) -> None:
        """A fault the drive found: logged once and kept for poll() to raise after the buffers
        that landed before it; the poller is woken and the drive stopped."""
        if self._peer_error is None and self.error is None:
            self._peer_error = exc
            getattr(self._log, fault_level(exc))(f"{self.medium} channel closed", reason=str(exc), **self._progress())
        if self._data_lot:
            self._data_lot.unpark_all()
        if self._drive is not None:
            self._drive.scope.cancel()
