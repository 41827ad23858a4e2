"""Verbs backend: the ring protocol over RDMA, one reliable-connected (RC) queue pair per channel.

The receiver's ring is registered memory; the sender writes each buffer straight into the next
remote slot with RDMA WRITE, and the receiver polls footers in its own memory exactly as it does
for the in-process and shared-memory rings (acquire loads of the flag byte). Credits flow back
the same way, as an RDMA WRITE of the released counter into the sender's registered credit word.
Nothing above the backend hooks changes: footers, sequence numbers, credit arithmetic, runs and
validation are the protocol of `_channel`.

Memory, per channel::

    receiver   ring       slots x slot_size, page-aligned, LOCAL_WRITE | REMOTE_WRITE
               scratch    64 bytes after the ring, REMOTE_WRITE (target of the sender's flushes)
               sources    64 u64 words, local: the values its credit WRITEs read
    sender     staging    slots x slot_size, local: reserve()/post() fill it, WRITEs read it
               credit     one u64, LOCAL_WRITE | REMOTE_WRITE: the receiver's released counter

Footer last. InfiniBand guarantees that the work requests of one RC queue pair are executed in
order, but not in which order the bytes of one RDMA WRITE are placed in remote memory. So a
published slot is written as separate WRITEs, split right before each flag byte: payload and the
first 31 footer bytes first, the flag byte in a later WRITE. A run of k full slots is one
contiguous region, written as k + 1 WRITEs (`[payload0 + footer0]`, `[flag0 + payload1 +
footer1]`, ..., `[flag(k-1)]`); slots with a shorter payload cost one more WRITE each (only
`nbytes` of the payload travel). A poller that sees the flag therefore sees the whole buffer.
The last WRITE of each publication carries an immediate value: it consumes a receive request at
the receiver and so produces a completion there, which is what wakes a parked receiver.
(The same holds for credits: each is a WRITE with immediate.)

Signalling. Only one WRITE in `sig_every` buffers (by default a quarter of the ring, at most
32) asks for a completion (and so does any publication
when no signalled WRITE is outstanding, so a slow producer learns of completions early). A
completion of a signalled WRITE implies that every earlier WRITE on the queue pair completed. A
staging slot is reused only once the WRITEs that read it completed: the sender's credit count is
``min(credit word, buffers whose WRITEs completed)`` (a credit alone is not enough: an RC
retransmission could still read the slot). A sender that would wait on a completion nobody
asked for posts one signalled 8-byte WRITE into the receiver's scratch area first (a flush).

Completion polling is a coroutine, `drive()`: it polls the completion queue, yields to the other
tasks at once when it is empty, and after a few empty polls arms the completion channel
(`req_notify`) and parks on its file descriptor (`trio.lowlevel.wait_readable`), so an idle
channel costs no CPU. (pyverbs 44 does not expose the channel's descriptor; it is found as the
one `[infinibandevent]` descriptor the channel's creation added. Where that fails, the drive
sleeps for a millisecond between polls instead.)

Set-up and teardown run over a TCP control connection that stays open for the channel's life::

    sender -> receiver   cluster-secret handshake (_auth); nothing is sent before it succeeds
    sender -> receiver   hello   {ring spec, QP number, PSN, GID/LID, MTU, credit word addr/rkey}
    receiver -> sender   accept  {QP number, PSN, GID/LID, MTU, ring addr/rkey}  (QP now at RTS)
                         or      {"error": why}   (ring spec mismatch, no device, ...)
    sender -> receiver   ready   (the sender's QP is at RTS)
    ...  RDMA traffic  ...
    sender -> receiver   b"B"    (END_OF_STREAM has landed; the sender is going)
    receiver -> sender   EOF     (the receiver will write no more credits)

Messages are a u32 length and JSON. The end of the control connection without that goodbye
means the peer is gone: the channel closes with ChannelClosed naming the peer (the receiver
still delivers every buffer that landed before), and so does an error completion. Nothing else
in the process is affected.

Device, port and GID index are discovered: the first device with an ACTIVE port; on Ethernet
(RoCE) the first RoCE v2 GID, preferring an IPv4-mapped one; on InfiniBand GID 0 and the LID.
Keyword arguments (`device`, `ib_port`, `gid_index`) or the environment (`SLASHRT_VERBS_DEVICE`,
`SLASHRT_VERBS_PORT`, `SLASHRT_VERBS_GID_INDEX`) override each choice.

Usage::

    async with open_verbs_listener(spec, secret) as listener:   # TCP on 127.0.0.1, a free port
        (receiver,) = await accept_authenticated(listener)
    sender = await connect_verbs(listener.address, spec, secret)
    # run sender.drive() and receiver.drive() in nurseries beside the code using them
    # (above the transport layer, `_registry.open_channels` opens channels and runs them)

Both ends must run `drive()` (a second call while one runs waits for it): it reaps completions, reposts receive requests, returns deferred
credits and wakes parked tasks. Beyond the channel protocol: `await sender.wait_written()` parks
until every posted buffer is in the receiver's ring (`sender.written` counts them),
`sender.stats` counts WRITEs, publications, signalled WRITEs and flushes, and `close()` on
either end releases everything at once (`aclose()` on a sender first delivers END_OF_STREAM).
`$SLASHRT_VERBS_IDLE_POLLS` sets how many empty polls a drive makes before it parks (default 8).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import mmap
import os
import secrets
import socket
import struct
from collections.abc import AsyncIterator

import attrs
import numpy as np
import structlog
import trio

from slashrt import _kernels as kernels
from slashrt._buffer import FOOTER_SIZE, FULL
from slashrt._logging import fault_level
from slashrt.errors import ChannelClosed, MalformedBuffer
from slashrt.transport._accept import (
    PORT_BACKLOG, TcpAcceptor, TcpPortSocket, bind_tcp, peer_name, refuse_named, stream_authenticator,
)
from slashrt.transport._auth import HANDSHAKE_TIMEOUT, client_handshake, receive_exactly, server_handshake
from slashrt.transport._channel import ChannelSilent, DrivenReceiver, RingSpec, RunningDrive, Sender
from slashrt.transport._pool import GrantTable, Grants, MediumPool, SlotPool, SlotViews
from slashrt.transport._port import ChannelPort, channel_of

# pyverbs configures the root logger when it is imported (logging.basicConfig in pyverbs.base);
# undo that so that importing this backend leaves the application's logging as it was.
_root_handlers = list(logging.root.handlers)
_root_level = logging.root.level
try:
    import pyverbs.enums as e
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ, CompChannel
    from pyverbs.device import Context, get_device_list
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.pyverbs_error import PyverbsError
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR
except ImportError as exc:  # pragma: no cover - depends on the machine
    raise ImportError(
        "the verbs transport needs pyverbs (rdma-core's Python bindings, Debian package "
        f"python3-pyverbs; scripts/rdma-vm-setup.sh links it into the venv): {exc}"
    ) from exc
finally:
    if not _root_handlers:
        for _h in list(logging.root.handlers):
            logging.root.removeHandler(_h)
    logging.root.setLevel(_root_level)

__all__ = [
    "DeviceChoice",
    "VerbsListener",
    "VerbsReceiver",
    "VerbsSender",
    "connect_verbs",
    "discover_device",
    "open_verbs_listener",
]

log = structlog.get_logger("slashrt.transport.verbs")

PROTOCOL = "slashrt-verbs"
VERSION = 2  # 2: a pooled channel (`_pool`): the accept names its grant window and first grants
PAGE = mmap.PAGESIZE
SCRATCH = 64  # bytes after the receiver's ring: the target of the sender's flush WRITEs
MAX_POOL_WINDOW = 1024  # the most slots a pooled channel may hold: its grant table at the sender (4 KiB)
CREDIT_SOURCES = 64  # the receiver's ring of source words for credit WRITEs
CREDIT_SIG_EVERY = 16  # one signalled credit WRITE in this many
SENDER_RECVS = 128  # receive requests the sender keeps posted (one per credit WRITE arriving)
# Empty completion-queue polls (yielding to the other tasks in between) before a drive parks on
# the completion channel: more trades CPU for latency. $SLASHRT_VERBS_IDLE_POLLS overrides.
IDLE_POLLS = int(os.environ.get("SLASHRT_VERBS_IDLE_POLLS", "") or 8)
POLL_BATCH = 32  # completions taken per poll call
YIELD_COMPLETIONS = 256  # a busy drive yields to the other tasks after this many completions
FALLBACK_SLEEP = 0.001  # seconds between polls when the channel's descriptor is unknown
CLOSE_TIMEOUT = 5.0  # how long a closing sender waits for its last completions and the goodbye
MAX_MESSAGE = 64 * 1024  # control messages are small JSON objects
# RC retransmission: the local ACK timeout is 4.096 us * 2**QP_TIMEOUT (about 0.27 s), retried
# QP_RETRY times; receiver-not-ready retries are unlimited (7).
QP_TIMEOUT = 16
QP_RETRY = 7
QP_MIN_RNR_TIMER = 12  # 0.64 ms

_RECV = 1 << 63  # wr_id bit of receive requests (an error completion's opcode is undefined)
_FLUSH = 1 << 62  # wr_id bit of the sender's flush WRITE
_SENDER, _RECEIVER = "sender", "receiver"
_MSG = struct.Struct(">I")
_U32 = struct.Struct("<I")
_NBYTES_AT = 4  # offset of nbytes inside a footer (see slashrt._buffer)
_GOODBYE = b"B"

_ACCESS_LOCAL = e.IBV_ACCESS_LOCAL_WRITE
_ACCESS_REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE

_WC_STATUS = {
    getattr(e, "IBV_WC_" + name): "IBV_WC_" + name
    for name in (
        "SUCCESS LOC_LEN_ERR LOC_QP_OP_ERR LOC_EEC_OP_ERR LOC_PROT_ERR WR_FLUSH_ERR MW_BIND_ERR "
        "BAD_RESP_ERR LOC_ACCESS_ERR REM_INV_REQ_ERR REM_ACCESS_ERR REM_OP_ERR RETRY_EXC_ERR "
        "RNR_RETRY_EXC_ERR LOC_RDD_VIOL_ERR REM_INV_RD_REQ_ERR REM_ABORT_ERR INV_EECN_ERR "
        "INV_EEC_STATE_ERR FATAL_ERR RESP_TIMEOUT_ERR GENERAL_ERR"
    ).split()
    if hasattr(e, "IBV_WC_" + name)
}
_WC_HINT = {
    e.IBV_WC_RETRY_EXC_ERR: "the peer stopped acknowledging: its process or queue pair is gone or unreachable",
    e.IBV_WC_REM_ACCESS_ERR: "the peer refused access to its memory (a wrong key or address)",
    e.IBV_WC_WR_FLUSH_ERR: "the queue pair is in the error state",
}


def _wc_error(wc, what: str, peer: str) -> ChannelClosed:
    name = _WC_STATUS.get(wc.status, f"status {wc.status}")
    hint = _WC_HINT.get(wc.status)
    return ChannelClosed(f"{what} with {peer} failed: {name}" + (f" ({hint})" if hint else ""))


class _Stop(Exception):
    """Ends a drive's completion loop (the channel failed or ended; the reason is recorded)."""


# -- device discovery ----------------------------------------------------------------------------


@attrs.frozen
class DeviceChoice:
    """The RDMA device, port and GID a channel end uses."""

    name: str
    port: int
    gid_index: int
    gid: str  # 8 colon-separated 16-bit words, as pyverbs prints it
    ethernet: bool  # RoCE (global routing by GID) rather than InfiniBand (LID)
    lid: int
    mtu: int  # the port's active MTU (an ibv_mtu enum value)


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {text!r}") from None


def _gid_type(name: str, port: int, index: int, ctx) -> str | None:
    try:
        with open(f"/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}") as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        kind = ctx.query_gid_type(port, index)
    except (PyverbsError, AttributeError):
        return None
    return "RoCE v2" if kind == getattr(e, "IBV_GID_TYPE_SYSFS_ROCE_V2", 1) else "IB/RoCE v1"


def _gid_words(gid) -> str:
    text = str(gid.gid if hasattr(gid, "gid") else gid).strip()
    return text


def _is_zero_gid(text: str) -> bool:
    return not text.replace(":", "").strip("0")


def _is_ipv4_mapped(text: str) -> bool:
    digits = text.replace(":", "").lower()
    return len(digits) == 32 and digits.startswith("0" * 20 + "ffff")


def discover_device(device: str | None = None, ib_port: int | None = None, gid_index: int | None = None) -> DeviceChoice:
    """Pick the device, port and GID index a channel end uses (see the module docstring).

    Raises ChannelClosed naming what is missing: no RDMA devices at all, the named device
    absent, no ACTIVE port, no RoCE v2 GID."""
    device = device or os.environ.get("SLASHRT_VERBS_DEVICE") or None
    ib_port = ib_port if ib_port is not None else _env_int("SLASHRT_VERBS_PORT")
    gid_index = gid_index if gid_index is not None else _env_int("SLASHRT_VERBS_GID_INDEX")
    try:
        names = [d.name.decode() for d in get_device_list()]
    except PyverbsError as exc:
        raise ChannelClosed(f"no RDMA devices on this machine ({exc})") from None
    if not names:
        raise ChannelClosed("no RDMA devices on this machine (ibv_get_device_list is empty)")
    if device is not None and device not in names:
        raise ChannelClosed(f"RDMA device {device!r} not found (devices: {', '.join(names)})")
    problems = []
    for name in [device] if device else names:
        try:
            ctx = Context(name=name)
        except PyverbsError as exc:
            problems.append(f"{name}: cannot open ({exc})")
            continue
        try:
            nports = ctx.query_device().phys_port_cnt
            for port in [ib_port] if ib_port is not None else range(1, nports + 1):
                try:
                    attr = ctx.query_port(port)
                except PyverbsError as exc:
                    problems.append(f"{name} port {port}: {exc}")
                    continue
                if attr.state != e.IBV_PORT_ACTIVE:
                    problems.append(f"{name} port {port} is not ACTIVE")
                    continue
                ethernet = attr.link_layer == e.IBV_LINK_LAYER_ETHERNET
                index = gid_index
                if index is None:
                    index = 0 if not ethernet else _pick_roce_v2_gid(ctx, name, port, attr.gid_tbl_len)
                    if index is None:
                        problems.append(f"{name} port {port} has no RoCE v2 GID (is the netdev addressed?)")
                        continue
                try:
                    gid = _gid_words(ctx.query_gid(port, index))
                except PyverbsError as exc:
                    problems.append(f"{name} port {port} GID index {index}: {exc}")
                    continue
                if ethernet and _is_zero_gid(gid):
                    problems.append(f"{name} port {port} GID index {index} is empty")
                    continue
                return DeviceChoice(name, port, index, gid, ethernet, int(attr.lid), int(attr.active_mtu))
        finally:
            ctx.close()
    raise ChannelClosed("no usable RDMA port: " + "; ".join(problems))


def _pick_roce_v2_gid(ctx, name: str, port: int, table: int) -> int | None:
    found = []
    for index in range(min(table, 256)):
        kind = _gid_type(name, port, index, ctx)
        if kind is None:
            if index > 16:
                break
            continue
        if kind.lower() != "roce v2":
            continue
        try:
            gid = _gid_words(ctx.query_gid(port, index))
        except PyverbsError:
            continue
        if _is_zero_gid(gid):
            continue
        if _is_ipv4_mapped(gid):
            return index
        found.append(index)
    return found[0] if found else None


# -- verbs resources of one channel end ----------------------------------------------------------


def _alloc(nbytes: int) -> np.ndarray:
    """Zeroed, page-aligned memory owned by Python (views of it stay valid after deregistration)."""
    size = -(-max(nbytes, 1) // PAGE) * PAGE
    return np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)


def _fd_links() -> dict[int, str]:
    links = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            links[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except (OSError, ValueError):
            pass  # the descriptor of the listing itself, or one closed meanwhile
    return links


class _Endpoint:
    """Context, protection domain, completion channel and queue, and the RC queue pair of one
    channel end. Closing it (closing the context) releases all of them."""

    def __init__(self, choice: DeviceChoice, *, max_send_wr: int, max_recv_wr: int):
        self.choice = choice
        self.closed = False
        self.ctx = Context(name=choice.name)
        self.event_fd: int | None = None
        try:
            dev = self.ctx.query_device()
            if max(max_send_wr, max_recv_wr) > dev.max_qp_wr:
                raise ChannelClosed(
                    f"this ring needs {max(max_send_wr, max_recv_wr)} work requests per queue, "
                    f"{choice.name} allows {dev.max_qp_wr}: use fewer slots"
                )
            cqe = max_send_wr + max_recv_wr + 16
            if cqe > dev.max_cqe:
                raise ChannelClosed(f"this ring needs a completion queue of {cqe} entries, {choice.name} allows {dev.max_cqe}")
            self.pd = PD(self.ctx)
            try:
                before = _fd_links()
            except OSError:
                before = None
            self.channel = CompChannel(self.ctx)
            if before is not None:
                self.event_fd = _new_event_fd(before)
            self.cq = CQ(self.ctx, cqe, None, self.channel, 0)
            cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=1, max_recv_sge=1)
            self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0))
            self.psn = secrets.randbits(24)
        except BaseException:
            self.ctx.close()
            raise
        self._mrs: list = []

    def register(self, array: np.ndarray, access: int):
        try:
            mr = MR(self.pd, array.nbytes, access, address=array.ctypes.data)
        except PyverbsError as exc:
            raise ChannelClosed(
                f"cannot register {array.nbytes} bytes with {self.choice.name}: {exc} "
                "(without CAP_IPC_LOCK, raise the locked-memory limit: ulimit -l)"
            ) from None
        self._mrs.append(mr)
        return mr

    def info(self) -> dict:
        c = self.choice
        return {"qpn": self.qp.qp_num, "psn": self.psn, "gid": c.gid, "lid": c.lid, "mtu": c.mtu}

    def connect(self, remote: dict) -> None:
        """RESET -> INIT -> RTR -> RTS, connected to the remote queue pair."""
        c = self.choice
        attr = QPAttr(port_num=c.port)
        attr.qp_access_flags = _ACCESS_REMOTE
        attr.path_mtu = min(c.mtu, remote["mtu"])
        attr.dest_qp_num = remote["qpn"]
        attr.rq_psn = remote["psn"]
        attr.sq_psn = self.psn
        attr.max_rd_atomic = 1
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = QP_MIN_RNR_TIMER
        attr.timeout = QP_TIMEOUT
        attr.retry_cnt = QP_RETRY
        attr.rnr_retry = 7  # unlimited
        if c.ethernet:
            dgid = GID()
            dgid.gid = remote["gid"]
            attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=dgid, sgid_index=c.gid_index), is_global=1, port_num=c.port)
        else:
            attr.ah_attr = AHAttr(port_num=c.port, dlid=remote["lid"], is_global=0)
        self.qp.to_rts(attr)

    def close(self) -> None:
        self.closed = True
        if self.event_fd is not None:
            with contextlib.suppress(RuntimeError):  # outside trio nobody can be waiting on it
                trio.lowlevel.notify_closing(self.event_fd)
        try:
            self.ctx.close()  # closes the QP, CQ, MRs, channel and PD with it
        except PyverbsError as exc:
            log.warning("verbs resources not released cleanly", device=self.choice.name, reason=str(exc))


def _new_event_fd(before: dict[int, str]) -> int | None:
    """The descriptor a CompChannel creation added (pyverbs 44 does not expose it)."""
    try:
        after = _fd_links()
    except OSError:
        return None
    new = [fd for fd, link in after.items() if before.get(fd) != link and "infinibandevent" in link]
    if len(new) != 1:
        log.warning("completion channel descriptor not found; idle channels will poll every millisecond", candidates=new)
        return None
    os.set_blocking(new[0], False)
    return new[0]


async def _pump(ep: _Endpoint, handle) -> None:
    """Poll the completion queue for ever, handing completions to `handle`; yield when it is
    empty and park on the completion channel when it stays empty. `handle` raises _Stop to end."""
    cq = ep.cq
    idle = 0
    budget = YIELD_COMPLETIONS
    while not ep.closed:  # checked after every await: a closed CQ must never be touched
        n, wcs = cq.poll(POLL_BATCH)
        if n:
            handle(wcs)
            idle = 0
            budget -= n
            if budget <= 0:
                budget = YIELD_COMPLETIONS
                await trio.lowlevel.checkpoint()
            continue
        budget = YIELD_COMPLETIONS
        if idle < IDLE_POLLS:
            idle += 1
            await trio.lowlevel.checkpoint()
            continue
        idle = 0
        if ep.event_fd is None:
            await trio.sleep(FALLBACK_SLEEP)
            continue
        cq.req_notify()
        n, wcs = cq.poll(POLL_BATCH)  # a completion that came before the arming sends no event
        if n:
            handle(wcs)
            continue
        await trio.lowlevel.wait_readable(ep.event_fd)
        try:
            ep.channel.get_cq_event(cq)
        except PyverbsError:
            continue  # nothing there after all (a stale readiness): poll and re-arm
        cq.ack_events(1)


async def _drive(end, role: str, failed: BaseException | None) -> None:
    """The drive of either end: pump its completion queue beside a watch of the control
    connection until the channel ends or fails (recorded by `end._fail`, never raised)."""
    if end._drive is not None:  # one drive moves the bytes; a second call waits for it
        await end._drive.ended.wait()
        return
    if end._ep is None or end._sock is None or failed is not None:
        return
    end._drive = running = RunningDrive()
    try:
        with running.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(end._watch)
                try:
                    await _pump(end._ep, end._on_completions)
                except _Stop:
                    pass
                except trio.ClosedResourceError:
                    pass  # closed locally
                except PyverbsError as exc:
                    end._fail(
                        ChannelClosed(f"polling the completion queue of the channel with {end.peer} failed: {exc}")
                    )
                nursery.cancel_scope.cancel()
    finally:
        end._drive = None
        running.ended.set()


def _detach(stream: trio.SocketStream) -> socket.socket:
    tsock = stream.socket
    sock = socket.socket(tsock.family, tsock.type, tsock.proto, fileno=tsock.detach())
    sock.setblocking(False)
    return sock


def _close_socket(sock: socket.socket | None) -> None:
    if sock is not None and sock.fileno() != -1:
        with contextlib.suppress(RuntimeError):
            trio.lowlevel.notify_closing(sock)
        sock.close()


async def _read_control(sock: socket.socket | None) -> bytes:
    """The next bytes from the control connection; b'' at its end (or when it was reset, or
    closed here: an end closed between its drive starting and its watch running has none)."""
    if sock is None:
        return b""
    while True:
        try:
            return sock.recv(64)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
        except OSError:  # reset by the peer (or closed here)
            return b""


# pyverbs (44 and later, so far) never frees the C memory of SGE and SendWR objects: their
# destructor is spelled `__dealloc` instead of `__dealloc__`. So the hot path reuses a fixed pool
# of them, pointing each SendWR at its SGE object (`sg_list`) so that changing the SGE changes
# the WR. A pyverbs with a real destructor would free that SGE memory twice; there each chain is
# built from fresh objects instead (which are then freed).
_REUSE_WRS = hasattr(SendWR, "_SendWR__dealloc") and hasattr(SGE, "_SGE__dealloc")


class _WorkRequests:
    """RDMA WRITE chains into the remote ring. With a reusable pool, each cell has one SGE and
    two SendWRs over it: `link`, whose next pointer is set per use, and `tail`, whose next
    pointer is never set (pyverbs cannot reset it to NULL), to end a chain."""

    def __init__(self, n: int, lkey: int, rkey: int, local: int, remote: int):
        self.lkey, self.rkey, self.local, self.remote = lkey, rkey, local, remote
        self.sges = []
        self.links = []
        self.tails = []
        if not _REUSE_WRS:
            return
        for _ in range(n):
            sge = SGE(0, 0, lkey)
            self.sges.append(sge)
            for out in (self.links, self.tails):
                wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=0)
                wr.sg_list = sge  # the WR reads the SGE object itself: its fields can change
                out.append(wr)

    def chain(self, ranges: list[list[int]], imm: int, flags: int, wr_id: int, shift: int = 0):
        """The head of a chain writing each [start, end) of the ring, in order, to the remote
        ring's [start + shift, end + shift) (a pooled channel's granted slots); the last WRITE
        carries `imm`, `flags` and `wr_id`. Returns (head, objects to keep alive until posted)."""
        last = len(ranges) - 1
        head = prev = None
        keep = []
        for i, (start, end) in enumerate(ranges):
            if _REUSE_WRS:
                sge = self.sges[i]
                sge.addr = self.local + start
                sge.length = end - start
                wr = self.tails[i] if i == last else self.links[i]
                if i == last:
                    wr.opcode = e.IBV_WR_RDMA_WRITE_WITH_IMM
                    wr.imm_data = imm
                    wr.send_flags = flags
                    wr.wr_id = wr_id
            else:
                sge = SGE(self.local + start, end - start, self.lkey)
                if i == last:
                    wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge], imm_data=imm, send_flags=flags)
                else:
                    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=0)
                keep.append((sge, wr))
            wr.set_wr_rdma(self.rkey, self.remote + start + shift)
            if prev is None:
                head = wr
            else:
                prev.next_wr = wr
            prev = wr
        return head, keep


# -- control messages ------------------------------------------------------------------------------


async def _send_message(stream: trio.SocketStream, obj: dict, peer: str) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    try:
        await stream.send_all(_MSG.pack(len(data)) + data)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise ChannelClosed(f"connection to {peer} lost while setting up the channel: {exc}") from None


async def _receive_message(stream: trio.SocketStream, peer: str, what: str) -> dict:
    with trio.move_on_after(HANDSHAKE_TIMEOUT) as scope:
        try:
            (n,) = _MSG.unpack(await receive_exactly(stream, _MSG.size, what))
            if n > MAX_MESSAGE:
                raise ChannelClosed(f"peer {peer} sent {what} of {n} bytes (at most {MAX_MESSAGE})")
            data = await receive_exactly(stream, n, what)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ChannelClosed(f"connection to {peer} lost while receiving {what}: {exc}") from None
        except ChannelClosed as exc:
            raise ChannelClosed(f"{exc} (peer {peer})") from None
    if scope.cancelled_caught:
        raise ChannelClosed(f"peer {peer} did not send {what} within {HANDSHAKE_TIMEOUT} s")
    try:
        obj = json.loads(data)
    except ValueError:
        raise ChannelClosed(f"peer {peer} sent {what} that is not JSON") from None
    if not isinstance(obj, dict):
        raise ChannelClosed(f"peer {peer} sent {what} that is not a JSON object")
    if "error" in obj:
        raise ChannelClosed(f"peer {peer} refused the channel: {obj['error']}")
    return obj


def _fields(obj: dict, peer: str, what: str, **types) -> dict:
    out = {}
    for name, kind in types.items():
        value = obj.get(name)
        if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0 or value >= 1 << 64):
            raise ChannelClosed(f"peer {peer} sent {what} without a valid {name!r}")
        if kind is str and not isinstance(value, str):
            raise ChannelClosed(f"peer {peer} sent {what} without a valid {name!r}")
        out[name] = value
    if len(out.get("gid", "").replace(":", "")) not in (0, 32):
        raise ChannelClosed(f"peer {peer} sent {what} with a malformed GID {out['gid']!r}")
    return out


_QP_FIELDS = dict(qpn=int, psn=int, gid=str, lid=int, mtu=int)


def _spec_fields(spec: RingSpec) -> dict:
    return {"slots": spec.slots, "slot_size": spec.slot_size, "record_size": spec.record_size or 0}


def _spec_mismatch(spec: RingSpec, hello: dict, peer: str) -> str | None:
    ours = (spec.slots, spec.slot_size, spec.record_size)
    theirs = (hello.get("slots"), hello.get("slot_size"), hello.get("record_size") or None)
    if theirs == ours:
        return None
    return (
        f"ring spec mismatch with {peer}: this end has slots={ours[0]}, slot_size={ours[1]}, "
        f"record_size={ours[2]}; the peer has slots={theirs[0]}, slot_size={theirs[1]}, record_size={theirs[2]}"
    )


# -- sender ------------------------------------------------------------------------------------------


class VerbsSender(Sender):
    """Producer end over RDMA. Run `drive()` in a nursery while the channel is in use."""

    def __init__(self, spec: RingSpec, choice: DeviceChoice, *, sig_every: int | None = None):
        super().__init__(spec)
        self.peer = "?"
        nslots, ss = spec.slots, spec.slot_size
        self.sig_every = max(1, sig_every if sig_every is not None else min(32, nslots // 4))
        # At most 3 WRITEs per buffer (payload, footer, flag) for every staging slot not yet
        # known written, plus the flush.
        self._max_wr = 3 * nslots + 2
        self._ep: _Endpoint | None = _Endpoint(choice, max_send_wr=self._max_wr, max_recv_wr=SENDER_RECVS)
        try:
            self._mem = _alloc(spec.ring_bytes + SCRATCH)
            self._stage = self._mem[: spec.ring_bytes]
            self._slots = [self._stage[i * ss : (i + 1) * ss] for i in range(nslots)]
            # the credit word; a pooled channel's grant table after it (`_pool`: the receiver writes both)
            self._credit_mem = _alloc(8 + 4 * MAX_POOL_WINDOW)
            self._mr = self._ep.register(self._mem, _ACCESS_LOCAL)
            self._credit_mr = self._ep.register(self._credit_mem, _ACCESS_REMOTE)
            # receive requests for the receiver's credit WRITEs (immediate data only: the
            # scatter entry is never written)
            sink = self._mem.ctypes.data + spec.ring_bytes + 8
            self._recv_sge = SGE(sink, 8, self._mr.lkey)
            self._recvs = [RecvWR(wr_id=_RECV | i, num_sge=1, sg=[self._recv_sge]) for i in range(SENDER_RECVS)]
        except BaseException:
            self._ep.close()
            raise
        self._wrs: _WorkRequests | None = None
        self._flush_wr = None
        self._remote_ring = 0
        self._sock: socket.socket | None = None
        # progress counters (buffers)
        self._pub = 0  # buffers handed to the queue pair
        self._done = 0  # buffers whose WRITEs are known complete
        self._credit = 0  # the receiver's released counter, as last read
        self._table: GrantTable | None = None  # a pooled channel's grant table (the receiver writes it)
        self._granted = spec.slots  # a pooled channel's limit, as its last credit WRITE's immediate said
        self._sig_mark = 0  # _pub at the last signalled WRITE
        self._sig_queue: collections.deque[tuple[int, int]] = collections.deque()  # (pub, wr count) per signalled WRITE
        self._wr_posted = 0
        self._wr_done = 0
        # what went out: WRITEs, publications (chains), signalled chains, flush WRITEs
        self.stats = {"writes": 0, "publications": 0, "signalled": 0, "flushes": 0}
        self._credit_lot = trio.lowlevel.ParkingLot()  # wait_credit waits here
        self._progress_lot = trio.lowlevel.ParkingLot()  # aclose/wait_written wait here
        self._peer_done = trio.Event()  # the receiver answered our goodbye
        self._delivered = False  # END_OF_STREAM known written
        self._goodbye_sent = False
        self._drive: RunningDrive | None = None
        self._own_drive = False  # aclose() runs the drive itself (nobody else had started one)
        self._log = log.bind(end=_SENDER)

    # -- set-up ------------------------------------------------------------------------------------
    def _hello(self) -> dict:
        return {
            "proto": PROTOCOL,
            "version": VERSION,
            **_spec_fields(self.spec),
            **self._ep.info(),
            "credit_addr": self._credit_mem.ctypes.data,
            "credit_rkey": self._credit_mr.rkey,
        }

    def _connect(self, remote: dict, peer: str) -> None:
        self.peer = peer
        self._log = log.bind(peer=peer, end=_SENDER)
        self._remote_ring = remote["ring_addr"]
        window = remote.get("pool_window")
        if window:  # a channel of the receiver's slot pool: the ring is the pool, slots as granted
            if not isinstance(window, int) or not self.spec.slots <= window <= MAX_POOL_WINDOW:
                raise ChannelClosed(f"peer {peer} announced a grant window of {window!r} slots "
                                    f"(from {self.spec.slots} to {MAX_POOL_WINDOW})")
            self._table = GrantTable(self._credit_mem[8 : 8 + 4 * window].view(np.uint32))
            first = remote.get("pool_grants")
            if not (isinstance(first, list) and len(first) == self.spec.slots
                    and all(isinstance(x, int) and 0 <= x < 1 << 32 for x in first)):
                raise ChannelClosed(f"peer {peer} sent no valid first grants of its pool")
            self._table.table[: self.spec.slots] = first
        self._wrs = _WorkRequests(
            2 * self.spec.slots + 2, self._mr.lkey, remote["ring_rkey"], self._mem.ctypes.data, self._remote_ring
        )
        flush_sge = SGE(self._mem.ctypes.data + self.spec.ring_bytes, 8, self._mr.lkey)
        self._flush_wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[flush_sge], send_flags=e.IBV_SEND_SIGNALED)
        self._flush_sge = flush_sge
        self._flush_wr.set_wr_rdma(remote["ring_rkey"], remote.get("scratch_addr", self._remote_ring + self.spec.ring_bytes))
        self._ep.connect(remote)
        # Receive requests can be posted from INIT on; the receiver writes its first credit
        # only after this end's "ready" and a buffer.
        for wr in self._recvs:
            self._ep.qp.post_recv(wr)

    # -- backend hooks -------------------------------------------------------------------------------
    def _slot(self, index):
        return self._slots[index]

    def _ring(self):
        return self._stage

    def _released(self):
        word = kernels.shm_load_u64(self._credit_mem, 0)
        if self._credit < word <= self._pub:  # monotonic and only for buffers sent: else torn or bogus
            self._credit = word
        return self._credit if self._credit < self._done else self._done

    def _limit(self):
        if self._table is None:
            return super()._limit()
        # the grants its completions confirmed (their table entries landed before), and no staging
        # slot reused before its WRITEs completed
        return min(self._granted, self._done + self.spec.slots)

    def _consecutive(self, seq, n):
        n = super()._consecutive(seq, n)  # the staging ring's
        return n if self._table is None else self._table.consecutive(seq, n)

    def _publish(self, index):
        self._write_slots(index, 1)

    def _publish_run(self, first, k):
        self._write_slots(first, k)

    async def _park_for_credit(self):
        if self.error is not None:
            raise self._failure()
        self._ensure_signal()
        if self.error is not None:  # the flush could not be posted
            raise self._failure()
        await self._credit_lot.park()
        if self.error is not None:
            raise self._failure()

    # -- a failed channel names its cause in every later call ---------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            getattr(self._log, fault_level(exc))("verbs channel closed", reason=str(exc), posted=self._posted,
                                                 written=self._done)
        self._credit_lot.unpark_all()
        self._progress_lot.unpark_all()
        self._peer_done.set()
        if self._drive is not None:
            self._drive.scope.cancel()

    # -- writing slots ---------------------------------------------------------------------------------
    def _write_slots(self, first: int, k: int) -> None:
        """Post the WRITEs of k consecutive staging slots into the same remote slots, each flag
        byte in a later WRITE than the rest of its slot (see the module docstring)."""
        if self._wrs is None:
            raise ChannelClosed("the channel is not connected")
        if self.error is not None:
            raise self._failure()
        ss, cap, stage = self.spec.slot_size, self.spec.payload_capacity, self._stage
        # a pooled channel's buffers go to the slots granted them (consecutive: `_consecutive`)
        shift = 0 if self._table is None else (self._table.slot_of(self._posted - k) - first) * ss
        # Byte ranges [start, end) of the ring, in posting order; a flag always starts a range.
        ranges: list[list[int]] = []
        cur: list[int] | None = None
        for index in range(first, first + k):
            base = index * ss
            flag = base + ss - 1
            nbytes = _U32.unpack_from(stage, flag + 1 - FOOTER_SIZE + _NBYTES_AT)[0]
            pieces = ((base, base + min(nbytes, cap)), (flag + 1 - FOOTER_SIZE, flag))
            for start, end in pieces:
                if start == end:
                    continue
                if cur is not None and cur[1] == start:
                    cur[1] = end
                else:
                    cur = [start, end]
                    ranges.append(cur)
            cur = [flag, flag + 1]
            ranges.append(cur)
        n = len(ranges)
        if self._wr_posted - self._wr_done + n + 1 > self._max_wr:  # cannot happen: staging reuse waits for completions
            raise self._fail_now(ChannelClosed(f"internal error: {n} WRITEs would overflow the send queue"))
        self._pub += k
        signal = self._pub - self._sig_mark >= self.sig_every or not self._sig_queue
        # The last WRITE carries an immediate value: it wakes a parked receiver.
        head, keep = self._wrs.chain(ranges, self._pub & 0xFFFFFFFF, e.IBV_SEND_SIGNALED if signal else 0, self._pub,
                                     shift)
        try:
            self._ep.qp.post_send(head)
        except PyverbsError as exc:
            raise self._fail_now(ChannelClosed(f"posting RDMA WRITEs to {self.peer} failed: {exc}")) from None
        del keep
        self._wr_posted += n
        self.stats["writes"] += n
        self.stats["publications"] += 1
        if signal:
            self.stats["signalled"] += 1
            self._sig_mark = self._pub
            self._sig_queue.append((self._pub, self._wr_posted))

    def _fail_now(self, exc: ChannelClosed) -> ChannelClosed:
        self._fail(exc)
        return self._failure()

    def _ensure_signal(self) -> None:
        """Make sure a completion will report every WRITE posted so far: if the last ones asked
        for none and no signalled WRITE is outstanding, post a signalled flush WRITE."""
        if self._sig_queue or self._sig_mark == self._pub or self._flush_wr is None or self.error is not None:
            return
        self.stats["flushes"] += 1
        self._flush_wr.wr_id = _FLUSH | self._pub
        try:
            self._ep.qp.post_send(self._flush_wr)
        except PyverbsError as exc:
            self._fail(ChannelClosed(f"posting a flush WRITE to {self.peer} failed: {exc}"))
            return
        self._wr_posted += 1
        self._sig_mark = self._pub
        self._sig_queue.append((self._pub, self._wr_posted))

    # -- completions ------------------------------------------------------------------------------------
    def _on_completions(self, wcs) -> None:
        credit = progress = False
        for wc in wcs:
            if wc.wr_id & _RECV:
                if wc.status != e.IBV_WC_SUCCESS:
                    self._fail(_wc_error(wc, "receiving credits", self.peer))
                    raise _Stop
                self._ep.qp.post_recv(self._recvs[wc.wr_id & 0xFFFF])
                if self._table is not None:  # the limit, low 32 bits: its table entries landed first
                    low = wc.imm_data
                    limit = (self._granted & ~0xFFFFFFFF) | low
                    if limit < self._granted:
                        limit += 1 << 32
                    if limit > self._pub + self._table.window:  # beyond any grant
                        self._fail(MalformedBuffer(f"receiver {self.peer} granted credit up to buffer {limit}, "
                                                   f"more than its grant window allows"))
                        raise _Stop
                    self._granted = limit
                credit = True
                continue
            if wc.status != e.IBV_WC_SUCCESS:
                self._fail(_wc_error(wc, "RDMA WRITE of buffers", self.peer))
                raise _Stop
            pub, wr_count = self._sig_queue.popleft()
            self._done = pub
            self._wr_done = wr_count
            progress = True
        if credit or progress:
            if self._credit_lot:
                self._credit_lot.unpark_all()
            if progress and self._progress_lot:
                self._progress_lot.unpark_all()

    @property
    def written(self) -> int:
        """Buffers whose RDMA WRITEs have completed (they are in the receiver's ring)."""
        return self._done

    async def wait_written(self) -> None:
        """Park until every posted buffer is known written into the receiver's ring (its WRITEs
        completed). Needs `drive()` running. Raises ChannelClosed if the channel failed."""
        while self._done < self._pub:
            self._ensure_signal()
            if self.error is not None:
                raise self._failure()
            await self._progress_lot.park()
        if self.error is not None:
            raise self._failure()

    # -- the drive ---------------------------------------------------------------------------------------
    async def drive(self) -> None:
        """Reap completions (written buffers, arriving credits) and watch the control connection
        until the channel ends or fails. Returns once the receiver acknowledged the end of the
        stream; a failure is recorded in `error` (and logged), never raised."""
        if self._own_drive:
            return  # aclose() drives this sender to its end
        await _drive(self, "sender", self.error)

    async def _watch(self) -> None:
        try:
            data = await _read_control(self._sock)
        except trio.ClosedResourceError:
            return
        if self._sock is None:
            return  # closed here
        if data:
            self._fail(ChannelClosed(f"receiver {self.peer} sent unexpected bytes on the control connection"))
            return
        # The receiver closed the control connection.
        if not self._goodbye_sent and self._closed and self.error is None:
            # END_OF_STREAM was posted: it landed if its WRITE completes (the receiver saw it).
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._wait_progress()
            if self._done >= self._pub and self.error is None:
                self._delivered = True
        if self._delivered or self._goodbye_sent:
            self._peer_done.set()
            if self._drive is not None:
                self._drive.scope.cancel()
            return
        self._fail(
            ChannelClosed(
                f"the receiver {self.peer} closed the channel "
                f"({self._posted - self._credit} buffers posted and not released)"
            )
        )

    async def _wait_progress(self) -> None:
        while self._done < self._pub and self.error is None:
            self._ensure_signal()
            if self.error is not None:
                return
            await self._progress_lot.park()

    # -- closing -------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Send END_OF_STREAM, wait until it is written into the receiver's ring, say goodbye on
        the control connection and wait (at most CLOSE_TIMEOUT) for the receiver's answer, then
        release everything. Raises ChannelClosed if the channel failed before the end of the
        stream was out. Runs the drive itself if nobody else does."""
        if self._ep is None:
            return
        try:
            if not self._closed and self.error is None and self._sock is not None:
                if self._drive is not None:
                    await self._finish()
                else:
                    # a drive the caller spawned but that has not started yet stands aside
                    self._own_drive = True
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_drive, self, _SENDER, self.error)
                        await self._finish()
                        nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            self.close()
        await trio.lowlevel.checkpoint()
        if self.error is not None and not self._delivered:
            raise self._failure()

    async def _finish(self) -> None:
        await Sender.aclose(self)  # END_OF_STREAM, through the usual credit wait
        with trio.move_on_after(CLOSE_TIMEOUT):
            await self._wait_progress()
        if self.error is not None or self._done < self._pub:
            if self.error is None:
                self._fail(ChannelClosed(f"END_OF_STREAM to {self.peer} was not written within {CLOSE_TIMEOUT} s"))
            return
        self._delivered = True
        if self._sock is None:
            return
        try:
            self._sock.send(_GOODBYE)
        except OSError:
            return  # the receiver is gone, but it has the whole stream
        self._goodbye_sent = True
        with trio.move_on_after(CLOSE_TIMEOUT):
            await self._peer_done.wait()

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        """Release the queue pair, memory registrations and control connection now (no
        END_OF_STREAM; the receiver sees the channel closed). Idempotent."""
        self._closed = True
        if self._drive is not None:
            self._drive.scope.cancel()
        _close_socket(self._sock)
        self._sock = None
        ep, self._ep = self._ep, None
        if ep is not None:
            self._wrs = None
            self._flush_wr = None
            ep.close()
        if self.error is None and not self._delivered:
            self.error = ChannelClosed(f"channel to {self.peer} closed by this sender")
        self._credit_lot.unpark_all()
        self._progress_lot.unpark_all()


# -- receiver --------------------------------------------------------------------------------------------


class VerbsReceiver(DrivenReceiver):
    """Consumer end over RDMA. Run `drive()` in a nursery beside the code that polls."""

    def __init__(self, spec: RingSpec, choice: DeviceChoice, pool: VerbsPool | None = None):
        super().__init__(spec)
        self.peer = "?"
        ss = spec.slot_size
        if pool is not None:  # a channel of a slot pool: its slots are the pool's, granted (`_pool`)
            self.grants = Grants(pool.slots)
        nslots = spec.slots if pool is None else pool.slots.window
        # Receive requests: one per publication with immediate data may be outstanding for each
        # buffer it may hold, and a few more while the drive catches up.
        self._nrecv = 2 * nslots + 32
        # a credit WRITE, and before it up to two of its grant table's entries
        self._ep: _Endpoint | None = _Endpoint(choice, max_send_wr=3 * CREDIT_SOURCES + 2, max_recv_wr=self._nrecv)
        try:
            self._mem = _alloc(spec.ring_bytes + SCRATCH) if pool is None else pool.memory
            self._ring_arr = self._mem[: spec.ring_bytes] if pool is None else pool.slots.memory
            self._slots = [self._ring_arr[i * ss : (i + 1) * ss] for i in range(spec.slots)] if pool is None \
                else SlotViews(self._ring_arr, ss)
            self._src = _alloc(CREDIT_SOURCES * 8 + 64)
            self._ring_mr = self._ep.register(self._mem, _ACCESS_REMOTE)
            self._src_mr = self._ep.register(self._src, _ACCESS_LOCAL)
            self._table_mr = None if pool is None else self._ep.register(pool.tables, _ACCESS_LOCAL)
            sink = self._src.ctypes.data + CREDIT_SOURCES * 8
            self._recv_sge = SGE(sink, 8, self._src_mr.lkey)
            self._recvs = [RecvWR(wr_id=_RECV | i, num_sge=1, sg=[self._recv_sge]) for i in range(self._nrecv)]
        except BaseException:
            self._ep.close()
            raise
        self._credit_wrs: list = []
        self._credit_sges: list = []
        self._credit_sent = 0 if pool is None else spec.slots  # released counter (pooled: limit) as last posted
        self._remote_table = 0  # a pooled channel's: where its sender keeps its grant table
        self._credit_writes = 0  # credit WRITEs posted
        self._credit_done = 0  # credit WRITEs known complete
        self._credit_sig_mark = 0
        self._credit_sig_outstanding = 0
        self._credit_batch = max(1, nslots // 4)
        self._sock: socket.socket | None = None
        self._data_lot = trio.lowlevel.ParkingLot()  # the poller parks here
        self._sender_done = False  # the sender said goodbye: the whole stream is in the ring
        self._drive: RunningDrive | None = None
        self._log = log.bind(end=_RECEIVER)

    # -- set-up ----------------------------------------------------------------------------------------
    def _accept_info(self) -> dict:
        return {
            "proto": PROTOCOL,
            "version": VERSION,
            **self._ep.info(),
            "ring_addr": self._mem.ctypes.data,
            "ring_rkey": self._ring_mr.rkey,
            "scratch_addr": self._mem.ctypes.data + len(self._mem) - SCRATCH,
            **({} if self.grants is None else {  # the grant window, and the first grants (its exclusive slots)
                "pool_window": self.grants.window, "pool_grants": self.grants.table[: self.spec.slots].tolist()}),
        }

    def _connect(self, hello: dict, peer: str) -> None:
        self.peer = peer
        self._log = log.bind(peer=peer, end=_RECEIVER)
        lkey = self._src_mr.lkey
        for i in range(CREDIT_SOURCES):
            sge = SGE(self._src.ctypes.data + 8 * i, 8, lkey)
            wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge], send_flags=0)
            wr.set_wr_rdma(hello["credit_rkey"], hello["credit_addr"])
            self._credit_sges.append(sge)
            self._credit_wrs.append(wr)
        self._remote_table = hello["credit_addr"] + 8
        self._credit_rkey = hello["credit_rkey"]
        self._ep.connect(hello)
        # Before the accept goes out: the sender writes only after receiving it.
        for wr in self._recvs:
            self._ep.qp.post_recv(wr)

    # -- backend hooks ---------------------------------------------------------------------------------
    def _slot(self, index):
        return self._slots[index]

    def _ring(self):
        return self._ring_arr

    def _credit_value(self) -> int:
        """What a credit WRITE carries: the released counter, or a pooled channel's limit."""
        return self._released_count if self.grants is None else self.grants.granted

    def _return_credits(self, released):
        # Coalesce: write when a batch has built up, or when nothing is left to poll (the sender
        # may be waiting for exactly these credits). Parking or an empty poll writes the rest.
        if self._credit_value() - self._credit_sent >= self._credit_batch or (
            self._polled == released and self._slots[self._slot_of(self._polled)][-1] != FULL
        ):
            self._post_credit()

    async def _park_for_data(self):
        if self._credit_value() > self._credit_sent:
            self._post_credit()
        await self._data_lot.park()

    def _write_grants(self, first: int, end: int) -> bool:
        """Post the WRITEs of grant table entries first .. end - 1 into the sender's copy (one,
        or two where they wrap), before the credit WRITE that announces them."""
        window = self.grants.window
        base = self.grants.table.ctypes.data
        at, n = first % window, end - first
        pieces = [(at, min(n, window - at))] + ([(0, n - (window - at))] if at + n > window else [])
        for start, count in pieces:
            sge = SGE(base + 4 * start, 4 * count, self._table_mr.lkey)
            wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=0)
            wr.set_wr_rdma(self._credit_rkey, self._remote_table + 4 * start)
            try:
                self._ep.qp.post_send(wr)
            except PyverbsError as exc:
                self._fail(ChannelClosed(f"returning credits to {self.peer} failed: {exc}"))
                return False
        return True

    def _post_credit(self) -> None:
        value = self._credit_value()
        if value <= self._credit_sent or self._ep is None or not self._credit_wrs:
            return
        if self._peer_error is not None or self._sender_done or self.error is not None:
            return
        w = self._credit_writes
        if w - self._credit_done >= CREDIT_SOURCES:
            return  # every source word is in flight: the drive retries when one completes
        if self.grants is not None and not self._write_grants(self._credit_sent, value):
            return
        i = w % CREDIT_SOURCES
        kernels.shm_store_u64(self._src, 8 * i, value)
        wr = self._credit_wrs[i]
        signal = w + 1 - self._credit_sig_mark >= CREDIT_SIG_EVERY or self._credit_sig_outstanding == 0
        wr.imm_data = value & 0xFFFFFFFF
        wr.send_flags = e.IBV_SEND_SIGNALED if signal else 0
        wr.wr_id = w + 1
        try:
            self._ep.qp.post_send(wr)
        except PyverbsError as exc:
            self._fail(ChannelClosed(f"returning credits to {self.peer} failed: {exc}"))
            return
        self._credit_writes = w + 1
        self._credit_sent = value
        if signal:
            self._credit_sig_mark = w + 1
            self._credit_sig_outstanding += 1

    # -- faults are reported after the buffers that landed before them -----------------------------------------
    def poll(self):
        buf = super().poll()
        if buf is None and self._credit_value() > self._credit_sent:
            self._post_credit()
        return buf

    medium = "verbs"

    # -- completions -----------------------------------------------------------------------------------------
    def _quiet(self) -> bool:
        """Errors no longer matter: the stream is complete (or the channel already failed)."""
        return self._sender_done or self.finished or self._peer_error is not None or self.error is not None

    def _on_completions(self, wcs) -> None:
        data = credit = False
        for wc in wcs:
            if wc.wr_id & _RECV:
                if wc.status != e.IBV_WC_SUCCESS:
                    if not self._quiet():
                        self._fail(_wc_error(wc, "receiving buffers", self.peer))
                    raise _Stop
                self._ep.qp.post_recv(self._recvs[wc.wr_id & 0xFFFFFF])
                data = True
                continue
            if wc.status != e.IBV_WC_SUCCESS:
                if not self._quiet():
                    self._fail(_wc_error(wc, "returning credits", self.peer))
                raise _Stop
            self._credit_done = wc.wr_id
            self._credit_sig_outstanding -= 1
            credit = True
        if data and self._data_lot:
            self._data_lot.unpark_all()
        if credit and self._credit_value() > self._credit_sent and self._credit_writes - self._credit_done < CREDIT_SOURCES:
            self._post_credit()  # one that had to wait for a free source word

    async def drive(self) -> None:
        """Reap completions (arrivals, credit WRITEs), repost receive requests, wake the poller,
        and watch the control connection, until the stream ends or fails. A failure is
        recorded (poll raises it once the buffers that landed before it are consumed) and
        logged, never raised."""
        await _drive(self, "receiver", self._peer_error)

    async def _watch(self) -> None:
        sock = self._sock
        try:
            while True:
                data = await _read_control(sock)
                if self._sock is None:
                    return  # closed here
                if not data:
                    break
                if data.strip(_GOODBYE):
                    self._fail(ChannelClosed(f"sender {self.peer} sent unexpected bytes on the control connection"))
                    return
                # The sender's goodbye: END_OF_STREAM is in the ring, no more WRITEs will come.
                self._sender_done = True
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)  # the answer: no more credits from here
                if self._data_lot:
                    self._data_lot.unpark_all()
        except trio.ClosedResourceError:
            return
        if self._sender_done or self.finished:
            if self._drive is not None:
                self._drive.scope.cancel()
            return
        self._fail(
            ChannelClosed(
                f"sender {self.peer} vanished: its control connection closed before END_OF_STREAM "
                f"(after {self._polled} buffers were polled here)"
            )
        )

    # -- closing ------------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Release everything. Polling afterwards raises ChannelClosed unless the stream ended."""
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        if self._drive is not None:
            self._drive.scope.cancel()
        _close_socket(self._sock)
        self._sock = None
        self._end_grants()
        ep, self._ep = self._ep, None
        if ep is not None:
            self._credit_wrs = []
            ep.close()
            if self.error is None and self._peer_error is None and not self.finished:
                self.error = ChannelClosed(f"channel from {self.peer} closed by this receiver")
        if self._data_lot:
            self._data_lot.unpark_all()


# -- connection set-up ---------------------------------------------------------------------------------------


class VerbsPool(MediumPool):
    """The slots that one executor receives one exchange's channels in (`_pool.SlotPool`:
    `spec.slots` exclusive per channel, `floating` lent, at most `max_lent` to one), in memory
    each of their receivers registers for its senders' WRITEs, with a scratch area after the
    slots for their flushes, and the grant tables their credit WRITEs read."""

    def __init__(self, spec: RingSpec, *, channels: int, floating: int, max_lent: int | None = None):
        window = spec.slots + (floating if max_lent is None else min(max_lent, floating))
        if window > MAX_POOL_WINDOW:
            raise ValueError(f"a verbs slot pool's channels hold at most {MAX_POOL_WINDOW} slots, not {window}")
        nbytes = (channels * spec.slots + floating) * spec.slot_size
        self.memory = _alloc(nbytes + SCRATCH)
        self.tables = _alloc(4 * channels * window)
        tables = self.tables[: 4 * channels * window].view(np.uint32).reshape(channels, window)
        self.slots = SlotPool(channels=channels, exclusive=spec.slots, floating=floating, slot_size=spec.slot_size,
                              max_lent=max_lent, memory=self.memory[:nbytes], tables=tables)

    def close(self) -> None:
        """(Python owns the memory; each receiver deregisters its own registration of it.)"""


class VerbsListener(TcpAcceptor):
    """Accepts channel senders on one TCP address; each accepted one becomes a VerbsReceiver.
    Without a socket of its own it is a channel of a port (`_port`; `attach` only)."""

    what = "verbs channel listener"

    def __init__(self, sock: trio.socket.SocketType | None, spec: RingSpec, secret: bytes, where: dict, *,
                 pool: VerbsPool | None = None):
        self._sock = sock
        self.pool = pool  # its channels' slots are this pool's (`_pool`), not a ring each
        self.spec = spec
        self._secret = secret
        self._where = where
        self.address: tuple[str, int] | None = None if sock is None else tuple(sock.getsockname()[:2])

    async def set_up(self, stream: trio.SocketStream, peer: str) -> VerbsReceiver:
        """Handshake, hello, queue pairs and ring on an accepted connection (closed if any of
        them fails); `accept_authenticated`'s deadline bounds it."""
        try:
            refuse_named(await server_handshake(stream, self._secret), peer, self.what)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise
        return await self.attach(stream, peer)

    async def attach(self, stream: trio.SocketStream, peer: str) -> VerbsReceiver:
        """The set-up after the handshake: hello, queue pairs and ring (closed if it fails)."""
        receiver: VerbsReceiver | None = None
        try:
            hello = await _receive_message(stream, peer, "its channel hello")
            if hello.get("proto") != PROTOCOL or hello.get("version") != VERSION:
                raise ChannelClosed(f"peer {peer} does not speak {PROTOCOL} version {VERSION}")
            mismatch = _spec_mismatch(self.spec, hello, peer)
            if mismatch is None:
                try:
                    remote = _fields(hello, peer, "its channel hello", credit_addr=int, credit_rkey=int, **_QP_FIELDS)
                    receiver = VerbsReceiver(self.spec, discover_device(**self._where), self.pool)
                    receiver._connect(remote, peer)
                except (ChannelClosed, PyverbsError) as exc:
                    mismatch = f"the receiver cannot set up its end: {exc}"
            if mismatch is not None:
                with contextlib.suppress(ChannelClosed):
                    await _send_message(stream, {"error": mismatch}, peer)
                raise ChannelClosed(mismatch)
            await _send_message(stream, receiver._accept_info(), peer)
            await _receive_message(stream, peer, "its ready message")
        except BaseException:
            if receiver is not None:
                receiver.close()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise
        receiver._sock = _detach(stream)
        log.debug("verbs channel accepted", peer=peer, device=receiver._ep.choice.name, slots=self.spec.slots)
        return receiver

    async def aclose(self) -> None:
        if self._sock is not None:
            self._sock.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> VerbsListener:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def open_verbs_listener(
    spec: RingSpec,
    secret: bytes,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    backlog: int = 128,
    device: str | None = None,
    ib_port: int | None = None,
    gid_index: int | None = None,
    pool: VerbsPool | None = None,
) -> AsyncIterator[VerbsListener]:
    """Listen for channel senders on TCP (host, port) -- loopback unless `host` says otherwise,
    port 0 picks a free one (see `listener.address`). `device`, `ib_port` and `gid_index`
    override the discovery of the RDMA port the receivers use. With a `pool` (`VerbsPool`), its
    channels' slots are the pool's."""
    if not secret:
        raise ValueError("a verbs channel needs the cluster secret")
    sock = await bind_tcp(host, port, backlog)
    where = {"device": device, "ib_port": ib_port, "gid_index": gid_index}
    async with VerbsListener(sock, spec, secret, where, pool=pool) as listener:
        if not (listener.address[0].startswith("127.") or listener.address[0] == "::1"):
            log.info("verbs listener on a non-loopback address", address=peer_name(listener.address))
        yield listener


@contextlib.asynccontextmanager
async def open_verbs_port(
    secret: bytes, *, host: str = "127.0.0.1", port: int = 0, expected: int = 0, device: str | None = None,
    ib_port: int | None = None, gid_index: int | None = None,
) -> AsyncIterator[ChannelPort]:
    """A port of named verbs channels (`_port`): their set-up connections on TCP (host, port),
    their receivers on the RDMA port `open_verbs_listener` would pick. `expected`: the
    connections its peers make at once."""
    if not secret:
        raise ValueError("a verbs channel needs the cluster secret")
    where = {"device": device, "ib_port": ib_port, "gid_index": gid_index}
    channel_port = ChannelPort("verbs", TcpPortSocket(await bind_tcp(host, port, PORT_BACKLOG)),
                               stream_authenticator(secret), lambda spec, **o: VerbsListener(None, spec, secret, where, **o),
                               expected=expected)
    try:
        yield channel_port
    finally:
        await channel_port.aclose()


async def connect_verbs(
    address,
    spec: RingSpec,
    secret: bytes,
    *,
    device: str | None = None,
    ib_port: int | None = None,
    gid_index: int | None = None,
    sig_every: int | None = None,
    connect_timeout: float | None = None,
) -> VerbsSender:
    """Connect to a listener's address as the channel's sender: handshake, then the queue
    pairs, then a VerbsSender whose `drive()` the caller runs.

    Raises AuthenticationFailed if the listener does not prove the secret (or refuses ours),
    ChannelClosed on a spec mismatch, a missing device or a lost connection, OSError if nobody
    listens there, and ChannelSilent if the set-up connection is not answered within
    `connect_timeout` (a partition, as `connect_tcp` says)."""
    if not secret:
        raise ValueError("a verbs channel needs the cluster secret")
    address, channel = channel_of(address)
    host, port = address[0], address[1]
    peer = peer_name((host, port)) + (f" {channel!r}" if channel else "")
    with trio.move_on_after(connect_timeout if connect_timeout is not None else math.inf) as unanswered:
        stream = await trio.open_tcp_stream(host, port)
    if unanswered.cancelled_caught:
        raise ChannelSilent(peer, connect_timeout, "no answer to a connection")
    sender: VerbsSender | None = None
    try:
        await client_handshake(stream, secret, channel=channel)
        # Only now, with the peer authenticated, create queue pair and memory.
        try:
            sender = VerbsSender(spec, discover_device(device, ib_port, gid_index), sig_every=sig_every)
        except (ChannelClosed, PyverbsError) as exc:
            with contextlib.suppress(ChannelClosed):
                await _send_message(stream, {"error": f"the sender cannot set up its end: {exc}"}, peer)
            raise ChannelClosed(f"cannot set up the sending end of a verbs channel: {exc}") from None
        await _send_message(stream, sender._hello(), peer)
        reply = await _receive_message(stream, peer, "its channel accept")
        remote = _fields(reply, peer, "its channel accept", ring_addr=int, ring_rkey=int, **_QP_FIELDS)
        if "scratch_addr" in reply:
            remote.update(_fields(reply, peer, "its channel accept", scratch_addr=int))
        if "pool_window" in reply:  # a channel of the receiver's slot pool (`_connect` checks them)
            remote.update(pool_window=reply["pool_window"], pool_grants=reply.get("pool_grants"))
        try:
            sender._connect(remote, peer)
        except PyverbsError as exc:
            with contextlib.suppress(ChannelClosed):
                await _send_message(stream, {"error": f"the sender cannot connect its queue pair: {exc}"}, peer)
            raise ChannelClosed(f"cannot connect the queue pair to {peer}: {exc}") from None
        await _send_message(stream, {"ready": True}, peer)
    except ChannelClosed as exc:
        log.error("verbs connection refused", peer=peer, end=_SENDER, reason=str(exc))
        if sender is not None:
            sender.close()
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
        raise
    except BaseException:
        if sender is not None:
            sender.close()
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
        raise
    sender._sock = _detach(stream)
    log.debug("verbs channel connected", peer=peer, device=sender._ep.choice.name, slots=spec.slots)
    return sender
