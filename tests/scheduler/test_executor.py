"""The executor: pollers and the compute coroutine interleave, idle pollers park, a bad channel
closes alone, an operator error fails the executor without hanging, and counters and coalescing
are exact. Deterministic: trio's virtual clock and `wait_all_tasks_blocked`, never sleeps as
synchronisation."""

import contextlib
import threading

import numpy as np
import pytest
import structlog
import trio

from slashrt import Batch, MalformedBuffer, OperatorError
from slashrt._buffer import Control, Kind, encode_control
from slashrt.ops._node import Node
from slashrt.scheduler import Executor, Input
from slashrt.testing import MockClock, wait_all_tasks_blocked
from slashrt.transport import RingSpec, open_inproc_channel

DT = np.dtype([("t", "<i8"), ("k", "<i8")])
SPEC = RingSpec(slots=8, slot_size=32 + 16 * 10, record_size=DT.itemsize)  # 10 records a buffer
PER_SLOT = SPEC.records_per_slot


def data(n, first=0):
    a = np.zeros(n, DT)
    a["t"] = np.arange(first, first + n)
    a["k"] = a["t"] % 7
    return a


class Recorder(Node):
    """A pipeline that keeps what reaches it (copies: slots are reused after release)."""

    def __init__(self, name="rec", fail_at=None):
        super().__init__(name)
        self.sizes: list[int] = []
        self.parts: list[np.ndarray] = []
        self.watermarks: list[int] = []
        self.ended_at: float | None = None
        self.fail_at = fail_at

    async def push(self, batch: Batch):
        if self.fail_at is not None and (batch["t"] >= self.fail_at).any():
            raise OperatorError(self.step_id, "bad record")
        self.sizes.append(len(batch))
        self.parts.append(batch.to_numpy().copy())

    async def on_watermark(self, watermark):
        self.watermarks.append(watermark)

    async def on_end(self):
        self.ended_at = trio.current_time()

    @property
    def records(self):
        return np.concatenate(self.parts) if self.parts else np.empty(0, DT)


def pipe(name, spec=SPEC, **rec_kw):
    tx, rx = open_inproc_channel(spec)
    rec = Recorder(name, **rec_kw)
    return tx, Input(name, rx, rec, DT), rec


@pytest.fixture
def clock():
    # pytest-trio runs a test under any Clock fixture it requests: virtual time that jumps
    # ahead whenever every task is parked
    return MockClock(autojump_threshold=0)


@contextlib.asynccontextmanager
async def real_time_limit(seconds=10):
    """Fail after `seconds` of wall-clock time. Under the virtual clock a spinning task keeps
    time from ever jumping, so trio's own timeouts would never fire: a thread cancels instead."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:
        timer = threading.Timer(seconds, token.run_sync_soon, [scope.cancel])
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        pytest.fail(f"still running after {seconds} s of real time: a task spins instead of parking")


# -- (1) a stalled input does not stall another pipeline ------------------------------------------


async def test_a_stalled_input_does_not_stall_another_pipeline(clock):
    tx_a, in_a, rec_a = pipe("a")
    tx_b, in_b, rec_b = pipe("b")
    b_data = data(20 * SPEC.slots * PER_SLOT + 3)  # many rings' worth: needs credits back
    a_state = {}

    async def producer_a():
        await tx_a.send_records(data(PER_SLOT))
        await trio.sleep(3600)  # stalls (virtual time: the clock jumps only when all are parked)
        a_state["open_when_b_ended"] = rec_b.ended_at is not None and rec_a.ended_at is None
        await tx_a.aclose()

    async def producer_b():
        await tx_b.send_records(b_data)
        await tx_b.send_control(Control.WATERMARK, 123)
        await tx_b.aclose()

    ex = Executor([in_a, in_b], coalesce=4)
    async with real_time_limit(), trio.open_nursery() as nursery:
        nursery.start_soon(ex.run)
        nursery.start_soon(producer_a)
        nursery.start_soon(producer_b)
    assert np.array_equal(rec_b.records, b_data)
    assert rec_b.watermarks == [123]
    assert rec_b.ended_at == 0.0, "B finished without virtual time reaching A's stall"
    assert a_state["open_when_b_ended"]
    assert rec_a.ended_at == 3600.0
    assert np.array_equal(rec_a.records, data(PER_SLOT))


# -- (2) idle pollers park instead of spinning ------------------------------------------------------


async def test_idle_pollers_park_rather_than_spin():
    tx_a, in_a, rec_a = pipe("a")
    tx_b, in_b, rec_b = pipe("b")
    ex = Executor([in_a, in_b])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ex.run)
        with trio.fail_after(5):  # a spinning poller never lets every task block
            await wait_all_tasks_blocked()
        polls, parks = ex.stats.empty_polls, ex.stats.parks
        assert parks >= 2
        await wait_all_tasks_blocked()
        assert (ex.stats.empty_polls, ex.stats.parks) == (polls, parks)

        # data wakes the parked poller, and everything parks again once it is processed
        await tx_a.send_records(data(25))
        with trio.fail_after(5):
            await wait_all_tasks_blocked()
        assert np.array_equal(rec_a.records, data(25))
        polls = ex.stats.empty_polls
        await wait_all_tasks_blocked()
        assert ex.stats.empty_polls == polls
        assert ex.stats.parks > parks

        await tx_a.aclose()
        await tx_b.aclose()
    assert rec_a.ended_at is not None and rec_b.ended_at is not None
    assert rec_b.sizes == []


class Awaiting(Recorder):
    """A pipeline whose every batch awaits `go` (as a broker's sink awaits its worker thread)."""

    def __init__(self, name="rec"):
        super().__init__(name)
        self.go, self.calls = trio.Event(), 0

    async def push(self, batch: Batch):
        self.calls += 1
        await self.go.wait()
        await super().push(batch)


async def test_a_poller_whose_compute_awaits_waits_for_its_turn_rather_than_spin():
    rec = Awaiting("a")
    tx, rx = open_inproc_channel(SPEC)
    ex = Executor([Input("a", rx, rec, DT)], coalesce=1)
    sent = data(3 * SPEC.slots * PER_SLOT)  # three rings' worth: needs the credits back
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ex.run)
        nursery.start_soon(tx.send_records, sent)
        # the ring is full and its first buffer is in a push that awaits: every task must block
        # (a poller that spins through empty polls while compute awaits never lets them)
        with trio.fail_after(5):
            await wait_all_tasks_blocked()
        assert rec.calls == 1 and ex.stats.waits >= 1
        polls = ex.stats.empty_polls
        await wait_all_tasks_blocked()
        assert ex.stats.empty_polls == polls
        rec.go.set()
        with trio.fail_after(5):
            await wait_all_tasks_blocked()
        assert np.array_equal(rec.records, sent)
        await tx.aclose()
    assert rec.ended_at is not None


# -- (3) a malformed buffer closes its channel only --------------------------------------------------


def post_bad_count(tx):
    tx.reserve()
    tx.post(nbytes=10, count=3)  # 3 records of 16 bytes cannot take 10 bytes


def post_bad_control(tx):
    encode_control(tx.reserve(), 99)  # no such control type
    tx.post(nbytes=24, count=0, kind=Kind.CONTROL)


@pytest.mark.parametrize("corrupt", [post_bad_count, post_bad_control])
@pytest.mark.parametrize("polled_together", [True, False], ids=["same-poll", "later-poll"])
async def test_a_malformed_buffer_closes_only_its_channel(corrupt, polled_together):
    tx_a, in_a, rec_a = pipe("a")
    tx_b, in_b, rec_b = pipe("b")
    good = data(3 * PER_SLOT + 4)  # 4 buffers, then the bad one
    b_data = data(10 * SPEC.slots * PER_SLOT, first=10_000)
    ex = Executor([in_a, in_b])

    async def producer_a():
        await tx_a.send_records(good)
        await tx_a.send_control(Control.WATERMARK, 7)
        if not polled_together:
            await wait_all_tasks_blocked()  # the good buffers are polled and processed first
            assert len(rec_a.records) == len(good)
        corrupt(tx_a)
        await trio.sleep_forever()  # a vanished peer: sends nothing more, never closes

    async def producer_b():
        await tx_b.send_records(b_data)
        await tx_b.aclose()

    with trio.fail_after(10), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer_a)
            if polled_together:
                await wait_all_tasks_blocked()  # everything of A is posted before polling starts
            nursery.start_soon(producer_b)
            await ex.run()
            nursery.cancel_scope.cancel()
    assert [e["channel"] for e in logs if e["log_level"] == "error"] == ["a"]
    assert isinstance(in_a.error, MalformedBuffer)
    assert ex.failed == {"a": in_a.error}
    assert ex.stats.failed_channels == 1
    assert np.array_equal(rec_a.records, good), "buffers posted before the bad one are processed"
    assert rec_a.watermarks == [7]
    assert rec_a.ended_at is None
    assert in_b.error is None and rec_b.ended_at is not None
    assert np.array_equal(rec_b.records, b_data)


# -- (4) an operator exception fails the executor ------------------------------------------------------


async def test_an_operator_exception_fails_the_executor_and_nothing_hangs():
    tx_a, in_a, rec_a = pipe("a", fail_at=55)
    tx_b, in_b, rec_b = pipe("b")

    async def endless(tx):  # would block on credits forever once nobody releases
        first = 0
        while True:
            await tx.send_records(data(PER_SLOT, first))
            first += PER_SLOT

    ex = Executor([in_a, in_b])
    with trio.fail_after(10):
        # the executor raises the OperatorError itself; this test's own nursery wraps it
        with pytest.RaisesGroup(pytest.RaisesExc(OperatorError, match=r"step 'a': bad record")):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(endless, tx_a)
                nursery.start_soon(endless, tx_b)
                await ex.run()
    assert (rec_a.records["t"] < 55).all()


# -- (5) counters and coalescing -----------------------------------------------------------------------


async def test_counters_count_what_was_sent():
    tx_a, in_a, rec_a = pipe("a")
    tx_b, in_b, rec_b = pipe("b")
    a_data, b_data = data(7 * PER_SLOT + 5), data(3)
    ex = Executor([in_a, in_b])

    async def produce(tx, records, watermarks):
        sent = await tx.send_records(records)
        for w in watermarks:
            await tx.send_control(Control.WATERMARK, w)
        await tx.aclose()
        return sent

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ex.run)
        nursery.start_soon(produce, tx_a, a_data, [1, 2, 3])
        nursery.start_soon(produce, tx_b, b_data, [])
    assert ex.stats.buffers == 8 + 1
    assert ex.stats.records == len(a_data) + len(b_data)
    assert ex.stats.control == 3 + 2  # watermarks and one end of stream per channel
    assert ex.stats.failed_channels == 0
    assert rec_a.watermarks == [1, 2, 3]
    assert np.array_equal(rec_a.records, a_data) and np.array_equal(rec_b.records, b_data)


@pytest.mark.parametrize("coalesce, sizes", [(1, [PER_SLOT] * 12 + [4]), (4, [4 * PER_SLOT] * 3 + [4]), (5, [50, 50, 20, 4])])
async def test_full_consecutive_buffers_are_coalesced(coalesce, sizes):
    spec = RingSpec(slots=16, slot_size=SPEC.slot_size, record_size=DT.itemsize)
    tx, inp, rec = pipe("a", spec)
    records = data(12 * PER_SLOT + 4)
    await tx.send_records(records)  # all posted (and polled in one pass) before compute starts
    await tx.aclose()
    ex = Executor([inp], coalesce=coalesce)
    await ex.run()
    assert rec.sizes == sizes
    assert np.array_equal(rec.records, records)
    assert ex.stats.buffers == 13 and ex.stats.records == len(records)


@pytest.mark.parametrize("coalesce", [1, 3, 16])
async def test_coalescing_across_ring_wrap_gives_the_same_result(coalesce):
    tx, inp, rec = pipe("a")  # 8 slots: runs wrap around the ring's end
    records = data(50 * PER_SLOT + 7)

    async def produce():
        for i, part in enumerate(np.array_split(records, 9)):
            await tx.send_records(part)  # partial buffers too, which are never coalesced
            await tx.send_control(Control.WATERMARK, i)
        await tx.aclose()

    ex = Executor([inp], coalesce=coalesce)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ex.run)
        nursery.start_soon(produce)
    assert np.array_equal(rec.records, records)
    assert rec.watermarks == list(range(9))
    assert max(rec.sizes) <= coalesce * PER_SLOT
    assert ex.stats.records == len(records)
    if coalesce == 1:
        assert max(rec.sizes) <= PER_SLOT
