"""The control connection between the coordinator and an executor agent.

A TCP stream that starts with the cluster-secret handshake (`transport._auth`), then carries
length-prefixed messages: a tuple ``(kind, payload)`` pickled with cloudpickle, so a job can
carry the user's dataflow with its lambdas and closures. Only a peer that proved the secret
gets this far, which is why unpickling its messages is acceptable (as in Spark or Dask).
"""

from __future__ import annotations

import struct

import cloudpickle
import trio

from slashrt.errors import ChannelClosed
from slashrt.transport._auth import receive_exactly

__all__ = ["send_message", "receive_message", "check_expected", "MAX_MESSAGE"]

_LENGTH = struct.Struct("<Q")
MAX_MESSAGE = 1 << 36  # 64 GiB: a corrupt length fails here instead of allocating it


async def send_message(stream: trio.abc.SendStream, kind: str, payload=None) -> None:
    data = cloudpickle.dumps((kind, payload), protocol=5)
    await stream.send_all(_LENGTH.pack(len(data)) + data)


async def receive_message(stream: trio.abc.ReceiveStream):
    """The next message as (kind, payload)."""
    (length,) = _LENGTH.unpack(await receive_exactly(stream, _LENGTH.size, "a control message length"))
    if length > MAX_MESSAGE:
        raise ChannelClosed(f"a control message of {length} bytes announced (at most {MAX_MESSAGE}): not the slashrt protocol")
    data = bytearray()
    while len(data) < length:
        chunk = await stream.receive_some(min(length - len(data), 1 << 24))
        if not chunk:
            raise ChannelClosed(f"control connection closed after {len(data)} of a {length}-byte message")
        data += chunk
    try:
        kind, payload = cloudpickle.loads(data)
    except Exception as exc:
        raise ChannelClosed(f"malformed control message: {type(exc).__name__}: {exc}") from None
    return kind, payload


def check_expected(kind: str, payload, expect: str) -> None:
    """A message of another kind than `expect` is an error; a "failed" one raises its text."""
    if kind != expect:
        if kind == "failed":
            raise ChannelClosed(str(payload))
        raise ChannelClosed(f"expected a {expect!r} control message, got {kind!r}")
