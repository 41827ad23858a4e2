"""Hostile connections: strangers without the cluster secret trying to stall or break a listener.

    async with hostile_connections(listener.address, 50) as strangers:
        ...  # the real peers connect and the job runs meanwhile
    strangers.connected   # how many connections were opened

Each connection is opened (and waits in the listener's backlog) before the block starts, so a
listener that serves connections in arrival order meets every stranger before the real peer.
The kinds, in turn:

* ``idle``: connects and sends nothing;
* ``garbage``: sends 4 KiB of random bytes, then nothing;
* ``wrong-secret``: runs the client side of the handshake with another secret;
* ``slow``: sends a valid handshake hello one byte at a time (slowloris), never finishing.

`address` is a TCP (host, port) or a Unix socket address as shm listeners give it ("@name" for
Linux's abstract namespace, else a path). Every connection is closed when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator

import attrs
import trio

from slashrt.transport._auth import MAGIC, NONCE, AuthenticationFailed, client_handshake, generate_secret

__all__ = ["HOSTILE_KINDS", "Strangers", "hostile_connections"]

HOSTILE_KINDS = ("idle", "garbage", "wrong-secret", "slow")
SLOW_BYTE_EVERY = 0.25  # seconds between a slow stranger's bytes


@attrs.define
class Strangers:
    """What the hostile connections did (for a test's assertions)."""

    connected: int = 0
    refused: int = 0  # wrong-secret strangers the listener refused, as they saw it
    closed_by_listener: int = 0  # connections the listener closed (deadline passed, dropped)


async def _open(address) -> trio.SocketStream:
    if isinstance(address, str):
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect("\0" + address[1:] if address.startswith("@") else address)
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
    return await trio.open_tcp_stream(address[0], address[1])


async def _behave(stream: trio.SocketStream, kind: str, strangers: Strangers) -> None:
    """Misbehave on `stream` until the listener closes it (or the block ends)."""
    try:
        if kind == "garbage":
            await stream.send_all(os.urandom(4096))
        elif kind == "wrong-secret":
            try:
                await client_handshake(stream, generate_secret(), timeout=3600)
            except AuthenticationFailed:
                strangers.refused += 1
                return
        elif kind == "slow":
            hello = MAGIC + os.urandom(NONCE)
            for byte in hello[:-1]:  # never the last byte: the hello is never complete
                await stream.send_all(bytes([byte]))
                await trio.sleep(SLOW_BYTE_EVERY)
        while await stream.receive_some(4096):  # idle: wait for the listener to give up
            pass
        strangers.closed_by_listener += 1
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        strangers.closed_by_listener += 1


async def _stranger(address, kind: str, strangers: Strangers, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    stream = await _open(address)
    strangers.connected += 1
    task_status.started()
    async with stream:
        await _behave(stream, kind, strangers)


@contextlib.asynccontextmanager
async def hostile_connections(address, count: int = 50, *, kinds=HOSTILE_KINDS) -> AsyncIterator[Strangers]:
    """Open `count` hostile connections to `address`, cycling through `kinds`; keep them
    misbehaving until the block ends."""
    strangers = Strangers()
    async with trio.open_nursery() as nursery:
        for i in range(count):
            await nursery.start(_stranger, address, kinds[i % len(kinds)], strangers)
        try:
            yield strangers
        finally:
            nursery.cancel_scope.cancel()
