"""A port serves many named channels on one socket (`_port`): each sender reaches the channel it
names, with that channel's ring; a name the port does not serve, a wrong secret or an idle
stranger is dropped and never delays the real senders."""

import numpy as np
import pytest
import trio
import trio.testing

from slashrt.errors import ChannelClosed
from slashrt.transport import RingSpec
from slashrt.transport._accept import PeersMissing
from slashrt.transport._auth import AuthenticationFailed, generate_secret
from slashrt.transport._port import ChannelAddress
from slashrt.transport._registry import open_channels
from tests.transport.test_registry import _take_all

RINGS = 50  # each channel moves this many times its ring


def _spec(i: int) -> RingSpec:
    return RingSpec(slots=4 + i, slot_size=4096, record_size=8)


def _data(i: int) -> np.ndarray:
    return np.arange(RINGS * _spec(i).ring_bytes // 8, dtype="<i8") * (i + 1)


@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_senders_reach_the_channels_they_name_on_one_port_each_with_its_own_ring(medium):
    secret = generate_secret()
    names = [f"window/{i}" for i in range(3)] + ["progress/0"]
    with trio.fail_after(60):
        async with open_channels() as receiving, open_channels() as sending:
            port = await receiving.open_port(medium, secret, expected=len(names))
            listeners = {name: port.listener(name, _spec(i)) for i, name in enumerate(names)}
            assert {lst.address for lst in listeners.values()} == {ChannelAddress(port.address, n) for n in names}
            senders, receivers = {}, {}

            async def dial(i: int, name: str) -> None:
                senders[name] = await sending.connect(medium, ChannelAddress(port.address, name), _spec(i), secret)

            async def accept() -> None:
                receivers.update(await receiving.accept_each(listeners, timeout=30))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept)
                for i, name in reversed(list(enumerate(names))):  # in another order than the listeners'
                    nursery.start_soon(dial, i, name)
            assert {name: end.spec for name, end in receivers.items()} == {n: _spec(i) for i, n in enumerate(names)}
            results = {}

            async def stream(i: int, name: str) -> None:
                await senders[name].send_records(_data(i))
                await senders[name].aclose()

            async def take(name: str) -> None:
                results[name] = await _take_all(receivers[name])

            async with trio.open_nursery() as nursery:
                for i, name in enumerate(names):
                    nursery.start_soon(stream, i, name)
                    nursery.start_soon(take, name)
    for i, name in enumerate(names):
        np.testing.assert_array_equal(results[name], _data(i))


@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_a_name_the_port_does_not_serve_and_a_wrong_secret_are_dropped_while_the_real_sender_gets_in(medium):
    secret = generate_secret()
    spec = _spec(0)
    with trio.fail_after(60):
        async with open_channels() as receiving, open_channels() as sending:
            port = await receiving.open_port(medium, secret)
            listener = port.listener("exchange/1", spec)
            with pytest.raises(ChannelClosed):  # the port closes a connection naming no channel of its own
                await sending.connect(medium, ChannelAddress(port.address, "exchange/2"), spec, secret)
            with pytest.raises(AuthenticationFailed, match="wrong cluster secret"):
                await sending.connect(medium, listener.address, spec, generate_secret())
            got = []

            async def accept() -> None:
                got.append(await receiving.accept(listener))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept)
                sender = await sending.connect(medium, listener.address, spec, secret)
            receiver = got[0]
            async with trio.open_nursery() as nursery:
                data = np.arange(RINGS * spec.ring_bytes // 8, dtype="<i8")
                out = []
                nursery.start_soon(_collect, out, receiver)
                await sender.send_records(data)
                await sender.aclose()
            np.testing.assert_array_equal(out[0], data)


async def _collect(out, receiver):
    out.append(await _take_all(receiver))


@pytest.mark.parametrize("medium", ["shm", "tcp"])
async def test_a_listener_of_one_channel_refuses_a_sender_naming_a_channel(medium):
    secret = generate_secret()
    spec = _spec(0)
    with trio.fail_after(30):
        async with open_channels() as receiving, open_channels() as sending:
            listener = await receiving.listen(medium, spec, secret)
            accepted = []

            async def accept():
                accepted.append(await receiving.accept(listener))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept)
                with pytest.raises(ChannelClosed):
                    await sending.connect(medium, ChannelAddress(listener.address, "named"), spec, secret)
                nursery.cancel_scope.cancel()
            assert accepted == []


async def test_accept_each_on_a_port_names_the_channels_nobody_dialled(autojump_clock):
    secret = generate_secret()
    async with open_channels() as receiving:
        port = await receiving.open_port("tcp", secret)
        listeners = {peer: port.listener(f"progress/{peer}", _spec(0)) for peer in (1, 2)}
        with pytest.raises(PeersMissing, match="executor 1's channel, executor 2's channel"):
            await receiving.accept_each(listeners, timeout=10, describe=lambda p: f"executor {p}'s channel")


async def test_a_port_refuses_two_channels_of_one_name():
    async with open_channels() as receiving:
        port = await receiving.open_port("tcp", generate_secret())
        port.listener("a", _spec(0))
        with pytest.raises(ValueError, match="already has a channel named 'a'"):
            port.listener("a", _spec(1))
