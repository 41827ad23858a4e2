"""When an executor of a cluster tells its peers of its progress (`BusCounts`): a move no one
here waits for waits in its buffer, netted with the moves after it, until the executor has been
idle for `GRACE_S` or nothing went out for `STALE_S` (trio's mock clock moves the time, over
two real buses); an update no executor needs promptly (a window's capability above a plain
sink) waits for the next news, without a grace of its own; and on a real cluster, a stream of
thousands of buffers sends a few messages per window, not one per buffer."""

import numpy as np
import pytest

import slashrt
from slashrt import sinks
from slashrt._plan import ClusterRole, build_plan
from slashrt.progress import Location, Tracker
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import move_capability
from slashrt.scheduler._bus_counts import GRACE_S, STALE_S, BusCounts
from slashrt.scheduler._pointstamp import PointstampProgress
from slashrt.ssb.partitions import Partitioning

from tests.cluster.test_graph_ssb import N, RINGS, expected, inputs, union_count, windows
from tests.cluster.test_progress_bus import BODY, SOURCE, T0, two_buses


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


async def test_updates_no_executor_needs_promptly_take_no_grace_and_go_with_the_next_news(mock_clock):
    async with two_buses() as (a, b):
        counts = BusCounts(a, on_news=lambda: None, silent=frozenset({SOURCE}))
        counts.update_iter(move_capability(SOURCE, T0, Timestamp(1)))
        assert not counts.must_settle()
        assert counts.idle() is None  # idle: it sleeps until woken, with no timer to publish this
        mock_clock.jump(STALE_S * 2)
        assert counts.idle() is None and a.stats.messages == 1  # ...but once stale it goes out
        counts.update_iter(move_capability(SOURCE, Timestamp(1), Timestamp(2)))
        counts.update(BODY, Timestamp(2, (0,)), 1)  # news someone may wait for: the grace again
        assert counts.idle() == GRACE_S
        counts.flush()
        while b.stats.received < 2:
            await b.wait_changed()
        received = [event[3] for event in b.history if event[1] == "receive"]
        assert received[1] == (((SOURCE, Timestamp(2)), 1), ((BODY, Timestamp(2, (0,))), 1), ((SOURCE, Timestamp(1)), -1))


class ViewOnlyBus:
    """A progress bus reduced to its view: what the executor records is dropped, and no peer
    messages arrive but those a test applies to the view itself."""

    def __init__(self, graph):
        self.exchange = type("Exchange", (), {"view": Tracker(graph), "holds_nothing": lambda self: True})()
        self.on_frontier_change = None

    def record(self, updates):
        pass

    def flush(self):
        pass

    def poll(self):
        return False


class _Forwarding(sinks.Collect):
    async def awatermark(self, watermark):
        pass


@pytest.mark.parametrize("sink", [sinks.Collect, _Forwarding])
def test_a_windows_capability_is_silent_unless_a_sink_below_passes_watermarks_on(sink):
    flow = union_count(sink=sink())
    plan = build_plan(flow, ClusterRole(0, Partitioning(16, 2), "slash"))
    progress = PointstampProgress(plan, ViewOnlyBus(plan.graph))
    at = {step: Location.output(i, 0) for i, step in enumerate(flow.steps)}
    silent = progress.tracker._silent
    assert at["uc.counts"] in silent if sink is sinks.Collect else at["uc.counts"] not in silent
    fragments = Location.input(list(flow.steps).index("uc.counts"), 1)
    assert not silent & {at["uc.a"], at["uc.b"], at["uc.doubled"], fragments}


async def test_an_idle_executor_recounts_the_windows_holds_only_after_a_source_moved_uncounted(monkeypatch):
    plan = build_plan(union_count(), ClusterRole(0, Partitioning(16, 2), "slash"))
    progress = PointstampProgress(plan, ViewOnlyBus(plan.graph))
    route = plan.steps["uc.counts"]
    looks = []
    monkeypatch.setattr(route.window, "fragment_holds", lambda: looks.append(1) or frozenset())
    await progress.settle()
    settled = len(looks)
    assert settled > 0
    for _ in range(3):  # idle moments between buffers: nothing moved past what was counted
        progress.quiet(streaming=True)
    assert len(looks) == settled
    source = plan.steps["uc.b"]
    await progress.advance(source, source.now, Timestamp(5))  # buffered: no settle
    assert len(looks) == settled
    progress.quiet(streaming=True)  # now the holds go with it
    assert len(looks) == settled + 1


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
    # (`seconds` counts from the start of processing: the start-up, longer on a loaded machine, is not in it)
    allowed = 5 * epochs + result.seconds / STALE_S
    assert max(s.progress_messages for s in result.stats) <= allowed, (allowed, result.seconds, result.stats)
