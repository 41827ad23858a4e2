"""Slot pools: exclusive credits per channel and floating slots lent to backlogged channels
(`slashrt.transport._pool`, over shm and tcp).

- the grant policy: a channel's exclusive slots come back to it in release order; a backlogged
  channel borrows floating slots up to its cap and keeps them while backlogged, gives them back
  when not, and when it ends; the pool never lends a slot twice;
- over shared memory, a random program of posts, polls and releases on three channels of one
  pool (drawn by hypothesis) keeps every channel FIFO and whole, never puts two unreleased
  buffers in one slot, always leaves each channel its exclusive slots, and accounts for every
  floating slot;
- over shm and tcp (and verbs, in the VM), three channels move 50 times the pool's slots with
  one slow consumer: every buffer arrives in order, the slow channel borrows up to its cap, and
  everything lent comes back;
- a sender refuses a pool whose header does not match the agreed spec, in one sentence.
"""

import os

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.errors import ChannelClosed
from slashrt.transport._accept import accept_authenticated
from slashrt.transport._auth import generate_secret
from slashrt.transport._channel import RingSpec
from slashrt.transport._pool import Grants, SlotPool
from slashrt.transport._registry import open_slot_pool
from slashrt.transport.shm import ShmPool, _Segment, connect_shm, open_shm_listener
from slashrt.transport.tcp import connect_tcp, open_tcp_listener

TIMEOUT = 60


# -- the policy ------------------------------------------------------------------------------------
def test_exclusive_slots_come_back_in_order_and_a_backlogged_channel_borrows_up_to_its_cap():
    pool = SlotPool(channels=2, exclusive=3, floating=5, max_lent=4, slot_size=64)
    a, b = Grants(pool), Grants(pool)
    assert [a.slot_of(s) for s in range(3)] == [0, 1, 2] and [b.slot_of(s) for s in range(3)] == [3, 4, 5]
    assert (a.granted, pool.window) == (3, 7)
    a.regrant(0, 2, backlogged=False)  # idle: its own slots again, in order, nothing borrowed
    assert a.granted == 5 and [a.slot_of(s) for s in range(2, 5)] == [2, 0, 1] and pool.free == 5
    a.regrant(2, 1, backlogged=True)  # backlogged: its slot again, and floating ones up to its cap
    assert a.lent == 4 and pool.free == 1 and a.granted == 10
    assert [a.slot_of(s) for s in range(5, 10)] == [2, 6, 7, 8, 9] and a.consecutive(5, 5) == 1
    assert a.consecutive(6, 4) == 4
    b.regrant(0, 3, backlogged=True)  # the other channel gets what is left; its own slots always
    assert b.lent == 1 and pool.free == 0 and [b.slot_of(s) for s in range(3, 7)] == [3, 4, 5, 10]
    a.regrant(3, 5, backlogged=True)  # still backlogged: keeps what it borrowed, the cap holds
    assert a.lent == 4 and pool.free == 0
    a.regrant(8, 2, backlogged=False)  # no longer: the floating ones among these go back
    assert a.lent == 2 and pool.free == 2 and pool.peak == 5
    a.close(10)  # ended with buffers 10.. granted: what it still holds returns
    assert a.lent == 0 and pool.free == 4
    with pytest.raises(ValueError, match="room for 2 channels, all joined"):
        Grants(pool)


# -- a random program over shared memory -------------------------------------------------------------
SPEC = RingSpec(slots=3, slot_size=256, record_size=8)
OPS = st.lists(st.tuples(st.sampled_from(["post", "poll"]), st.integers(0, 2), st.integers(0, 4)), max_size=120)


async def _shm_pool_channels(pool, n, secret):
    async with open_shm_listener(SPEC, secret, pool=pool) as listener:
        senders = []
        async with trio.open_nursery() as nursery:
            async def dial():
                senders.append(await connect_shm(listener.address, SPEC, secret))
            for _ in range(n):
                nursery.start_soon(dial)
            receivers = await accept_authenticated(listener, n)
    # pair them up by the pool channel each was given
    by_channel = {r.grants.channel: r for r in receivers}
    return [(s, by_channel[_channel_of(s, pool)]) for s in senders]


def _channel_of(sender, pool) -> int:
    """The pool channel a shm sender writes for: its grant table's place among the pool's."""
    address = sender._table.table.ctypes.data
    return next(c for c in range(pool.slots.channels)
                if pool.slots.tables[c].ctypes.data - pool.seg.buf.ctypes.data == address - sender._link.seg.buf.ctypes.data)


@settings(max_examples=30, deadline=None)
@given(OPS, st.integers(1, 6))
def test_a_random_program_on_a_shm_pool_keeps_every_channel_fifo_whole_and_apart(program, max_lent):
    secret = generate_secret()

    async def main():
        pool = ShmPool(SPEC, channels=3, floating=6, max_lent=max_lent)
        try:
            pairs = await _shm_pool_channels(pool, 3, secret)
            posted = [0, 0, 0]
            polled = [0, 0, 0]
            for op, ch, k in program:
                s, r = pairs[ch]
                if op == "post":
                    for _ in range(k + 1):
                        if s.credits() <= 0:
                            break
                        s.reserve()[:8].view(np.int64)[0] = ch * 1_000_000 + posted[ch]
                        s.post(nbytes=8, count=1)
                        posted[ch] += 1
                else:
                    while (buf := r.poll()) is not None:
                        assert buf.records(np.int64)[0] == ch * 1_000_000 + polled[ch]  # FIFO, whole
                        polled[ch] += 1
                    r.release(min(k, r.outstanding))
                # no slot holds two buffers not yet released, of any channels
                held = [r.grants.slot_of(q) for c, (_, r) in enumerate(pairs) for q in range(r._released_count, posted[c])]
                assert len(held) == len(set(held))
                for _, r in pairs:  # each channel keeps its exclusive slots, and at most its cap more
                    assert SPEC.slots <= r.grants.granted - r._released_count <= SPEC.slots + max_lent
                assert pool.slots.free + sum(r.grants.lent for _, r in pairs) == 6
            for ch, (s, r) in enumerate(pairs):  # the rest arrives too
                while polled[ch] < posted[ch]:
                    buf = r.poll()
                    assert buf is not None and buf.records(np.int64)[0] == ch * 1_000_000 + polled[ch]
                    polled[ch] += 1
                r.release(r.outstanding)
                assert r.poll() is None
            for s, r in pairs:
                s.close()
                r.close()
        finally:
            pool.close()

    trio.run(main)


# -- many times the pool, with one slow consumer -----------------------------------------------------
def _medium(name):
    """(listener, connect) of medium `name`."""
    if name == "verbs":
        from slashrt.transport.verbs import connect_verbs, open_verbs_listener

        return open_verbs_listener, connect_verbs
    return (open_shm_listener, connect_shm) if name == "shm" else (open_tcp_listener, connect_tcp)


async def _channels(medium, pool, spec, secret, n):
    listen, connect = _medium(medium)
    async with listen(spec, secret, pool=pool) as listener:
        senders = []
        async with trio.open_nursery() as nursery:
            async def dial(i):
                senders.append((i, await connect(listener.address, spec, secret)))
            for i in range(n):
                nursery.start_soon(dial, i)
                await trio.testing.wait_all_tasks_blocked()
            receivers = await accept_authenticated(listener, n)
    return [s for _, s in sorted(senders, key=lambda x: x[0])], receivers


@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_channels_move_fifty_pools_with_a_slow_consumer_and_every_loan_comes_back(medium):
    await move_fifty_pools(medium)


async def move_fifty_pools(medium: str) -> None:
    """Three channels of one pool move 50 times its slots each, one of them slowly consumed:
    everything in order, the slow one borrows up to its cap, every loan comes back (also run
    over verbs in the VM: tests/rdma)."""
    spec = RingSpec(slots=4, slot_size=4096, record_size=8)
    pool = open_slot_pool(medium, spec, channels=3, floating=12, max_lent=8)
    slots = pool if isinstance(pool, SlotPool) else pool.slots
    total = slots.slots
    buffers = 50 * total  # per channel
    per = spec.payload_capacity // 8
    try:
        with trio.fail_after(TIMEOUT):
            senders, receivers = await _channels(medium, pool, spec, generate_secret(), 3)
            most = {}

            async def produce(k, s):
                for i in range(buffers):
                    await s.wait_credit()
                    s.reserve()[: 8 * per].view(np.int64)[:] = np.arange(i * per, (i + 1) * per) + k * 10**9
                    s.post(nbytes=8 * per, count=per)
                await s.aclose()

            async def consume(r):
                got, first = 0, None
                while not r.finished:
                    await r.wait_readable()
                    while (buf := r.poll()) is not None:
                        if not buf.is_control:
                            values = buf.records(np.int64)
                            first = values[0] // 10**9 if first is None else first
                            assert np.array_equal(values, np.arange(got * per, (got + 1) * per) + first * 10**9)
                            got += 1
                            most[first] = max(most.get(first, 0), r.grants.lent)
                            if first == 0:
                                await trio.sleep(0.0002)  # the slow one: its sender has a backlog
                        r.release()
                assert got == buffers

            async with trio.open_nursery() as drives:
                for end in (*senders, *receivers):
                    drives.start_soon(end.drive)
                async with trio.open_nursery() as nursery:
                    for k, s in enumerate(senders):
                        nursery.start_soon(produce, k, s)
                    for r in receivers:
                        nursery.start_soon(consume, r)
                drives.cancel_scope.cancel()
            assert most[0] == 8  # the slow channel borrowed up to its cap
            for r in receivers:
                await r.aclose()
            assert slots.free == 12 and pool.peak >= 8  # every loan came back
            for s in senders:
                await s.aclose()
    finally:
        pool.close()


def test_a_sender_refuses_a_pool_that_does_not_match_the_spec():
    pool = ShmPool(SPEC, channels=2, floating=4)
    fd = os.dup(pool.fd)
    try:
        with pytest.raises(ChannelClosed, match="slot pool header does not match the agreed ring spec"):
            _Segment.attach_pool(fd, RingSpec(slots=5, slot_size=256, record_size=8), 0, pool.slots.window)
        with pytest.raises(ChannelClosed, match="slot pool header does not match"):
            _Segment.attach_pool(fd, SPEC, 0, pool.slots.window + 1)
        with pytest.raises(ChannelClosed, match="slot pool header does not match"):
            _Segment.attach_pool(fd, SPEC, 2, pool.slots.window)  # no such channel
        seg = _Segment.attach_pool(fd, SPEC, 1, pool.slots.window)
        assert len(seg.ring) == pool.slots.nbytes
        seg.close()
    finally:
        os.close(fd)
        pool.close()
