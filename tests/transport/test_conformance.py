"""Every transport backend runs the same conformance kit: plug one in by adding its factory."""

import contextlib

import pytest
import trio

from slashrt.testing import check_channel, open_inproc_pair
from slashrt.transport.inproc import InprocReceiver, InprocSender, _Shared

BACKENDS = [
    pytest.param(open_inproc_pair, id="inproc"),
    # pytest.param(open_shm_pair, id="shm"),
    # pytest.param(open_tcp_pair, id="tcp"),
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
