"""Multi-executor jobs over verbs, inside the VM: every exchange mode, with every channel
wrapping its small ring at least a hundred times, gives the single-executor result; the
progress bus keeps the distributed protocol's laws over verbs queue pairs, a loop whose
records cross executors runs on it, and so does a graph flow's window on the state backend;
exchange rings shrunk by the channel budget hold what it says."""

import os
import subprocess
import sys

import numpy as np
import pytest

import slashrt

from slashrt.testing import EXCHANGE_MODES, WRAPS, check_exchanges, check_progress_bus
from slashrt.testing._check_progress import WRAPS as PROGRESS_WRAPS
from slashrt.transport._auth import generate_secret
from cluster.test_graph_cluster import KEYED, exchange_flow
from cluster.test_graph_cluster import K as HOPS
from cluster.test_graph_ssb import N as SSB_N, RINGS as SSB_RINGS, expected as ssb_expected, inputs as ssb_inputs
from cluster.test_graph_ssb import union_count, windows as ssb_windows
from cluster.test_ring_budget import SLOT, SOURCE_SLOTS, assert_counted, budget_for, counting, held, keyed_records

MEDIUM = "verbs"


@pytest.fixture(scope="module")
def agents():
    """Two executor agents serving one job after another (starting a Python process costs tens
    of seconds in the TCG guest: once for the three modes, not once per job)."""
    secret = generate_secret()
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    procs = []
    try:
        for _ in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "slashrt.cluster.agent", "--listen", "127.0.0.1:0", "--log-level", "warning"],
                env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
            ))
        addresses = []
        for proc in procs:  # each prints its address once it listens
            words = proc.stdout.readline().decode().split()
            assert words[:2] == ["slashrt-agent", "listening"], words
            addresses.append(f"{words[2]}:{words[3]}")
        yield addresses, secret
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize("mode", list(EXCHANGE_MODES))
async def test_every_exchange_over_verbs_wraps_small_rings_many_times_and_equals_one_executor(rdma_device, agents, mode, rdma_report):
    # two agent processes on the VM, their exchange channels verbs queue pairs on rxe0 (loopback)
    addresses, secret = agents
    report = await check_exchanges(MEDIUM, mode, executors=addresses, secret=secret, deadline=600)
    assert report["rings"] >= WRAPS
    rdma_report(f"{mode} over {MEDIUM}, 2 executors, rings wrapped >= {report['rings']:.0f} times: {report['seconds']:.1f} s")


async def test_progress_bus_over_verbs_converges_and_keeps_the_protocol_laws(rdma_device, rdma_report):
    # two executor processes whose progress channels are verbs queue pairs: every view ends
    # idle, and the real delivery order replayed through the pure protocol keeps its laws
    report = await check_progress_bus(MEDIUM, executors=2, deadline=600)
    assert report["events"] > 0 and report["rings"] >= PROGRESS_WRAPS
    rdma_report(
        f"progress bus over {MEDIUM}, 2 executors: {report['messages']} messages, rings wrapped >= "
        f"{report['rings']:.0f} times"
    )


def test_a_loop_whose_records_cross_executors_over_verbs_equals_one_executor(rdma_device, agents, rdma_report):
    # a graph flow on distributed pointstamp progress: every iteration exchanges records by key
    # between the two agents over verbs queue pairs, and progress travels on its own channels
    addresses, secret = agents
    rng = np.random.default_rng(3)
    n = 4000
    data = np.zeros(n, KEYED)
    data["v"], data["k"], data["t"] = 100 * np.arange(n), rng.integers(0, 60, n), np.arange(n) // 100
    one = slashrt.run(exchange_flow(), {"a": data}, slot_size=256, slots=4)
    many = slashrt.run(
        exchange_flow(), {"a": data}, executors=addresses, transport=MEDIUM, secret=secret, slot_size=256, slots=4
    )
    hopped = many.outputs["x.hopped"]
    assert len(hopped) == n and (hopped["v"] % 100 == HOPS).all()
    assert sorted(hopped.tolist()) == sorted(one.outputs["x.hopped"].tolist())
    assert sorted(many.outputs["x.per_key_out"].tolist()) == sorted(one.outputs["x.per_key_out"].tolist())
    rdma_report(f"a loop exchanging by key over {MEDIUM}, 2 executors: {n} records x {HOPS} hops: {many.seconds:.1f} s")


def test_a_graph_flows_window_on_the_state_backend_over_verbs_ships_partials_and_equals_numpy(rdma_device, agents, rdma_report):
    # mode="slash" in a graph flow (a union behind a user operator into a tumbling count):
    # fragments shipped as partial states over verbs queue pairs, records never
    addresses, secret = agents
    result = slashrt.run(union_count(), ssb_inputs(), executors=addresses, transport=MEDIUM, secret=secret,
                         mode="slash", **SSB_RINGS)
    np.testing.assert_array_equal(ssb_windows(result), ssb_expected())
    shipments = [e for per_executor in result.epochs["uc.counts"] for e in per_executor]
    assert sum(e.records for e in shipments) == 3 * SSB_N
    assert 0 < sum(s.shipped_bytes for s in result.stats) < 3 * SSB_N * 8  # partial rows, not a row per record
    rdma_report(f"a graph flow's SSB window over {MEDIUM}, 2 executors: {3 * SSB_N} records, "
                f"{sum(s.shipped_bytes for s in result.stats)} bytes shipped: {result.seconds:.1f} s")


def test_exchange_rings_shrunk_by_the_channel_budget_over_verbs_hold_what_it_says_and_are_exact(rdma_device, agents, rdma_report):
    # verbs keeps slots at both ends of a channel (the receiver's registered pool, the sender's
    # staging slots): the budget counts both, and 5 slots a channel carry data many times their size
    addresses, secret = agents
    records, slots = keyed_records(80_000), 5
    budget = budget_for(2, slots, MEDIUM)
    flow, out = counting()
    result = slashrt.run(flow, {"a": records}, executors=addresses, transport=MEDIUM, secret=secret, mode="uppar",
                         slot_size=SLOT, slots=SOURCE_SLOTS, channel_budget=budget)
    assert_counted(out, records)
    assert [s.channel_bytes for s in result.stats] == [held(2, 1, slots, MEDIUM)] * 2
    assert min(s.shipped_bytes for s in result.stats) > 20 * slots * SLOT
    assert max(s.floating_peak for s in result.stats) > 0  # its pools lent where a backlog was
    rdma_report(f"exchange rings of {slots} slots under channel_budget={budget} over {MEDIUM}, 2 executors: "
                f"{result.channel_bytes_per_executor} bytes of rings each, {result.seconds:.1f} s")
