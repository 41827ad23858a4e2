"""In-process backend: both ends of the ring in one process and one trio event loop.

The ring is a plain numpy byte array; the credit word is an integer both ends see. Idle ends
park on trio parking lots, which the other end unparks only when someone is parked, so a busy
pair does no extra work per buffer.

Both ends share memory, so a sender may also lend records instead of copying them
(`InprocSender.lend_run`: a source feeding an array it owns): the slots get their footers as
usual (credits, order, control buffers in between and the checks of `poll_run` stay as they
are), and each lent slot names the run of records it stands for. The receiver reads a lent
slot's records there (`run_records`, `poll`, `posted_unpolled`), and forgets the loan when it
releases the slot.
"""

from __future__ import annotations

import collections

import numpy as np
import trio

from slashrt.transport._channel import Buffer, DataRun, NoCredit, Receiver, RingSpec, Sender

__all__ = ["open_inproc_channel", "InprocSender", "InprocReceiver"]


class _Shared:
    __slots__ = ("ring", "released", "data_lot", "credit_lot", "spec", "lent_from", "lent_row", "loans", "loan_ends")

    def __init__(self, spec: RingSpec):
        self.spec = spec
        self.ring = np.zeros(spec.ring_bytes, dtype=np.uint8)
        self.released = 0
        self.data_lot = trio.lowlevel.ParkingLot()
        self.credit_lot = trio.lowlevel.ParkingLot()
        # lent slots: slot i holds row lent_row[i] of loans[lent_from[i]] (the run of k x count
        # records lent from that sequence number on); -1: the slot's records are in the ring.
        # A loan occupies consecutive slots; loan_ends: (loan, sequence after its last slot), in order
        self.lent_from = np.full(spec.slots, -1, np.int64)
        self.lent_row = np.zeros(spec.slots, np.int64)
        self.loans: dict[int, np.ndarray] = {}
        self.loan_ends: collections.deque[tuple[int, int]] = collections.deque()

    def lent(self, first: int, n: int) -> np.ndarray | None:
        """The records of the n polled slots from `first` (one loan) as one k x count view,
        or None if the first is not lent."""
        owner = int(self.lent_from[first])
        if owner < 0:
            return None
        row = int(self.lent_row[first])
        return self.loans[owner][row : row + n]

    def payload(self, index: int, slot: np.ndarray, nbytes: int) -> np.ndarray:
        """Slot `index`'s payload bytes: lent records, or the slot's own."""
        records = self.lent(index, 1)
        return slot[:nbytes] if records is None else records[0].view(np.uint8)[:nbytes]

    def lent_extent(self, first: int, n: int) -> int:
        """How many of the n slots from `first` hold records of one loan (or none lent)."""
        head, last = self.lent_from[first], self.lent_from[first + n - 1]
        if head >= 0 and head == last:  # (a loan's slots are consecutive: all of it)
            return n
        owners = self.lent_from[first : first + n]
        return int(np.argmax(owners != head)) if (owners != head).any() else n

    def forget(self, released: int) -> None:
        """The slots up to sequence `released` were released: no loan there any more, and the
        loans whose last slot is among them are dropped."""
        done, first = released - self.released, self.released % self.spec.slots
        head = min(done, self.spec.slots - first)
        self.lent_from[first : first + head] = -1
        self.lent_from[: done - head] = -1
        while self.loan_ends and self.loan_ends[0][1] <= released:
            del self.loans[self.loan_ends.popleft()[0]]

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

    lends = True

    def lend_run(self, records, *, count, epoch=0):
        k = len(records)
        if k > self.contiguous_credits():
            raise NoCredit(f"lend_run of {k} slots with only {self.contiguous_credits()} contiguous credits")
        if k == 0 or records.shape[1] != count or records.dtype.itemsize * count > self.spec.payload_capacity:
            raise ValueError(f"lend_run: {records.shape} records of {records.dtype.itemsize} bytes do not fill "
                             f"{k} slots of {count} records")
        shared = self._shared
        first = self._posted % self.spec.slots
        records = records.view()
        records.flags.writeable = False  # (what operators see is a view of the lender's array)
        # keyed by the first slot's sequence number, not its index: a loan whose first slot
        # was released may still be read in its other slots when that index is lent again
        shared.loans[self._posted] = records
        shared.loan_ends.append((self._posted, self._posted + k))
        shared.lent_from[first : first + k] = self._posted
        shared.lent_row[first : first + k] = np.arange(k)
        self.post_run(k, nbytes=count * records.dtype.itemsize, count=count, epoch=epoch)

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
        shared = self._shared
        if shared.loans:  # (forget what the released slots held on loan)
            shared.forget(released)
        shared.released = released
        if shared.credit_lot:
            shared.credit_lot.unpark_all()

    def run_records(self, run, dtype):
        records = self._shared.lent(run.first_slot, run.n)
        if records is None:
            return super().run_records(run, dtype)
        if records.dtype != dtype:  # (the same layout under the receiver's field names)
            records = records.view(dtype)
        return records[0] if run.n == 1 else records

    def poll_run(self, max_buffers):
        run = super().poll_run(max_buffers)
        if run is not None and self._shared.loans:  # a run ends where a loan does
            n = self._shared.lent_extent(run.first_slot, run.n)
            if n < run.n:
                self._polled -= run.n - n
                run = DataRun(run.first_slot, n, run.count)
        return run

    def poll(self):
        buf = super().poll()
        if buf is not None and not buf.is_control and self._shared.loans:
            index = (self._polled - 1) % self.spec.slots
            buf = Buffer(buf.footer, self._shared.payload(index, buf.payload, buf.footer.nbytes))
        return buf

    def posted_unpolled(self):
        found = super().posted_unpolled()
        if self._shared.loans:
            found = [buf if buf.is_control else Buffer(buf.footer, self._shared.payload(
                (self._polled + i) % self.spec.slots, buf.payload, buf.footer.nbytes)) for i, buf in enumerate(found)]
        return found

    async def _park_for_data(self):
        await self._shared.data_lot.park()

    def _ring(self):
        return self._shared.ring


def open_inproc_channel(spec: RingSpec | None = None) -> tuple[InprocSender, InprocReceiver]:
    """Create a channel whose two ends live in this process."""
    shared = _Shared(spec or RingSpec())
    return InprocSender(shared), InprocReceiver(shared)
