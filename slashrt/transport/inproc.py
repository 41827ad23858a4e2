"""In-process backend: both ends of the ring in one process and one trio event loop.

The ring is a plain numpy byte array; the credit word is an integer both ends see. Idle ends
park on trio parking lots, which the other end unparks only when someone is parked, so a busy
pair does no extra work per buffer.
"""

from __future__ import annotations

import numpy as np
import trio

from slashrt.transport._channel import Receiver, RingSpec, Sender

__all__ = ["open_inproc_channel", "InprocSender", "InprocReceiver"]


class _Shared:
    __slots__ = ("ring", "released", "data_lot", "credit_lot", "spec")

    def __init__(self, spec: RingSpec):
        self.spec = spec
        self.ring = np.zeros(spec.ring_bytes, dtype=np.uint8)
        self.released = 0
        self.data_lot = trio.lowlevel.ParkingLot()
        self.credit_lot = trio.lowlevel.ParkingLot()

    def slot(self, index: int) -> np.ndarray:
        start = index * self.spec.slot_size
        return self.ring[start : start + self.spec.slot_size]


class InprocSender(Sender):
    def __init__(self, shared: _Shared):
        super().__init__(shared.spec)
        self._shared = shared
        self._slots = [shared.slot(i) for i in range(shared.spec.slots)]

    def _slot(self, index):
        return self._slots[index]

    def _publish(self, index):
        if self._shared.data_lot:
            self._shared.data_lot.unpark_all()

    def _publish_run(self, first, k):
        self._publish(first + k - 1)

    def _released(self):
        return self._shared.released

    def _ring(self):
        return self._shared.ring

    async def _park_for_credit(self):
        await self._shared.credit_lot.park()


class InprocReceiver(Receiver):
    def __init__(self, shared: _Shared):
        super().__init__(shared.spec)
        self._shared = shared
        self._slots = [shared.slot(i) for i in range(shared.spec.slots)]

    def _slot(self, index):
        return self._slots[index]

    def _return_credits(self, released):
        self._shared.released = released
        if self._shared.credit_lot:
            self._shared.credit_lot.unpark_all()

    async def _park_for_data(self):
        await self._shared.data_lot.park()

    def _ring(self):
        return self._shared.ring


def open_inproc_channel(spec: RingSpec | None = None) -> tuple[InprocSender, InprocReceiver]:
    """Create a channel whose two ends live in this process."""
    shared = _Shared(spec or RingSpec())
    return InprocSender(shared), InprocReceiver(shared)
