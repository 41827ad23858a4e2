"""Real verbs on the VM's soft-RoCE device: the things the verbs transport is built on.

Run by ``bash scripts/rdma-vm-run.sh`` (never collected on the host).
"""

from __future__ import annotations

import ipaddress
import os
import re
import time

import pyverbs.enums as e

from slashrt.bench.perftest import ib_write_bw

from . import _verbs as v

KIB64 = 64 * 1024


def test_rxe_device_is_active_with_roce_v2_gid(ctx):
    assert v.DEVICE in v.device_names()
    port = ctx.query_port(v.PORT)
    assert port.state == e.IBV_PORT_ACTIVE
    assert port.link_layer == e.IBV_LINK_LAYER_ETHERNET
    assert port.active_mtu >= e.IBV_MTU_1024
    # GID index 1 is the IPv4-mapped address of the netdev (RoCEv2).
    digits = re.sub(r"[^0-9a-f]", "", str(v.local_gid(ctx)).lower())
    assert len(digits) == 32, str(v.local_gid(ctx))
    mapped = ipaddress.IPv6Address(int(digits, 16)).ipv4_mapped
    assert mapped == ipaddress.IPv4Address(v.ADDR)
    with open(f"/sys/class/infiniband/{v.DEVICE}/ports/{v.PORT}/gid_attrs/types/{v.GID_INDEX}") as f:
        assert f.read().strip() == "RoCE v2"


def test_rc_loopback_rdma_write_64k_one_at_a_time(ctx, rdma_report):
    """Signaled 64 KiB RDMA WRITEs from QP a into b's MR, each verified byte for byte."""
    slots, count = 4, 100
    with v.rc_pair(ctx, mr_size=slots * KIB64) as (a, b):
        assert a.qp.qp_state == e.IBV_QPS_RTS and b.qp.qp_state == e.IBV_QPS_RTS
        b.mr.write(b"\0" * (slots * KIB64), slots * KIB64, 0)
        t0 = time.perf_counter()
        for i in range(count):
            off = (i % slots) * KIB64
            payload = os.urandom(KIB64)
            a.mr.write(payload, KIB64, off)
            v.post_rdma_write(a, b.mr, KIB64, src_offset=off, dst_offset=off, wr_id=i)
            (wc,) = v.poll_cq(a.cq, 1)
            assert wc.wr_id == i
            assert wc.opcode == e.IBV_WC_RDMA_WRITE
            assert b.mr.read(KIB64, off) == payload, f"write {i}: data differs at the target"
        dt = time.perf_counter() - t0
    rdma_report(f"pyverbs RC RDMA WRITE 64 KiB, 1 in flight: {count * KIB64 / dt / 1e6:.1f} MB/s "
                f"({dt / count * 1e6:.0f} us per write)")


def test_rc_loopback_many_writes_in_flight_both_directions(ctx, rdma_report):
    """16 signaled writes posted at once, a -> b and b -> a at the same time."""
    n = 16
    with v.rc_pair(ctx, mr_size=n * KIB64, max_send_wr=n) as (a, b):
        data = {}
        for src, name in ((a, "a"), (b, "b")):
            data[name] = os.urandom(n * KIB64)
            src.mr.write(data[name], n * KIB64, 0)
        # Each side sends its first half of slots into the peer's second half.
        half = n // 2
        t0 = time.perf_counter()
        for i in range(half):
            for src, dst in ((a, b), (b, a)):
                v.post_rdma_write(src, dst.mr, KIB64, src_offset=i * KIB64,
                                  dst_offset=(half + i) * KIB64, wr_id=i)
        got_a = v.poll_cq(a.cq, half)
        got_b = v.poll_cq(b.cq, half)
        dt = time.perf_counter() - t0
        # RC completions on one send queue come back in posting order.
        assert [wc.wr_id for wc in got_a] == list(range(half))
        assert [wc.wr_id for wc in got_b] == list(range(half))
        lo, hi = half * KIB64, n * KIB64
        assert b.mr.read(hi - lo, lo) == data["a"][: hi - lo]
        assert a.mr.read(hi - lo, lo) == data["b"][: hi - lo]
        # The halves nobody wrote to are untouched.
        assert b.mr.read(lo, 0) == data["b"][:lo]
        assert a.mr.read(lo, 0) == data["a"][:lo]
    rdma_report(f"pyverbs RC RDMA WRITE 64 KiB, {half} in flight each way: "
                f"{2 * half * KIB64 / dt / 1e6:.1f} MB/s total")


def test_write_with_a_wrong_rkey_completes_with_an_error_not_a_hang(ctx):
    with v.rc_pair(ctx, mr_size=KIB64) as (a, b):
        b.mr.write(b"\x5a" * KIB64, KIB64, 0)
        a.mr.write(b"\x01" * KIB64, KIB64, 0)
        v.post_rdma_write(a, b.mr, KIB64, rkey=(b.mr.rkey ^ 0x5A5A00) & 0xFFFFFFFF, wr_id=7)
        (wc,) = v.poll_cq(a.cq, 1, check_status=False)
        assert wc.wr_id == 7
        assert wc.status == e.IBV_WC_REM_ACCESS_ERR, v.CompletionError(wc)
        assert b.mr.read(KIB64, 0) == b"\x5a" * KIB64


def test_poll_cq_is_bounded(ctx):
    with v.rc_pair(ctx, mr_size=4096) as (a, _b):
        t0 = time.monotonic()
        try:
            v.poll_cq(a.cq, 1, timeout=0.2)
        except v.VerbsTimeout:
            pass
        else:
            raise AssertionError("poll_cq returned a completion nobody posted")
        assert time.monotonic() - t0 < 5


def test_perftest_ib_write_bw(rdma_device, rdma_report):
    result = ib_write_bw(rdma_device, v.GID_INDEX, v.ADDR, size=65536, iters=300, port=18515)
    assert result["avg_mb_per_s"] > 0 and result["peak_mb_per_s"] >= result["avg_mb_per_s"] * 0.5
    rdma_report(f"ib_write_bw -s 65536 -n 300: average {result['avg_mb_per_s']:.1f} MB/sec (peak {result['peak_mb_per_s']:.1f})")
