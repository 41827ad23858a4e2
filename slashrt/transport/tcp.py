"""TCP backend: the ring protocol over one socket, for hosts without RDMA.

Each end keeps its ring in local memory, so everything above the backend hooks (footers,
sequence numbers, credit arithmetic, runs, validation) is the protocol of `_channel`, unchanged:

* the sender's slots are a staging ring. Posting writes the posted slots to the socket at
  once when the socket takes them (one non-blocking `sendmsg` for a run of slots, no task
  switch); what it does not take, the sender's `drive()` writes when it drains. The drive also
  reads credits back.
* the receiver's `drive()` reads frames straight into the next slot of its ring (one
  `recvmsg_into` per 64 KiB buffer: the payload lands in the slot, the next frame's footer in a
  small scratch buffer; small frames arrive many per recv and are copied) and sets the slot's
  flag last, so the poller sees it only once the whole buffer is in. Released slots go back as
  credit frames.

Wire protocol, after the cluster-secret handshake of `_auth` (nothing is sent before it)::

    both ends:          spec    b"SRNG" | version u1 | role u1 | 2 pad | slots u4 | slot_size u4 | record_size u8
                                | window u4 | 4 pad   (window: the most buffers the receiver lets
                                in at once: slots, or a pooled channel's grant window)
    sender -> receiver  frame   footer (32 B, as the producer wrote it) | payload (footer.nbytes bytes)
    receiver -> sender  credit  limit u8 (the sender may post the buffers below it: released +
                                slots, or a pooled channel's grant counter; monotonic; sent
                                again unchanged every liveness interval as a keepalive)

The footer leads so the receiver knows the payload's length, and a frame carries only the
payload bytes the footer claims: a small buffer costs what it holds. Credits are coalesced: the
receiver sends its counter when a quarter of the ring has been released, or at once when it has
nothing left to poll (then the sender may be waiting); never one syscall per buffer while both
ends are busy.

The sender's staging ring has `slots` slots, and a staging slot is reused once its frame is
written out in full: the sender's limit is the receiver's, and at most `slots` past the frames
written. (A pooled receiver, `_pool`, may grant a backlogged channel more credits than
`slots`; the receiver's slots are its pool's, and the frames land in the slots it granted.) A
credit beyond what the receiver may grant (more than `window` past the frames written) is a
protocol violation and closes the channel.

With a `Liveness` (set by the channels' owner), the receiver sends its counter every interval
even when nothing was released, and the sender fails the channel with `ChannelSilent` when no
byte came back for the timeout: a partition between two hosts is noticed in seconds, not after
TCP's minutes of retransmissions, and a backpressured channel (a slow consumer) still answers.

Faults close only the channel they hit, with an error-level log line naming the peer and why:
a frame longer than a slot, a frame sent without a credit or after END_OF_STREAM, a footer flag
that is not FULL (`MalformedBuffer`), a bad footer (`MalformedBuffer` from the base poll, as
for every backend), the connection lost or closed in the middle of a buffer or before
END_OF_STREAM (`ChannelClosed`). Buffers received in full before the fault are still delivered;
the receiver's `poll()` raises the error once they are consumed. The sender's later calls raise
`ChannelClosed` naming the cause.

Usage (the two ends usually live in different processes or hosts)::

    async with open_tcp_listener(spec, secret) as listener:   # 127.0.0.1 unless host=, free port
        (receiver,) = await accept_authenticated(listener)  # the first sender that proves the secret
        # run receiver.drive() beside the code that polls; await receiver.aclose() at the end

    sender = await connect_tcp(listener.address, spec, secret)
    # run sender.drive() beside the code that posts; await sender.aclose() ends the stream

These are the backend's own calls; code above the transport layer opens channels through
`slashrt.transport._registry.open_channels`, which runs both drives for it. A second call of
`drive()` while one runs waits for it.
"""

from __future__ import annotations

import contextlib
import math
import socket
import struct
from collections.abc import AsyncIterator

import attrs
import numpy as np
import structlog
import trio

from slashrt._buffer import FOOTER_SIZE, FULL, Control, Kind
from slashrt._logging import fault_level
from slashrt.errors import ChannelClosed, MalformedBuffer
from slashrt.transport._accept import (
    PORT_BACKLOG, TcpAcceptor, TcpPortSocket, bind_tcp, peer_name, refuse_named, stream_authenticator,
)
from slashrt.transport._auth import HANDSHAKE_TIMEOUT, client_handshake, receive_exactly, server_handshake
from slashrt.transport._port import ChannelPort, channel_of
from slashrt.transport._channel import ChannelSilent, DrivenReceiver, RingSpec, RunningDrive, Sender
from slashrt.transport._pool import Grants, SlotPool, SlotViews

__all__ = ["TcpListener", "TcpReceiver", "TcpSender", "TcpStatistics", "connect_tcp", "open_tcp_listener"]

log = structlog.get_logger("slashrt.transport.tcp")

_VERSION = 2
_SENDER, _RECEIVER = 1, 0
_ROLE_NAMES = {_SENDER: "sender", _RECEIVER: "receiver"}
_SPEC = struct.Struct("<4sBB2xIIQI4x")
_CREDIT = struct.Struct("<Q")
_U32 = struct.Struct("<I")

# Offsets inside a footer (see slashrt._buffer).
_NBYTES_AT = 4
_KIND_AT = 26
_FLAG_AT = FOOTER_SIZE - 1

SCRATCH_BYTES = 256 * 1024  # frames smaller than DIRECT_MIN are received here, many per recv, then copied
DIRECT_MIN = 8 * 1024  # payloads at least this big go from the socket straight into their slot
SEND_BATCH_BYTES = 1 << 20  # bytes of frames gathered into one sendmsg (the socket takes what fits)
YIELD_BYTES = 1 << 20  # a drive yields to the other tasks after moving this much without blocking
CLOSE_TIMEOUT = 5.0  # how long a closing sender waits for the receiver to acknowledge the end


@attrs.frozen
class TcpStatistics:
    """What one end of a TCP channel has moved so far (`statistics()`)."""

    buffers: int  # frames written out in full (sender) or received in full (receiver)
    bytes: int  # frame bytes (footers and payloads) written or read
    calls: int  # sendmsg / recv calls that moved frame bytes
    credit_frames: int  # credit frames received (sender) or sent (receiver)


def _lost(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


async def _close_stream_forcefully(stream: trio.abc.AsyncResource) -> None:
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(stream)


async def _agree_spec(stream: trio.SocketStream, spec: RingSpec, role: int, peer: str, window: int = 0) -> int:
    """Both ends send their ring spec and check the other's: same shape, opposite roles.
    Returns the peer's window (the receiver's: `window` = its grant window, else slots)."""
    mine = _SPEC.pack(b"SRNG", _VERSION, role, spec.slots, spec.slot_size, spec.record_size or 0, window or spec.slots)
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as scope:
        try:
            await stream.send_all(mine)
            theirs = await receive_exactly(stream, _SPEC.size, "its ring spec")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ChannelClosed(f"connection to {peer} lost while agreeing on the ring spec: {exc}") from None
    if scope.cancelled_caught:
        raise ChannelClosed(f"peer {peer} did not send its ring spec within {HANDSHAKE_TIMEOUT} s")
    magic, version, peer_role, slots, slot_size, record_size, their_window = _SPEC.unpack(theirs)
    if magic != b"SRNG" or version != _VERSION:
        raise ChannelClosed(
            f"peer {peer} sent no ring spec of protocol version {_VERSION} (magic {magic!r}, version {version})"
        )
    if peer_role == role or peer_role not in _ROLE_NAMES:
        raise ChannelClosed(f"peer {peer} is not a channel {_ROLE_NAMES[1 - role]} (role {peer_role})")
    ours = (spec.slots, spec.slot_size, spec.record_size)
    other = (slots, slot_size, record_size or None)
    if other != ours:
        raise ChannelClosed(
            f"ring spec mismatch with {peer}: this end has slots={ours[0]}, slot_size={ours[1]}, "
            f"record_size={ours[2]}; the peer has slots={other[0]}, slot_size={other[1]}, record_size={other[2]}"
        )
    if their_window < slots:
        raise ChannelClosed(f"peer {peer} announced a window of {their_window} buffers, fewer than its {slots} slots")
    return their_window


def _detach(stream: trio.SocketStream) -> socket.socket:
    """The stream's socket as a plain non-blocking socket (the drives call it directly: no
    per-call trio wrapper; they wait on it with trio.lowlevel.wait_readable/wait_writable)."""
    tsock = stream.socket
    family, type_, proto = tsock.family, tsock.type, tsock.proto
    sock = socket.socket(family, type_, proto, fileno=tsock.detach())
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _close_socket(sock: socket.socket | None) -> None:
    if sock is not None and sock.fileno() != -1:
        trio.lowlevel.notify_closing(sock)  # wakes a drive waiting on it with ClosedResourceError
        sock.close()


# -- sender --------------------------------------------------------------------------------------


async def _drive(end, write, read, failure, *, finished: bool = False, beside=None) -> None:
    """The drive of either end: `write(sock)` beside `read(sock)` (and `beside()`, the
    liveness task, if given) until the channel ends or fails (recorded by `end._fail`, never
    raised; `failure()` reads it). A second call while one runs waits for it. A failed
    channel's socket is closed."""
    if end._drive is not None:
        await end._drive.ended.wait()
        return
    sock = end._sock
    if sock is None or finished or failure() is not None:
        return
    end._drive = running = RunningDrive()
    try:
        with running.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, sock)
                if beside is not None:
                    nursery.start_soon(beside)
                try:
                    await read(sock)
                except (MalformedBuffer, ChannelClosed) as exc:
                    end._fail(exc)
                except trio.ClosedResourceError:
                    pass  # closed locally (aclose) while waiting on the socket
                nursery.cancel_scope.cancel()
    finally:
        end._drive = None
        running.ended.set()
        if failure() is not None:
            _close_socket(end._sock)
            end._sock = None


class TcpSender(Sender):
    """Producer end over TCP (from `connect_tcp`). Run `drive()` in a nursery while the
    channel is in use; `aclose()` sends END_OF_STREAM and closes the connection.

    When the channel fails (the receiver vanished, or returned credit it was never owed), the
    cause is logged and kept in `error`; `wait_credit`, `reserve`, `post` and their run
    variants then raise ChannelClosed naming it."""

    def __init__(self, spec: RingSpec, sock: socket.socket, peer: str, window: int | None = None):
        super().__init__(spec)
        self.peer = peer
        self._window = window or spec.slots  # the receiver's: its limit is at most this past the frames written
        self._sock: socket.socket | None = sock
        self._stage = np.zeros(spec.ring_bytes, dtype=np.uint8)
        ss, cap = spec.slot_size, spec.payload_capacity
        self._slots = [self._stage[i * ss : (i + 1) * ss] for i in range(spec.slots)]
        mv = memoryview(self._stage)
        self._payload_mv = [mv[i * ss : i * ss + cap] for i in range(spec.slots)]
        self._footer_mv = [mv[(i + 1) * ss - FOOTER_SIZE : (i + 1) * ss] for i in range(spec.slots)]
        self._published = 0  # slots handed to _publish (frames to send, in ring order)
        self._sent = 0  # frames written to the socket in full
        self._credit = spec.slots  # the receiver's limit, as last received (its first: one ring)
        self._bytes = self._calls = self._credit_frames = 0
        # the writer's state: the socket it writes, whether it is parked, the run being written
        self._wsock: socket.socket | None = None
        self._writer_idle = False
        self._out: list[memoryview] | None = None
        self._out_ends: list[int] = []
        self._out_first = self._out_done = self._out_k = 0
        self._send_lot = trio.lowlevel.ParkingLot()  # drive's writer waits here for posts
        self._credit_lot = trio.lowlevel.ParkingLot()  # wait_credit waits here
        self._flush_lot = trio.lowlevel.ParkingLot()  # aclose waits here for the writer to catch up
        self._peer_done = trio.Event()  # the receiver closed its side after our END_OF_STREAM
        self._delivered = False  # END_OF_STREAM written out
        self._closing: trio.Event | None = None  # set once aclose() has released the socket
        self._drive: RunningDrive | None = None
        self._heard = 0.0  # when the receiver last sent anything (a credit or a keepalive)
        self._log = log.bind(peer=peer, end="sender")

    # -- backend hooks ---------------------------------------------------------------------------
    def _slot(self, index):
        return self._slots[index]

    def _ring(self):
        return self._stage

    def _publish(self, index):
        self._published += 1
        if self._writer_idle:
            self._kick()

    def _publish_run(self, first, k):
        self._published += k
        if self._writer_idle:
            self._kick()

    def _kick(self) -> None:
        """Write what was just posted from here, while the drive's writer is parked: one
        non-blocking sendmsg, no task switch before the bytes leave. Whatever the socket does
        not take now, the writer sends once the socket drains."""
        try:
            if self._pump():
                return
        except OSError as exc:
            self._write_failed(exc)
            return
        self._writer_idle = False
        self._send_lot.unpark_all()

    def _released(self):
        return self._credit - self.spec.slots

    def _limit(self):
        # the receiver's limit, and no staging slot reused before its frame is out (`_pump` wakes)
        return min(self._credit, self._sent + self.spec.slots)

    async def _park_for_credit(self):
        if self.error is not None:
            raise self._failure()
        await self._credit_lot.park()

    # -- a failed channel names its cause in every later call -----------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            getattr(self._log, fault_level(exc))("tcp channel closed", reason=str(exc), posted=self._posted,
                                                 sent=self._sent)
        self._credit_lot.unpark_all()
        self._flush_lot.unpark_all()
        self._peer_done.set()
        if self._drive is not None:
            self._drive.scope.cancel()

    # -- moving bytes ------------------------------------------------------------------------------
    async def drive(self) -> None:
        """Write posted slots to the socket and read credits until the channel ends or fails.
        Returns once the receiver has acknowledged END_OF_STREAM; a failure is recorded in
        `error` (and logged), never raised. A second call while one runs waits for it."""
        self._heard = trio.current_time()
        watch = None if self.liveness is None else self._watch_receiver
        await _drive(self, self._write_frames, self._read_credits, lambda: self.error, beside=watch)

    async def _watch_receiver(self) -> None:
        """Fail the channel when the receiver sent nothing, not even a keepalive, for the
        liveness timeout: a partition or a vanished host, which TCP itself notices only after
        minutes of retransmissions. Judged from this end only: the receiver answers every
        interval whatever its consumer does, so a full ring (backpressure) is never silence."""
        timeout = self.liveness.timeout
        while True:
            await trio.sleep_until(self._heard + timeout)
            await trio.lowlevel.checkpoint()  # a credit that arrived meanwhile counts first
            if trio.current_time() >= self._heard + timeout:
                self._fail(ChannelSilent(self.peer, timeout))
                return

    async def _write_frames(self, sock: socket.socket) -> None:
        self._wsock = sock
        try:
            while True:
                try:
                    done = self._pump()
                except OSError as exc:
                    self._write_failed(exc)
                    return
                if done:
                    self._writer_idle = True  # from now on a post writes at once (_kick)
                    try:
                        await self._send_lot.park()
                    finally:
                        self._writer_idle = False
                else:
                    await trio.lowlevel.wait_writable(sock)
        except trio.ClosedResourceError:
            return  # closed locally
        finally:
            self._wsock = None

    def _pump(self) -> bool:
        """Write published frames until all are out (True) or the socket is full (False).
        Frames are gathered in runs (the footer as the producer wrote it, then the payload
        bytes it claims) and written with one sendmsg per run."""
        sock = self._wsock
        while True:
            bufs = self._out
            if bufs is None:
                if self._sent == self._published:
                    if self._flush_lot:
                        self._flush_lot.unpark_all()
                    return True
                bufs = self._gather()
            try:
                n = sock.sendmsg(bufs)
            except BlockingIOError:
                return False
            self._calls += 1
            self._bytes += n
            done = self._out_done + n
            ends, k = self._out_ends, self._out_k
            while k < len(ends) and ends[k] <= done:
                k += 1
            self._sent = self._out_first + k
            if k and self._credit_lot:  # staging slots came free: a wait for credit may be over
                self._credit_lot.unpark_all()
            if k == len(ends):
                self._out = None
                continue
            self._out_done, self._out_k = done, k
            i = 0
            while n:  # drop what went out from the gather list
                b = bufs[i]
                if n >= len(b):
                    n -= len(b)
                    i += 1
                else:
                    bufs[i] = b[n:]
                    n = 0
            self._out = bufs[i:]

    def _gather(self) -> list[memoryview]:
        nslots, cap = self.spec.slots, self.spec.payload_capacity
        footers, payloads = self._footer_mv, self._payload_mv
        first, end = self._sent, self._published
        bufs: list[memoryview] = []
        ends: list[int] = []
        total = 0
        seq = first
        while seq < end and total < SEND_BATCH_BYTES:
            i = seq % nslots
            footer = footers[i]
            nbytes = _U32.unpack_from(footer, _NBYTES_AT)[0]
            length = nbytes if nbytes <= cap else 0  # a lying footer is the receiver's to reject
            bufs += (footer, payloads[i][:length])
            total += FOOTER_SIZE + length
            ends.append(total)
            seq += 1
        self._out, self._out_ends, self._out_first, self._out_done, self._out_k = bufs, ends, first, 0, 0
        return bufs

    def _write_failed(self, exc: OSError) -> None:
        sock = self._wsock
        if sock is not None and sock.fileno() != -1:  # not closed locally
            self._fail(ChannelClosed(f"connection to {self.peer} lost while sending buffer {self._sent}: {_lost(exc)}"))

    async def _read_credits(self, sock: socket.socket) -> None:
        buf = bytearray(64 * _CREDIT.size)
        mv = memoryview(buf)
        have = 0
        while True:
            try:
                n = sock.recv_into(mv[have:])
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                if self._acknowledged() or sock.fileno() == -1:
                    break
                raise ChannelClosed(f"connection to the receiver {self.peer} lost: {_lost(exc)}") from None
            if n == 0:
                if self._acknowledged():
                    break
                raise ChannelClosed(
                    f"the receiver {self.peer} closed the connection "
                    f"({self._posted - self._released()} buffers posted and not released)"
                )
            self._heard = trio.current_time()
            have += n
            whole = have - have % _CREDIT.size
            credit = self._credit
            for (value,) in _CREDIT.iter_unpack(mv[:whole]):
                if value < credit or value > self._sent + self._window:
                    raise MalformedBuffer(
                        f"receiver {self.peer} granted credit up to buffer {value}, but up to {credit} before "
                        f"and {self._sent} buffers sent (at most {self._window} more may be granted)"
                    )
                credit = value
            self._credit_frames += whole // _CREDIT.size
            buf[: have - whole] = buf[whole:have]
            have -= whole
            if credit != self._credit:
                self._credit = credit
                if self._credit_lot:
                    self._credit_lot.unpark_all()
        self._peer_done.set()

    def statistics(self) -> TcpStatistics:
        return TcpStatistics(self._sent, self._bytes, self._calls, self._credit_frames)

    def _acknowledged(self) -> bool:
        """Is the end of the connection expected? (END_OF_STREAM posted and written out.)"""
        return self._closed and self._sent == self._published

    # -- closing -----------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Send END_OF_STREAM, wait until every posted buffer is written and the receiver has
        seen the end (at most CLOSE_TIMEOUT), and close the socket. Raises ChannelClosed if the
        channel failed before the end of the stream was out; always releases the socket.
        Runs the drive itself if nobody else does."""
        if self._closing is not None:  # another aclose() is at work: let it finish
            await self._closing.wait()
            return
        if self._sock is None:
            return
        self._closing = trio.Event()
        try:
            if not self._closed and self.error is None:
                if self._drive is not None:
                    await self._finish()
                else:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.drive)
                        await self._finish()
                        nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            _close_socket(self._sock)
            self._sock = None
            self._credit_lot.unpark_all()
            self._closing.set()
        await trio.lowlevel.checkpoint()
        if self.error is not None and not self._delivered:
            raise self._failure()

    def abort(self) -> None:
        self._closed = True
        if self._sock is not None and self._closing is None:
            _close_socket(self._sock)
            self._sock = None
            self._credit_lot.unpark_all()

    async def _finish(self) -> None:
        try:
            await Sender.aclose(self)  # END_OF_STREAM, through the usual credit wait
        except ChannelClosed:
            return  # the channel failed meanwhile: aclose() reports it
        while self._sent < self._published and self.error is None:
            await self._flush_lot.park()
        if self.error is not None:
            return
        self._delivered = True
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        # Wait for the receiver to close its side: closing ours with its credits unread would
        # reset the connection under data it may not have read yet.
        with trio.move_on_after(CLOSE_TIMEOUT):
            await self._peer_done.wait()


# -- receiver --------------------------------------------------------------------------------------


class TcpReceiver(DrivenReceiver):
    """Consumer end over TCP (from `TcpListener.accept`). Run `drive()` in a nursery beside
    the code that polls; `aclose()` closes the connection.

    A fault the drive finds (a malformed frame, a vanished peer) is held back until every
    buffer received before it has been polled; then `poll()` raises it (MalformedBuffer or
    ChannelClosed) and marks the channel failed, as a bad footer does. `wait_readable()`
    returns at once when such a fault is pending."""

    def __init__(self, spec: RingSpec, sock: socket.socket, peer: str, grants: Grants | None = None):
        super().__init__(spec)
        self.peer = peer
        self._sock: socket.socket | None = sock
        self.grants = grants  # a pooled channel's (`_pool`): its slots are the pool's
        self._ring_arr = np.zeros(spec.ring_bytes, dtype=np.uint8) if grants is None else grants.pool.memory
        ss = spec.slot_size
        self._slots = [self._ring_arr[i * ss : (i + 1) * ss] for i in range(spec.slots)] if grants is None \
            else SlotViews(self._ring_arr, ss)
        self._received = 0  # frames written in full into the ring
        self._credit_sent = spec.slots  # the limit as last sent to the sender (its first: one ring)
        self._bytes = self._calls = self._credit_frames = 0
        self._credit_out = b""  # a credit frame (or its rest) not yet taken by the socket
        self._credit_idle = False  # the drive's credit writer is parked
        self._ping = False  # a keepalive is due: send the counter even if unchanged
        self._csock: socket.socket | None = None
        self._credit_batch = max(1, spec.slots // 4)
        self._data_lot = trio.lowlevel.ParkingLot()  # the poller parks here
        self._credit_lot = trio.lowlevel.ParkingLot()  # drive's credit writer parks here
        self._eos = False  # END_OF_STREAM received
        self._done = False  # the stream ended cleanly
        self._drive: RunningDrive | None = None
        self._log = log.bind(peer=peer, end="receiver")

    # -- backend hooks ---------------------------------------------------------------------------
    def _slot(self, index):
        return self._slots[index]

    def _ring(self):
        return self._ring_arr

    def _return_credits(self, released):
        # Coalesce: send when a batch has built up, or when nothing is left to poll (the sender
        # may be waiting for exactly these credits).
        if self._limit() - self._credit_sent >= self._batch() or self._received == self._polled:
            self._want_credits()

    def _batch(self) -> int:
        """Credits worth a frame: a quarter of the slots the channel holds (a pooled channel's
        grow with what it borrows)."""
        if self.grants is None:
            return self._credit_batch
        return max(1, (self.grants.granted - self._released_count) // 4)

    def _want_credits(self) -> None:
        """Send the released counter now, from here, if the drive's credit writer is parked
        (one non-blocking send, no task switch); else the writer sends it when it can."""
        if self._credit_idle:
            try:
                if self._flush_credits():
                    return
            except OSError:
                return  # the sender is gone: the frame reader sees it too and says how
            self._credit_idle = False
            self._credit_lot.unpark_all()

    def _flush_credits(self) -> bool:
        """Write the latest released counter; False if the socket is full (rest pending)."""
        while True:
            if not self._credit_out:
                value = self._limit()
                if value <= self._credit_sent and not self._ping:
                    return True
                self._ping = False
                self._credit_out = _CREDIT.pack(value)
                self._credit_sent = value
                self._credit_frames += 1
            try:
                n = self._csock.send(self._credit_out)
            except BlockingIOError:
                return False
            self._credit_out = self._credit_out[n:]

    async def _park_for_data(self):
        if self._limit() > self._credit_sent:
            self._want_credits()
        await self._data_lot.park()

    # -- faults are reported after the buffers received before them ----------------------------------
    def poll(self):
        try:
            buf = super().poll()
        except MalformedBuffer as exc:  # a bad footer, found by the protocol's validation
            self._log.error(f"{self.medium} channel closed", reason=str(exc), **self._progress())
            self._stop()
            raise
        if buf is None and self._limit() > self._credit_sent:
            self._want_credits()
        return buf

    medium = "tcp"

    def _progress(self) -> dict:
        return {"received": self._received}

    def _stop(self) -> None:
        """Stop reading from the peer: its drive ends, the socket closes, the peer sees it."""
        if self._drive is not None:
            self._drive.scope.cancel()
        _close_socket(self._sock)
        self._sock = None

    # -- moving bytes ------------------------------------------------------------------------------
    async def drive(self) -> None:
        """Read frames into the ring and return credits until the stream ends or fails. A
        failure is recorded (poll raises it once the buffers received before it are consumed)
        and logged, never raised. A second call while one runs waits for it."""
        keepalive = None if self.liveness is None else self._keep_alive
        await _drive(self, self._write_credits, self._read_frames, lambda: self._peer_error, finished=self._done,
                     beside=keepalive)

    async def _keep_alive(self) -> None:
        """Every liveness interval, send the credit counter (unchanged if nothing was released:
        the sender takes an equal counter as a sign of life), from the drive, whatever the
        consumer does: a slow consumer's channel is busy, not partitioned."""
        while True:
            await trio.sleep(self.liveness.interval)
            self._ping = True
            self._want_credits()

    async def _read_frames(self, sock: socket.socket) -> None:
        ring_mv = memoryview(self._ring_arr)
        scratch = bytearray(SCRATCH_BYTES)
        smv = memoryview(scratch)
        head = tail = 0  # unparsed bytes: scratch[head:tail]
        length = -1  # payload length of the frame being read; -1 while its footer is not in
        got = 0  # payload bytes of that frame already in its slot
        base = 0  # ring offset of its slot
        small_run = 4  # consecutive frames below DIRECT_MIN (start small: one recv may hold many)
        drained = False  # the last recv emptied the socket
        budget = YIELD_BYTES
        while True:
            # 1. Parse what the scratch buffer holds: footers and payload pieces.
            completed = 0
            while True:
                avail = tail - head
                if length < 0:
                    if avail < FOOTER_SIZE:
                        break
                    length, base = self._take_footer(ring_mv, smv[head : head + FOOTER_SIZE])
                    head += FOOTER_SIZE
                    got = 0
                    small_run = small_run + 1 if length < DIRECT_MIN else 0
                elif got < length:
                    if avail == 0:
                        break
                    n = min(length - got, avail)
                    ring_mv[base + got : base + got + n] = smv[head : head + n]
                    got += n
                    head += n
                if length >= 0 and got == length:
                    self._complete(ring_mv, base, length)
                    length = -1
                    completed += 1
            if completed and self._data_lot:
                self._data_lot.unpark_all()
            if head == tail:
                head = tail = 0
            elif head:  # a partial footer (< 32 B): move it to the front
                scratch[: tail - head] = scratch[head:tail]
                tail -= head
                head = 0

            # 2. Receive: the rest of a payload straight into its slot; footers and small frames
            # into the scratch buffer. After a short read the socket is drained: wait for it at
            # once rather than pay a failing recv first.
            if drained:
                drained = False
                budget = YIELD_BYTES
                await trio.lowlevel.wait_readable(sock)
            try:
                if length >= 0:  # then got < length: the parse loop took everything else
                    direct = ring_mv[base + got : base + length]
                    extra = smv[:FOOTER_SIZE] if small_run < 4 else smv  # the next footer, or many frames
                    n = sock.recvmsg_into((direct, extra))[0]
                    d = min(n, len(direct))
                    got += d
                    tail += n - d
                    drained = n < len(direct) + len(extra)
                else:
                    want = FOOTER_SIZE - tail if small_run < 4 else len(scratch) - tail
                    n = sock.recv_into(smv[tail : tail + want])
                    tail += n
                    drained = n < want
            except BlockingIOError:
                drained = True
                continue
            except OSError as exc:
                if sock.fileno() == -1:
                    return  # closed locally
                if length < 0 and tail == 0 and self._eos:
                    break  # everything arrived; the peer just left abruptly
                raise ChannelClosed(self._where(f" ({_lost(exc)})", length, got, tail)) from None
            if n == 0:
                if length < 0 and tail == 0 and self._eos:
                    break
                raise ChannelClosed(self._where("", length, got, tail))
            self._bytes += n
            self._calls += 1
            budget -= n
            if budget <= 0:
                budget = YIELD_BYTES
                await trio.lowlevel.checkpoint()
        # The sender finished: END_OF_STREAM, then it closed its side. Close ours in turn.
        self._done = True
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _where(self, cause: str, length: int, got: int, tail: int) -> str:
        """Why the connection ended: mid-buffer or between buffers, before END_OF_STREAM."""
        if length < 0 and tail == 0:
            how = "closed the connection" if not cause else f"lost the connection{cause}"
            return f"peer {self.peer} {how} before END_OF_STREAM (after {self._received} buffers)"
        part = f"{tail} of {FOOTER_SIZE} footer bytes" if length < 0 else f"{got} of {length} payload bytes"
        return f"peer {self.peer} vanished mid-buffer{cause}: buffer {self._received} incomplete ({part})"

    def _take_footer(self, ring_mv: memoryview, footer: memoryview) -> tuple[int, int]:
        """Check a frame's footer (it comes first) and write it into its slot, all but the
        flag; return the payload length that follows it and the slot's offset."""
        seq = self._received
        if self._eos:
            raise MalformedBuffer(f"peer {self.peer} sent buffer {seq} after END_OF_STREAM")
        flag = footer[_FLAG_AT]
        if flag != FULL:
            raise MalformedBuffer(f"peer {self.peer} sent buffer {seq} with footer flag {flag}, expected {FULL}")
        length = _U32.unpack_from(footer, _NBYTES_AT)[0]
        if length > self.spec.payload_capacity:
            raise MalformedBuffer(
                f"peer {self.peer} sent buffer {seq} as a frame of {length} payload bytes, "
                f"longer than a {self.spec.slot_size}-byte slot holds ({self.spec.payload_capacity})"
            )
        if seq >= self._limit():
            raise MalformedBuffer(
                f"peer {self.peer} sent buffer {seq} without a credit "
                f"({self._released_count} released, credit granted up to buffer {self._limit()})"
            )
        # The slot is released (its flag clear): nobody reads these bytes until the flag is set.
        base = self._slot_of(seq) * self.spec.slot_size
        end = base + self.spec.slot_size
        ring_mv[end - FOOTER_SIZE : end - 1] = footer[:_FLAG_AT]
        return length, base

    def _complete(self, ring_mv: memoryview, base: int, length: int) -> None:
        """The whole frame is in its slot: set the flag, last."""
        end = base + self.spec.slot_size
        if ring_mv[end - FOOTER_SIZE + _KIND_AT] == Kind.CONTROL and length >= 4:
            if _U32.unpack_from(ring_mv, base)[0] == Control.END_OF_STREAM:
                self._eos = True
        self._received += 1
        ring_mv[end - 1] = FULL  # the poller now sees the whole buffer

    async def _write_credits(self, sock: socket.socket) -> None:
        self._csock = sock
        try:
            while True:
                try:
                    done = self._flush_credits()
                except OSError:
                    return  # the sender is gone (or we closed): the frame reader says how
                if done:
                    self._credit_idle = True  # from now on a release sends at once (_want_credits)
                    try:
                        await self._credit_lot.park()
                    finally:
                        self._credit_idle = False
                else:
                    await trio.lowlevel.wait_writable(sock)
        except trio.ClosedResourceError:
            return
        finally:
            self._csock = None

    def statistics(self) -> TcpStatistics:
        return TcpStatistics(self._received, self._bytes, self._calls, self._credit_frames)

    async def aclose(self) -> None:
        """Close the socket. Polling afterwards raises ChannelClosed unless the stream ended."""
        self._end_grants()
        if self._sock is not None:
            _close_socket(self._sock)
            self._sock = None
            if self.error is None and self._peer_error is None and not self.finished:
                self.error = ChannelClosed(f"channel from {self.peer} closed by this receiver")
            if self._data_lot:
                self._data_lot.unpark_all()
        await trio.lowlevel.checkpoint()


# -- connection setup ---------------------------------------------------------------------------


class TcpListener(TcpAcceptor):
    """Accepts channel senders on one address; each accepted connection becomes a TcpReceiver.
    Connections are set up concurrently (`_accept`): a stranger never delays a real sender.
    Without a socket of its own it is a channel of a port (`_port`; `attach` only)."""

    what = "tcp channel listener"

    def __init__(self, sock: trio.socket.SocketType | None, spec: RingSpec, secret: bytes, *,
                 pool: SlotPool | None = None):
        if pool is not None and (pool.exclusive, pool.slot_size) != (spec.slots, spec.slot_size):
            raise ValueError(f"a listener of {spec} with a slot pool of {pool.exclusive} exclusive slots of "
                             f"{pool.slot_size} bytes")
        self._sock = sock
        self.pool = pool  # its channels' slots are this pool's (`_pool`), not a ring each
        self.spec = spec
        self._secret = secret
        self.address: tuple[str, int] | None = None if sock is None else sock.getsockname()[:2]

    async def set_up(self, stream: trio.SocketStream, peer: str) -> TcpReceiver:
        """Handshake and ring spec check on an accepted connection (closed if they fail);
        `accept_authenticated`'s deadline bounds them."""
        try:
            refuse_named(await server_handshake(stream, self._secret), peer, self.what)
        except BaseException:
            await _close_stream_forcefully(stream)
            raise
        return await self.attach(stream, peer)

    async def attach(self, stream: trio.SocketStream, peer: str) -> TcpReceiver:
        """The set-up after the handshake: the ring spec check (the stream is closed if it fails)."""
        try:
            await _agree_spec(stream, self.spec, _RECEIVER, peer, window=0 if self.pool is None else self.pool.window)
        except BaseException:
            await _close_stream_forcefully(stream)
            raise
        log.debug("tcp channel accepted", peer=peer, slots=self.spec.slots, slot_size=self.spec.slot_size,
                  pooled=self.pool is not None)
        return TcpReceiver(self.spec, _detach(stream), peer, None if self.pool is None else Grants(self.pool))

    async def aclose(self) -> None:
        if self._sock is not None:
            self._sock.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> TcpListener:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def open_tcp_listener(
    spec: RingSpec, secret: bytes, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 128,
    pool: SlotPool | None = None,
) -> AsyncIterator[TcpListener]:
    """Listen for channel senders on (host, port); loopback unless `host` says otherwise, and
    port 0 picks a free one (see `listener.address`). With a `pool` (`_pool.SlotPool`), its
    channels' slots are the pool's."""
    if not secret:
        raise ValueError("a TCP channel needs the cluster secret")
    sock = await bind_tcp(host, port, backlog)
    async with TcpListener(sock, spec, secret, pool=pool) as listener:
        if not _is_loopback(listener.address[0]):
            log.info("tcp listener on a non-loopback address", address=peer_name(listener.address))
        yield listener


@contextlib.asynccontextmanager
async def open_tcp_port(secret: bytes, *, host: str = "127.0.0.1", port: int = 0, expected: int = 0
                        ) -> AsyncIterator[ChannelPort]:
    """A port of named tcp channels (`_port`) on (host, port); `expected`: the connections its
    peers make at once."""
    if not secret:
        raise ValueError("a TCP channel needs the cluster secret")
    channel_port = ChannelPort("tcp", TcpPortSocket(await bind_tcp(host, port, PORT_BACKLOG)),
                               stream_authenticator(secret), lambda spec, **o: TcpListener(None, spec, secret, **o),
                               expected=expected)
    try:
        yield channel_port
    finally:
        await channel_port.aclose()


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost")


async def connect_tcp(address: tuple[str, int], spec: RingSpec, secret: bytes, *,
                      connect_timeout: float | None = None) -> TcpSender:
    """Connect to a listener as the channel's sender: handshake, ring spec check, then a TcpSender.

    Raises AuthenticationFailed if the listener does not prove the secret (or refuses ours),
    ChannelClosed on a spec mismatch or a lost connection, OSError if nobody listens there, and
    ChannelSilent if the connection is not answered within `connect_timeout` (a partition: the
    peer's kernel answers a connection whatever its process does, so no answer is the network)."""
    if not secret:
        raise ValueError("a TCP channel needs the cluster secret")
    address, channel = channel_of(address)
    host, port = address[0], address[1]
    peer = peer_name((host, port)) + (f" {channel!r}" if channel else "")
    with trio.move_on_after(connect_timeout if connect_timeout is not None else math.inf) as unanswered:
        stream = await trio.open_tcp_stream(host, port)
    if unanswered.cancelled_caught:
        raise ChannelSilent(peer, connect_timeout, "no answer to a connection")
    try:
        await client_handshake(stream, secret, channel=channel)
        window = await _agree_spec(stream, spec, _SENDER, peer)
    except ChannelClosed as exc:
        log.error("tcp connection refused", peer=peer, end="sender", reason=str(exc))
        await _close_stream_forcefully(stream)
        raise
    except BaseException:
        await _close_stream_forcefully(stream)
        raise
    return TcpSender(spec, _detach(stream), peer, window)
