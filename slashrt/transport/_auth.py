"""Cluster secrets and the mutual HMAC handshake every network connection starts with.

Before any data, ring address or memory key crosses a connection, both ends prove they hold
the cluster secret without sending it::

    client -> server   HELLO  b"SLRT1" + client nonce (32 B)
    server -> client   b"SLRT1" + server nonce (32 B) + HMAC(secret, "server" | cn | sn)
    client -> server   HMAC(secret, "client" | sn | cn | channel) + len(channel) (2 B) + channel
    server -> client   b"OK" (or the server closes the connection)

`channel` names the channel the client wants from a listening port that serves many
(`_port.ChannelPort`: one port per executor and medium); it is empty for a listener of one
channel and for a control connection. It travels only after the server proved the secret, and
the client's MAC covers it, so nobody can redirect an authenticated connection to another
channel.

A server that proved the secret can refuse the client's proof only if that proof was forged,
so a client whose proof was answered by a closed connection says so, not "wrong secret".

Each side checks the other's MAC with a constant-time comparison. Nonces are fresh random
bytes, so a recorded exchange cannot be replayed. A wrong secret, a short read or a slow peer
raises `AuthenticationFailed` (a ChannelClosed) with a message saying which.

The secret comes from `SLASHRT_SECRET` (hex), or a file named by `SLASHRT_SECRET_FILE`, or is
generated for a local cluster with `generate_secret`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import os
import secrets
from pathlib import Path

import trio

from slashrt.errors import ChannelClosed

__all__ = ["AuthenticationFailed", "generate_secret", "load_secret", "server_handshake", "client_handshake"]

MAGIC = b"SLRT1"
NONCE = 32
MAC = hashlib.sha256().digest_size
ACCEPTED = b"OK"
MAX_CHANNEL_NAME = 1024  # bytes of a channel's name
HANDSHAKE_TIMEOUT = 10.0


class AuthenticationFailed(ChannelClosed):
    """The peer did not prove the cluster secret (or did not finish the handshake)."""


class HandshakeTimeout(AuthenticationFailed):
    """The peer said nothing more for `timeout` seconds during the handshake (frozen or gone)."""

    def __init__(self, message: str, timeout: float):
        super().__init__(message)
        self.timeout = timeout


def generate_secret() -> bytes:
    return secrets.token_bytes(32)


def load_secret(*, env: str = "SLASHRT_SECRET", file_env: str = "SLASHRT_SECRET_FILE") -> bytes:
    """The cluster secret from the environment: hex in $SLASHRT_SECRET, or the contents of the
    file named by $SLASHRT_SECRET_FILE (raw bytes or hex). Raises AuthenticationFailed if
    neither is set or the secret is shorter than 16 bytes."""
    if (text := os.environ.get(env)) is not None:
        try:
            secret = bytes.fromhex(text.strip())
        except ValueError:
            raise AuthenticationFailed(f"${env} must be a hex string") from None
    elif (path := os.environ.get(file_env)) is not None:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise AuthenticationFailed(f"cannot read the cluster secret file ${file_env}={path}: {exc}") from None
        try:
            secret = bytes.fromhex(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            secret = data
    else:
        raise AuthenticationFailed(f"no cluster secret: set ${env} (hex) or ${file_env}")
    if len(secret) < 16:
        raise AuthenticationFailed("the cluster secret must be at least 16 bytes")
    return secret


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


RECEIVE_CHUNK = 1 << 16  # a read asks for at most this much: memory follows what arrived, not what was announced


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int, what: str) -> bytes:
    """Read exactly n bytes or raise ChannelClosed naming what was being read. Callers bound
    `n` when a peer announced it; the buffer grows only with the bytes that arrive."""
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(min(n - len(buf), RECEIVE_CHUNK))
        if not chunk:
            raise ChannelClosed(f"peer closed the connection while sending {what} ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


@contextlib.contextmanager
def _handshake_errors(timeout: float, who: str):
    """Turn whatever goes wrong during a handshake into AuthenticationFailed saying what."""
    try:
        with trio.fail_after(timeout):
            yield
    except trio.TooSlowError:
        raise HandshakeTimeout(f"{who} did not finish the handshake within {timeout} s", timeout) from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise AuthenticationFailed(f"connection lost during the handshake: {exc}") from None
    except AuthenticationFailed:
        raise
    except ChannelClosed as exc:  # the peer closed the connection half-way
        raise AuthenticationFailed(str(exc)) from None


async def server_handshake(stream: trio.abc.Stream, secret: bytes, *, timeout: float = math.inf) -> str:
    """The accepting side of the handshake; raises AuthenticationFailed unless the peer proves
    the secret, and returns the name of the channel it asks for ("" for none). No deadline of
    its own by default: a listener's acceptor (`_accept`) bounds the whole set-up."""
    with _handshake_errors(timeout, "peer"):
        hello = await receive_exactly(stream, len(MAGIC) + NONCE, "the handshake hello")
        if hello[: len(MAGIC)] != MAGIC:
            raise AuthenticationFailed("peer does not speak the slashrt protocol (bad hello)")
        client_nonce = hello[len(MAGIC) :]
        server_nonce = secrets.token_bytes(NONCE)
        await stream.send_all(MAGIC + server_nonce + _mac(secret, b"server", client_nonce, server_nonce))
        proof = await receive_exactly(stream, MAC + 2, "the handshake proof")
        length = int.from_bytes(proof[MAC:], "big")
        if length > MAX_CHANNEL_NAME:
            raise AuthenticationFailed(f"peer announced a {length}-byte channel name (at most {MAX_CHANNEL_NAME})")
        name = await receive_exactly(stream, length, "the channel's name") if length else b""
        if not hmac.compare_digest(proof[:MAC], _mac(secret, b"client", server_nonce, client_nonce + name)):
            raise AuthenticationFailed("peer failed the handshake: wrong cluster secret")
        try:
            channel = name.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("peer sent a channel name that is not UTF-8") from None
        await stream.send_all(ACCEPTED)
        return channel


async def client_handshake(stream: trio.abc.Stream, secret: bytes, *, timeout: float = HANDSHAKE_TIMEOUT,
                           channel: str = "") -> None:
    """The connecting side, asking for `channel` (a port's channel, or "" for none); raises
    AuthenticationFailed unless the server proves the secret."""
    name = channel.encode()
    if len(name) > MAX_CHANNEL_NAME:
        raise ValueError(f"a channel's name is at most {MAX_CHANNEL_NAME} bytes, {channel!r} has {len(name)}")
    with _handshake_errors(timeout, "server"):
        client_nonce = secrets.token_bytes(NONCE)
        await stream.send_all(MAGIC + client_nonce)
        reply = await receive_exactly(stream, len(MAGIC) + NONCE + MAC, "the handshake reply")
        if reply[: len(MAGIC)] != MAGIC:
            raise AuthenticationFailed("server does not speak the slashrt protocol (bad reply)")
        server_nonce = reply[len(MAGIC) : len(MAGIC) + NONCE]
        if not hmac.compare_digest(reply[len(MAGIC) + NONCE :], _mac(secret, b"server", client_nonce, server_nonce)):
            raise AuthenticationFailed("server failed the handshake: wrong cluster secret")
        await stream.send_all(_mac(secret, b"client", server_nonce, client_nonce + name)
                              + len(name).to_bytes(2, "big") + name)
        try:
            verdict = await receive_exactly(stream, len(ACCEPTED), "the handshake verdict")
        except ChannelClosed:  # (it proved the same secret, so ours was right: it closed, say while failing)
            raise AuthenticationFailed("the server closed the connection before accepting it") from None
        if verdict != ACCEPTED:
            raise AuthenticationFailed("server sent a bad handshake verdict")
