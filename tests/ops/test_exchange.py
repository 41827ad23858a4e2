"""ChannelSink: a dataflow split across executors gives the single-executor result."""

import numpy as np
import pytest
import trio

from slashrt._runtime import run_async, run_receivers
from slashrt.bench import ysb
from slashrt.bench.ysb_split import VIEWS_SCHEMA, back_flow, front_flow, run_split
from slashrt.ops.exchange import ChannelSink
from slashrt.ops.sinks import Collect
from slashrt.transport import RingSpec, open_inproc_channel


async def test_split_in_one_process_equals_the_reference():
    records = ysb.generate(120_000, 30, seed=9, disorder_ms=200)
    mapping = ysb.campaign_map(30)
    sender, receiver = open_inproc_channel(RingSpec(slots=8, slot_size=4096, record_size=VIEWS_SCHEMA.record_size))
    out = Collect()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_async, front_flow(mapping, ChannelSink(sender, VIEWS_SCHEMA), max_delay=200), {"events": records})
        result = await run_receivers(back_flow(out), {"views": receiver})
    assert np.array_equal(ysb.to_result(out.records), ysb.reference(records, mapping))
    # watermarks crossed the channel: windows fired before the end, not only at it
    assert result.stats[0].control > 2
    assert result.late_records == {"ysb_back.count_window_2": 0} or sum(result.late_records.values()) == 0


def test_channel_sink_checks_the_record_size():
    sender, _ = open_inproc_channel(RingSpec(slots=2, slot_size=1024, record_size=24))
    with pytest.raises(ValueError, match="24-byte records"):
        ChannelSink(sender, VIEWS_SCHEMA)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_split_across_two_processes(transport):
    result = run_split(transport, events=200_000, campaigns=40, slot_size=8192, slots=8)
    assert result["correct"] is True and result["executors"] == 2 and result["result_rows"] > 0
