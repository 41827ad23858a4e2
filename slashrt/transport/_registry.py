"""Network transports by name, and the owner that drives every channel opened through them.

Callers pick a medium with a string (`--transport shm`) and open channels through an owner,
`open_channels()`, which runs each end's `drive()` (the coroutine that moves a network
medium's bytes: writing posted slots to a socket, reading credits back, polling a completion
queue) in its own nursery from the moment the end exists. No code that posts or polls can
forget a drive, because no end leaves here undriven::

    async with open_channels() as channels:
        listener = await channels.listen(name, spec, secret, **where)   # closed with `channels`
        receiver = await channels.accept(listener)                      # after the handshake, driven
        receivers = await channels.accept_each({key: listener, ...}, timeout=60)   # one per listener
        sender = await channels.connect(name, listener.address, spec, secret)   # driven
        port = await channels.open_port(name, secret, expected=n, **where)     # one socket, served
        listener = port.listener("channel name", spec)                          # many channels (`_port`)
        ...
    # on leaving: senders not ended are aborted (a stream cut short never looks complete),
    # receivers closed, drives stopped, listeners closed

With `open_channels(liveness=Liveness(interval, timeout))`, every end it drives is watched
(`_channel.Liveness`): a channel whose peer sends nothing, not even a keepalive, for the
timeout raises `ChannelSilent` out of the owner's block (its `end` names the channel), since
an owner cannot go on without one of its channels and an idle end would otherwise never
notice.

An owner that must listen before it opens channels (an ingest endpoint announces its address
long before anyone connects) opens a listener with `open_listener` and accepts through
`channels.accept` later; a `Listener` has an address but no accept of its own.

Backends are imported on first use: `verbs` needs pyverbs, which only exists where RDMA does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import weakref
from collections.abc import AsyncIterator

import trio

from slashrt.errors import unwrap_groups
from slashrt.transport._accept import accept_authenticated, accept_each, serve_authenticated
from slashrt.transport._channel import ChannelSilent, Liveness, Receiver, RingSpec, Sender
from slashrt.transport._pool import SlotPool
from slashrt.transport._port import ChannelPort, PortListener

__all__ = ["NETWORK_TRANSPORTS", "Channels", "Listener", "open_channels", "open_listener", "open_port", "open_slot_pool"]

# name -> (module, listener factory, connect function, port factory)
NETWORK_TRANSPORTS = {
    "shm": ("slashrt.transport.shm", "open_shm_listener", "connect_shm", "open_shm_port"),
    "tcp": ("slashrt.transport.tcp", "open_tcp_listener", "connect_tcp", "open_tcp_port"),
    "verbs": ("slashrt.transport.verbs", "open_verbs_listener", "connect_verbs", "open_verbs_port"),
}


def _backend(name: str):
    """(listener factory, connect function, port factory) of medium `name`."""
    try:
        module, *functions = NETWORK_TRANSPORTS[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}; choose one of {sorted(NETWORK_TRANSPORTS)}") from None
    mod = importlib.import_module(module)
    return tuple(getattr(mod, f) for f in functions)


class Listener:
    """A medium's listener: where peers connect (`address`). Channels are accepted from it
    through an owner (`Channels.accept`), which drives them."""

    def __init__(self, medium: str, backend_listener):
        self.medium = medium
        self.address = backend_listener.address
        self.spec: RingSpec = backend_listener.spec
        self._backend = backend_listener


@contextlib.asynccontextmanager
async def open_listener(name: str, spec: RingSpec, secret: bytes, **where) -> AsyncIterator[Listener]:
    """Listen for channel senders of medium `name` (bound where `where` says: host, port, ...)."""
    async with _backend(name)[0](spec, secret, **where) as backend_listener:
        yield Listener(name, backend_listener)


def open_slot_pool(name: str, spec: RingSpec, *, channels: int, floating: int, max_lent: int | None = None):
    """A slot pool (`_pool`) for `channels` channels of medium `name` into this process, each with
    `spec.slots` exclusive slots, and `floating` slots they borrow: a listener's `pool=` option
    (shm: one memfd every sender maps, `shm.ShmPool`; tcp: this process's memory; verbs: memory
    each receiver registers, `verbs.VerbsPool`). Close it after its channels."""
    if name == "shm":
        from slashrt.transport.shm import ShmPool

        return ShmPool(spec, channels=channels, floating=floating, max_lent=max_lent)
    if name == "verbs":
        from slashrt.transport.verbs import VerbsPool

        return VerbsPool(spec, channels=channels, floating=floating, max_lent=max_lent)
    if name == "tcp":
        return SlotPool(channels=channels, exclusive=spec.slots, floating=floating, slot_size=spec.slot_size,
                        max_lent=max_lent)
    raise ValueError(f"unknown transport {name!r}; choose one of {sorted(NETWORK_TRANSPORTS)}")


def _acceptor(listener: Listener | PortListener):
    """What `_accept` accepts from: a medium's listener, or a port's channel as it is."""
    return listener._backend if isinstance(listener, Listener) else listener


@contextlib.asynccontextmanager
async def open_port(name: str, secret: bytes, *, expected: int = 0, setup_timeout: float | None = None,
                    **where) -> AsyncIterator[ChannelPort]:
    """A port of named channels of medium `name` (`_port`; bound where `where` says), served
    until the block ends: each handshake within `setup_timeout` (default
    `_accept.SETUP_TIMEOUT`); `expected`: the connections its peers make at once. Its channels'
    listeners (`port.listener(...)`) are accepted from through any owner."""
    async with _backend(name)[2](secret, expected=expected, **where) as port, unwrap_groups(), \
            trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(port.serve, timeout=setup_timeout), name=f"serve:{port.what}")
        yield port
        nursery.cancel_scope.cancel()


class Channels:
    """The channels one owner opened; every end is driven in the owner's nursery (`open_channels`)."""

    def __init__(self, nursery: trio.Nursery, listeners: contextlib.AsyncExitStack, liveness: Liveness | None = None):
        self._nursery = nursery
        self.liveness = liveness
        self._listeners = listeners
        # ends still to close when the owner is done (an end closed and dropped earlier, e.g. an
        # ingest endpoint's finished connection, leaves the set with its last reference)
        self._ends: weakref.WeakSet = weakref.WeakSet()
        self._drives: set[trio.CancelScope] = set()  # one per end being driven

    async def _drive(self, end: Sender | Receiver, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self._drives.add(scope)
            task_status.started()
            try:
                await end.drive()
            finally:
                self._drives.discard(scope)
        silent = getattr(end, "error", None) or getattr(end, "_peer_error", None)
        if isinstance(silent, ChannelSilent):  # the owner's job cannot go on without this channel
            silent.end = end
            raise silent

    async def _own(self, end):
        end.liveness = self.liveness
        await self._nursery.start(self._drive, end, name=f"drive:{type(end).__name__}")
        self._ends.add(end)
        return end

    async def listen(self, name: str, spec: RingSpec, secret: bytes, **where) -> Listener:
        """A listener of medium `name`, closed when the owner is done."""
        return await self._listeners.enter_async_context(open_listener(name, spec, secret, **where))

    async def open_port(self, name: str, secret: bytes, *, expected: int = 0, setup_timeout: float | None = None,
                        **where) -> ChannelPort:
        """A port of named channels of medium `name` (`_port`), served (each handshake within
        `setup_timeout`, default `_accept.SETUP_TIMEOUT`) and closed when the owner is done.
        Its channels' listeners (`port.listener(...)`) are accepted from like any listener's."""
        # (the port's socket closes with the listeners, after the owner's nursery, which serves it)
        port = await self._listeners.enter_async_context(_backend(name)[2](secret, expected=expected, **where))
        self._nursery.start_soon(functools.partial(port.serve, timeout=setup_timeout), name=f"serve:{port.what}")
        return port

    async def accept(self, listener: Listener | PortListener) -> Receiver:
        """The next sender that proves the cluster secret and agrees on the ring spec, as a
        driven receiver; strangers dropped meanwhile (`_accept.accept_authenticated`)."""
        (end,) = await accept_authenticated(_acceptor(listener))
        return await self._own(end)

    async def accept_each(self, listeners: dict, *, timeout: float = math.inf, describe=str) -> dict:
        """One driven receiver per listener ({key: Listener}), every one within `timeout`
        seconds, strangers dropped meanwhile (`_accept.accept_each`); PeersMissing names the
        listeners nobody connected to in time."""
        ends = await accept_each({k: _acceptor(lst) for k, lst in listeners.items()}, timeout=timeout, describe=describe)
        return {key: await self._own(end) for key, end in ends.items()}

    async def serve(self, listener: Listener, on_peer, *, on_refused=None) -> None:
        """Every sender that proves the secret on `listener`, for as long as it is open, driven
        and served by `await on_peer(receiver)` in a task of its own; set up concurrently,
        strangers dropped and reported to `on_refused(peer, reason)`
        (`_accept.serve_authenticated`). Returns once the listener closed and every `on_peer`
        returned."""

        async def own(end) -> None:
            await on_peer(await self._own(end))

        async with trio.open_nursery() as peers:
            await serve_authenticated(_acceptor(listener), lambda end: peers.start_soon(own, end), on_refused=on_refused)

    async def connect(self, name: str, address, spec: RingSpec, secret: bytes, **options) -> Sender:
        """A driven sender connected to a listener of medium `name` at `address`."""
        return await self._own(await _backend(name)[1](address, spec, secret, **options))

    def stop_driving(self) -> None:
        """Stop driving every end, leaving them open: their peers may close theirs now unnoticed
        (nothing is logged nor failed). For owners that agreed with every peer that the streams
        stop here (a cluster stopped with a savepoint); the ends are closed when the owner is done."""
        for scope in list(self._drives):
            scope.cancel()

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):  # also when the owner is being cancelled
            for end in list(self._ends):
                if isinstance(end, Sender):
                    if not end.closed:
                        end.abort()  # never END_OF_STREAM for a stream its owner did not end
                else:
                    with contextlib.suppress(Exception):
                        await end.aclose()


@contextlib.asynccontextmanager
async def open_channels(liveness: Liveness | None = None) -> AsyncIterator[Channels]:
    """An owner for channels: the ends it opens are driven until its block ends, then closed;
    with `liveness`, watched (a silent peer raises `ChannelSilent` out of the block)."""
    async with contextlib.AsyncExitStack() as listeners, unwrap_groups(), trio.open_nursery() as nursery:
        channels = Channels(nursery, listeners, liveness)
        try:
            yield channels
        finally:
            await channels._close()
            nursery.cancel_scope.cancel()
