"""The shared-memory backend between two real processes.

The consumer is this test process; the producer is this same file run as a script
(``python test_shm.py producer ...``), so what crosses between them is only the ring in shared
memory, the eventfds and the Unix socket. Every producer is killed in a ``finally`` if it is
still running, and every wait is bounded.

The producer fills buffer `seq` with `pattern(seq, n)` and reports how many buffers it has posted
in a progress word (an 8-byte file it maps), so the consumer can check what was posted against
what arrived without a system call per buffer.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import structlog
import trio
import trio.testing

from slashrt.errors import ChannelClosed
from slashrt.testing import check_channel
from slashrt.transport import RingSpec
from slashrt.transport._accept import accept_authenticated
from slashrt.transport._auth import AuthenticationFailed, generate_secret
from slashrt.transport.shm import connect_shm, open_shm_listener, open_shm_pair

ROOT = Path(__file__).resolve().parents[2]
PEER_TIMEOUT = 30.0


def pattern(seq: int, n: int) -> np.ndarray:
    """The payload of buffer `seq`: every byte depends on the sequence number and the position."""
    i = np.arange(n, dtype=np.uint64)
    return ((i * np.uint64(131) + np.uint64(seq * 2654435761 % 2**32)) >> np.uint64(3)).astype(np.uint8)


def size_of(seq: int, capacity: int) -> int:
    return (seq * 37) % (capacity + 1)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def open_fds() -> set[int]:
    gc.collect()  # mappings (and their descriptors) that earlier tests left to the collector
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture(scope="module", autouse=True)
def no_dev_shm_leaks():
    """Nothing this module does may leave an entry in /dev/shm (memfds never appear there)."""
    before = shm_entries()
    yield
    leaked = shm_entries() - before
    assert not leaked, f"/dev/shm entries left behind: {sorted(leaked)}"


class Progress:
    """An 8-byte word in a file both processes map: the producer's posted count."""

    def __init__(self, path: Path):
        self.path = path
        path.write_bytes(bytes(8))
        self._file = open(path, "r+b")
        self._mm = mmap.mmap(self._file.fileno(), 8)
        self.word = np.frombuffer(self._mm, np.uint64)

    @property
    def posted(self) -> int:
        return int(self.word[0])

    def close(self):
        del self.word
        self._mm.close()
        self._file.close()


@contextlib.contextmanager
def producer(address: str, spec: RingSpec, secret: bytes, *args: str):
    """Run this file as the producer process; kill it on the way out if it still runs."""
    cmd = [sys.executable, __file__, "producer", "--address", address, "--slots", str(spec.slots),
           "--slot-size", str(spec.slot_size), *args]
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=PEER_TIMEOUT)


async def exited(proc: subprocess.Popen, timeout: float = PEER_TIMEOUT) -> tuple[int, str]:
    """Wait (bounded, without blocking the event loop) for the process; its exit code and output."""
    with trio.fail_after(timeout):
        while proc.poll() is None:
            await trio.sleep(0.01)
    out, err = proc.communicate(timeout=5)
    return proc.returncode, out.decode() + err.decode()


async def accept_from(listener, proc) -> object:
    """The listener's next receiver, failing fast (with the producer's output) if it died first."""
    with trio.fail_after(PEER_TIMEOUT):
        async with trio.open_nursery() as nursery:
            got = []

            async def accept():
                got.extend(await accept_authenticated(listener))
                nursery.cancel_scope.cancel()

            nursery.start_soon(accept)
            while proc.poll() is None:
                await trio.sleep(0.01)
            await trio.sleep(0.5)  # it may have connected just before it exited
            if not got:
                out, err = proc.communicate(timeout=5)
                raise AssertionError(f"the producer exited ({proc.returncode}) without connecting: {err.decode()}")
    return got[0]


async def receive_all(receiver, on_buffer, *, hold=None) -> tuple[int, BaseException | None]:
    """Poll until END_OF_STREAM or a channel error; `on_buffer(buf)` checks each data buffer.
    Returns (buffers received, the ChannelClosed that ended it or None)."""
    n = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver.drive)
        try:
            while True:
                buf = receiver.poll()
                if buf is None:
                    if receiver.finished:
                        return n, None
                    await receiver.wait_readable()
                    continue
                if buf.is_control:
                    receiver.release()
                    continue
                on_buffer(buf)
                n += 1
                if hold is not None:
                    await hold(n)
                receiver.release()
        except ChannelClosed as exc:
            return n, exc
        finally:
            nursery.cancel_scope.cancel()


def check_pattern(spec: RingSpec, expected: list[int]):
    def check(buf):
        seq = expected[0]
        assert buf.footer.seq == seq, f"buffer {seq} arrived as seq {buf.footer.seq}"
        assert 0 <= buf.footer.nbytes <= spec.payload_capacity
        want = pattern(seq, buf.footer.nbytes)
        if not np.array_equal(buf.payload, want):
            bad = int(np.flatnonzero(buf.payload != want)[0])
            raise AssertionError(f"buffer {seq}: byte {bad} is {buf.payload[bad]}, expected {want[bad]}")
        expected[0] += 1

    return check


# -- the tests -------------------------------------------------------------------------------------


async def test_fifo_byte_exact_with_a_slow_consumer_and_bounded_producer(tmp_path):
    spec = RingSpec(slots=4, slot_size=1024)
    secret = generate_secret()
    progress = Progress(tmp_path / "progress")
    count = 300
    expected = [0]
    max_in_flight = 0
    check = check_pattern(spec, expected)
    try:
        async with open_shm_listener(spec, secret) as listener:
            with producer(listener.address, spec, secret, "--count", str(count), "--progress", str(progress.path)) as proc:
                receiver = await accept_from(listener, proc)
                try:

                    async def hold(n):
                        nonlocal max_in_flight
                        if n % 25 == 0:
                            await trio.sleep(0.02)  # a slow consumer: the producer fills the ring meanwhile
                        # posted by the producer minus released by us: never more than the ring
                        max_in_flight = max(max_in_flight, progress.posted - receiver._released_count)

                    n, error = await receive_all(receiver, check, hold=hold)
                finally:
                    receiver.close()
                code, output = await exited(proc)
        assert code == 0, output
        assert error is None, error
        assert n == count and expected[0] == count
        assert 1 <= max_in_flight <= spec.slots, f"{max_in_flight} buffers in flight in a {spec.slots}-slot ring"
        assert max_in_flight == spec.slots, "the producer never filled the ring while the consumer slept"
    finally:
        progress.close()


async def test_memory_ordering_stress_20000_small_buffers(tmp_path):
    """Payload bytes must never be seen before they are written: small slots, a fast producer
    (single posts and runs of posts), and every byte of every buffer checked."""
    spec = RingSpec(slots=8, slot_size=128)
    secret = generate_secret()
    count = 20_000
    expected = [0]
    async with open_shm_listener(spec, secret) as listener:
        with producer(listener.address, spec, secret, "--count", str(count), "--runs") as proc:
            receiver = await accept_from(listener, proc)
            try:
                n, error = await receive_all(receiver, check_pattern(spec, expected))
            finally:
                receiver.close()
            code, output = await exited(proc)
    assert code == 0, output
    assert error is None, error
    assert n == count


async def test_idle_consumer_parks_instead_of_spinning():
    spec = RingSpec(slots=4, slot_size=256)
    secret = generate_secret()
    pause = 0.6
    async with open_shm_listener(spec, secret) as listener:
        with producer(listener.address, spec, secret, "--count", "6", "--pause-after", "3", "--pause", str(pause)) as proc:
            receiver = await accept_from(listener, proc)
            expected = [0]
            check = check_pattern(spec, expected)
            idle = {}

            async def hold(n):
                if n == 3:  # the producer now sleeps: so must we, on the eventfd
                    parks = receiver.stats.parks
                    cpu, wall = time.process_time(), time.monotonic()
                    await receiver.wait_readable()
                    idle.update(cpu=time.process_time() - cpu, wall=time.monotonic() - wall,
                                parks=receiver.stats.parks - parks)

            try:
                n, error = await receive_all(receiver, check, hold=hold)
            finally:
                receiver.close()
            code, output = await exited(proc)
    assert code == 0, output
    assert error is None and n == 6
    assert idle["wall"] > pause / 6, idle  # it did wait for the paused producer
    assert 1 <= idle["parks"] <= 3, f"woken {idle['parks']} times while the producer slept"
    assert idle["cpu"] < 0.25 * idle["wall"], f"an idle consumer used {idle['cpu']:.3f} s of CPU in {idle['wall']:.3f} s"


async def test_a_busy_pair_makes_no_system_call_per_buffer():
    """Posting into a receiver that is not parked, and releasing to a sender that is not parked,
    writes no eventfd at all."""
    spec = RingSpec(slots=8, slot_size=256)
    sender, receiver = open_shm_pair(spec)
    try:
        for round_ in range(100):
            for _ in range(spec.slots):
                sender.reserve()[:4] = round_
                sender.post(nbytes=4, count=0)
            for _ in range(spec.slots):
                assert receiver.poll() is not None
                receiver.release()
        assert sender.stats.wakeups == 0 and receiver.stats.wakeups == 0
        # a parked receiver is woken once by the next post, and only then
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver.wait_readable)
            await trio.testing.wait_all_tasks_blocked()
            assert receiver.stats.parks == 1
            sender.reserve()
            sender.post(nbytes=0, count=0)
            sender.reserve()
            sender.post(nbytes=0, count=0)
        assert sender.stats.wakeups == 1
    finally:
        sender.close()
        receiver.close()


async def test_a_spinning_receiver_takes_data_without_sleeping_and_still_parks():
    spec = RingSpec(slots=4, slot_size=256)
    sender, receiver = open_shm_pair(spec, spin_us=200_000)
    try:
        # a buffer posted (by another thread) during the spin is taken without a sleep
        poster = threading.Timer(0.01, lambda: (sender.reserve(), sender.post(nbytes=0, count=0)))
        poster.start()
        try:
            await receiver.wait_readable()
        finally:
            poster.join()
        assert receiver.poll() is not None and receiver.stats.parks == 0 and sender.stats.wakeups == 0
        receiver.release()
        # with nothing coming, the spin ends and the receiver sleeps on the eventfd
        receiver.spin_us = 1000
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver.wait_readable)
            await trio.testing.wait_all_tasks_blocked()
            assert receiver.stats.parks == 1
            sender.reserve()
            sender.post(nbytes=0, count=0)
        assert sender.stats.wakeups == 1
    finally:
        sender.close()
        receiver.close()


async def test_a_spinning_receiver_conforms():
    @contextlib.asynccontextmanager
    async def open_pair(spec):
        sender, receiver = open_shm_pair(spec, spin_us=50)
        try:
            yield sender, receiver
        finally:
            sender.close()
            receiver.close()

    await check_channel(open_pair)


async def test_sender_waiting_for_many_credits_is_woken_once():
    spec = RingSpec(slots=8, slot_size=256)
    sender, receiver = open_shm_pair(spec)
    try:
        for _ in range(spec.slots):
            sender.reserve()
            sender.post(nbytes=0, count=0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.wait_credit, spec.slots)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(spec.slots):
                receiver.poll()
                receiver.release()
                await trio.testing.wait_all_tasks_blocked()
        assert receiver.stats.wakeups == 1, f"{receiver.stats.wakeups} wake-ups for one wait"
        assert sender.credits() == spec.slots
    finally:
        sender.close()
        receiver.close()


async def test_wrong_secret_is_refused_on_both_sides_and_hands_nothing_over():
    spec = RingSpec(slots=4, slot_size=256)
    secret = generate_secret()
    fds_before = open_fds()
    with structlog.testing.capture_logs() as logs:
        async with open_shm_listener(spec, secret) as listener, trio.open_nursery() as nursery:
            nursery.start_soon(accept_authenticated, listener)
            with producer(listener.address, spec, generate_secret(), "--count", "1", "--expect-refusal") as proc:
                code, output = await exited(proc)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()  # the refused peer was dropped: accept_authenticated still waits
    assert code == 3, output
    assert "refused: " in output and "wrong cluster secret" in output, output
    assert "new descriptors: []" in output, output  # the producer received no fd
    # the client sees the server's proof fail first and hangs up: the server learns only that
    # the peer did not prove the secret (the _auth handshake's design)
    (dropped,) = [e for e in logs if e["event"] == "connection dropped"]
    assert dropped["listener"] == "shm channel listener" and "handshake proof" in dropped["reason"]
    assert open_fds() == fds_before, "the refused connection left descriptors open here"


async def test_wrong_secret_in_process_leaves_no_descriptors():
    spec = RingSpec(slots=2, slot_size=128)
    fds_before = open_fds()
    async with open_shm_listener(spec, generate_secret()) as listener, trio.open_nursery() as nursery:
        nursery.start_soon(accept_authenticated, listener)
        with pytest.raises(AuthenticationFailed, match="wrong cluster secret"):
            await connect_shm(listener.address, spec, generate_secret())
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert open_fds() == fds_before


async def test_ring_spec_mismatch_is_refused_clearly():
    secret = generate_secret()
    with structlog.testing.capture_logs() as logs:
        async with open_shm_listener(RingSpec(slots=4, slot_size=256), secret) as listener:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept_authenticated, listener)
                with pytest.raises(ChannelClosed, match="ring spec mismatch") as info:
                    await connect_shm(listener.address, RingSpec(slots=8, slot_size=256), secret)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
    (dropped,) = [e for e in logs if e["event"] == "connection dropped"]
    assert "ring spec mismatch" in dropped["reason"] and "slots=8" in str(info.value)


async def test_a_listener_that_never_answers_fails_the_connect_after_its_timeout(autojump_clock):
    """`connect_timeout` bounds the set-up (the one keyword of every medium's connect)."""
    name = "slashrt-shm-silent-" + os.urandom(6).hex()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind("\0" + name)
    sock.listen(1)
    try:
        started = trio.current_time()
        with pytest.raises((ChannelClosed, AuthenticationFailed)):
            await connect_shm("@" + name, RingSpec(), generate_secret(), connect_timeout=3.0)
        assert 3.0 <= trio.current_time() - started < 4.0
    finally:
        sock.close()


async def test_connect_to_nothing_is_a_clear_error():
    with pytest.raises(ChannelClosed, match="cannot connect"):
        await connect_shm("@slashrt-shm-nobody-listens-here", RingSpec(), generate_secret())


async def test_listener_on_a_path_is_private_and_removed(tmp_path):
    path = tmp_path / "ring.sock"
    async with open_shm_listener(RingSpec(slots=2, slot_size=128), generate_secret(), path=path) as listener:
        assert listener.address == str(path)
        assert (path.stat().st_mode & 0o777) == 0o600
    assert not path.exists()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
async def test_producer_killed_mid_stream(tmp_path, signum):
    """Kill the producer while it streams: everything it posted is delivered, byte-exact and in
    order, then the receiver fails with a ChannelClosed naming the peer that went."""
    spec = RingSpec(slots=8, slot_size=512)
    secret = generate_secret()
    progress = Progress(tmp_path / "progress")
    expected = [0]
    check = check_pattern(spec, expected)
    try:
        async with open_shm_listener(spec, secret) as listener:
            with producer(listener.address, spec, secret, "--count", "1000000", "--progress", str(progress.path)) as proc:
                receiver = await accept_from(listener, proc)
                killed_at = []

                async def hold(n):
                    if n == 200:
                        os.kill(proc.pid, signum)
                        await exited(proc)
                        killed_at.append(progress.posted)
                    elif n % 10 == 0:
                        await trio.sleep(0.001)  # slower than the producer: the ring stays full

                try:
                    n, error = await receive_all(receiver, check, hold=hold)
                finally:
                    receiver.close()
        assert proc.returncode != 0
        (posted,) = killed_at
        # the progress word is stored just after each post, so at most one post is not counted
        assert posted <= n <= posted + 1, f"{posted} posted before the kill, {n} delivered"
        assert posted >= 200
        assert isinstance(error, ChannelClosed), error
        assert "shm sender" in str(error) and "without END_OF_STREAM" in str(error), str(error)
        if signum == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
            assert "vanished" in str(error), str(error)
    finally:
        progress.close()


async def test_consumer_killed_fails_a_waiting_producer():
    """SIGKILL the consumer process: the producer here, parked for credit, gets ChannelClosed."""
    spec = RingSpec(slots=4, slot_size=256)
    secret = generate_secret()
    address = "@slashrt-shm-test-" + os.urandom(8).hex()
    cmd = [sys.executable, __file__, "consumer", "--address", address, "--slots", str(spec.slots),
           "--slot-size", str(spec.slot_size)]
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with trio.fail_after(PEER_TIMEOUT):
            while True:  # until the consumer listens
                try:
                    sender = await connect_shm(address, spec, secret)
                    break
                except ChannelClosed as exc:
                    assert "cannot connect" in str(exc) and proc.poll() is None, exc
                    await trio.sleep(0.02)
        try:
            for _ in range(spec.slots):
                sender.reserve()
                sender.post(nbytes=0, count=0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender.drive)

                async def kill_when_parked():
                    await trio.testing.wait_all_tasks_blocked()
                    assert sender.stats.parks == 1
                    os.kill(proc.pid, signal.SIGKILL)

                nursery.start_soon(kill_when_parked)
                with pytest.raises(ChannelClosed, match="vanished") as info:
                    with trio.fail_after(PEER_TIMEOUT):
                        await sender.wait_credit()
            assert "shm receiver" in str(info.value)
            assert isinstance(sender.error, ChannelClosed)
        finally:
            sender.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=PEER_TIMEOUT)
    assert proc.returncode == -signal.SIGKILL


async def test_receiver_gone_fails_the_sender(tmp_path):
    """The consumer process's end closes: a sender waiting for credit gets ChannelClosed."""
    spec = RingSpec(slots=2, slot_size=128)
    sender, receiver = open_shm_pair(spec)
    try:
        for _ in range(spec.slots):
            sender.reserve()
            sender.post(nbytes=0, count=0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.drive)
            failed = []

            async def wait():
                with pytest.raises(ChannelClosed, match="receiver") as info:
                    await sender.wait_credit()
                failed.append(info.value)

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            receiver.close()
        assert failed and isinstance(sender.error, ChannelClosed)
        with pytest.raises(ChannelClosed, match="closed the channel"):
            sender.reserve()
        await sender.aclose()  # nobody to tell: closes without waiting
    finally:
        sender.close()
        receiver.close()


async def test_closing_releases_every_descriptor():
    fds_before = open_fds()
    for _ in range(20):
        sender, receiver = open_shm_pair(RingSpec(slots=4, slot_size=4096))
        sender.reserve()
        sender.post(nbytes=0, count=0)
        held = receiver.poll()  # a payload view still alive when the ring is closed
        sender.close()
        receiver.close()
        del held
    assert open_fds() == fds_before


# -- the producer process --------------------------------------------------------------------------


async def _consume_nothing(args) -> int:
    """A consumer that accepts one channel at the address it is given and never reads it."""
    from slashrt.transport._auth import load_secret

    spec = RingSpec(slots=args.slots, slot_size=args.slot_size)
    async with open_shm_listener(spec, load_secret(), path=args.address) as listener:
        (receiver,) = await accept_authenticated(listener)
        await trio.sleep(PEER_TIMEOUT)  # until it is killed
        receiver.close()
    return 0


async def _produce(args) -> int:
    from slashrt.transport._auth import load_secret

    spec = RingSpec(slots=args.slots, slot_size=args.slot_size)
    if args.expect_refusal:
        before = open_fds()
        try:
            await connect_shm(args.address, spec, load_secret())
        except AuthenticationFailed as exc:
            print(f"refused: {exc}")
            print(f"new descriptors: {sorted(open_fds() - before)}")
            return 3
        return 0
    word = None
    if args.progress:
        f = open(args.progress, "r+b")
        progress_mm = mmap.mmap(f.fileno(), 8)
        word = np.frombuffer(progress_mm, np.uint64)
    sender = await connect_shm(args.address, spec, load_secret())
    cap = spec.payload_capacity
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.drive)
        seq = 0
        while seq < args.count:
            if args.pause_after and seq == args.pause_after:
                await trio.sleep(args.pause)
            await sender.wait_credit()
            # with --runs, every third step posts a run of up to 5 buffers (one native call)
            k = min(sender.contiguous_credits(), args.count - seq, 5) if args.runs and seq % 3 == 0 else 1
            n = size_of(seq, cap)
            if k > 1:
                rows = sender.reserve_run(k)
                for j in range(k):
                    rows[j, :n] = pattern(seq + j, n)
                sender.post_run(k, nbytes=n, count=0)
            else:
                sender.reserve()[:n] = pattern(seq, n)
                sender.post(nbytes=n, count=0)
            seq += k
            if word is not None:
                word[0] = seq
        await sender.aclose()
        nursery.cancel_scope.cancel()
    return 0


def _main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["producer", "consumer"])
    p.add_argument("--address", required=True)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--slot-size", type=int, required=True)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--progress")
    p.add_argument("--runs", action="store_true")
    p.add_argument("--pause-after", type=int, default=0)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--expect-refusal", action="store_true")
    args = p.parse_args(argv)
    return trio.run(_produce if args.role == "producer" else _consume_nothing, args)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
