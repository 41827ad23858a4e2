"""The TCP backend: credits and backpressure over a socket, the handshake in front of every
channel, and peers that misbehave (each failure closes only its own channel).

Run as a script, this file is the producer process of `test_two_processes`.
"""

import contextlib
import functools
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import structlog
import trio
from trio.testing import wait_all_tasks_blocked

import slashrt
from slashrt import ChannelFailed, Dataflow, Schema, Tumbling, sinks
from slashrt._buffer import FULL, MAGIC, Control, Kind
from slashrt._runtime import run_receivers
from slashrt.errors import ChannelClosed, MalformedBuffer
from slashrt.ops.sources import feed_array
from slashrt.transport import RingSpec
from slashrt.transport import tcp
from slashrt.transport._accept import accept_authenticated
from slashrt.transport._auth import (
    AuthenticationFailed,
    client_handshake,
    generate_secret,
    receive_exactly,
    server_handshake,
)
from slashrt.transport._channel import ChannelSilent, Liveness
from slashrt.transport.tcp import TcpReceiver, connect_tcp, open_tcp_listener

TIMEOUT = 10.0


async def _connect_pair(listener, spec, secret):
    """Accept and connect concurrently (the handshake needs both ends)."""
    accepted = []

    async def accept():
        accepted.extend(await accept_authenticated(listener))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        sender = await connect_tcp(listener.address, spec, secret)
    return sender, accepted[0]


@contextlib.asynccontextmanager
async def open_tcp_pair(spec, secret=None, *, liveness=None, drive_receiver=True):
    """A TCP channel over loopback in this trio run: listener, handshake, both drives running
    until exit (the conformance kit's factory too); with `liveness` on both ends, and without
    `drive_receiver` a receiver whose process seems frozen (its socket open, nothing read)."""
    secret = secret or generate_secret()
    async with open_tcp_listener(spec, secret) as listener:
        sender, receiver = await _connect_pair(listener, spec, secret)
    sender.liveness = receiver.liveness = liveness
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.drive)
            if drive_receiver:
                nursery.start_soon(receiver.drive)
            yield sender, receiver
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await receiver.aclose()
            with contextlib.suppress(ChannelClosed):
                await trio.aclose_forcefully(sender)


async def receive(r):
    while (buf := r.poll()) is None:
        await r.wait_readable()
    return buf


def payload(i: int, size: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()


async def send(s, data: bytes, *, count=0):
    await s.wait_credit()
    s.reserve()[: len(data)] = np.frombuffer(data, np.uint8)
    s.post(nbytes=len(data), count=count)


# -- credits and backpressure ------------------------------------------------------------------------


async def test_fifo_and_credits_under_a_slow_consumer():
    spec = RingSpec(slots=4, slot_size=4096)
    n = 60
    sizes = [(i * 997) % spec.payload_capacity for i in range(n)]
    async with open_tcp_pair(spec) as (s, r):

        async def produce():
            for i, size in enumerate(sizes):
                await send(s, payload(i, size), count=i)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            done = 0
            while done < n:
                k = min(1 + done % spec.slots, n - done)
                held = [await receive(r) for _ in range(k)]
                await wait_all_tasks_blocked()  # let the producer run as far ahead as it can
                assert s.posted - done <= spec.slots, "the producer overran the consumer's ring"
                for j, buf in enumerate(held):
                    i = done + j
                    assert (buf.footer.seq, buf.footer.count) == (i, i)
                    assert buf.payload.tobytes() == payload(i, sizes[i])
                r.release(k)
                done += k


async def test_a_producer_that_outruns_its_consumer_stays_bounded():
    spec = RingSpec(slots=3, slot_size=64 * 1024)
    async with open_tcp_pair(spec) as (s, r):

        async def produce():
            for i in range(100):
                await send(s, bytes([i % 256]) * spec.payload_capacity)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await wait_all_tasks_blocked()
            # everything the producer got to post fits the ring; nothing queues beyond it
            assert s.posted == spec.slots
            await wait_all_tasks_blocked()
            assert r.statistics().buffers == spec.slots
            for i in range(100):
                buf = await receive(r)
                assert buf.payload[0] == i % 256 and buf.payload.size == spec.payload_capacity
                r.release()
                assert s.posted - (i + 1) <= spec.slots


async def test_credits_are_coalesced_while_the_consumer_is_busy():
    """Releasing buffers one by one while more wait to be polled does not cost a credit
    frame per buffer: a quarter of the ring at a time, and at once when nothing is left."""
    spec = RingSpec(slots=16, slot_size=256)
    async with open_tcp_pair(spec) as (s, r):
        for _ in range(spec.slots):
            await send(s, b"x")
        with trio.fail_after(TIMEOUT):
            while r.statistics().buffers < spec.slots:
                await wait_all_tasks_blocked()
        credits = []
        for _ in range(spec.slots):
            await receive(r)
            r.release()
            await wait_all_tasks_blocked()  # the credit writer runs if it was asked to
            credits.append(s.credits())
        assert credits == [0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 16]
        assert r.statistics().credit_frames == s.statistics().credit_frames == 4


async def test_big_and_small_buffers_mixed_arrive_byte_exact():
    """Big payloads go from the socket straight into their slots, small ones through a scratch
    buffer; switching between the two paths (and control buffers among data) loses nothing."""
    spec = RingSpec(slots=8, slot_size=64 * 1024)
    cap = spec.payload_capacity
    sizes = [cap, 0, 1, cap, 8191, 8192, 24, 30000, cap, cap, cap, cap, 5, 6, 7, 8, 9, cap, 100] * 6
    async with open_tcp_pair(spec) as (s, r):

        async def produce():
            for i, size in enumerate(sizes):
                await send(s, payload(i, size))
                if i % 7 == 0:
                    await s.send_control(Control.WATERMARK, i)
            await s.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            got = []
            while not r.finished:
                buf = await receive(r)
                if buf.is_control:
                    ctype, value, _ = buf.control()
                    assert ctype is Control.END_OF_STREAM or (ctype is Control.WATERMARK and value == len(got) - 1)
                else:
                    assert buf.payload.tobytes() == payload(len(got), sizes[len(got)])
                    got.append(buf.footer.seq)
                r.release()
        assert len(got) == len(sizes)
        assert r.statistics().buffers == s.statistics().buffers == s.posted


# -- setting up a channel ------------------------------------------------------------------------------


async def test_listener_binds_to_loopback_by_default():
    async with open_tcp_listener(RingSpec(), generate_secret()) as listener:
        host, port = listener.address
        assert host == "127.0.0.1" and port > 0


async def test_wrong_secret_is_refused_on_both_sides_and_nothing_is_exchanged():
    spec = RingSpec(slots=2, slot_size=256)
    secret = generate_secret()
    with structlog.testing.capture_logs() as logs:
        async with open_tcp_listener(spec, secret) as listener:
            accepted = []

            async def accept():
                accepted.extend(await accept_authenticated(listener))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept)
                with pytest.raises(AuthenticationFailed, match="wrong cluster secret"):
                    await connect_tcp(listener.address, spec, generate_secret())
                await wait_all_tasks_blocked()
                assert not accepted  # the refused peer is dropped, never returned
                # the same accept() goes on: the next peer with the right secret gets the channel
                sender = await connect_tcp(listener.address, spec, secret)
            await accepted[0].aclose()
            await trio.aclose_forcefully(sender)
    refused = [e for e in logs if e["event"] == "tcp connection refused"]
    assert [e["end"] for e in refused] == ["sender"] and refused[0]["log_level"] == "error"
    dropped = [e for e in logs if e["event"] == "connection dropped"]
    assert [e["listener"] for e in dropped] == ["tcp channel listener"]
    assert dropped[0]["log_level"] == "warning" and dropped[0]["peer"].startswith("127.0.0.1:")


async def test_spec_mismatch_is_refused_on_both_sides():
    secret = generate_secret()
    with structlog.testing.capture_logs() as logs:
        async with open_tcp_listener(RingSpec(slots=4, slot_size=256), secret) as listener:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept_authenticated, listener)
                with pytest.raises(ChannelClosed, match=r"ring spec mismatch.*slots=8"):
                    await connect_tcp(listener.address, RingSpec(slots=8, slot_size=256), secret)
                await wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
    (dropped,) = [e for e in logs if e["event"] == "connection dropped"]
    assert "ring spec mismatch" in dropped["reason"]


# -- misbehaving peers -----------------------------------------------------------------------------


SPEC = RingSpec(slots=4, slot_size=256, record_size=8)


FOOTER = struct.Struct("<IIQQHB4xB")  # slashrt._buffer's footer layout


def frame(seq: int, data: bytes = b"12345678", *, nbytes=None, flag=FULL) -> bytes:
    """One frame as a sender writes it: the footer, then the payload (the footer may lie)."""
    nbytes = len(data) if nbytes is None else nbytes
    return FOOTER.pack(len(data) // 8, nbytes, seq, 0, MAGIC, Kind.DATA, flag) + data


async def raw_sender(listener, secret) -> tuple[trio.SocketStream, TcpReceiver]:
    """A hand-made peer that passes the handshake and the spec check, then sends what it likes."""
    accepted = []

    async def accept():
        accepted.extend(await accept_authenticated(listener))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        stream = await trio.open_tcp_stream(*listener.address)
        await client_handshake(stream, secret)
        spec = listener.spec
        await stream.send_all(
            tcp._SPEC.pack(b"SRNG", tcp._VERSION, tcp._SENDER, spec.slots, spec.slot_size, spec.record_size, spec.slots)
        )
        await receive_exactly(stream, tcp._SPEC.size, "the spec")
    return stream, accepted[0]


async def healthy_channel(n: int) -> int:
    """Another channel in the same trio run: it must keep working whatever the bad peer does."""
    got = 0
    async with open_tcp_pair(RingSpec(slots=2, slot_size=512)) as (s, r):

        async def produce():
            for i in range(n):
                await send(s, payload(i, 100 + i))
            await s.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            while not r.finished:
                buf = await receive(r)
                if not buf.is_control:
                    assert buf.payload.tobytes() == payload(got, 100 + got)
                    got += 1
                r.release()
    return got


TRUNCATED = r"vanished mid-buffer: buffer 1 incomplete"
BAD_PEERS = [
    # what the peer sends after `good_before` good buffers, the error, the error's message
    pytest.param(b"\xff" * 64, 0, MalformedBuffer, "buffer 0 with footer flag 255", id="garbage"),
    pytest.param(
        b"\x01" * 64, 0, MalformedBuffer, "frame of 16843009 payload bytes, longer than a 256-byte slot",
        id="garbage-with-flag-set",
    ),
    pytest.param(
        frame(1, nbytes=SPEC.slot_size), 1, MalformedBuffer, "frame of 256 payload bytes, longer",
        id="frame-longer-than-a-slot",
    ),
    pytest.param(frame(1)[:20], 1, ChannelClosed, TRUNCATED + r" \(20 of 32 footer", id="truncated-footer"),
    pytest.param(frame(1, b"x" * 64)[:60], 1, ChannelClosed, TRUNCATED + r" \(28 of 64 payl", id="truncated-payload"),
    pytest.param(b"", 1, ChannelClosed, "closed the connection before END_OF_STREAM", id="closed-without-end"),
    pytest.param(frame(5), 1, MalformedBuffer, "out-of-order buffer: sequence number 5, expected 1", id="out-of-order"),
    pytest.param(frame(1, flag=0), 1, MalformedBuffer, "buffer 1 with footer flag 0, expected 1", id="flag-not-full"),
    pytest.param(
        frame(1, b"x" * 8, nbytes=16) + b"y" * 8 + frame(2), 1, MalformedBuffer,
        "footer claims 1 records of 8 bytes but 16 payload bytes", id="footer-disagrees-with-payload",
    ),
    pytest.param(
        b"".join(frame(i) for i in range(1, 5)), 4, MalformedBuffer, "sent buffer 4 without a credit", id="no-credit"
    ),
]


@pytest.mark.parametrize("bad, good_before, error, message", BAD_PEERS)
async def test_a_bad_peer_closes_only_its_own_channel(bad, good_before, error, message):
    """Buffers received in full before the fault are delivered; then the receiver reports it
    once (poll raises it, later polls raise ChannelClosed), logs it, and the other channel in
    the same run goes on."""
    secret = generate_secret()
    healthy = []
    with structlog.testing.capture_logs() as logs, trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_healthy_channel, healthy)
            async with open_tcp_listener(SPEC, secret) as listener:
                stream, r = await raw_sender(listener, secret)
            async with trio.open_nursery() as drives:
                drives.start_soon(r.drive)
                good = b"".join(frame(i) for i in range(good_before))
                await stream.send_all(good + bad)
                await stream.aclose()  # also: a peer that disappears right after
                await wait_all_tasks_blocked()  # everything sent is read (consumers hold every slot)
                delivered = []
                with pytest.raises(error, match=message):
                    while True:
                        buf = await receive(r)
                        delivered.append(buf.footer.seq)  # held, not released: no credit returned
                assert delivered == list(range(good_before))
                with pytest.raises(ChannelClosed, match="failed earlier"):
                    r.poll()
                await r.wait_readable()  # returns at once on a failed channel
            await r.aclose()
    assert healthy == [40]
    closed = [e for e in logs if e["event"] == "tcp channel closed"]
    assert any(re.search(message, e["reason"]) for e in closed), closed
    for e in closed:
        assert e["log_level"] == "error" and e["end"] == "receiver" and e["peer"].startswith("127.0.0.1:")


async def run_healthy_channel(results):
    results.append(await healthy_channel(40))


async def test_a_peer_vanishing_mid_buffer_wakes_the_parked_consumer():
    secret = generate_secret()
    with trio.fail_after(TIMEOUT):
        async with open_tcp_listener(SPEC, secret) as listener:
            stream, r = await raw_sender(listener, secret)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(r.drive)
            await stream.send_all(frame(0))
            assert (await receive(r)).footer.seq == 0
            r.release()
            woke = trio.Event()

            async def consumer():
                with pytest.raises(ChannelClosed, match=r"vanished mid-buffer.*: buffer 1 incomplete \(3 of 16 payl"):
                    await receive(r)
                woke.set()

            nursery.start_soon(consumer)
            await wait_all_tasks_blocked()
            assert not woke.is_set()
            await stream.send_all(frame(1, b"x" * 16)[:35])
            await stream.aclose()
            await woke.wait()
        await r.aclose()


async def test_the_executor_goes_on_when_one_tcp_channel_fails():
    """A whole run over two TCP channels: the bad one is reported in ChannelFailed, the good
    one's windows are complete and exact."""
    schema = Schema({"t": "i8", "k": "i8"})
    flow = Dataflow("f")
    for name in ("good", "bad"):
        src = flow.source(name, schema, time="t")
        src.window(Tumbling(ms=100)).count(key="k").sink(sinks.Collect(), name=f"{name}_out")
    good = np.zeros(5000, schema.dtype)
    good["t"] = np.arange(len(good))
    good["k"] = np.random.default_rng(1).integers(-3, 3, len(good))
    spec = RingSpec(slots=4, slot_size=1024, record_size=schema.record_size)
    secret = generate_secret()
    with trio.fail_after(TIMEOUT):
        async with open_tcp_listener(spec, secret) as listener:
            sender, good_rx = await _connect_pair(listener, spec, secret)
            stream, bad_rx = await raw_sender(listener, secret)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.drive)
            nursery.start_soon(functools.partial(feed_array, sender, good, time="t", max_delay=0, watermark_every=3))
            await stream.send_all(b"\xff" * 64)
            with pytest.raises(ChannelFailed, match=r"1 input channel\(s\) failed: f\.bad: .*footer flag 255") as info:
                await run_receivers(flow, {"good": good_rx, "bad": bad_rx})
            nursery.cancel_scope.cancel()
        await good_rx.aclose()
        await bad_rx.aclose()
        await stream.aclose()
    out = info.value.result["f.good_out"]
    got = sorted(zip(out["window_start"].tolist(), out["k"].tolist(), out["count"].tolist()))
    keys, n = np.unique(np.stack([good["t"] // 100 * 100, good["k"]], axis=1), axis=0, return_counts=True)
    assert got == sorted(zip(keys[:, 0].tolist(), keys[:, 1].tolist(), n.tolist()))


async def test_a_receiver_that_lies_about_credit_fails_the_sender():
    spec = RingSpec(slots=2, slot_size=256)
    secret = generate_secret()
    with structlog.testing.capture_logs() as logs, trio.fail_after(TIMEOUT):
        listen = await trio.open_tcp_listeners(0, host="127.0.0.1")
        address = listen[0].socket.getsockname()

        async def fake_receiver():
            stream = await listen[0].accept()
            await server_handshake(stream, secret)
            await stream.send_all(tcp._SPEC.pack(b"SRNG", tcp._VERSION, tcp._RECEIVER, 2, 256, 0, 2))
            await receive_exactly(stream, tcp._SPEC.size, "the spec")
            await stream.send_all(struct.pack("<Q", 1000))  # credit far beyond the receiver's window
            await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fake_receiver)
            s = await connect_tcp(address, spec, secret)
            nursery.start_soon(s.drive)
            s.reserve()
            s.post(nbytes=0, count=0)
            s.reserve()
            s.post(nbytes=0, count=0)
            with pytest.raises(ChannelClosed, match="granted credit up to buffer 1000") as info:
                await s.wait_credit()
            assert isinstance(info.value.__cause__, MalformedBuffer)
            with pytest.raises(ChannelClosed, match="granted credit up to buffer 1000"):
                s.reserve()
            with pytest.raises(ChannelClosed):
                await s.aclose()
            nursery.cancel_scope.cancel()
        for listener in listen:
            await listener.aclose()
    assert [e["end"] for e in logs if e["event"] == "tcp channel closed"] == ["sender"]


async def test_a_vanished_receiver_wakes_a_sender_waiting_for_credit():
    spec = RingSpec(slots=2, slot_size=256)
    async with open_tcp_pair(spec) as (s, r):
        for _ in range(spec.slots):
            await send(s, b"abc")
        await receive(r)
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:

                async def wait():
                    with pytest.raises(ChannelClosed, match="closed the connection"):
                        await s.wait_credit()

                nursery.start_soon(wait)
                await wait_all_tasks_blocked()
                await r.aclose()
        assert isinstance(s.error, ChannelClosed)


async def test_aclose_reports_a_stream_it_could_not_finish():
    """The receiver vanishes while aclose() waits for the credit END_OF_STREAM needs."""
    spec = RingSpec(slots=2, slot_size=256)
    async with open_tcp_pair(spec) as (s, r):
        for _ in range(spec.slots):
            await send(s, b"abc")
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:

                async def vanish():
                    await wait_all_tasks_blocked()
                    await r.aclose()

                nursery.start_soon(vanish)
                with pytest.raises(ChannelClosed, match="failed: the receiver .* closed the connection"):
                    await s.aclose()
        await s.aclose()  # closed already: nothing more to report


async def test_end_of_stream_closes_both_ends_cleanly():
    spec = RingSpec(slots=2, slot_size=256)
    async with open_tcp_pair(spec) as (s, r):
        await send(s, b"last words")
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.aclose)  # waits until the receiver has seen the end
                assert (await receive(r)).payload.tobytes() == b"last words"
                r.release()
                eos = await receive(r)
                assert eos.is_control and r.finished
                r.release()
        assert s.error is None and r.error is None and r._done
        assert r.poll() is None


# -- two real processes ---------------------------------------------------------------------------


ROOT = os.path.dirname(os.path.dirname(slashrt.__file__))  # the child imports this slashrt
TWO_PROCESS_SPEC = RingSpec(slots=8, slot_size=16 * 1024)
TWO_PROCESS_BUFFERS = 3000


def _two_process_payload(i: int) -> bytes:
    size = (i * 7919) % (TWO_PROCESS_SPEC.payload_capacity + 1)
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


async def _produce(address) -> None:
    secret = bytes.fromhex(os.environ["SLASHRT_SECRET"])
    sender = await connect_tcp(tuple(address), TWO_PROCESS_SPEC, secret)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.drive)
        for i in range(TWO_PROCESS_BUFFERS):
            await send(sender, _two_process_payload(i), count=i)
        await sender.aclose()


async def test_two_processes_deliver_every_byte():
    secret = generate_secret()
    async with open_tcp_listener(TWO_PROCESS_SPEC, secret) as listener:
        proc = subprocess.Popen(
            [sys.executable, __file__, json.dumps(listener.address)],
            env=dict(
                os.environ,
                SLASHRT_SECRET=secret.hex(),
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
            ),
            stdin=subprocess.DEVNULL,
        )
        try:
            with trio.fail_after(60):
                (r,) = await accept_authenticated(listener)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(r.drive)
                    for i in range(TWO_PROCESS_BUFFERS):
                        buf = await receive(r)
                        assert buf.footer.seq == i and buf.footer.count == i
                        assert buf.payload.tobytes() == _two_process_payload(i), f"buffer {i} differs"
                        r.release()
                    eos = await receive(r)
                    assert eos.is_control and r.finished
                    r.release()
                    returncode = await trio.to_thread.run_sync(proc.wait)
                await r.aclose()
            assert returncode == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    trio.run(_produce, json.loads(sys.argv[1]))


# -- liveness: a silent peer (a partition) against a slow one (backpressure) ---------------------------------

LIVELY = Liveness(interval=0.05, timeout=0.3)


async def test_a_backpressured_idle_channel_keeps_answering_and_is_never_taken_for_silence():
    """The ring is full and the consumer does not poll: no credit is due for many timeouts,
    yet the receiver's drive sends its unchanged counter every interval, so the sender hears
    from it and the channel stays healthy (paced by the keepalives counted, not by a sleep)."""
    spec = RingSpec(slots=2, slot_size=256)
    async with open_tcp_pair(spec, liveness=LIVELY) as (s, r):
        for _ in range(spec.slots):
            await send(s, b"abc")
        with trio.fail_after(TIMEOUT):
            while s.statistics().credit_frames < 4 * LIVELY.timeout / LIVELY.interval:
                await trio.sleep(LIVELY.interval)
        assert s.error is None and s.credits() == 0
        for _ in range(spec.slots):  # and the stream goes on where it stood
            await receive(r)
        r.release(spec.slots)
        await send(s, b"more")
        assert (await receive(r)).payload.tobytes() == b"more"


async def test_a_receiver_that_sends_nothing_fails_the_sender_within_the_timeout():
    """A peer whose socket stays open but which sends nothing (a blackholed host, a frozen
    process): TCP would notice after minutes; the sender's liveness fails the channel with
    ChannelSilent naming the peer, and a sender waiting for credit is woken with it."""
    spec = RingSpec(slots=1, slot_size=256)
    async with open_tcp_pair(spec, liveness=LIVELY, drive_receiver=False) as (s, r):
        await send(s, b"abc")
        began = trio.current_time()
        with trio.fail_after(TIMEOUT):
            with pytest.raises(ChannelClosed, match=r"failed: no traffic from 127\.0\.0\.1:\d+ for 0\.3 s"):
                await s.wait_credit()
        assert isinstance(s.error, ChannelSilent)
        assert trio.current_time() - began >= LIVELY.timeout


async def test_an_owner_with_liveness_raises_when_one_of_its_channels_goes_silent():
    """An idle end would never notice its channel failed: the owner's block raises
    ChannelSilent, naming the end, so the job cannot hang on a partition."""
    from slashrt.transport._registry import open_channels

    spec = RingSpec(slots=2, slot_size=256)
    secret = generate_secret()
    async with open_tcp_listener(spec, secret) as listener:
        with trio.fail_after(TIMEOUT), pytest.raises(ChannelSilent) as caught:
            async with open_channels(LIVELY) as channels:
                accepted = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: _append_accepted(listener, accepted))
                    sender = await channels.connect("tcp", listener.address, spec, secret)
                await trio.sleep_forever()  # the receiver (accepted here, never driven) stays silent
        assert caught.value.end is sender
        for end in accepted:
            await end.aclose()


async def _append_accepted(listener, out):
    out.extend(await accept_authenticated(listener))
