"""The flat buffer format: footer layout, validation, control messages."""

import numpy as np
import pytest

from slashrt._buffer import (
    CONTROL_DTYPE,
    EMPTY,
    FOOTER_DTYPE,
    FOOTER_SIZE,
    FULL,
    MAGIC,
    Control,
    Kind,
    decode_control,
    encode_control,
    read_footer,
    write_footer,
)
from slashrt.errors import MalformedBuffer

SLOT = 256


def new_slot(size=SLOT):
    return np.zeros(size, np.uint8)


def footer_of(slot):
    return slot[-FOOTER_SIZE:].view(FOOTER_DTYPE)[0]


def test_flag_is_the_last_byte():
    assert FOOTER_SIZE == 32
    assert FOOTER_DTYPE.fields["flag"][1] == FOOTER_SIZE - 1


@pytest.mark.parametrize(
    "fields",
    [
        dict(count=0, nbytes=0, seq=0, epoch=0, kind=Kind.DATA),
        dict(count=28, nbytes=224, seq=2**64 - 1, epoch=2**64 - 1, kind=Kind.DATA),
        dict(count=0, nbytes=CONTROL_DTYPE.itemsize, seq=7, epoch=3, kind=Kind.CONTROL),
    ],
)
def test_footer_round_trip(fields):
    slot = new_slot()
    payload = np.arange(SLOT - FOOTER_SIZE, dtype=np.uint8)
    slot[: payload.size] = payload
    write_footer(slot, **fields)
    footer = read_footer(slot, expected_seq=fields["seq"])
    assert {k: getattr(footer, k) for k in fields} == fields
    assert footer.kind is fields["kind"]
    assert np.array_equal(slot[: payload.size], payload), "write_footer touched the payload"


def test_write_footer_fills_every_field_and_sets_flag_last():
    seen_at_flag_write = []

    class Spy(np.ndarray):
        def __setitem__(self, key, value):
            if key in (-1, self.size - 1):
                seen_at_flag_write.append(np.asarray(self).copy())
            super().__setitem__(key, value)

    slot = new_slot().view(Spy)
    assert slot[-1] == EMPTY
    write_footer(slot, count=3, nbytes=24, seq=41, epoch=9, kind=Kind.DATA)

    final = np.asarray(slot)
    assert final[-1] == FULL
    f = footer_of(final)
    assert (f["count"], f["nbytes"], f["seq"], f["epoch"], f["magic"], f["kind"]) == (3, 24, 41, 9, MAGIC, Kind.DATA)
    # The flag was written exactly once, after every other footer byte already had its final value.
    assert len(seen_at_flag_write) == 1
    before = seen_at_flag_write[0]
    assert before[-1] == EMPTY
    assert np.array_equal(before[:-1], final[:-1])


def test_write_footer_rejects_oversized_payload_and_leaves_slot_empty():
    slot = new_slot()
    with pytest.raises(MalformedBuffer, match="does not fit"):
        write_footer(slot, count=0, nbytes=SLOT - FOOTER_SIZE + 1, seq=0, epoch=0, kind=Kind.DATA)
    assert slot[-1] == EMPTY
    write_footer(slot, count=0, nbytes=SLOT - FOOTER_SIZE, seq=0, epoch=0, kind=Kind.DATA)  # exactly full: fine
    assert read_footer(slot).nbytes == SLOT - FOOTER_SIZE


def valid_slot(**overrides):
    slot = new_slot()
    write_footer(slot, count=4, nbytes=32, seq=5, epoch=0, kind=Kind.DATA)
    f = footer_of(slot)
    for name, value in overrides.items():
        f[name] = value
    return slot


@pytest.mark.parametrize(
    "overrides, kwargs, message",
    [
        (dict(flag=EMPTY), {}, "flag is 0"),
        (dict(magic=0xBEEF), {}, "bad footer magic 0xbeef"),
        (dict(kind=9), {}, "unknown buffer kind 9"),
        (dict(nbytes=SLOT), {}, "claims 256 payload bytes"),
        (dict(count=5), dict(record_size=8), "5 records of 8 bytes but 32"),
        (dict(kind=Kind.CONTROL), {}, "control buffer with 32 payload bytes"),
        ({}, dict(expected_seq=6), "sequence number 5, expected 6"),
        ({}, dict(expected_seq=4), "sequence number 5, expected 4"),
    ],
)
def test_read_footer_rejects(overrides, kwargs, message):
    with pytest.raises(MalformedBuffer, match=message):
        read_footer(valid_slot(**overrides), **kwargs)


def test_read_footer_accepts_what_it_should():
    assert read_footer(valid_slot(), expected_seq=5, record_size=8).count == 4
    assert read_footer(valid_slot(count=99)).count == 99  # no record size: count is not checked
    control = valid_slot(kind=Kind.CONTROL, nbytes=CONTROL_DTYPE.itemsize, count=0)
    assert read_footer(control, record_size=8).kind is Kind.CONTROL  # record size applies to data only


@pytest.mark.parametrize("ctype", list(Control))
@pytest.mark.parametrize("value, aux", [(0, 0), (-1, 2**63 - 1), (-(2**63), 12345)])
def test_control_round_trip(ctype, value, aux):
    payload = np.full(SLOT - FOOTER_SIZE, 0xAB, np.uint8)
    assert encode_control(payload, ctype, value, aux) == CONTROL_DTYPE.itemsize == 24
    assert decode_control(payload) == (ctype, value, aux)
    assert isinstance(decode_control(payload)[0], Control)
    assert (payload[CONTROL_DTYPE.itemsize :] == 0xAB).all(), "encode_control wrote past its message"


def test_decode_control_rejects_unknown_type():
    payload = np.zeros(CONTROL_DTYPE.itemsize, np.uint8)
    payload[0] = 77
    with pytest.raises(MalformedBuffer, match="unknown control message type 77"):
        decode_control(payload)
