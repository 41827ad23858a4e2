"""Lent records (`Sender.lend_run`): an in-process sender hands the receiver runs of an array it
owns instead of copying them into the ring. Streams many times the ring's size, lent runs
mixed with copied buffers and control buffers; the receiver polls runs and single buffers as
the executor does. The records arrive in order, read in place (views of the lender's array,
read-only), a polled run never spans two loans, an unaligned checkpoint's view of the ring
(`posted_unpolled`) sees lent records, and released slots forget their loans. A source fed
with lending sends the same buffers and watermarks as one that copies."""

import numpy as np
import pytest
import trio

from slashrt._buffer import Control
from slashrt.ops.sources import ChannelFeeder
from slashrt.transport import RingSpec, open_inproc_channel
from slashrt.transport.shm import open_shm_pair

REC = np.dtype([("t", "<i8"), ("k", "<i4"), ("f", "u1")])
SPEC = RingSpec(slots=8, slot_size=16 + 13 * 10 + 16, record_size=REC.itemsize)
PER_SLOT = SPEC.payload_capacity // REC.itemsize  # (10)


def records(n: int, seed: int = 0, first_key: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, REC)
    out["t"] = rng.integers(0, 1000, n)
    out["k"] = first_key + np.arange(n)
    out["f"] = rng.integers(0, 255, n)
    return out


async def receive(receiver, coalesce: int, lender=None, hold: int = 1):
    """Poll as the executor does (runs first, then single buffers), keeping up to `hold` polled
    items unreleased (the executor's ready queue: the sender lends into the slots released
    meanwhile while a loan's later slots are still held): the records in order, the control
    messages, and whether every run from `lender` was read in place (a read-only view of it)."""
    got, controls, in_place, held = [], [], [], []

    def release_oldest():
        n, recs = held.pop(0)
        if recs is not None:  # (read only now: its slots were held all along)
            if lender is not None and np.shares_memory(recs, lender):
                in_place.append(not recs.flags.writeable)
            got.append(recs.reshape(-1).copy())
        receiver.release(n)

    while not receiver.finished:
        run = receiver.poll_run(coalesce)
        if run is not None:
            held.append((run.n, receiver.run_records(run, REC)))
        elif (buf := receiver.poll()) is not None:
            if buf.is_control:
                controls.append(buf.control()[:2])
            held.append((1, None if buf.is_control else buf.records(REC)))
        elif held:
            release_oldest()
            await trio.lowlevel.checkpoint()
            continue
        else:
            await receiver.wait_readable()
            continue
        if len(held) > hold:
            release_oldest()
        await trio.lowlevel.checkpoint()  # (the sender lends into what was released meanwhile)
    while held:
        release_oldest()
    return (np.concatenate(got) if got else np.zeros(0, REC)), controls, in_place


@pytest.mark.parametrize("coalesce,hold", [(1, 1), (1, 5), (3, 2), (8, 1)])
async def test_lent_runs_copied_buffers_and_controls_arrive_in_order_read_in_place(coalesce, hold):
    sender, receiver = open_inproc_channel(SPEC)
    data = records(PER_SLOT * 8 * 40 + 7)  # 40 rings' worth and a partial slot
    copied = records(PER_SLOT, seed=1, first_key=-PER_SLOT)  # keys below 0
    expected_keys, expected_controls = [], []

    async def send():
        pos, step = 0, 0
        while pos < len(data):
            step += 1
            if step % 5 == 0:  # a copied buffer between loans
                await sender.send_records(copied)
                expected_keys.append(copied["k"])
            if step % 7 == 0:
                await sender.send_control(Control.WATERMARK, step)
                expected_controls.append((Control.WATERMARK, step))
            full = (len(data) - pos) // PER_SLOT
            k, count = (min(1 + step % 4, full), PER_SLOT) if full else (1, len(data) - pos)
            await sender.wait_credit(k)
            k = min(k, sender.contiguous_credits())
            sender.lend_run(data[pos : pos + k * count].reshape(k, count), count=count)
            expected_keys.append(data["k"][pos : pos + k * count])
            pos += k * count
        await sender.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        arrived, controls, in_place = await receive(receiver, coalesce, lender=data, hold=hold)
    assert np.array_equal(arrived["k"], np.concatenate(expected_keys))
    assert np.array_equal(arrived[arrived["k"] >= 0], data)
    assert controls == [*expected_controls, (Control.END_OF_STREAM, 0)]
    assert len(in_place) >= len(data) // (PER_SLOT * coalesce) and all(in_place)
    assert not receiver._shared.loans and (receiver._shared.lent_from == -1).all()  # all forgotten


async def test_a_polled_run_ends_where_its_loan_ends():
    sender, receiver = open_inproc_channel(SPEC)
    a, b = records(PER_SLOT * 2), records(PER_SLOT * 3, seed=2, first_key=1000)
    sender.lend_run(a.reshape(2, PER_SLOT), count=PER_SLOT)
    sender.lend_run(b.reshape(3, PER_SLOT), count=PER_SLOT)
    first = receiver.poll_run(8)
    assert first.n == 2 and np.array_equal(receiver.run_records(first, REC).reshape(-1), a)
    second = receiver.poll_run(8)
    assert second.n == 3 and np.array_equal(receiver.run_records(second, REC).reshape(-1), b)
    receiver.release(2)
    assert list(receiver._shared.loans) == [2]  # a's loan is forgotten once its slots are released
    receiver.release(3)
    assert not receiver._shared.loans


async def test_an_unaligned_checkpoint_sees_the_lent_records_in_the_ring():
    sender, receiver = open_inproc_channel(SPEC)
    data = records(PER_SLOT * 3)
    sender.lend_run(data.reshape(3, PER_SLOT), count=PER_SLOT)
    await sender.send_control(Control.BARRIER, 4)
    in_flight = receiver.posted_unpolled()
    assert [b.is_control for b in in_flight] == [False, False, False, True]
    assert np.array_equal(np.concatenate([b.records(REC) for b in in_flight[:3]]), data)
    # polled one by one, a lent buffer's payload is its records too
    assert np.array_equal(receiver.poll().records(REC), data[:PER_SLOT])


async def test_a_batch_cannot_change_the_lenders_array():
    sender, receiver = open_inproc_channel(SPEC)
    data = records(PER_SLOT * 2)
    before = data.copy()
    sender.lend_run(data.reshape(2, PER_SLOT), count=PER_SLOT)
    recs = receiver.run_records(receiver.poll_run(8), REC)
    with pytest.raises(ValueError, match="read-only"):
        recs["k"] += 1
    assert np.array_equal(data, before)


def test_a_channel_between_processes_does_not_lend():
    sender, receiver = open_shm_pair(SPEC)
    try:
        assert not sender.lends
        with pytest.raises(NotImplementedError, match="cannot lend records: copy them"):
            sender.lend_run(records(PER_SLOT).reshape(1, PER_SLOT), count=PER_SLOT)
        assert ChannelFeeder(sender, time="t", max_delay=0, lend=True).lend is False
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize("n", [0, 1, PER_SLOT * 8 * 25 + 3])
async def test_a_source_fed_by_lending_sends_what_a_copying_one_sends(n):
    data = records(n, seed=5)

    async def fed(lend: bool):
        sender, receiver = open_inproc_channel(SPEC)
        feeder = ChannelFeeder(sender, time="t", max_delay=3, watermark_every=4, lend=lend)

        async def feed():
            await feeder.feed(data)
            await feeder.finish()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            arrived, controls, in_place = await receive(receiver, 3, lender=data, hold=3)
        return arrived, controls, in_place, feeder.snapshot().meta

    lent, copied = await fed(True), await fed(False)
    assert np.array_equal(lent[0], data) and np.array_equal(copied[0], data)
    assert lent[1] == copied[1]  # the same watermarks at the same places
    assert lent[3] == copied[3]  # the same position (records, buffers, largest time)
    assert (len(lent[2]) > 0) == (n > 0) and all(lent[2]) and not copied[2]


# -- which sources lend: what an operator sees ---------------------------------------------------
def _writeable_batches(tmp_path, source_input) -> set:
    import slashrt

    seen = set()

    async def look(batch):
        seen.add(bool(batch._records.flags.writeable))  # (the records under the batch: a ring's or a loan's)
        return batch

    flow = slashrt.Dataflow("lend")
    flow.source("s", REC, time="t").apply(look).sink(slashrt.sinks.Collect())
    slashrt.run(flow, {"s": source_input}, slot_size=SPEC.slot_size, slots=SPEC.slots)
    return seen


def _chunks(data):
    from slashrt.cluster import PerExecutor

    def make(index, executors):
        buffer = np.empty(PER_SLOT * 7, REC)  # one array refilled for every chunk: it must be copied
        for start in range(0, len(data), len(buffer)):
            part = data[start : start + len(buffer)]
            buffer[: len(part)] = part
            yield buffer[: len(part)]

    return PerExecutor(make)


def test_arrays_and_files_are_lent_a_users_chunks_copied(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slashrt.connectors import FileSource

    data = records(PER_SLOT * 8 * 30)
    data["t"].sort()
    pq.write_table(pa.table({name: data[name] for name in REC.names}), tmp_path / "a.parquet")
    assert _writeable_batches(tmp_path, data) == {False}  # lent: read-only views of the array
    assert _writeable_batches(tmp_path, FileSource(tmp_path)) == {False}
    assert _writeable_batches(tmp_path, _chunks(data)) == {True}  # copied into the ring
