"""Accepting peers without letting strangers stall a listener.

Every listener (the tcp, shm and verbs channel listeners, an agent's control port, an ingest
endpoint's listeners) is reachable by anyone who can reach its address; only a peer that proves
the cluster secret (`_auth`) and completes the set-up becomes a peer. So the set-up of each
connection runs in a task of its own under a short deadline (`SETUP_TIMEOUT`), beside the
accept loop, which keeps accepting: an idle, slow, garbage or wrong-secret connection costs a
task and a descriptor until its deadline, never a real peer's time. A connection that fails
its set-up is closed and logged ("connection dropped") and never counts as a peer. At most
`MAX_PENDING` connections are set up at once; a further one drops the oldest of them (a real
peer finishes in milliseconds on a machine with room, so only a flood of strangers can be that
old). A job's exchange and progress listeners, which wait for known peers (`accept_each`),
give each set-up the whole wait instead.

A listener offers two hooks::

    connection, peer = await listener.accept_connection()   # the raw accept; `peer` names it
    end = await listener.set_up(connection, peer)           # handshake and set-up: the end,
                                                            # or ChannelClosed; the connection
                                                            # is closed on any failure

and the callers pick how many peers they wait for:

* `serve_authenticated(listener, on_peer)`: every peer, for as long as the listener is open
  (an ingest endpoint);
* `authenticated_peers(listener)`: a channel of every peer, for as long as a block runs,
  the ones that arrive while earlier ones are served waiting their turn (an agent's
  coordinators, one job at a time);
* `accept_authenticated(listener, n)`: the first n peers (`Channels.accept`;
  connections still being set up when the n-th peer is in are closed);
* `accept_each(listeners, timeout=...)`: one peer on each listener, within a deadline; the
  failure names the listeners nobody connected to (the exchange channels of a job).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import math
import socket
from collections.abc import AsyncIterator, Callable, Hashable

import attrs
import structlog
import trio

from slashrt.errors import ChannelClosed
from slashrt.transport._auth import server_handshake

__all__ = [
    "MAX_PENDING",
    "PORT_BACKLOG",
    "SETUP_TIMEOUT",
    "HandshakeListener",
    "PeersMissing",
    "TcpAcceptor",
    "TcpPortSocket",
    "bind_tcp",
    "stream_authenticator",
    "accept_authenticated",
    "accept_each",
    "authenticated_peers",
    "peer_name",
    "refuse_named",
    "serve_authenticated",
]

log = structlog.get_logger("slashrt.transport.accept")

SETUP_TIMEOUT = 5.0  # seconds a connection has to prove the secret and finish its set-up
MAX_PENDING = 64  # connections being set up at once, per listener
_RETRY_ACCEPT = 0.1  # out of descriptors: wait this long before accepting again
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_ACCEPT_ABORTED = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM}


class PeersMissing(ChannelClosed):
    """The expected peers did not all prove the secret and connect in time (or the listener
    closed first); the message names who is missing."""


@attrs.define(eq=False)
class _Pending:
    """One connection being set up: its deadline scope and, if it is dropped, why."""

    peer: str
    scope: trio.CancelScope
    reason: str | None = None


async def _close(end) -> None:
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(end)


async def serve_authenticated(
    listener,
    on_peer: Callable[[object], bool | None],
    *,
    on_refused: Callable[[str, str], None] | None = None,
    timeout: float | None = None,
    max_pending: int = MAX_PENDING,
) -> None:
    """Accept connections on `listener` until it closes (or the caller cancels), each set up in
    its own task within `timeout` seconds (default `SETUP_TIMEOUT`). Each peer that proves the
    secret is handed to `on_peer(end)`, which takes it (or returns False: then it is closed);
    each dropped connection is logged and reported to `on_refused(peer, reason)`."""
    timeout = SETUP_TIMEOUT if timeout is None else timeout
    what = getattr(listener, "what", type(listener).__name__)
    pending: collections.OrderedDict[int, _Pending] = collections.OrderedDict()
    keys = itertools.count()

    def dropped(slot: _Pending, reason: str) -> None:
        log.warning("connection dropped", listener=what, peer=slot.peer, reason=reason)
        if on_refused is not None:
            on_refused(slot.peer, reason)

    async def set_up(key: int, slot: _Pending, connection) -> None:
        end = reason = None
        try:
            with slot.scope:
                end = await listener.set_up(connection, slot.peer)
        except ChannelClosed as exc:
            reason = str(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"connection lost during the set-up: {exc}"
        except Exception as exc:  # a bug the peer triggered must not take the listener down
            log.error("connection set-up failed", listener=what, peer=slot.peer, exc_info=exc)
            reason = f"set-up failed: {type(exc).__name__}: {exc}"
        finally:
            pending.pop(key, None)
        if end is None:
            dropped(slot, reason or slot.reason or f"did not finish the handshake and set-up within {timeout:g} s")
        elif on_peer(end) is False:
            await _close(end)

    async with trio.open_nursery() as nursery:
        while True:
            try:
                connection, peer = await listener.accept_connection()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break  # the listener was closed
            except OSError as exc:
                if exc.errno in _ACCEPT_ABORTED:
                    continue  # the connection was gone before we took it
                if exc.errno in _OUT_OF_RESOURCES:
                    log.warning("cannot accept a connection", listener=what, reason=str(exc), pending=len(pending))
                    await trio.sleep(_RETRY_ACCEPT)
                    continue
                log.debug("listener stops accepting", listener=what, reason=str(exc))
                break
            if len(pending) >= max_pending:
                _, oldest = pending.popitem(last=False)
                oldest.reason = f"dropped to make room: more than {max_pending} connections were setting up at once"
                oldest.scope.cancel()
            key = next(keys)
            slot = pending[key] = _Pending(peer, trio.CancelScope(deadline=trio.current_time() + timeout))
            nursery.start_soon(set_up, key, slot, connection)
        nursery.cancel_scope.cancel()  # connections still setting up are closed with the listener


async def accept_authenticated(
    listener, expected: int = 1, *, timeout: float | None = None, max_pending: int = MAX_PENDING
) -> list:
    """The first `expected` peers that prove the secret on `listener` (strangers are dropped
    meanwhile); raises PeersMissing if the listener closes first."""
    ends: list = []
    refused = 0

    def keep(end) -> bool:
        if len(ends) >= expected:
            return False
        ends.append(end)
        if len(ends) == expected:
            scope.cancel()
        return True

    def count(peer: str, reason: str) -> None:
        nonlocal refused
        refused += 1

    try:
        with trio.CancelScope() as scope:
            await serve_authenticated(listener, keep, on_refused=count, timeout=timeout, max_pending=max_pending)
        if len(ends) < expected:
            raise PeersMissing(
                f"the listener closed after {len(ends)} of {expected} peers proved the cluster secret "
                f"({refused} connections dropped)"
            )
    except BaseException:
        for end in ends:
            await _close(end)
        raise
    return ends


@contextlib.asynccontextmanager
async def authenticated_peers(listener, *, waiting: int = MAX_PENDING) -> AsyncIterator[trio.MemoryReceiveChannel]:
    """Serve `listener` in the background while the block runs; yields a channel of the peers
    that prove the secret, in the order they do. A peer that arrives while the previous ones
    are still being used waits there (at most `waiting` of them; a further one is closed with
    a log line); peers not taken when the block ends are closed."""
    send, receive = trio.open_memory_channel(waiting)

    def queue(end) -> bool:
        try:
            send.send_nowait(end)
        except trio.WouldBlock:
            log.warning("connection dropped", listener=getattr(listener, "what", None),
                        reason=f"{waiting} authenticated peers already wait to be served")
            return False
        return True

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(serve_authenticated, listener, queue))
            yield receive
            nursery.cancel_scope.cancel()
    finally:
        send.close()
        while True:
            try:
                end = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            await _close(end)


async def accept_each(listeners: dict, *, timeout: float = math.inf, describe: Callable[[Hashable], str] = str) -> dict:
    """One peer on each of `listeners` ({key: listener}), all within `timeout` seconds; returns
    {key: end}. Raises PeersMissing naming (by `describe(key)`) every listener nobody proved
    the secret on in time. A connection's set-up may take as long (not `SETUP_TIMEOUT`): these
    are a job's own peers, whose set-ups on a machine crowded with executors (64 processes
    on 2 cores, each setting up 126 channels) take seconds, not milliseconds; a stranger still
    never delays them, and at most `MAX_PENDING` of its connections wait at once."""
    ends: dict = {}
    each = None if math.isinf(timeout) else max(timeout, SETUP_TIMEOUT)

    async def accept(key, listener) -> None:
        (ends[key],) = await accept_authenticated(listener, timeout=each)

    try:
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for key, listener in listeners.items():
                    nursery.start_soon(accept, key, listener)
        missing = [describe(key) for key in listeners if key not in ends]
        if missing:
            raise PeersMissing(f"not connected within {timeout:g} s (no peer proved the cluster secret): {', '.join(missing)}")
    except BaseException:
        for end in ends.values():
            await _close(end)
        raise
    return ends


def peer_name(address) -> str:
    """How logs and errors name a TCP peer: host:port ([host]:port for IPv6)."""
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


PORT_BACKLOG = 4096  # (the kernel caps it at somaxconn) a job's peers dial a port's channels all at once


async def bind_tcp(host: str, port: int, backlog: int) -> trio.socket.SocketType:
    """A listening trio TCP socket on (host, port); port 0 picks a free one."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, type_, proto, _, sockaddr = infos[0]
    sock = trio.socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(sockaddr)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


class TcpAcceptor:
    """The raw accept of a listener over a listening trio TCP socket (`_sock`): the tcp and
    verbs channel listeners' `accept_connection`."""

    _sock: trio.socket.SocketType

    async def accept_connection(self) -> tuple[trio.SocketStream, str]:
        tsock, address = await self._sock.accept()
        return trio.SocketStream(tsock), peer_name(address)


class TcpPortSocket(TcpAcceptor):
    """The listening socket of a tcp or verbs `_port.ChannelPort`."""

    def __init__(self, sock: trio.socket.SocketType):
        self._sock = sock
        self.address: tuple[str, int] = tuple(sock.getsockname()[:2])

    @staticmethod
    async def close_connection(stream: trio.SocketStream) -> None:
        await _close(stream)

    async def aclose(self) -> None:
        self._sock.close()
        await trio.lowlevel.checkpoint()


def refuse_named(channel: str, peer: str, what: str) -> None:
    """A listener of one channel (not a port's: `_port`) takes connections that name none."""
    if channel:
        raise ChannelClosed(f"{peer} asked for channel {channel!r} of a {what}, which serves one channel")


def stream_authenticator(secret: bytes):
    """A port's handshake of an accepted TCP stream (closed if it fails): the name of the
    channel it asks for."""

    async def authenticate(stream: trio.SocketStream, peer: str) -> str:
        try:
            return await server_handshake(stream, secret)
        except BaseException:
            await _close(stream)
            raise

    return authenticate


class HandshakeListener:
    """A trio listener (e.g. from `trio.open_tcp_listeners`) whose streams count as peers once
    they prove the cluster secret; the stream itself is the end."""

    what = "control listener"

    def __init__(self, listener: trio.SocketListener, secret: bytes):
        self.listener = listener
        self._secret = secret

    async def accept_connection(self) -> tuple[trio.SocketStream, str]:
        stream = await self.listener.accept()
        try:
            address = stream.socket.getpeername()
        except OSError:
            address = ("?", 0)
        return stream, peer_name(address)

    async def set_up(self, stream: trio.SocketStream, peer: str) -> trio.SocketStream:
        try:
            refuse_named(await server_handshake(stream, self._secret), peer, self.what)
        except BaseException:
            await _close(stream)
            raise
        return stream
