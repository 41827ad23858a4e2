"""The flat buffer format every channel carries.

A buffer is one fixed-size slot of `slot_size` bytes (default 64 KiB)::

    +--------------------------------------------+----------------- 32 B footer ----------------+
    | payload: records back to back (data) or     | count u4 | nbytes u4 | seq u8 | epoch u8 |    |
    | one control message (control)               | magic u2 | kind u1 | reserved 4 B | flag u1 |
    +--------------------------------------------+-----------------------------------------------+

The flag is the slot's last byte and is written last: a poller that sees `flag == FULL`
sees the whole buffer (on shared memory and RDMA the transport makes the ordering explicit).
The consumer clears the flag when it hands the slot back.

Control buffers carry runtime messages in-band (watermarks, end of stream, barriers), so they
are ordered with the data they refer to.
"""

from __future__ import annotations

import enum
import struct

import numpy as np

from slashrt.errors import MalformedBuffer

__all__ = [
    "DEFAULT_SLOT_SIZE",
    "FOOTER_DTYPE",
    "FOOTER_SIZE",
    "MAGIC",
    "Kind",
    "Control",
    "CONTROL_DTYPE",
    "Footer",
    "write_footer",
    "read_footer",
    "encode_control",
    "decode_control",
    "EMPTY",
    "FULL",
]

DEFAULT_SLOT_SIZE = 64 * 1024
DEFAULT_SLOTS = 96  # slots of a source's ring and of an executor's channel to a peer
MAGIC = 0x5B5A
EMPTY = 0
FULL = 1

FOOTER_DTYPE = np.dtype(
    [
        ("count", "<u4"),
        ("nbytes", "<u4"),
        ("seq", "<u8"),
        ("epoch", "<u8"),
        ("magic", "<u2"),
        ("kind", "u1"),
        ("reserved", "V4"),
        ("flag", "u1"),
    ]
)
FOOTER_SIZE = FOOTER_DTYPE.itemsize
assert FOOTER_SIZE == 32 and FOOTER_DTYPE.fields["flag"][1] == FOOTER_SIZE - 1
# The same layout for struct, which packs and unpacks a footer in one call (this is per buffer).
_FOOTER_STRUCT = struct.Struct("<IIQQHB4xB")
assert _FOOTER_STRUCT.size == FOOTER_SIZE
_HEAD_STRUCT = struct.Struct("<IIQQHB")  # everything before the reserved bytes and the flag


class Kind(enum.IntEnum):
    DATA = 0
    CONTROL = 1


class Control(enum.IntEnum):
    """Control message types."""

    WATERMARK = 1  # value: the sender's event-time low watermark
    END_OF_STREAM = 2  # the sender will send nothing more on this channel
    BARRIER = 3  # value: checkpoint id (snapshots)
    # Ingestion from Spark (slashrt.spark._protocol): an ingest endpoint consumes these itself;
    # they never reach a dataflow.
    INGEST_OPEN = 16  # a task attempt's partition stream starts: value ingest id, aux attempt, pad partition
    INGEST_PREPARE = 17  # the attempt's stream is complete: value rows, aux data buffers
    INGEST_PICK = 18  # driver: commit this attempt: value attempt, aux rows, pad partition
    INGEST_COMMIT = 19  # driver: commit the picks sent before: value ingest id, aux picks
    INGEST_ABORT = 20  # driver: drop everything staged for ingest id `value`
    INGEST_END = 21  # driver: the ingested stream ends after what was committed


CONTROL_DTYPE = np.dtype([("type", "<u4"), ("pad", "<u4"), ("value", "<i8"), ("aux", "<i8")])


class Footer:
    """A decoded footer (plain values, not a view)."""

    __slots__ = ("count", "nbytes", "seq", "epoch", "kind")

    def __init__(self, count: int, nbytes: int, seq: int, epoch: int, kind: Kind):
        self.count, self.nbytes, self.seq, self.epoch, self.kind = count, nbytes, seq, epoch, kind

    def __repr__(self) -> str:
        return (
            f"Footer(count={self.count}, nbytes={self.nbytes}, seq={self.seq}, "
            f"epoch={self.epoch}, kind={self.kind.name})"
        )


def write_footer(slot: np.ndarray, *, count: int, nbytes: int, seq: int, epoch: int, kind: Kind) -> None:
    """Write the footer of `slot` (a uint8 array of the whole slot), the flag byte last."""
    size = slot.size
    if nbytes > size - FOOTER_SIZE:
        raise MalformedBuffer(f"payload of {nbytes} bytes does not fit a {size}-byte slot")
    _HEAD_STRUCT.pack_into(slot, size - FOOTER_SIZE, count, nbytes, seq, epoch, MAGIC, kind)
    slot[size - 1] = FULL


_KINDS = {k.value: k for k in Kind}


def read_footer(slot: np.ndarray, *, expected_seq: int | None = None, record_size: int | None = None) -> Footer:
    """Decode and validate the footer of a full slot; raise MalformedBuffer on any violation."""
    size = slot.size
    count, nbytes, seq, epoch, magic, kind_code, flag = _FOOTER_STRUCT.unpack_from(slot, size - FOOTER_SIZE)
    if flag != FULL:
        raise MalformedBuffer(f"slot flag is {flag}, expected {FULL} (full)")
    if magic != MAGIC:
        raise MalformedBuffer(f"bad footer magic 0x{magic:04x}, expected 0x{MAGIC:04x}")
    kind = _KINDS.get(kind_code)
    if kind is None:
        raise MalformedBuffer(f"unknown buffer kind {kind_code}")
    if nbytes > size - FOOTER_SIZE:
        raise MalformedBuffer(f"footer claims {nbytes} payload bytes in a {slot.size}-byte slot")
    if kind is Kind.DATA and record_size is not None and count * record_size != nbytes:
        raise MalformedBuffer(f"footer claims {count} records of {record_size} bytes but {nbytes} payload bytes")
    if kind is Kind.CONTROL and nbytes != CONTROL_DTYPE.itemsize:
        raise MalformedBuffer(f"control buffer with {nbytes} payload bytes, expected {CONTROL_DTYPE.itemsize}")
    if expected_seq is not None and seq != expected_seq:
        raise MalformedBuffer(f"out-of-order buffer: sequence number {seq}, expected {expected_seq}")
    return Footer(count, nbytes, seq, epoch, kind)


def encode_control(payload: np.ndarray, ctype: Control, value: int = 0, aux: int = 0) -> int:
    """Write a control message into the payload area; return its size in bytes."""
    msg = payload[: CONTROL_DTYPE.itemsize].view(CONTROL_DTYPE)[0]
    msg["type"] = ctype
    msg["pad"] = 0
    msg["value"] = value
    msg["aux"] = aux
    return CONTROL_DTYPE.itemsize


def decode_control(payload: np.ndarray) -> tuple[Control, int, int]:
    msg = payload[: CONTROL_DTYPE.itemsize].view(CONTROL_DTYPE)[0]
    try:
        ctype = Control(int(msg["type"]))
    except ValueError:
        raise MalformedBuffer(f"unknown control message type {int(msg['type'])}") from None
    return ctype, int(msg["value"]), int(msg["aux"])
