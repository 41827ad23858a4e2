"""Channels opened through `open_channels` are driven by it: code that only posts and polls
moves any amount of data, and what is left open when the owner is done is closed."""

import numpy as np
import pytest
import trio
import trio.testing

from slashrt.errors import ChannelClosed
from slashrt.transport import RingSpec
from slashrt.transport._auth import generate_secret
from slashrt.transport._registry import open_channels, open_listener

SPEC = RingSpec(slots=4, slot_size=4096, record_size=8)
RINGS = 100


async def _connected(channels, medium, secret, listener=None):
    listener = listener or await channels.listen(medium, SPEC, secret)
    accepted = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(accepted, channels.accept(listener)))
        sender = await channels.connect(medium, listener.address, SPEC, secret)
    return sender, accepted[0]


async def _across(receiving, sending, listener, medium, secret):
    """A sender of owner `sending` connected to `listener`, and its receiver accepted by owner `receiving`."""
    accepted = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _append(accepted, receiving.accept(listener)))
        sender = await sending.connect(medium, listener.address, SPEC, secret)
    return sender, accepted[0]


async def _append(out, awaitable):
    out.append(await awaitable)


async def _take_all(receiver) -> np.ndarray:
    """Poll until END_OF_STREAM, never calling drive()."""
    got = []
    while not receiver.finished:
        await receiver.wait_readable()
        while (buf := receiver.poll()) is not None:
            if not buf.is_control:
                got.append(buf.records(np.dtype("<i8")).copy())
            receiver.release()
    return np.concatenate(got)


@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_ends_from_open_channels_move_many_rings_without_anyone_calling_drive(medium):
    data = np.arange(RINGS * SPEC.ring_bytes // 8, dtype="<i8")
    secret = generate_secret()
    with trio.fail_after(30):
        async with open_channels() as channels:
            sender, receiver = await _connected(channels, medium, secret)
            results = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _append(results, _take_all(receiver)))
                await sender.send_records(data)
                await sender.aclose()
    np.testing.assert_array_equal(results[0], data)


@pytest.mark.parametrize("stop_driving", [False, True], ids=["driven", "stopped-driving"])
@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_leaving_the_owner_aborts_senders_that_were_not_ended(medium, stop_driving):
    secret = generate_secret()
    with trio.fail_after(30):
        # the listener outlives the sending owner, as a peer's would
        async with open_channels() as receiving, open_listener(medium, SPEC, secret) as listener:
            async with open_channels() as sending:
                sender, receiver = await _across(receiving, sending, listener, medium, secret)
                await sender.send_records(np.arange(10, dtype="<i8"))
                assert not sender.closed
                if stop_driving:  # a cluster stopped with a savepoint: every owner stops driving first
                    await _take_some(receiver)
                    receiving.stop_driving()
                    sending.stop_driving()
            assert sender.closed
            if stop_driving:
                # nobody noticed the close, nothing failed (a driven shm receiver would fail and
                # warn here; tcp notices a close only when polled)
                await trio.testing.wait_all_tasks_blocked()
                assert receiver.error is None
            else:
                with pytest.raises(ChannelClosed):
                    await _take_all(receiver)  # the 10 records, then the channel fails: no END_OF_STREAM
            assert not receiver.finished


def test_a_listener_from_the_registry_accepts_only_through_an_owner():
    from slashrt.transport._registry import Listener

    assert not hasattr(Listener, "accept")


@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_a_second_drive_of_an_owned_end_joins_the_running_one(medium):
    # the executor starts its inputs' drives although their owner already runs them
    secret = generate_secret()
    with trio.fail_after(30):
        async with open_channels() as channels:
            sender, receiver = await _connected(channels, medium, secret)
            got = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver.drive)
                nursery.start_soon(sender.drive)
                await trio.testing.wait_all_tasks_blocked()  # both second drives wait, none raised
                nursery.start_soon(lambda: _append(got, _take_all(receiver)))
                await sender.send_records(np.arange(3 * SPEC.ring_bytes // 8, dtype="<i8"))
                await sender.aclose()
            assert len(got[0]) == 3 * SPEC.ring_bytes // 8


async def _take_some(receiver) -> None:
    """Poll what arrived (the peer's close, once all is polled, would fail a driven receiver)."""
    await receiver.wait_readable()
    while receiver.poll() is not None:
        receiver.release()
