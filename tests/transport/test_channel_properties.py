"""Channel invariants under any interleaving of producer and consumer steps.

Hypothesis drives an in-process pair synchronously (reserve/post/poll/release need no event
loop) and checks after every step: the ring never holds more than `slots` unreleased buffers,
the sender's credits match what the receiver released, ready() tells exactly whether an unread
buffer exists, and what the receiver sees is a byte-exact prefix of what was sent.
"""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from slashrt._buffer import CONTROL_DTYPE, FOOTER_SIZE, Control, Kind, encode_control
from slashrt.transport import NoCredit, RingSpec, open_inproc_channel

MIN_SLOT = FOOTER_SIZE + CONTROL_DTYPE.itemsize
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


def has_credit(machine):
    return machine.sender.credits() > 0


class ChannelMachine(RuleBasedStateMachine):
    @initialize(
        slots=st.integers(1, 8),
        slot_size=st.integers(MIN_SLOT, 512),
        record_size=st.none() | st.integers(1, MIN_SLOT - FOOTER_SIZE),
    )
    def open_channel(self, slots, slot_size, record_size):
        self.spec = RingSpec(slots=slots, slot_size=slot_size, record_size=record_size)
        self.sender, self.receiver = open_inproc_channel(self.spec)
        self.sent = []  # (kind, count, epoch, payload bytes) in post order
        self.polled = 0
        self.held = []  # polled, not yet released: (index into sent, Buffer)
        self.released = 0

    @precondition(has_credit)
    @rule(data=st.data(), epoch=U64)
    def produce(self, data, epoch):
        if self.spec.record_size is None:
            payload = data.draw(st.binary(max_size=self.spec.payload_capacity))
            count = data.draw(st.integers(0, 2**32 - 1))
        else:
            count = data.draw(st.integers(0, self.spec.records_per_slot))
            payload = data.draw(st.binary(min_size=count * self.spec.record_size, max_size=count * self.spec.record_size))
        self.sender.reserve()[: len(payload)] = np.frombuffer(payload, np.uint8)
        self.sender.post(nbytes=len(payload), count=count, epoch=epoch)
        self.sent.append((Kind.DATA, count, epoch, payload))

    @precondition(has_credit)
    @rule(ctype=st.sampled_from([Control.WATERMARK, Control.BARRIER]), value=I64, aux=I64, epoch=U64)
    def send_control(self, ctype, value, aux, epoch):
        scratch = np.zeros(CONTROL_DTYPE.itemsize, np.uint8)
        nbytes = encode_control(scratch, ctype, value, aux)
        self.sender.reserve()[:nbytes] = scratch
        self.sender.post(nbytes=nbytes, count=0, kind=Kind.CONTROL, epoch=epoch)
        self.sent.append((Kind.CONTROL, 0, epoch, scratch.tobytes()))

    @precondition(lambda self: not has_credit(self))
    @rule()
    def produce_without_credit(self):
        posted = self.sender.posted
        with pytest.raises(NoCredit):
            self.sender.reserve()
        with pytest.raises(NoCredit):
            self.sender.post(nbytes=0, count=0)
        assert self.sender.posted == posted

    @rule()
    def poll(self):
        buf = self.receiver.poll()
        if self.polled == len(self.sent):
            assert buf is None, "poll() returned a buffer that was never sent"
            return
        assert buf is not None, "poll() returned None with an unread buffer in the ring"
        assert buf.footer.seq == self.polled
        self.held.append((self.polled, buf))
        self.polled += 1
        self.assert_held_intact()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        k = data.draw(st.integers(1, len(self.held)))
        self.assert_held_intact()  # nothing the receiver still holds was overwritten
        self.receiver.release(k)
        del self.held[:k]
        self.released += k

    def assert_held_intact(self):
        for index, buf in self.held:
            kind, count, epoch, payload = self.sent[index]
            f = buf.footer
            assert (f.kind, f.count, f.epoch, f.nbytes) == (kind, count, epoch, len(payload))
            assert buf.payload.tobytes() == payload, f"payload of buffer {index} changed or differs"

    @invariant()
    def in_flight_is_bounded_and_credits_match(self):
        in_flight = self.sender.posted - self.released
        assert 0 <= in_flight <= self.spec.slots
        assert self.sender.credits() == self.spec.slots - in_flight
        assert self.receiver.outstanding == len(self.held)

    @invariant()
    def ready_iff_unread(self):
        assert self.sender.posted == len(self.sent)
        assert self.receiver.ready() == (self.polled < len(self.sent))


ChannelMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestChannelInvariants = ChannelMachine.TestCase
