"""Accepting peers beside strangers (`transport._accept`): connections are set up concurrently
under a deadline, strangers are dropped and never count as peers, and a listener that waits for
several peers names the ones missing and gives their set-ups its whole wait.

Set-up deadlines here are a minute unless a test is about the deadline: a listener that waited
on any stranger would take that minute, so finishing within `WITHIN` proves it waited on none.
"""

import os
import shutil
import socket

import numpy as np
import pytest
import structlog
import trio
from trio.testing import wait_all_tasks_blocked

from slashrt.testing import hostile_connections
from slashrt.errors import ChannelClosed
from slashrt.transport import RingSpec, shm
from slashrt.transport import _accept
from slashrt.transport._accept import PeersMissing, accept_authenticated, accept_each, serve_authenticated
from slashrt.transport._auth import generate_secret, receive_exactly, server_handshake
from slashrt.transport._registry import _backend


def open_listener(name: str, spec: RingSpec, secret: bytes, **where):
    """A medium's own listener (with the acceptor's hooks), below the registry's owner."""
    return _backend(name)[0](spec, secret, **where)


async def connect(name: str, address, spec: RingSpec, secret: bytes):
    """A medium's own sender, undriven: the tests here drive what they use."""
    return await _backend(name)[1](address, spec, secret)

SLOW = 60.0
WITHIN = 20.0
SPEC = RingSpec(slots=2, slot_size=256)


async def send_one(address, transport, secret, value: int) -> None:
    """Connect as a real sender and send one record holding `value`, then END_OF_STREAM."""
    sender = await connect(transport, address, SPEC, secret)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.drive)
        await sender.wait_credit()
        sender.reserve()[:8] = np.frombuffer(value.to_bytes(8, "little"), np.uint8)
        sender.post(nbytes=8, count=1)
        await sender.aclose()
        nursery.cancel_scope.cancel()


async def connect_and_hold(address, transport, secret) -> None:
    """A real sender that connects (proving the secret) and then sends nothing."""
    sender = await connect(transport, address, SPEC, secret)
    try:
        await trio.sleep_forever()
    finally:
        sender.abort()


async def receive_one(receiver) -> int:
    """The value of the one record a `send_one` sender sends, once its stream has ended."""
    values = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver.drive)
        while not receiver.finished:
            buf = receiver.poll()
            if buf is None:
                await receiver.wait_readable()
                continue
            if not buf.is_control:
                values.append(int.from_bytes(bytes(buf.payload[:8]), "little"))
            receiver.release()
        await receiver.aclose()
        nursery.cancel_scope.cancel()
    (value,) = values
    return value


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_fifty_strangers_ahead_of_the_sender_do_not_delay_it(transport):
    secret = generate_secret()
    with trio.fail_after(WITHIN), structlog.testing.capture_logs() as logs:
        async with open_listener(transport, SPEC, secret) as listener:
            async with hostile_connections(listener.address, 50) as strangers, trio.open_nursery() as nursery:
                nursery.start_soon(send_one, listener.address, transport, secret, 42)
                (receiver,) = await accept_authenticated(listener, timeout=SLOW)
                assert await receive_one(receiver) == 42
    assert strangers.connected == 50
    # the garbage ones at least were refused on sight; none was taken for the peer
    dropped = [e for e in logs if e["event"] == "connection dropped"]
    assert any("bad hello" in e["reason"] for e in dropped)
    assert all(e["listener"] == f"{transport} channel listener" for e in dropped)


async def test_a_flood_beyond_max_pending_drops_the_oldest_not_the_peer():
    secret = generate_secret()
    with trio.fail_after(WITHIN), structlog.testing.capture_logs() as logs:
        async with open_listener("tcp", SPEC, secret) as listener:
            async with hostile_connections(listener.address, 20, kinds=["idle"]), trio.open_nursery() as nursery:
                nursery.start_soon(send_one, listener.address, "tcp", secret, 7)
                (receiver,) = await accept_authenticated(listener, timeout=SLOW, max_pending=8)
                assert await receive_one(receiver) == 7
    evicted = [e for e in logs if e["event"] == "connection dropped" and "make room" in e["reason"]]
    assert len(evicted) >= 20 - 8 + 1  # every stranger beyond the 8 newest, and more as the peer came


async def test_a_connection_that_does_not_finish_its_set_up_in_time_is_dropped():
    refused = []
    got = trio.Event()

    def on_refused(peer, reason):
        refused.append(reason)
        got.set()

    with trio.fail_after(WITHIN):
        async with open_listener("tcp", SPEC, generate_secret()) as listener:
            async with hostile_connections(listener.address, 1, kinds=["slow"]):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: serve_authenticated(listener, pytest.fail, on_refused=on_refused, timeout=0.3))
                    await got.wait()
                    nursery.cancel_scope.cancel()
    assert refused == ["did not finish the handshake and set-up within 0.3 s"]


async def test_accept_each_names_every_listener_nobody_connected_to():
    secret = generate_secret()
    with trio.fail_after(WITHIN):
        async with open_listener("tcp", SPEC, secret) as a, open_listener("tcp", SPEC, secret) as b, \
                open_listener("tcp", SPEC, secret) as c:
            async with hostile_connections(b.address, 4), trio.open_nursery() as nursery:
                nursery.start_soon(connect_and_hold, a.address, "tcp", secret)
                with pytest.raises(PeersMissing) as info:
                    await accept_each({"a": a, "b": b, "c": c}, timeout=2.0, describe=lambda key: f"listener {key}")
                nursery.cancel_scope.cancel()
    assert str(info.value).endswith("within 2 s (no peer proved the cluster secret): listener b, listener c")


async def test_accept_each_returns_one_peer_per_listener():
    secret = generate_secret()
    with trio.fail_after(WITHIN):
        async with open_listener("tcp", SPEC, secret) as a, open_listener("shm", SPEC, secret) as b:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_one, a.address, "tcp", secret, 1)
                nursery.start_soon(send_one, b.address, "shm", secret, 2)
                ends = await accept_each({"a": a, "b": b}, timeout=WITHIN)
                assert [await receive_one(ends["a"]), await receive_one(ends["b"])] == [1, 2]


async def test_a_listener_closed_while_peers_are_missing_says_so():
    async with open_listener("tcp", SPEC, generate_secret()) as listener:
        async with trio.open_nursery() as nursery:

            async def close_soon():
                await wait_all_tasks_blocked()
                await listener.aclose()

            nursery.start_soon(close_soon)
            with pytest.raises(PeersMissing, match="the listener closed after 0 of 2 peers"):
                await accept_authenticated(listener, 2)


PYTHON = shutil.which("python3", path="/usr/bin:/bin")
CONNECT_AS_NOBODY = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
print("closed" if s.recv(64) == b"" else "answered", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or PYTHON is None, reason="needs root (to connect as another user)")
async def test_an_shm_listener_drops_another_users_connection_at_once():
    """Abstract socket names are open to every local user (and listed in /proc/net/unix): a
    connection from another uid is dropped before the handshake, without waiting for it."""
    with trio.fail_after(WITHIN), structlog.testing.capture_logs() as logs:
        async with open_listener("shm", SPEC, generate_secret()) as listener, trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_authenticated(listener, pytest.fail, timeout=SLOW))
            child = await trio.run_process(
                [PYTHON, "-c", CONNECT_AS_NOBODY, listener.address[1:]], user=65534, capture_stdout=True,
                env={"PATH": "/usr/bin:/bin"}, cwd="/",
            )
            nursery.cancel_scope.cancel()
    assert child.stdout.decode().strip() == "closed"
    (dropped,) = [e for e in logs if e["event"] == "connection dropped"]
    assert "runs as uid 65534" in dropped["reason"]


# -- sizes a peer announces ------------------------------------------------------------------------


async def test_an_announced_length_allocates_only_what_arrives():
    """receive_exactly(n) with n announced by a peer (2**40 here) reads what arrives in small
    pieces: the peer's 10 bytes and its hang-up give a ChannelClosed, not a 1 TiB buffer."""
    left, right = socket.socketpair()
    right.sendall(b"0123456789")
    right.close()
    async with trio.SocketStream(trio.socket.from_stdlib_socket(left)) as stream:
        with pytest.raises(ChannelClosed, match=r"10 of 1099511627776 bytes"):
            await receive_exactly(stream, 1 << 40, "an announced message")


async def test_an_shm_listener_announcing_a_huge_refusal_is_refused_before_reading_it():
    """A listener that proves the secret, then announces a 4 GiB refusal reason."""
    secret = generate_secret()
    name = "@slashrt-test-" + os.urandom(6).hex()
    server = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await server.bind("\0" + name[1:])
    server.listen(1)

    async def fake_listener():
        conn, _ = await server.accept()
        stream = trio.SocketStream(conn)
        await server_handshake(stream, secret)
        await receive_exactly(stream, shm._SPEC.size, "the ring spec")
        await stream.send_all(shm._REPLY.pack(b"N", 2**32 - 1) + b"x" * 100)
        await trio.sleep_forever()

    with trio.fail_after(WITHIN):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fake_listener)
            with pytest.raises(ChannelClosed, match="announced a 4294967295-byte ring set-up reply"):
                await shm.connect_shm(name, SPEC, secret)
            nursery.cancel_scope.cancel()
    server.close()


class SlowSetUp:
    """A listener whose every set-up first waits `delay` seconds: a peer's, on a machine whose
    cores are busy with many executors setting up their channels at once."""

    def __init__(self, listener, delay: float):
        self.listener, self.delay = listener, delay
        self.what = listener.what

    async def accept_connection(self):
        return await self.listener.accept_connection()

    async def set_up(self, connection, peer):
        try:
            await trio.sleep(self.delay)
        except BaseException:  # (dropped while it waited: closed, as a listener's set-up closes it)
            connection[0].close()  # (an shm listener's connection: its socket and the peer's uid)
            raise
        return await self.listener.set_up(connection, peer)


async def test_accept_each_gives_its_peers_set_up_the_whole_wait_not_the_short_deadline(monkeypatch):
    # a job's own peers (accept_each) whose set-up takes longer than SETUP_TIMEOUT are accepted;
    # a listener waiting for anyone (accept_authenticated) still drops them at the deadline
    monkeypatch.setattr(_accept, "SETUP_TIMEOUT", 0.2)
    secret = generate_secret()
    with trio.fail_after(WITHIN):
        async with open_listener("shm", SPEC, secret) as listener:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_one, listener.address, "shm", secret, 5)
                ends = await accept_each({"a": SlowSetUp(listener, 0.6)}, timeout=WITHIN)
                assert await receive_one(ends["a"]) == 5
        async with open_listener("shm", SPEC, secret) as listener:
            with structlog.testing.capture_logs() as logs:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(refused_sender, listener.address, secret)
                    with trio.move_on_after(1.5):
                        await accept_authenticated(SlowSetUp(listener, 0.6))
                    nursery.cancel_scope.cancel()
    assert [e["reason"] for e in logs if e["event"] == "connection dropped"] == [
        "did not finish the handshake and set-up within 0.2 s"]


async def refused_sender(address, secret) -> None:
    with pytest.raises(ChannelClosed, match="during the handshake"):  # (dropped by the listener)
        await connect("shm", address, SPEC, secret)
