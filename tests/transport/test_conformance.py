"""Every transport backend runs the same conformance kit: plug one in by adding its factory."""

import contextlib

import pytest
import trio

from slashrt.testing import check_channel, open_inproc_pair
from slashrt.transport._accept import accept_authenticated
from slashrt.transport._auth import generate_secret
from slashrt.transport.inproc import InprocReceiver, InprocSender, _Shared
from slashrt.transport.shm import connect_shm, open_shm_listener, open_shm_pair

from .test_tcp import open_tcp_pair


@contextlib.asynccontextmanager
async def open_shm_pair_cm(spec):
    """Both ends over one memfd in this process (two mappings, eventfds, a socket pair)."""
    sender, receiver = open_shm_pair(spec)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


@contextlib.asynccontextmanager
async def open_shm_connected(spec):
    """The full set-up path: a listener, the handshake, descriptors passed with SCM_RIGHTS."""
    secret = generate_secret()
    async with open_shm_listener(spec, secret) as listener:
        async with trio.open_nursery() as nursery:
            accepted = []

            async def accept():
                accepted.extend(await accept_authenticated(listener))

            nursery.start_soon(accept)
            sender = await connect_shm(listener.address, spec, secret)
    (receiver,) = accepted
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver.drive)
            nursery.start_soon(sender.drive)
            yield sender, receiver
            nursery.cancel_scope.cancel()
    finally:
        sender.close()
        receiver.close()


BACKENDS = [
    pytest.param(open_inproc_pair, id="inproc"),
    pytest.param(open_shm_pair_cm, id="shm"),
    pytest.param(open_shm_connected, id="shm-connected"),
    pytest.param(open_tcp_pair, id="tcp"),
]


@pytest.mark.parametrize("open_pair", BACKENDS)
async def test_backend_conforms(open_pair):
    await check_channel(open_pair)


# -- the kit itself must fail backends that break the protocol -----------------------------------


class GreedySender(InprocSender):
    def _released(self):  # sees one credit the receiver never granted
        return self._shared.released + 1


class CorruptingSender(InprocSender):
    def _publish(self, index):  # flips a payload byte on the way
        self._slots[index][0] ^= 0xFF
        super()._publish(index)


class SpinningSender(InprocSender):
    async def _park_for_credit(self):  # busy-waits instead of parking
        await trio.sleep(0)


class SilentSender(InprocSender):
    def _publish(self, index):  # never wakes a parked receiver
        pass


class SilentReceiver(InprocReceiver):
    def _return_credits(self, released):  # never wakes a parked sender
        self._shared.released = released


def broken(sender_cls=InprocSender, receiver_cls=InprocReceiver):
    @contextlib.asynccontextmanager
    async def open_pair(spec):
        shared = _Shared(spec)
        yield sender_cls(shared), receiver_cls(shared)

    return open_pair


@pytest.mark.parametrize(
    "open_pair, failing_check",
    [
        pytest.param(broken(sender_cls=GreedySender), "check_credits", id="extra-credit"),
        pytest.param(broken(sender_cls=CorruptingSender), "check_wait_readable", id="corrupts-payload"),
        pytest.param(broken(sender_cls=SilentSender), "check_wait_readable", id="lost-data-wakeup"),
        pytest.param(broken(receiver_cls=SilentReceiver), "check_wait_credit_parks", id="lost-credit-wakeup"),
        pytest.param(broken(sender_cls=SpinningSender), "check_wait_credit_parks", id="spins-for-credit"),
    ],
)
async def test_kit_rejects_broken_backend(open_pair, failing_check):
    with pytest.raises(AssertionError, match=f"^{failing_check}: "):
        await check_channel(open_pair, timeout=0.5)
