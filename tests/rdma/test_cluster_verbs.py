"""Multi-executor jobs over verbs, inside the VM: every exchange mode, with every channel
wrapping its small ring at least a hundred times, gives the single-executor result; the
progress bus keeps the distributed protocol's laws over verbs queue pairs."""

import os
import subprocess
import sys

import pytest

from slashrt.testing import EXCHANGE_MODES, WRAPS, check_exchanges, check_progress_bus
from slashrt.testing._check_progress import WRAPS as PROGRESS_WRAPS
from slashrt.transport._auth import generate_secret

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
