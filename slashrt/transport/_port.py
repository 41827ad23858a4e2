"""One listening port per executor and medium, serving many named channels.

An executor of a job receives a channel from every peer for every exchange, and one for the
progress bus. With a listener each, every executor had (N - 1) x (exchanges + 1) addresses to
hand out and a job N^2 of them, which the coordinator gathered and redistributed. A port is one
listening socket; a peer names the channel it wants in the handshake (`_auth`), so the address
of any channel is the port's address and the channel's name (`ChannelAddress`), and a peer
that knows an executor's port knows all its channels: a job has N addresses::

    port = await channels.open_port("tcp", secret, host=..., expected=n)  # one socket
    listener = port.listener("window/3", spec)     # a channel's listener: no socket of its own
    listener.address                               # ChannelAddress(port.address, "window/3")
    ends = await channels.accept_each({key: listener, ...}, timeout=60)
    sender = await channels.connect("tcp", listener.address, spec, secret)   # names "window/3"

The port accepts each connection and runs its handshake in a task of its own, as every
listener does (`_accept`: strangers and slow peers never delay a real one), then hands it to the
listener of the channel it named, which sets the channel up (the ring spec check, the ring) as a
listener of its own would, the handshake done. A connection naming no channel of the port is
dropped with a log line. The medium's backend supplies the socket (`acceptor`), the handshake of
its raw connections (`authenticate`) and listeners that start after the handshake (`make`).
"""

from __future__ import annotations

import math

import attrs
import structlog
import trio

from slashrt.transport._accept import MAX_PENDING, serve_authenticated

__all__ = ["ChannelAddress", "ChannelPort", "PortListener", "channel_name", "channel_of"]

log = structlog.get_logger("slashrt.transport.port")


@attrs.frozen
class ChannelAddress:
    """Where a port's channel is: the port's address and the channel's name."""

    port: object
    channel: str


def channel_name(what: str, sender: int) -> str:
    """The name of the channel `what` (an exchange's step, "progress") from executor `sender`
    on its receiver's port: every executor's channels are named alike, so one that knows a
    peer's port knows the address of its channel there."""
    return f"{what}/{sender}"


def channel_of(address) -> tuple[object, str]:
    """(the address to connect to, the channel to name in the handshake) of a listener's
    address: a port's channel, or a listener of its own ("")."""
    if isinstance(address, ChannelAddress):
        return address.port, address.channel
    return address, ""


@attrs.define(eq=False)
class _Authenticated:
    """A connection that proved the secret, on its way to its channel's listener."""

    connection: object
    peer: str
    channel: str
    close: object  # async close of the raw connection

    async def aclose(self) -> None:
        await self.close(self.connection)


class PortListener:
    """A named channel's listener on a port: accepted like any listener (`_accept`), its
    connections are the port's, authenticated and naming it."""

    def __init__(self, port: ChannelPort, name: str, backend_listener):
        self.address = ChannelAddress(port.address, name)
        self.spec = backend_listener.spec
        self.what = f"{backend_listener.what} {name!r}"
        self._backend = backend_listener
        self._port = port
        self._send, self._receive = trio.open_memory_channel(math.inf)

    async def accept_connection(self):
        try:
            handed = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("the port was closed") from None
        return handed, handed.peer

    async def set_up(self, handed: _Authenticated, peer: str):
        """The channel's set-up after the handshake (the backend's `attach`: the connection is
        closed if it fails)."""
        return await self._backend.attach(handed.connection, peer)

    def _hand(self, handed: _Authenticated) -> None:
        self._send.send_nowait(handed)

    async def aclose(self) -> None:
        self._port._listeners.pop(self.address.channel, None)
        self._send.close()
        while True:
            try:
                handed = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            with trio.CancelScope(shield=True):
                await handed.aclose()


class ChannelPort:
    """A medium's listening socket serving named channels (the module docstring). `serve()`
    accepts until the port closes; the owner (`Channels.open_port`) runs it."""

    def __init__(self, medium: str, acceptor, authenticate, make, *, expected: int = 0):
        self.medium = medium
        self.address = acceptor.address
        self.what = f"{medium} channel port"
        self._acceptor = acceptor
        self._authenticate = authenticate  # (raw connection, peer) -> channel name; closes it on failure
        self._make = make  # (spec, **options) -> a backend listener with `attach`
        self._listeners: dict[str, PortListener] = {}
        # the connections its peers make at once (every channel of a job's set-up) plus room for strangers
        self._max_pending = MAX_PENDING + expected

    def listener(self, name: str, spec, **options) -> PortListener:
        """The listener of channel `name` (a RingSpec, and the medium's listener options)."""
        if name in self._listeners:
            raise ValueError(f"{self.what} already has a channel named {name!r}")
        listener = self._listeners[name] = PortListener(self, name, self._make(spec, **options))
        return listener

    # the acceptor interface `serve_authenticated` uses: the raw accept, then the handshake
    async def accept_connection(self):
        return await self._acceptor.accept_connection()

    async def set_up(self, connection, peer: str) -> _Authenticated:
        channel = await self._authenticate(connection, peer)
        return _Authenticated(connection, peer, channel, self._acceptor.close_connection)

    async def serve(self, *, timeout: float | None = None) -> None:
        """Hand every connection that proves the secret to its channel's listener, each
        handshake within `timeout` seconds (`_accept.serve_authenticated`)."""

        def hand(handed: _Authenticated) -> bool:
            listener = self._listeners.get(handed.channel)
            if listener is None:
                log.warning("connection dropped", listener=self.what, peer=handed.peer,
                            reason=f"it asked for channel {handed.channel!r}, which this port does not serve")
                return False
            listener._hand(handed)
            return True

        await serve_authenticated(self, hand, timeout=timeout, max_pending=self._max_pending)

    async def aclose(self) -> None:
        for listener in list(self._listeners.values()):
            await listener.aclose()
        await self._acceptor.aclose()

