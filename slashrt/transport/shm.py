"""Shared-memory backend: the ring lives in memory shared by two processes on one machine.

This is the one-machine analogue of RDMA WRITE: the producer writes payload then footer
straight into the consumer's ring, the consumer polls the next slot's footer, and the credit
word flows back through the same memory. Nothing is copied by the kernel and a busy pair makes
no system call per buffer::

    one memfd, mapped by both processes (nothing in /dev/shm; freed when both are gone)
    +-------------------- control block, 4 KiB ---------------------+---- ring -----------+
    | header | released (u64) | receiver parked (u64) | sender parked (u64) | slots x slot_size |
    +--------+----------------+------------------------+---------------------+-------------------+
       each word on its own cache line

    eventfd "data posted"     sender -> receiver   (written only if the receiver is parked)
    eventfd "credit returned" receiver -> sender   (written only if the sender is parked)
    Unix socket               stays open for the channel's life: its end means the peer is gone

Memory ordering is explicit (native/ring.c, native/shm.c): slot flags are stored with release
and loaded with acquire, the credit word likewise, and parking is Dekker's pattern with seq_cst
operations, so an end that parks never sleeps through a publication (see native/shm.h). A
sender parks with a threshold (the credit word it waits for), so it is woken once per wait,
not once per released slot.

Setting up (the receiver owns the ring)::

    async with open_shm_listener(spec, secret) as listener:   # listener.address: "@name" or a path
        (receiver,) = await accept_authenticated(listener)  # ShmReceiver
    sender = await connect_shm(address, spec, secret)        # ShmSender, in another process

The listener binds a Unix socket in the abstract namespace (nothing on disk to leak) or at a
filesystem path (mode 0600, removed on close). Abstract names have no permissions, so the
listener drops a connection from another user (its uid from SO_PEERCRED; root excepted) at
once. Each connection runs the cluster-secret handshake (`_auth`), in a task of its own
beside the others (`_accept`), then both ends check they agree on the RingSpec, and only then does the
receiver create the segment and pass it and the two eventfds with SCM_RIGHTS. The segment is
sealed against shrinking, so neither process can make the other's mapping fault.

`open_shm_pair(spec)` builds both ends in this process over one memfd (two mappings), for
tests and same-process use.

A vanished peer (the socket's end without a goodbye) is noticed by `drive()`, which waits on
the socket, and by any end that parks (it waits on the eventfd and the socket at once): the
receiver still delivers every buffer posted before the peer went, then fails with
ChannelClosed naming it; the sender fails at once. `close()` releases everything now (the peer
sees the channel closed); `aclose()` on a sender first sends END_OF_STREAM.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import mmap
import os
import secrets
import select
import socket
import stat
import struct
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import numpy as np
import structlog
import trio

from slashrt import _kernels as kernels
from slashrt._buffer import FULL
from slashrt._logging import fault_level
from slashrt.errors import ChannelClosed
from slashrt.transport._auth import HANDSHAKE_TIMEOUT, client_handshake, receive_exactly, server_handshake
from slashrt.transport._accept import PORT_BACKLOG, refuse_named
from slashrt.transport._channel import Receiver, RingSpec, Sender
from slashrt.transport._pool import GrantTable, Grants, MediumPool, SlotPool, SlotViews
from slashrt.transport._port import ChannelPort, channel_of

__all__ = [
    "ShmListener",
    "ShmPool",
    "ShmReceiver",
    "ShmSender",
    "ShmStats",
    "connect_shm",
    "open_shm_listener",
    "open_shm_pair",
]

log = structlog.get_logger("slashrt.transport.shm")

# -- the segment -----------------------------------------------------------------------------------

CONTROL_BYTES = 4096  # the control block; the ring starts on the next page
RELEASED = 64  # u64: the receiver's released counter (the credit word)
RECV_PARKED = 128  # u64: nonzero while the receiver waits for data
SEND_PARKED = 192  # u64: nonzero while the sender waits for credit: the credit word it waits for
WAKE_ANY = 2**64 - 1

_HEADER = struct.Struct("<8sIIqqqqq")  # magic, version, reserved, slots, slot_size, record_size, ring offset, size
_SEGMENT_MAGIC = b"SLRTSHM1"
_VERSION = 1
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

# set-up messages on the socket
_SPEC = struct.Struct("<8sqqq")  # magic, slots, slot_size, record_size (-1: none)
_SPEC_MAGIC = b"SLRTRING"
_REPLY = struct.Struct("<cI")  # code (Y: here is the ring, N: refused), length of what follows
_MAX_REFUSAL = 4096  # bytes of a refusal's reason
_READY = b"R"  # sender -> receiver: mapped and checked, the channel is up
_BYE = b"B"  # either way, once: this end closes the channel on purpose


def _segment_size(spec: RingSpec) -> int:
    return CONTROL_BYTES + spec.ring_bytes


# A slot pool (`ShmPool`): one memfd for the channels one executor receives of one exchange.
#   | pool header (4 KiB) | channel 0's control block | ... | channel C-1's | slots x slot_size |
# A channel's control block has the words of a ring's (the credit word holds its grant counter)
# and, from TABLE on, its grant table (`_pool.Grants`: window u32 slot numbers).
POOL_HEADER_BYTES = 4096
TABLE = 256
_POOL_HEADER = struct.Struct("<8sIqqqqqqq")  # magic, version, channels, exclusive, window, slots, slot_size, record_size, size
_POOL_MAGIC = b"SLRTPOOL"
_POOLED = struct.Struct("<II")  # a pooled channel's set-up reply: its channel index and grant window


def _pool_ctrl_bytes(window: int) -> int:
    return -(-(TABLE + 4 * window) // 4096) * 4096


def _pool_layout(channels: int, window: int, slots: int, slot_size: int) -> tuple[int, int, int]:
    """(the first control block's offset, the slots' offset, the size) of a slot pool."""
    slots_at = POOL_HEADER_BYTES + channels * _pool_ctrl_bytes(window)
    return POOL_HEADER_BYTES, slots_at, slots_at + slots * slot_size


def _record_size(spec: RingSpec) -> int:
    return -1 if spec.record_size is None else spec.record_size


# A receiver about to park first polls the next slot's flag this long: a producer that posts
# within it costs no eventfd round trip (40-50 us here). Bounded, then it parks as before.
# Measured: 4 KiB latency through the executor p50 74 us with 0, 31 us with 100 (docs/benchmarks.md).
DEFAULT_SPIN_US = 100.0

class _Segment:
    """One mapping of the channel's memfd (or a pool's), seen as numpy arrays (control block and ring)."""

    def __init__(self, fd: int, spec: RingSpec, *, size: int | None = None, ctrl: slice | None = None,
                 ring: slice | None = None):
        size = _segment_size(spec) if size is None else size
        # not MAP_POPULATE: a ring's pages are allocated and mapped as its slots are first used
        # (most rings between executors carry a few slots of partial rows; a busy one pays
        # about a millisecond for its first pass), so N executors do not zero N(N-1) rings at
        # set-up (2 GiB at 32 executors: 0.7 s of their start, docs/benchmarks.md)
        self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.buf = np.frombuffer(self.mm, np.uint8)
        self.ctrl = self.buf[ctrl if ctrl is not None else slice(0, CONTROL_BYTES)]
        self.ring = self.buf[ring if ring is not None else slice(CONTROL_BYTES, size)]

    @classmethod
    def create(cls, spec: RingSpec) -> tuple[_Segment, int]:
        """A fresh, zeroed, sealed memfd with its header written; returns (mapping, fd)."""
        fd = os.memfd_create("slashrt-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, _segment_size(spec))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            seg = cls(fd, spec)
        except BaseException:
            os.close(fd)
            raise
        header = _HEADER.pack(
            _SEGMENT_MAGIC, _VERSION, 0, spec.slots, spec.slot_size, _record_size(spec), CONTROL_BYTES, _segment_size(spec)
        )
        seg.ctrl[: _HEADER.size] = np.frombuffer(header, np.uint8)
        return seg, fd

    @classmethod
    def attach(cls, fd: int, spec: RingSpec) -> _Segment:
        """Map a segment received from the peer, after checking it is what `spec` says."""
        size = _segment_size(spec)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise ChannelClosed(f"the peer's ring segment has {st.st_size} bytes, expected {size}")
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            raise ChannelClosed("the peer's ring segment is not sealed against resizing")
        seg = cls(fd, spec)
        magic, version, _, slots, slot_size, record_size, offset, total = _HEADER.unpack_from(seg.ctrl)
        if (magic, version, slots, slot_size, record_size, offset, total) != (
            _SEGMENT_MAGIC, _VERSION, spec.slots, spec.slot_size, _record_size(spec), CONTROL_BYTES, size
        ):
            seg.close()
            raise ChannelClosed("the peer's ring segment header does not match the agreed ring spec")
        return seg

    @classmethod
    def attach_pool(cls, fd: int, spec: RingSpec, channel: int, window: int) -> _Segment:
        """Map a slot pool received from the peer (`ShmPool`) as channel `channel`'s end: its
        control block and grant table, and the pool's slots, after checking the header."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < POOL_HEADER_BYTES:
            raise ChannelClosed(f"the peer's slot pool has {st.st_size} bytes, too few for its header")
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            raise ChannelClosed("the peer's slot pool is not sealed against resizing")
        with mmap.mmap(fd, POOL_HEADER_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as head:
            magic, version, channels, exclusive, their_window, slots, slot_size, record_size, total = \
                _POOL_HEADER.unpack_from(head)
        layout = _pool_layout(channels, their_window, slots, slot_size)
        if (magic, version, exclusive, their_window, slot_size, record_size, total) != (
            _POOL_MAGIC, _VERSION, spec.slots, window, spec.slot_size, _record_size(spec), st.st_size
        ) or total != layout[-1] or not 0 <= channel < channels:
            raise ChannelClosed("the peer's slot pool header does not match the agreed ring spec and grant window")
        first, slots_at, size = layout
        ctrl_at = first + channel * _pool_ctrl_bytes(window)
        return cls(fd, spec, size=size, ctrl=slice(ctrl_at, ctrl_at + _pool_ctrl_bytes(window)), ring=slice(slots_at, size))

    def table(self, window: int) -> np.ndarray:
        """A pool channel's grant table (u32 x window) in its control block."""
        return self.ctrl[TABLE : TABLE + 4 * window].view(np.uint32)

    def close(self) -> None:
        mm, self.mm = self.mm, None
        self.buf = self.ctrl = self.ring = None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a view handed out (a polled payload) still holds the mapping: unmapped when it dies


class ShmPool(MediumPool):
    """The slots that one executor receives one exchange's channels in, from every peer
    (`_pool.SlotPool`: `spec.slots` exclusive slots per channel and `floating` shared, at most
    `max_lent` lent to one channel), in one sealed memfd that each sender maps (`ShmListener(...,
    pool=)`). Close it after its channels."""

    def __init__(self, spec: RingSpec, *, channels: int, floating: int, max_lent: int | None = None):
        self.spec = spec
        window = spec.slots + (floating if max_lent is None else min(max_lent, floating))
        slots = channels * spec.slots + floating
        first, slots_at, size = _pool_layout(channels, window, slots, spec.slot_size)
        self.fd = os.memfd_create("slashrt-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            self.seg = _Segment(self.fd, spec, size=size, ctrl=slice(0, POOL_HEADER_BYTES), ring=slice(slots_at, size))
        except BaseException:
            os.close(self.fd)
            raise
        ctrl_bytes = _pool_ctrl_bytes(window)
        tables = np.ndarray((channels, window), np.uint32, buffer=self.seg.buf, offset=first + TABLE,
                            strides=(ctrl_bytes, 4))
        self.slots = SlotPool(channels=channels, exclusive=spec.slots, floating=floating, slot_size=spec.slot_size,
                              max_lent=max_lent, memory=self.seg.ring, tables=tables)
        self._first, self._ctrl_bytes = first, ctrl_bytes
        header = _POOL_HEADER.pack(_POOL_MAGIC, _VERSION, channels, spec.slots, window, slots, spec.slot_size,
                                   _record_size(spec), size)
        self.seg.ctrl[: _POOL_HEADER.size] = np.frombuffer(header, np.uint8)

    def join(self) -> tuple[np.ndarray, Grants]:
        """A new channel's control block and grants; its credit word holds its first grants."""
        grants = Grants(self.slots)
        at = self._first + grants.channel * self._ctrl_bytes
        ctrl = self.seg.buf[at : at + self._ctrl_bytes]
        kernels.shm_store_u64(ctrl, RELEASED, grants.granted)
        return ctrl, grants

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.seg.close()


# -- one end's resources ---------------------------------------------------------------------------


def _notify_closing(fd) -> None:
    with contextlib.suppress(RuntimeError):  # outside trio nobody can be waiting on it
        trio.lowlevel.notify_closing(fd)


def _close_all(seg: _Segment | None, sock: socket.socket | None, fds: list[int], epoll=None) -> None:
    """Release one end's mapping, socket and descriptors (once: _Link calls it via weakref.finalize)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.send(_BYE, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        sock.close()
    if epoll is not None:
        epoll.close()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if seg is not None:
        seg.close()


class _Link:
    """What one end holds: its mapping, the socket to the peer, the eventfd it sleeps on, the
    eventfd it writes to wake the peer, and an epoll set of (its eventfd, the socket) so that one
    wait wakes for either a notification or the peer's departure."""

    def __init__(self, seg: _Segment, sock: socket.socket, wait_efd: int, wake_efd: int, peer: str):
        self.seg = seg
        self.sock = sock
        sock.setblocking(False)
        self.wait_efd = wait_efd
        self.wake_efd = wake_efd
        self.peer = peer  # e.g. "shm sender (pid 123)"
        self.gone: str | None = None  # why the peer is gone, once it is
        self.bye = False
        self.closed = False
        self._watching: trio.Event | None = None  # set when the running watch() ends
        self.epoll = select.epoll(2)
        try:
            self.epoll.register(wait_efd, select.EPOLLIN)
            self.epoll.register(sock.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        except BaseException:
            self.epoll.close()
            raise
        # a dropped end still gives its descriptors and mapping back (a process's exit does anyway)
        self._finalizer = weakref.finalize(self, _close_all, seg, sock, [wait_efd, wake_efd], self.epoll)

    def check_peer(self) -> str | None:
        """Read whatever the peer sent on the socket (only a goodbye is allowed); return why it is
        gone if it is, else None. Never blocks."""
        if self.gone is None and not self.closed:
            try:
                data = self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                self.gone = f"peer {self.peer} vanished ({exc.strerror or exc})"
                return self.gone
            if data == _BYE:
                self.bye = True
                self.gone = f"{self.peer} closed the channel"
            elif data:
                self.gone = f"{self.peer} broke the protocol: {len(data)} unexpected bytes on its control socket"
            else:
                self.gone = f"peer {self.peer} vanished (connection lost)"
        return self.gone

    async def sleep(self) -> None:
        """Wait until the peer writes our eventfd or its socket has news (peer gone)."""
        try:
            await trio.lowlevel.wait_readable(self.epoll.fileno())
        except trio.ClosedResourceError:
            return  # closed locally meanwhile: the caller looks at `closed`
        try:
            os.eventfd_read(self.wait_efd)
        except BlockingIOError:  # it was not the eventfd: the socket, or a spurious wake-up
            self.check_peer()

    def wake_self(self) -> None:
        """Wake whoever sleeps on this end (the peer is gone and will not)."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self.wait_efd, 1)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _notify_closing(self.epoll.fileno())
        _notify_closing(self.sock)
        self._finalizer()

    async def watch(self, on_gone) -> None:
        """drive(): wait on the socket (no spinning) until the peer goes or this end closes.
        One watch per end: a second call while one runs waits for it."""
        if self._watching is not None:
            await self._watching.wait()
            return
        self._watching = trio.Event()
        try:
            while not self.closed and self.gone is None:
                try:
                    await trio.lowlevel.wait_readable(self.sock)
                except (trio.ClosedResourceError, OSError):
                    return
                if self.check_peer() is not None:
                    on_gone()
                    self.wake_self()  # a parked end wakes and sees it
        finally:
            self._watching.set()
            self._watching = None


@attrs.define
class ShmStats:
    """Counters of one channel end: times it really slept (`parks`) and eventfd writes it made to
    wake its peer (`wakeups`). A busy pair keeps both far below the number of buffers."""

    parks: int = 0
    wakeups: int = 0


# -- the two ends ----------------------------------------------------------------------------------


class _Parking:
    """At most one task per end sleeps on the end's eventfd; others wait here for it to wake."""

    def __init__(self):
        self.busy = False
        self.lot = trio.lowlevel.ParkingLot()


class ShmSender(Sender):
    """Producer end: writes slots of the shared ring, reads the credit word from it. A pooled
    channel's (`table`: its grant table in the pool) writes each buffer into the slot granted
    for it, and its credit word is the grant counter (`_pool`)."""

    def __init__(self, spec: RingSpec, link: _Link, table: np.ndarray | None = None):
        super().__init__(spec)
        self._link = link
        self._ctrl = link.seg.ctrl
        self._ring_array = link.seg.ring
        self._table = None if table is None else GrantTable(table)
        size = spec.slot_size
        self._slots = [self._ring_array[i * size : (i + 1) * size] for i in range(spec.slots)] if table is None \
            else SlotViews(self._ring_array, size)
        self._last_released = 0
        self._credit_target = 0
        self._parking = _Parking()
        self.stats = ShmStats()

    def __repr__(self) -> str:
        return f"<ShmSender {self.spec} posted={self.posted} to {self._link.peer}>"

    # -- hooks -------------------------------------------------------------------------------------
    def _slot(self, index):
        return self._slots[index]

    def _ring(self):
        return self._ring_array

    def _released(self):
        if self._ctrl is not None:
            self._last_released = kernels.shm_load_u64(self._ctrl, RELEASED)
        return self._last_released

    def _slot_of(self, seq):
        return seq % self.spec.slots if self._table is None else self._table.slot_of(seq)

    def _limit(self):
        return self._released() + (self.spec.slots if self._table is None else 0)

    def _consecutive(self, seq, n):
        return super()._consecutive(seq, n) if self._table is None else self._table.consecutive(seq, n)

    def _word_for(self, n: int) -> int:
        """The credit word's value with which this end holds n credits."""
        return self._posted + n - (self.spec.slots if self._table is None else 0)

    def _publish(self, index):
        # the flag was stored with release (ring_post); wake the receiver only if it sleeps
        if self._ctrl is not None and kernels.shm_wake(self._ctrl, RECV_PARKED, WAKE_ANY, self._link.wake_efd):
            self.stats.wakeups += 1

    def _publish_run(self, first, k):
        self._publish(first + k - 1)

    async def _park_for_credit(self):
        self._check_open()
        parking = self._parking
        if parking.busy:
            await parking.lot.park()
            return
        # the credit word this wait needs (wait_credit sets it; else the next credit)
        target = max(1, self._credit_target or self._word_for(1))
        self._credit_target = 0
        parking.busy = True
        try:
            kernels.shm_park(self._ctrl, SEND_PARKED, target)
            if kernels.shm_load_u64(self._ctrl, RELEASED) < target and self._link.gone is None:
                self.stats.parks += 1
                await self._link.sleep()
        finally:
            parking.busy = False
            parking.lot.unpark_all()
            if self._ctrl is not None:
                kernels.shm_unpark(self._ctrl, SEND_PARKED)
        if self._link.gone is not None:
            self._peer_gone()
        self._check_open()

    async def drive(self) -> None:
        """Wait on the connection (never spinning) until the receiver goes or this end closes;
        a receiver that goes is recorded in `error` and wakes a parked wait_credit()."""
        await self._link.watch(self._peer_gone)

    # -- failure -----------------------------------------------------------------------------------
    def _peer_gone(self) -> None:
        if self.error is None and self._link.gone is not None:
            self.error = ChannelClosed(self._link.gone)
            getattr(log, fault_level(None, "warning"))("shm channel lost its receiver", peer=self._link.peer,
                                                       reason=self._link.gone)
            self._link.wake_self()

    def _check_open(self) -> None:
        if self.error is not None:
            raise ChannelClosed(f"channel failed: {self.error}") from self.error
        if self._closed or self._ctrl is None:
            raise ChannelClosed("channel is closed for sending")

    async def wait_credit(self, n: int = 1) -> None:
        """Park until at least `n` credits are held (n <= slots); the receiver wakes this end
        once, when it has released enough, not once per slot."""
        n = min(n, self.spec.slots)
        while self.credits() < n:
            self._check_open()
            self._credit_target = self._word_for(n)
            await self._park_for_credit()

    # -- closing -----------------------------------------------------------------------------------
    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        """Release the mapping and descriptors now, without END_OF_STREAM; the receiver sees the
        channel closed after the buffers already posted."""
        self._closed = True
        self._released()  # keep the last credit word for credits() after the unmapping
        self._ctrl = self._ring_array = None
        self._slots = []
        self._link.close()

    async def aclose(self) -> None:
        """Send END_OF_STREAM (waiting for a credit if need be), then close. If the receiver is
        gone there is no one to tell: just close (the reason stays in `error`)."""
        try:
            if not self._closed and self.error is None:
                with contextlib.suppress(ChannelClosed):
                    await super().aclose()
        finally:
            if self._ctrl is not None:
                self.close()


class ShmReceiver(Receiver):
    """Consumer end: owns the ring, polls slot footers in it, stores the credit word.

    `spin_us` (default DEFAULT_SPIN_US; 0: never) lets an end about to sleep poll the next
    slot's flag for that many microseconds first, without yielding: a buffer that arrives
    meanwhile is taken without the eventfd round trip through the kernel (tens of microseconds
    on a VM), at the price of that much CPU per idle moment; then it parks as before."""

    def __init__(self, spec: RingSpec, link: _Link, *, spin_us: float = DEFAULT_SPIN_US,
                 pooled: tuple[np.ndarray, np.ndarray, Grants] | None = None):
        super().__init__(spec)
        self.spin_us = spin_us
        self._link = link
        if pooled is None:
            self._ctrl, self._ring_array = link.seg.ctrl, link.seg.ring
        else:  # a pool's channel (`ShmPool.join`): its control block, the pool's slots, its grants
            self._ctrl, self._ring_array, self.grants = pooled
        size = spec.slot_size
        self._slots = [self._ring_array[i * size : (i + 1) * size] for i in range(spec.slots)] if pooled is None \
            else SlotViews(self._ring_array, size)
        self._parking = _Parking()
        self.stats = ShmStats()

    def __repr__(self) -> str:
        return f"<ShmReceiver {self.spec} polled={self._polled} from {self._link.peer}>"

    # -- hooks -------------------------------------------------------------------------------------
    def _slot(self, index):
        return self._slots[index]

    def _ring(self):
        return self._ring_array

    def _flag(self, slot: int) -> int:
        """The offset of slot `slot`'s flag byte."""
        return (slot + 1) * self.spec.slot_size - 1

    def _return_credits(self, released):
        word = released if self.grants is None else self.grants.granted  # (a pool's: after its grant table)
        if self._ctrl is not None and kernels.shm_store_and_wake(
            self._ctrl, RELEASED, word, SEND_PARKED, self._link.wake_efd
        ):
            self.stats.wakeups += 1

    def _next_posted(self) -> bool:
        """Is the next slot's flag FULL (acquire load)? False while every slot is polled and
        unreleased: then nothing more can have been posted."""
        return (
            self._polled < self._limit()
            and kernels.shm_load_u8(self._ring_array, self._flag(self._slot_of(self._polled))) == FULL
        )

    def ready(self) -> bool:
        if self.finished or self.error is not None or self._polled >= self._limit():
            return False
        if kernels.shm_load_u8(self._ring_array, self._flag(self._slot_of(self._polled))) == FULL:
            return True
        if self._link.gone is not None:  # drained, and nothing more will come
            self._peer_gone()
        return False

    async def _park_for_data(self):
        if self._ctrl is None or self._link.gone is not None:
            self._peer_gone()
            await trio.lowlevel.checkpoint()
            return
        parking = self._parking
        if parking.busy:
            await parking.lot.park()
            return
        if self.spin_us > 0 and self._spin():
            await trio.lowlevel.checkpoint()
            return
        parking.busy = True
        try:
            kernels.shm_park(self._ctrl, RECV_PARKED, 1)
            if not self._next_posted():  # re-check after announcing: no wake-up can be lost
                self.stats.parks += 1
                await self._link.sleep()
        finally:
            parking.busy = False
            parking.lot.unpark_all()
            if self._ctrl is not None:
                kernels.shm_unpark(self._ctrl, RECV_PARKED)
        if self._ctrl is None or self._link.gone is not None:
            self._peer_gone()

    def _spin(self) -> bool:
        """Poll the next slot's flag for up to spin_us; True if a buffer was posted meanwhile."""
        if self._polled >= self._limit():
            return False
        deadline = time.perf_counter() + self.spin_us * 1e-6
        flag = self._flag(self._slot_of(self._polled))
        while time.perf_counter() < deadline:
            if kernels.shm_load_u8(self._ring_array, flag) == FULL:
                return True
        return False

    async def drive(self) -> None:
        """Wait on the connection (never spinning) until the sender goes or this end closes.
        A sender that goes fails the channel once every buffer it posted has been polled."""
        await self._link.watch(self._peer_gone)

    # -- failure -----------------------------------------------------------------------------------
    def _peer_gone(self) -> None:
        """Record why the channel ended once nothing posted is left to poll, and wake a poller."""
        if self.error is not None or self.finished:
            return
        if self._ctrl is None:
            self.error = ChannelClosed("channel closed by this receiver")
            return
        if self._next_posted():
            return  # buffers posted before the peer went are still delivered
        if self._link.bye:
            reason = f"{self._link.gone} without END_OF_STREAM"
        else:
            reason = f"{self._link.gone} without END_OF_STREAM; {self._polled} buffers were delivered"
        self.error = ChannelClosed(reason)
        getattr(log, fault_level(None, "warning"))("shm channel lost its sender", peer=self._link.peer, reason=reason)
        self._link.wake_self()

    def release(self, n: int = 1) -> None:
        if self._ctrl is None:
            raise ChannelClosed("channel closed by this receiver")
        super().release(n)

    # -- closing -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap the ring and close the descriptors; the sender sees the channel closed."""
        if self._ctrl is None:
            return
        self._end_grants()
        self._ctrl = self._ring_array = None
        self._slots = []
        self._link.close()
        if self.error is None and not self.finished:
            self.error = ChannelClosed("channel closed by this receiver")

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()


# -- connection set-up -----------------------------------------------------------------------------


def _sockaddr(address: str) -> str:
    """'@name' is Linux's abstract namespace (nothing on disk), anything else a path."""
    return "\0" + address[1:] if address.startswith("@") else address


def _peer_credentials(sock) -> tuple[int, int]:
    """The connected peer's (pid, uid), as the kernel recorded them when it connected."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _peer_pid(sock) -> int:
    return _peer_credentials(sock)[0]


def _encode_spec(spec: RingSpec) -> bytes:
    return _SPEC.pack(_SPEC_MAGIC, spec.slots, spec.slot_size, _record_size(spec))


def _decode_spec(data: bytes) -> RingSpec:
    magic, slots, slot_size, record_size = _SPEC.unpack(data)
    if magic != _SPEC_MAGIC:
        raise ChannelClosed("peer sent no ring spec after the handshake (bad magic)")
    try:
        return RingSpec(slots=slots, slot_size=slot_size, record_size=None if record_size < 0 else record_size)
    except ValueError as exc:
        raise ChannelClosed(f"peer sent an invalid ring spec: {exc}") from None


def _link(seg: _Segment, trio_sock, *, wait_efd: int, wake_efd: int, peer: str) -> _Link:
    """Move a set-up connection's socket out of trio into the channel end's _Link."""
    std = socket.socket(fileno=trio_sock.detach())
    try:
        return _Link(seg, std, wait_efd=wait_efd, wake_efd=wake_efd, peer=peer)
    except BaseException:
        std.close()
        raise


def _eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def _received_fds(ancdata) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


class ShmListener:
    """The receiving side's listening socket; each sender accepted through `_accept` (as every
    listener's) becomes a ShmReceiver. Without a socket of its own (`path=False`) it is a
    channel of a port (`_port`; `attach` only).

    Connections are set up concurrently, each within `_accept.SETUP_TIMEOUT` seconds: one from
    another user is dropped at once (the kernel names its uid), one that fails the handshake,
    asks for another ring spec or leaves mid-setup is dropped with a log line; none delays a
    real sender and the listener stays open. Nothing is created or handed over before the peer
    proves the secret."""

    what = "shm channel listener"

    def __init__(self, spec: RingSpec, secret: bytes, path: str | os.PathLike | None | bool = None, *,
                 backlog: int = 128, spin_us: float = DEFAULT_SPIN_US, pool: ShmPool | None = None):
        if pool is not None and pool.spec != spec:
            raise ValueError(f"a listener of {spec} with a slot pool of {pool.spec}")
        self.spec = spec
        self.spin_us = spin_us
        self.pool = pool  # its channels' slots are this pool's (`ShmPool`), not a ring each
        self._secret = secret
        self._path: Path | None = None
        self._sock = None
        self.address = None
        if path is not False:
            self._sock, self.address, self._path = _bind_unix(path, backlog)
            log.debug("shm listener open", address=self.address)

    async def accept_connection(self):
        return await _accept_unix(self._sock)

    async def set_up(self, connection, peer: str) -> ShmReceiver:
        """Authenticate the sender, agree on the ring, hand it the memory (the connection is
        closed if anything fails); `accept_authenticated`'s deadline bounds it."""
        channel = await _authenticate(connection, peer, self._secret)
        try:
            refuse_named(channel, peer, self.what)
        except BaseException:
            connection[0].close()
            raise
        return await self.attach(connection, peer)

    async def attach(self, connection, peer: str) -> ShmReceiver:
        """The set-up after the handshake: the ring spec, the memory (closed if it fails)."""
        conn, _ = connection
        try:
            return await self._attach(conn, peer)
        except BaseException:
            conn.close()
            raise

    async def _attach(self, conn, peer: str) -> ShmReceiver:
        stream = trio.SocketStream(conn)
        try:
            theirs = _decode_spec(await receive_exactly(stream, _SPEC.size, "the ring spec"))
            if theirs != self.spec:
                why = f"ring spec mismatch: the receiver has {self.spec}, the sender {theirs}"
                text = why.encode()
                await stream.send_all(_REPLY.pack(b"N", len(text)) + text)
                raise ChannelClosed(why)
            pooled = None
            if self.pool is None:
                seg, memfd = _Segment.create(self.spec)
                reply = _REPLY.pack(b"Y", 0)
            else:  # the pool's memfd (the sender maps it all) and this channel's place in it
                seg, memfd = None, self.pool.fd
                ctrl, grants = self.pool.join()
                pooled = (ctrl, self.pool.seg.ring, grants)
                reply = _REPLY.pack(b"P", _POOLED.size) + _POOLED.pack(grants.channel, grants.window)
            fds = [memfd, _eventfd(), _eventfd()]  # the ring, "data posted", "credit returned"
            try:
                await conn.sendmsg([reply], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                ready = await receive_exactly(stream, 1, "the sender's ready signal")
                if ready != _READY:
                    raise ChannelClosed(f"{peer} sent {ready!r} instead of its ready signal")
                link = _link(seg, conn, wait_efd=fds[1], wake_efd=fds[2], peer=peer)
            except BaseException:
                _close_all(seg, None, fds[1:])
                raise
            finally:
                if seg is not None:
                    os.close(memfd)  # the mappings keep the memory alive
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise ChannelClosed(f"{peer} left during the ring set-up: {exc}") from None
        log.info("shm channel accepted", peer=peer, slots=self.spec.slots, slot_size=self.spec.slot_size,
                 pooled=self.pool is not None)
        return ShmReceiver(self.spec, link, spin_us=self.spin_us, pooled=pooled)

    async def aclose(self) -> None:
        _close_unix(self._sock, self._path)
        self._path = None
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ShmListener:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _bind_unix(path, backlog: int):
    """A listening unix socket (trio), its address and its file (None for an abstract name):
    `open_shm_listener` says which path means what."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    file = None
    try:
        if path is None or os.fspath(path).startswith("@"):
            address = "@slashrt-shm-" + secrets.token_hex(12) if path is None else os.fspath(path)
            sock.bind(_sockaddr(address))
        else:
            file = Path(path)
            address = os.fspath(path)
            old = os.umask(0o177)  # the socket is born 0600: no window with wider permissions
            try:
                sock.bind(address)
            finally:
                os.umask(old)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return trio.socket.from_stdlib_socket(sock), address, file


def _close_unix(sock, file: Path | None) -> None:
    if sock is not None:
        sock.close()
    if file is not None:
        with contextlib.suppress(FileNotFoundError):
            file.unlink()


async def _accept_unix(sock):
    conn, _ = await sock.accept()
    try:
        pid, uid = _peer_credentials(conn)
    except OSError:
        pid, uid = "?", None
    return (conn, uid), f"shm sender (pid {pid})"


async def _authenticate(connection, peer: str, secret: bytes) -> str:
    """The handshake of an accepted sender (closed if it fails): another user's is refused
    at once; returns the channel it asks for."""
    conn, uid = connection
    try:
        if uid not in (os.geteuid(), 0):  # abstract names are open to every local user
            raise ChannelClosed(f"{peer} runs as uid {uid}, not as this user (uid {os.geteuid()}) or root")
        return await server_handshake(trio.SocketStream(conn), secret)
    except BaseException:
        conn.close()
        raise


class _UnixPortSocket:
    """The listening socket of an shm `_port.ChannelPort`."""

    def __init__(self, path, backlog: int):
        self._sock, self.address, self._file = _bind_unix(path, backlog)

    async def accept_connection(self):
        return await _accept_unix(self._sock)

    @staticmethod
    async def close_connection(connection) -> None:
        connection[0].close()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        _close_unix(self._sock, self._file)
        self._file = None
        await trio.lowlevel.checkpoint()


@contextlib.asynccontextmanager
async def open_shm_port(secret: bytes, path: str | os.PathLike | None = None, *, expected: int = 0
                        ) -> AsyncIterator[ChannelPort]:
    """A port of named shm channels (`_port`), bound as `open_shm_listener` binds; its
    channels take the listener's options (`spin_us`). `expected`: the connections its peers
    make at once."""
    channel_port = ChannelPort(
        "shm", _UnixPortSocket(path, PORT_BACKLOG), lambda connection, peer: _authenticate(connection, peer, secret),
        lambda spec, **options: ShmListener(spec, secret, False, **options), expected=expected)
    try:
        yield channel_port
    finally:
        await channel_port.aclose()


def open_shm_listener(
    spec: RingSpec, secret: bytes, path: str | os.PathLike | None = None, **options
) -> ShmListener:
    """Listen for shm senders (use as ``async with``). `path` None binds a fresh random name in
    Linux's abstract socket namespace (nothing on disk, nothing left behind by a crash), "@name"
    binds that abstract name, anything else a socket file created with mode 0600 and removed on
    close. `listener.address` is what senders pass to `connect_shm`."""
    return ShmListener(spec, secret, path, **options)


async def connect_shm(address: str, spec: RingSpec, secret: bytes, *,
                      connect_timeout: float | None = None) -> ShmSender:
    """Connect to a listener at `address` (or a port's channel: `_port.ChannelAddress`), prove
    the secret, agree on `spec`, map the ring; the handshake and the set-up each within
    `connect_timeout` seconds (default `HANDSHAKE_TIMEOUT`: a local peer always answers a
    connection at once, so the time to wait for is its set-up)."""
    timeout = HANDSHAKE_TIMEOUT if connect_timeout is None else connect_timeout
    address, channel = channel_of(address)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            await sock.connect(_sockaddr(address))
        except OSError as exc:
            raise ChannelClosed(f"cannot connect to the shm listener at {address!r}: {exc}") from None
        stream = trio.SocketStream(sock)
        await client_handshake(stream, secret, timeout=timeout, channel=channel)
        peer = f"shm receiver (pid {_peer_pid(sock)})"
        with trio.move_on_after(timeout):
            try:
                await stream.send_all(_encode_spec(spec))
                return await _receive_ring(sock, stream, spec, peer)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise ChannelClosed(f"{peer} left during the ring set-up: {exc}") from None
        raise ChannelClosed(f"{peer} did not finish the ring set-up within {timeout} s")
    finally:
        if sock.fileno() >= 0:
            sock.close()


async def _receive_ring(sock, stream, spec: RingSpec, peer: str) -> ShmSender:
    data, ancdata, flags, _ = await sock.recvmsg(_REPLY.size, socket.CMSG_SPACE(3 * 4), socket.MSG_CMSG_CLOEXEC)
    fds = _received_fds(ancdata)
    try:
        if flags & socket.MSG_CTRUNC:
            raise ChannelClosed(f"{peer} sent more descriptors than a ring needs")
        if not data:
            raise ChannelClosed(f"{peer} closed the connection during the ring set-up")
        if len(data) < _REPLY.size:
            data += await receive_exactly(stream, _REPLY.size - len(data), "the ring set-up reply")
        code, length = _REPLY.unpack(data)
        if length > _MAX_REFUSAL:
            raise ChannelClosed(f"{peer} announced a {length}-byte ring set-up reply (at most {_MAX_REFUSAL})")
        extra = await receive_exactly(stream, length, "the ring set-up reply") if length else b""
        if code == b"N":
            raise ChannelClosed(f"{peer} refused the channel: {extra.decode(errors='replace')}")
        if code not in (b"Y", b"P") or len(fds) != 3 or (code == b"P" and len(extra) != _POOLED.size):
            raise ChannelClosed(f"{peer} sent a bad ring set-up reply ({code!r} with {len(fds)} descriptors)")
        memfd, data_efd, credit_efd = fds
        table = None
        if code == b"P":  # a channel of the receiver's slot pool
            channel, window = _POOLED.unpack(extra)
            seg = _Segment.attach_pool(memfd, spec, channel, window)
            table = seg.table(window)
        else:
            seg = _Segment.attach(memfd, spec)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    os.close(memfd)
    try:
        await stream.send_all(_READY)
        link = _link(seg, sock, wait_efd=credit_efd, wake_efd=data_efd, peer=peer)
    except BaseException:
        _close_all(seg, None, [data_efd, credit_efd])
        raise
    log.info("shm channel connected", peer=peer, slots=spec.slots, slot_size=spec.slot_size, pooled=table is not None)
    return ShmSender(spec, link, table)


def open_shm_pair(spec: RingSpec | None = None, *, spin_us: float = DEFAULT_SPIN_US) -> tuple[ShmSender, ShmReceiver]:
    """Both ends of a shared-memory channel in this process: one memfd mapped twice, a socket
    pair for the peer-gone signal, each end with its own descriptors. Close both ends."""
    spec = spec or RingSpec()
    seg, memfd = _Segment.create(spec)
    owned: list = [seg]
    try:
        data_efd, credit_efd = _eventfd(), _eventfd()
        owned += [data_efd, credit_efd]
        sender_data, sender_credit = os.dup(data_efd), os.dup(credit_efd)
        owned += [sender_data, sender_credit]
        left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        owned += [left, right]
        sender_seg = _Segment.attach(memfd, spec)
        owned.append(sender_seg)
        pid = os.getpid()
        receiving = _Link(seg, left, wait_efd=data_efd, wake_efd=credit_efd, peer=f"shm sender (pid {pid})")
        owned = [receiving, sender_data, sender_credit, right, sender_seg]
        sending = _Link(sender_seg, right, wait_efd=sender_credit, wake_efd=sender_data, peer=f"shm receiver (pid {pid})")
        owned = []
    except BaseException:
        for item in owned:
            if isinstance(item, int):
                os.close(item)
            else:
                item.close()
        raise
    finally:
        os.close(memfd)
    return ShmSender(spec, sending), ShmReceiver(spec, receiving, spin_us=spin_us)
