"""Small pyverbs helpers for the tests that run inside the soft-RoCE VM (scripts/rdma-vm-run.sh).

The VM has one rxe device (``rxe0`` on a veth with 10.77.0.1); both ends of a connection use it
(rxe loopback). Everything that waits is bounded: a completion that does not arrive in time
raises :class:`VerbsTimeout` instead of hanging the suite.

Typical use::

    with open_device() as dev, rc_pair(dev, mr_size=1 << 20) as (a, b):
        post_rdma_write(a, b.mr, length=65536)
        poll_cq(a.cq, 1)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

DEVICE = os.environ.get("SLASHRT_RDMA_DEVICE", "rxe0")
GID_INDEX = int(os.environ.get("SLASHRT_RDMA_GID_INDEX", "1"))  # RoCEv2, IPv4-mapped
ADDR = os.environ.get("SLASHRT_RDMA_ADDR", "10.77.0.1")  # the rxe netdev's address
PORT = 1
DEFAULT_TIMEOUT = 10.0  # seconds; rxe under qemu TCG is slow, but not this slow

ACCESS_RW = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


class VerbsTimeout(AssertionError):
    """A bounded wait for completions ran out."""


class CompletionError(AssertionError):
    """A work completion came back with a status other than IBV_WC_SUCCESS."""

    def __init__(self, wc) -> None:
        self.wc = wc
        self.status = wc.status
        super().__init__(
            f"work completion wr_id={wc.wr_id} failed: status {wc.status} "
            f"({_wc_status_name(wc.status)}), opcode {wc.opcode}, vendor_err {wc.vendor_err}"
        )


_WC_STATUS_NAMES = (
    "SUCCESS LOC_LEN_ERR LOC_QP_OP_ERR LOC_EEC_OP_ERR LOC_PROT_ERR WR_FLUSH_ERR MW_BIND_ERR "
    "BAD_RESP_ERR LOC_ACCESS_ERR REM_INV_REQ_ERR REM_ACCESS_ERR REM_OP_ERR RETRY_EXC_ERR "
    "RNR_RETRY_EXC_ERR LOC_RDD_VIOL_ERR REM_INV_RD_REQ_ERR REM_ABORT_ERR INV_EECN_ERR "
    "INV_EEC_STATE_ERR FATAL_ERR RESP_TIMEOUT_ERR GENERAL_ERR"
).split()


def _wc_status_name(status: int) -> str:
    for name in _WC_STATUS_NAMES:
        if getattr(e, "IBV_WC_" + name, None) == status:
            return "IBV_WC_" + name
    return "unknown"


def device_names() -> list[str]:
    return [d.name.decode() for d in get_device_list()]


@contextlib.contextmanager
def open_device(name: str = DEVICE) -> Iterator[Context]:
    ctx = Context(name=name)
    try:
        yield ctx
    finally:
        ctx.close()


def port_active(ctx: Context, port: int = PORT) -> bool:
    return ctx.query_port(port).state == e.IBV_PORT_ACTIVE


def local_gid(ctx: Context, port: int = PORT, index: int = GID_INDEX):
    return ctx.query_gid(port_num=port, index=index)


@dataclass
class Endpoint:
    """One side of an RC connection: its QP, CQ and a registered buffer."""

    ctx: Context
    pd: PD
    cq: CQ
    qp: QP
    mr: MR

    @property
    def qp_num(self) -> int:
        return self.qp.qp_num


def make_mr(pd: PD, size: int, access: int = ACCESS_RW) -> MR:
    return MR(pd, size, access)


def make_rc_qp(pd: PD, cq: CQ, max_send_wr: int = 64, max_recv_wr: int = 64) -> QP:
    cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=1, max_recv_sge=1)
    # sq_sig_all=0: only WRs posted with IBV_SEND_SIGNALED produce completions.
    return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))


def connect_rc(qp: QP, remote_qp_num: int, remote_gid, *, port: int = PORT,
               gid_index: int = GID_INDEX, path_mtu: int = e.IBV_MTU_1024,
               access: int = ACCESS_RW, psn: int = 0) -> None:
    """Moves ``qp`` from RESET to RTS, connected to ``remote_qp_num`` at ``remote_gid``."""
    attr = QPAttr(port_num=port)
    attr.qp_access_flags = access
    attr.path_mtu = path_mtu
    attr.dest_qp_num = remote_qp_num
    attr.rq_psn = psn
    attr.sq_psn = psn
    attr.max_rd_atomic = 1
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.timeout = 14  # 4.096 us * 2^14 ~ 67 ms per retry
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    gr = GlobalRoute(dgid=remote_gid, sgid_index=gid_index)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=port)
    qp.to_rts(attr)


@contextlib.contextmanager
def rc_pair(ctx: Context, mr_size: int = 1 << 20, cq_depth: int = 256,
            max_send_wr: int = 64) -> Iterator[tuple[Endpoint, Endpoint]]:
    """Two RC QPs on one device, connected to each other (rxe loopback), each with its own PD,
    CQ and MR of ``mr_size`` bytes (LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ)."""
    with contextlib.ExitStack() as stack:
        ends = []
        for _ in range(2):
            cq = CQ(ctx, cq_depth)
            stack.callback(cq.close)
            pd = PD(ctx)
            stack.callback(pd.close)  # closes its QP and MR, before the CQ is closed
            mr = make_mr(pd, mr_size)
            qp = make_rc_qp(pd, cq, max_send_wr=max_send_wr)
            ends.append(Endpoint(ctx, pd, cq, qp, mr))
        a, b = ends
        gid = local_gid(ctx)
        connect_rc(a.qp, b.qp_num, gid)
        connect_rc(b.qp, a.qp_num, gid)
        yield a, b


def post_rdma_write(src: Endpoint, dst_mr: MR, length: int, *, src_offset: int = 0,
                    dst_offset: int = 0, wr_id: int = 0, signaled: bool = True,
                    rkey: int | None = None) -> None:
    """Posts an RDMA WRITE of ``length`` bytes from ``src.mr`` at ``src_offset`` into the
    remote ``dst_mr`` at ``dst_offset``."""
    sge = SGE(src.mr.buf + src_offset, length, src.mr.lkey)
    flags = e.IBV_SEND_SIGNALED if signaled else 0
    wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
    wr.set_wr_rdma(dst_mr.rkey if rkey is None else rkey, dst_mr.buf + dst_offset)
    src.qp.post_send(wr)


def poll_cq(cq: CQ, count: int = 1, timeout: float = DEFAULT_TIMEOUT, *,
            check_status: bool = True) -> list:
    """Polls ``cq`` until ``count`` completions arrived or ``timeout`` seconds passed
    (then :class:`VerbsTimeout`). Failed completions raise :class:`CompletionError` unless
    ``check_status`` is false."""
    deadline = time.monotonic() + timeout
    got: list = []
    idle = 0
    while len(got) < count:
        n, wcs = cq.poll(num_entries=count - len(got))
        if n:
            idle = 0
            for wc in wcs[:n]:
                if check_status and wc.status != e.IBV_WC_SUCCESS:
                    raise CompletionError(wc)
                got.append(wc)
            continue
        if time.monotonic() > deadline:
            raise VerbsTimeout(f"{len(got)} of {count} completions after {timeout} s")
        idle += 1
        if idle > 1000:  # stop burning the (emulated) CPU that rxe's kernel side needs
            time.sleep(0.0005)
    return got
