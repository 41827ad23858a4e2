"""The cluster-secret handshake: both sides prove the secret; anything else is refused clearly."""

import pytest
import trio
import trio.testing

from slashrt.transport._auth import (
    AuthenticationFailed,
    client_handshake,
    generate_secret,
    load_secret,
    server_handshake,
)


async def handshake(server_secret: bytes, client_secret: bytes):
    left, right = trio.testing.memory_stream_pair()
    results = {}

    async def side(name, fn, stream, secret):
        try:
            await fn(stream, secret)
            results[name] = "ok"
        except AuthenticationFailed as exc:
            results[name] = exc
            await stream.aclose()

    async with trio.open_nursery() as n:
        n.start_soon(side, "server", server_handshake, left, server_secret)
        n.start_soon(side, "client", client_handshake, right, client_secret)
    return results


async def test_same_secret_is_accepted_on_both_sides():
    secret = generate_secret()
    assert await handshake(secret, secret) == {"server": "ok", "client": "ok"}


async def test_wrong_secret_is_refused_on_both_sides():
    results = await handshake(generate_secret(), generate_secret())
    assert isinstance(results["server"], AuthenticationFailed) or isinstance(results["client"], AuthenticationFailed)
    assert isinstance(results["client"], AuthenticationFailed)
    assert "wrong cluster secret" in str(results["client"])


async def test_garbage_hello_is_refused():
    left, right = trio.testing.memory_stream_pair()
    await right.send_all(b"GET / HTTP/1.1\r\n" + b"x" * 64)
    with pytest.raises(AuthenticationFailed, match="bad hello"):
        await server_handshake(left, generate_secret())


async def test_silent_peer_times_out(autojump_clock):
    left, _right = trio.testing.memory_stream_pair()
    with pytest.raises(AuthenticationFailed, match="within"):
        await server_handshake(left, generate_secret(), timeout=5)


async def test_peer_closing_mid_handshake():
    left, right = trio.testing.memory_stream_pair()
    await right.send_all(b"SLRT1" + b"\0" * 10)
    await right.aclose()
    with pytest.raises(AuthenticationFailed, match="closed"):
        await server_handshake(left, generate_secret())


async def test_a_server_closing_after_proving_the_secret_is_named_as_closing_not_as_a_wrong_secret():
    """A listener that shuts down (its executor failed) between its proof and its verdict: the
    client's secret was right, so its error must not blame the secret."""
    from slashrt.transport._auth import MAC, MAGIC, NONCE, _mac, receive_exactly

    secret = generate_secret()
    left, right = trio.testing.memory_stream_pair()

    async def closing_server():
        hello = await receive_exactly(left, len(MAGIC) + NONCE, "hello")
        nonce = b"\1" * NONCE
        await left.send_all(MAGIC + nonce + _mac(secret, b"server", hello[len(MAGIC):], nonce))
        await receive_exactly(left, MAC, "proof")
        await left.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(closing_server)
        with pytest.raises(AuthenticationFailed) as failed:
            await client_handshake(right, secret)
    assert str(failed.value) == "the server closed the connection before accepting it"


def test_load_secret_from_env_and_file(monkeypatch, tmp_path):
    monkeypatch.delenv("SLASHRT_SECRET", raising=False)
    monkeypatch.delenv("SLASHRT_SECRET_FILE", raising=False)
    with pytest.raises(AuthenticationFailed, match="no cluster secret"):
        load_secret()
    monkeypatch.setenv("SLASHRT_SECRET", "ab" * 16)
    assert load_secret() == bytes([0xAB]) * 16
    monkeypatch.setenv("SLASHRT_SECRET", "zz")
    with pytest.raises(AuthenticationFailed, match="hex"):
        load_secret()
    monkeypatch.delenv("SLASHRT_SECRET")
    path = tmp_path / "secret"
    path.write_bytes(b"\x01" * 32)
    monkeypatch.setenv("SLASHRT_SECRET_FILE", str(path))
    assert load_secret() == b"\x01" * 32
    path.write_bytes(b"short")
    with pytest.raises(AuthenticationFailed, match="at least 16 bytes"):
        load_secret()
