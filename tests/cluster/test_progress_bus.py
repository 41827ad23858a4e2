"""The progress bus over real channels: 2-4 executor processes over shm and tcp converge and
never run ahead of the global frontier (replayed in the real order), a vanished peer is one
clear error; in one process, the bus's own behaviour (large messages, waiting, bad input)."""

import contextlib
import pytest
import trio
import trio.testing

from slashrt.cluster._progress import ProgressBus, open_progress_bus
from slashrt.errors import ChannelClosed, MalformedBuffer
from slashrt.progress.exchange import ProgressExchange
from slashrt.progress.reachability import Location
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import move_capability
from slashrt.progress.wire import ProgressCodec
from slashrt.testing import check_progress_bus
from slashrt.testing._check_progress import WRAPS, loop_graph, replay
from slashrt.testing._peers import run_peers
from slashrt.transport import RingSpec
from slashrt.transport._auth import generate_secret
from slashrt.transport.shm import open_shm_pair

# --- real processes ------------------------------------------------------------------------


@pytest.mark.parametrize("executors", [2, 3, 4])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_every_view_converges_and_none_runs_ahead_in_the_real_order(transport, executors):
    summary = await check_progress_bus(transport, executors=executors, seed=executors, steps=300, deadline=90)
    assert summary["rings"] >= WRAPS and summary["messages"] > 100


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_a_vanished_executor_is_one_clear_error_on_the_others(transport):
    await check_progress_bus(transport, executors=3, steps=300, vanish=1, deadline=60)


async def test_the_replay_catches_a_reordered_a_lost_and_a_diverging_message():
    results = await run_peers(
        "slashrt.testing._check_progress:workload", executors=2, transport="shm", args={"seed": 5, "steps": 200}, timeout=60
    )
    histories = [r["history"] for r in results]
    graph, nodes = loop_graph()
    initial = [((Location.output(nodes["source"]), Timestamp(0)), 2)]
    replay(graph, initial, histories)  # the real one passes

    received = [i for i, event in enumerate(histories[1]) if event[1] == "receive"]
    first, second = received[0], received[1]

    reordered = list(histories[1])
    a, b = reordered[first], reordered[second]
    reordered[first], reordered[second] = (a[0], *b[1:]), (b[0], *a[1:])
    with pytest.raises(AssertionError, match="executor 1 applied .*, executor 0 sent .* next"):
        replay(graph, initial, [histories[0], reordered])

    lost = [event for i, event in enumerate(histories[1]) if i != first]
    with pytest.raises(AssertionError):
        replay(graph, initial, [histories[0], lost])

    diverging = list(histories[0])
    i = next(i for i, event in enumerate(diverging) if event[4])  # the first event that sent something
    diverging[i] = (*diverging[i][:4], ())
    with pytest.raises(AssertionError, match="executor 0 broadcast"):
        replay(graph, initial, [diverging, histories[1]])


# --- two buses in this process -------------------------------------------------------------

GRAPH, NODES = loop_graph()
SOURCE, BODY, SINK = Location.output(NODES["source"]), Location.input(NODES["body"], 1), Location.input(NODES["sink"])
T0 = Timestamp(0)


@contextlib.asynccontextmanager
async def two_buses(transport="shm", spec=RingSpec(slots=4, slot_size=256), initial=((SOURCE, T0), 2), graph=GRAPH):
    """Executors 0 and 1 as two tasks, their addresses swapped through memory (the progress
    graph `graph`, whose pointstamps at the start are `initial`)."""
    secret, offers, swapped = generate_secret(), {}, trio.Event()
    buses, opened, leave = {}, trio.Event(), trio.Event()

    async def swap(index, addresses):
        offers[index] = addresses
        if len(offers) == 2:
            swapped.set()
        await swapped.wait()
        return {1 - index: offers[1 - index][index]}

    async def executor(index):
        where = {"host": "127.0.0.1"} if transport == "tcp" else {}
        async with open_progress_bus(
            index, 2, graph, transport=transport, secret=secret, swap_addresses=lambda a: swap(index, a),
            initial=[initial], spec=spec, history=True, **where,
        ) as bus:
            buses[index] = bus
            if len(buses) == 2:
                opened.set()
            await leave.wait()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(executor, 0)
            nursery.start_soon(executor, 1)
            await opened.wait()
            try:
                yield buses[0], buses[1]
            finally:
                leave.set()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_a_message_larger_than_a_slot_arrives_whole_in_order(transport):
    updates = [((BODY, Timestamp(e, (c,))), 1) for e in range(10) for c in range(1, 5)]  # 40 x 32 bytes, 7 per slot
    async with two_buses(transport) as (a, b):
        a.record(updates)  # covered by the capabilities, positive: held
        assert a.stats.messages == 0
        a.flush()
        while b.stats.received < 1:
            await b.wait_changed()  # (nothing can change between the check and the wait)
        receives = [event for event in b.history if event[1] == "receive"]
        assert len(receives) == 1 and receives[0][3] == a.history[-1][4][0]  # whole, rows in order
        assert sorted(receives[0][3], key=repr) == sorted(updates, key=repr)
        assert a.stats.frames >= 6 and a.stats.messages == 1
        # retire them again (a owns both source instances here), so both views end idle
        a.record([(pointstamp, -1) for pointstamp, _ in updates] + [((SOURCE, T0), -2)])
        await b.wait_complete(SINK, Timestamp(100))
    assert a.exchange.view.is_idle() and b.exchange.view.is_idle()


async def test_waiting_returns_exactly_when_the_frontier_passes():
    async with two_buses() as (a, b):
        complete, moved, changes = [], [], []
        a.on_frontier_change = changes.extend

        async def wait_complete():
            await b.wait_complete(SINK, T0)
            complete.append(b.frontier(SOURCE))

        async def wait_frontier():
            moved.append(await a.next_frontier(SOURCE))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_complete)
            nursery.start_soon(wait_frontier)
            a.record([((SOURCE, Timestamp(1)), 1), ((SOURCE, T0), -1)])  # one instance moves: held
            a.flush()
            while b.stats.received < 1:
                await b.wait_changed()
            await trio.testing.wait_all_tasks_blocked()
            assert not complete and not moved  # b's own instance is still at 0
            b.record([((SOURCE, Timestamp(1)), 1), ((SOURCE, T0), -1)])  # the last one leaves 0: sent
        assert list(complete[0]) == [Timestamp(1)] and list(moved[0]) == [Timestamp(1)]
        assert {(SOURCE, T0, -1), (SOURCE, Timestamp(1), 1), (SINK, T0, -1)} <= set(changes)
        a.record([((SOURCE, Timestamp(1)), -1)])
        b.record([((SOURCE, Timestamp(1)), -1)])


def leaves(exc):
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def test_bad_bytes_on_a_progress_channel_name_their_sender():
    with pytest.raises(BaseException) as info:
        async with two_buses() as (a, b):
            sender = a._senders[1]
            payload = sender.reserve()
            payload[:8] = memoryview(b"garbage!")
            sender.post(nbytes=8, count=0)
            await trio.sleep_forever()
    errors = [str(e) for e in leaves(info.value) if isinstance(e, MalformedBuffer)]
    assert errors == ["from executor 0: not a progress message: magic 0x6167, expected 0x4750"]


async def test_a_closed_bus_refuses_to_record():
    async with two_buses() as (a, b):
        a.record([((SOURCE, T0), -1)])
        b.record([((SOURCE, T0), -1)])
    with pytest.raises(ChannelClosed, match="progress bus is closed"):
        a.record([((SOURCE, T0), 1)])


async def test_accumulation_leaves_one_message_per_watermark_and_executor():
    args = {"watermarks": 20, "batches": 5, "accumulate": True}
    results = await run_peers("slashrt.bench.progress_bus:accumulation", executors=2, transport="shm", args=args, timeout=60)
    assert [r["updates"] for r in results] == [20 * (5 * 2 + 2) + 1] * 2
    assert [r["messages"] for r in results] == [21, 21]  # a move per watermark, and the last drop


async def test_record_never_blocks_on_a_full_ring_and_the_backlog_goes_out_in_order():
    sender, receiver = open_shm_pair(RingSpec(slots=2, slot_size=128))  # one 56-byte message a slot
    codec = ProgressCodec(GRAPH)
    bus = ProgressBus(0, ProgressExchange(GRAPH, [((SOURCE, T0), 1)]), codec, {1: sender}, {})
    moves = [move_capability(SOURCE, Timestamp(k), Timestamp(k + 1)) for k in range(20)]
    for move in moves:  # the only instance leaves k: each move goes at once, and nobody reads
        bus.record(move)
    assert sender.posted == 2 and bus.stats.messages == 20
    got = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bus._send_task, 1)
            while len(got) < 20:
                await receiver.wait_readable()
                buffer = receiver.poll()
                got.append(codec.decode(buffer.payload))
                receiver.release()
            nursery.cancel_scope.cancel()
    assert [sorted(m, key=repr) for m in got] == [sorted(m, key=repr) for m in moves]
    assert all([delta > 0 for _, delta in m] == [True, False] for m in got)  # +1 before -1
    sender.close()
    receiver.close()


async def test_one_executor_needs_no_channels():
    async def no_peers(addresses):
        assert addresses == {}
        return {}

    async with open_progress_bus(
        0, 1, GRAPH, transport="shm", secret=generate_secret(), swap_addresses=no_peers, initial=[((SOURCE, T0), 1)]
    ) as bus:
        bus.record([((SOURCE, T0), -1)])
        await bus.wait_complete(SINK, Timestamp(10**6))
        assert bus.exchange.view.is_idle() and bus.stats.bytes == 0
