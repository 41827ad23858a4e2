"""Multi-executor jobs over verbs, inside the VM: every exchange mode, with every channel
wrapping its small ring at least a hundred times, gives the single-executor result."""

import pytest

from slashrt.testing import EXCHANGE_MODES, WRAPS, check_exchanges


@pytest.mark.parametrize("mode", list(EXCHANGE_MODES))
async def test_every_exchange_over_verbs_wraps_small_rings_many_times_and_equals_one_executor(rdma_device, mode, rdma_report):
    # two agent processes on the VM, their exchange channels verbs queue pairs on rxe0 (loopback)
    report = await check_exchanges("verbs", mode, executors=2, deadline=400)
    assert report["rings"] >= WRAPS
    rdma_report(f"{mode} over verbs, 2 executors, rings wrapped >= {report['rings']:.0f} times: {report['seconds']:.1f} s")
