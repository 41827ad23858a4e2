"""When an executor of a cluster tells its peers of its progress (`BusCounts`): a move no one
here waits for waits in its buffer, netted with the moves after it, until the executor has been
idle for `GRACE_S` or nothing went out for `STALE_S` (trio's mock clock moves the time, over
two real buses); and on a real cluster, a stream of thousands of buffers sends a few messages
per window, not one per buffer."""

import numpy as np
import pytest

import slashrt
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import move_capability
from slashrt.scheduler._bus_counts import GRACE_S, STALE_S, BusCounts

from tests.cluster.test_graph_ssb import N, RINGS, expected, inputs, union_count, windows
from tests.cluster.test_progress_bus import SOURCE, T0, two_buses


async def test_moves_no_one_waits_for_go_out_netted_after_the_grace_or_once_stale(mock_clock):
    async with two_buses() as (a, b):
        counts = BusCounts(a, on_news=lambda: None)
        assert counts.idle() is None  # nothing to tell: an idle executor sleeps until woken
        time = T0
        for epoch in range(1, 4):  # busy: the source's capability moves three times
            counts.update_iter(move_capability(SOURCE, time, Timestamp(epoch)))
            time = Timestamp(epoch)
            assert not counts.must_settle()  # no frontier can move: nothing to settle
            counts.propagate()
            mock_clock.jump(STALE_S / 4)
        assert counts.idle() == GRACE_S  # idle: it waits that long for more work first
        assert a.stats.messages == 0
        mock_clock.jump(STALE_S / 2)  # nothing published for more than STALE_S now
        assert counts.must_settle()
        counts.propagate()
        while b.stats.received < 1:
            await b.wait_changed()
        received = [event[3] for event in b.history if event[1] == "receive"]
        assert received == [(((SOURCE, Timestamp(3)), 1), ((SOURCE, T0), -1))]  # three moves, netted to one
        assert counts.idle() is None and not counts.must_settle()
        counts.update_iter(move_capability(SOURCE, time, Timestamp(4)))  # just published: not stale
        assert not counts.must_settle() and counts.idle() == GRACE_S
        counts.flush()  # (what the executor does once it stayed idle for the grace)
        while b.stats.received < 2:
            await b.wait_changed()
        assert a.stats.messages == 2


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_stream_of_thousands_of_buffers_sends_a_few_progress_messages_per_window(transport):
    """20 windows; each executor computes ~2,000 buffers of 256 bytes and goes idle between
    most of them (its feeders fill rings of four slots)."""
    result = slashrt.run(union_count(), inputs(), executors=2, transport=transport, mode="slash", **RINGS)
    np.testing.assert_array_equal(windows(result), expected())
    epochs = N // 10 // 100
    assert min(s.buffers for s in result.stats) > 1_500
    # a few per window, and at most one per STALE_S of the run's time (a loaded machine's longer
    # run publishes more of those; 421 when every idle moment published, in a 1.2 s run)
    allowed = 5 * epochs + (result.seconds - (result.startup_s or 0)) / STALE_S
    assert max(s.progress_messages for s in result.stats) <= allowed, (allowed, result.seconds, result.stats)
