"""The ingest protocol: what a Spark task and the driver say to an ingest endpoint.

Every connection is an ordinary authenticated channel (the cluster secret handshake, then the
ring protocol with its consecutive sequence numbers): over TCP (`slashrt.transport.tcp`), or,
for a task on a host with an RDMA device when the endpoint offers one, over verbs
(`slashrt.transport.verbs`: the task's buffers are RDMA WRITEs into the endpoint's ring). What
travels on it is the same either way:

    task attempt   INGEST_OPEN(ingest id, partition, attempt)     sequence 0
                   data buffers (whole records of the source)   sequences 1 .. n
                   INGEST_PREPARE(rows, n)                        sequence n + 1
                   END_OF_STREAM

    driver         INGEST_PICK(partition, attempt, rows) x P, INGEST_COMMIT(ingest id, P)
                   or INGEST_ABORT(ingest id), or INGEST_END (the source's stream ends)
                   END_OF_STREAM

A task attempt that sent INGEST_PREPARE waits until the endpoint has handed back every slot
(its credits): the endpoint has then staged the whole partition. Nothing staged is counted
until the driver commits it, naming for every partition the one attempt whose result Spark
kept; every other attempt of that ingest (failed, retried, speculative) is dropped, and so is
anything that arrives for an ingest already committed. This is a two-phase commit, as Spark's
own output committers do, because a task's Python code cannot tell that its task will
succeed: when an earlier step of the same task fails, the ingesting UDF sees its input end
*cleanly* (observed on Spark 4), and only the driver learns which attempts succeeded.
"""

from __future__ import annotations

import hashlib

import attrs
import numpy as np

from slashrt._buffer import CONTROL_DTYPE, Control, Kind
from slashrt.transport import RingSpec, Sender

__all__ = ["IngestTarget", "ingest_id_for", "send_message", "read_message", "Message", "TRANSPORTS", "verbs_unavailable"]

DEFAULT_SLOTS = 32
DEFAULT_SLOT_SIZE = 64 * 1024
# "auto": verbs where both ends have an RDMA device, else tcp; "tcp", "verbs": that one only
TRANSPORTS = ("auto", "tcp", "verbs")


def check_transport(transport: str) -> str:
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown ingest transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    return transport


def verbs_unavailable() -> str | None:
    """None when this host can open verbs channels; otherwise why not (no pyverbs, no device,
    no ACTIVE port: see `slashrt.transport.verbs.discover_device`, whose environment
    overrides apply)."""
    try:
        from slashrt.errors import ChannelClosed
        from slashrt.transport.verbs import discover_device
    except ImportError as exc:
        return f"pyverbs is not importable ({exc})"
    try:
        discover_device()
    except ChannelClosed as exc:
        return str(exc)
    return None


@attrs.frozen
class IngestTarget:
    """Where a DataFrame goes: an ingest endpoint's address and its source's record layout.

    Plain and picklable (it travels to Spark's executors inside the UDF). Get one from
    `IngestEndpoint.target` or `IngestServer.target(name)`, or build it by hand for an
    endpoint running elsewhere (`fields` as (name, numpy type string) pairs, in order).
    `verbs_address` is the endpoint's verbs listener, where it has an RDMA device (else None);
    `address` (TCP) always takes tasks and the driver.
    """

    address: tuple[str, int]
    fields: tuple[tuple[str, str], ...]
    source: str = "events"
    slots: int = DEFAULT_SLOTS
    slot_size: int = DEFAULT_SLOT_SIZE
    verbs_address: tuple[str, int] | None = None

    @property
    def schema(self):
        from slashrt._schema import Schema

        return Schema(list(self.fields))

    @property
    def spec(self) -> RingSpec:
        # record_size None: the same listener takes the driver's control-only connections
        return RingSpec(slots=self.slots, slot_size=self.slot_size, record_size=None)


def fields_of(schema) -> tuple[tuple[str, str], ...]:
    return tuple((name, schema.field(name).str) for name in schema.names)


def ingest_id_for(name: str, batch: int | None = None) -> int:
    """A stable 63-bit ingest id for a named ingest (and a stream's batch id): the same name and
    batch give the same id, so a replayed micro-batch is recognised as a duplicate."""
    text = name if batch is None else f"{name}\x00{batch}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


@attrs.frozen
class Message:
    ctype: Control
    value: int
    aux: int
    pad: int


async def send_message(sender: Sender, ctype: Control, value: int = 0, aux: int = 0, pad: int = 0) -> None:
    """A control buffer whose `pad` word is used too (the base `send_control` leaves it 0)."""
    await sender.wait_credit()
    msg = sender.reserve()[: CONTROL_DTYPE.itemsize].view(CONTROL_DTYPE)
    msg["type"], msg["pad"], msg["value"], msg["aux"] = int(ctype), pad, value, aux
    sender.post(nbytes=CONTROL_DTYPE.itemsize, count=0, kind=Kind.CONTROL)


def read_message(payload: np.ndarray) -> Message:
    """Decode a polled control buffer (its type was validated by the receiver's poll)."""
    msg = payload[: CONTROL_DTYPE.itemsize].view(CONTROL_DTYPE)[0]
    return Message(Control(int(msg["type"])), int(msg["value"]), int(msg["aux"]), int(msg["pad"]))
