"""Conformance kit for channel transports, after trio's ``testing/_check_streams.py``.

A backend passes when ``await check_channel(open_pair)`` returns. ``open_pair(spec)`` is an async
context manager factory yielding ``(sender, receiver)`` for a fresh channel of that `RingSpec`;
it may start processes or sockets on entry and must tear them down on exit. Every check opens
its own pair and the first violation raises AssertionError named after the check.

The kit holds both ends in this task's event loop. Whatever crosses between the ends (the posted
slot one way, the released counter the other) may take time on a real medium, so the kit only
asserts what a backend must guarantee: it *waits* for anything to arrive, and it proves that an
end blocks by starting it in a task and letting everything park (`wait_all_tasks_blocked`),
never by sleeping. Run it with the real clock: a spinning end never lets virtual time move.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import AsyncContextManager

import numpy as np
import trio
from trio.testing import wait_all_tasks_blocked

from slashrt._buffer import CONTROL_DTYPE, EMPTY, FOOTER_DTYPE, FOOTER_SIZE, FULL, MAGIC, Control, Kind
from slashrt.errors import ChannelClosed, MalformedBuffer
from slashrt.transport._channel import Buffer, NoCredit, Receiver, RingSpec, Sender
from slashrt.transport.inproc import open_inproc_channel

__all__ = ["OpenPair", "check_channel", "open_inproc_pair"]

OpenPair = Callable[[RingSpec], AsyncContextManager[tuple[Sender, Receiver]]]
Check = Callable[[OpenPair, float], Awaitable[None]]


@contextlib.asynccontextmanager
async def open_inproc_pair(spec: RingSpec) -> AsyncIterator[tuple[Sender, Receiver]]:
    """The reference factory: an in-process channel (nothing to set up or tear down)."""
    yield open_inproc_channel(spec)


# -- helpers ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _assert_raises(exc_type: type[BaseException], what: str):
    try:
        yield
    except exc_type:
        return
    raise AssertionError(f"{what}: expected {exc_type.__name__}, nothing was raised")


async def _parked(what: str, timeout: float) -> None:
    """Return once every task is parked; fail if `what` keeps running (it spins)."""
    with trio.move_on_after(timeout):
        await wait_all_tasks_blocked()
        return
    raise AssertionError(f"{what} never parked within {timeout}s: it spins instead of waiting")


async def _receive(r: Receiver) -> Buffer:
    """The next buffer, parking while none is there. A well-formed stream must never fail."""
    while True:
        try:
            buf = r.poll()
        except (MalformedBuffer, ChannelClosed) as exc:
            raise AssertionError(f"receiver rejected a well-formed buffer: {exc}") from exc
        if buf is not None:
            return buf
        if r.finished:
            raise AssertionError("receiver finished while more buffers were expected")
        await r.wait_readable()


def _payloads(spec: RingSpec, n: int, seed: int) -> list[np.ndarray]:
    """`n` random payloads, including the edge sizes 0, 1 and a full slot."""
    rng = np.random.default_rng(seed)
    cap = spec.payload_capacity
    sizes = [0, cap, 1, *rng.integers(0, cap + 1, max(n - 3, 0))][:n]
    return [rng.integers(0, 256, int(size), dtype=np.uint8) for size in sizes]


async def _set_after(wait: Callable[[], Awaitable[None]], event: trio.Event) -> None:
    await wait()
    event.set()


async def _send_bytes(s: Sender, payload: np.ndarray, *, count: int = 0, epoch: int = 0) -> None:
    await s.wait_credit()
    s.reserve()[: payload.size] = payload
    s.post(nbytes=payload.size, count=count, epoch=epoch)


def _check_bound(s: Sender, released: int) -> None:
    """The sender never believes it holds more credit than the receiver has granted."""
    granted = s.spec.slots - (s.posted - released)
    credits = s.credits()
    if not 0 <= credits <= granted:
        raise AssertionError(
            f"sender reports {credits} credits with {s.posted} posted and {released} released "
            f"in a {s.spec.slots}-slot ring (at most {granted} allowed)"
        )


def _expect_buffer(buf: Buffer, seq: int, payload: np.ndarray, *, count: int, epoch: int) -> None:
    f = buf.footer
    assert f.seq == seq, f"buffer {seq} arrived with sequence number {f.seq}"
    assert f.kind is Kind.DATA, f"buffer {seq} arrived as {f.kind.name}, expected DATA"
    assert (f.nbytes, f.count, f.epoch) == (payload.size, count, epoch), (
        f"buffer {seq}: footer {f!r}, expected nbytes={payload.size}, count={count}, epoch={epoch}"
    )
    assert np.array_equal(buf.payload, payload), f"payload bytes of buffer {seq} differ from what was sent"


def _forge(s: Sender, *, count=0, nbytes=0, seq=None, kind=Kind.DATA, magic=MAGIC, payload=b"") -> None:
    """Write a footer by hand into the sender's next slot, flag last, and publish it."""
    index = s.posted % s.spec.slots
    slot = s._slot(index)
    slot[: len(payload)] = np.frombuffer(payload, np.uint8)
    footer = np.zeros(1, FOOTER_DTYPE)
    footer["count"], footer["nbytes"], footer["seq"] = count, nbytes, s.posted if seq is None else seq
    footer["magic"], footer["kind"], footer["flag"] = magic, kind, EMPTY
    slot[-FOOTER_SIZE:-1] = footer.view(np.uint8)[:-1]
    slot[-1] = FULL
    s._publish(index)


# -- the checks ------------------------------------------------------------------------------------


async def check_credits(open_pair: OpenPair, timeout: float) -> None:
    """A fresh sender holds `slots` credits, spends one per post, and cannot post without one."""
    spec = RingSpec(slots=4, slot_size=128)
    async with open_pair(spec) as (s, r):
        assert s.credits() == spec.slots, f"a fresh sender has {s.credits()} credits, expected {spec.slots}"
        for i in range(spec.slots):
            s.reserve()
            s.post(nbytes=0, count=0)
            assert s.credits() == spec.slots - i - 1, f"{s.credits()} credits after {i + 1} posts"
        with _assert_raises(NoCredit, "reserve() without credit"):
            s.reserve()
        with _assert_raises(NoCredit, "post() without credit"):
            s.post(nbytes=0, count=0)
        assert s.posted == spec.slots, f"posted is {s.posted} after a refused post"

        held = [await _receive(r) for _ in range(spec.slots)]
        await wait_all_tasks_blocked()
        assert s.credits() == 0, "polling a buffer returned a credit; only release() may"
        assert r.poll() is None and not r.ready(), "receiver offers more than `slots` unreleased buffers"
        with _assert_raises(ValueError, "release() of more buffers than outstanding"):
            r.release(len(held) + 1)

        # Release in two steps; the sender may then post exactly `slots` more, no more.
        r.release(1)
        r.release(spec.slots - 1)
        for _ in range(spec.slots):
            await s.wait_credit()
            _check_bound(s, released=spec.slots)
            s.reserve()
            s.post(nbytes=0, count=0)
        assert s.credits() == 0, f"sender has {s.credits()} credits after using all {spec.slots} returned"
        with _assert_raises(NoCredit, "reserve() after spending every returned credit"):
            s.reserve()


async def check_wait_credit_parks(open_pair: OpenPair, timeout: float) -> None:
    """wait_credit() parks while the ring is full and returns once the receiver releases a slot."""
    spec = RingSpec(slots=2, slot_size=64)
    async with open_pair(spec) as (s, r):
        for _ in range(spec.slots):
            await _send_bytes(s, np.zeros(0, np.uint8))
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_set_after, s.wait_credit, done)
            await _parked("wait_credit() on a full ring", timeout / 2)
            assert not done.is_set(), "wait_credit() returned while the sender had no credit"
            await _receive(r)
            await _parked("wait_credit() after a poll without release", timeout / 2)
            assert not done.is_set(), "wait_credit() returned after a poll; only release() returns credit"
            r.release()
            await done.wait()  # a lost wakeup hangs here until the kit's timeout
        assert s.credits() == 1, f"{s.credits()} credits after one release, expected 1"


async def check_wait_readable(open_pair: OpenPair, timeout: float) -> None:
    """wait_readable() parks on an empty ring, returns once a buffer is posted, and at once if one is."""
    spec = RingSpec(slots=2, slot_size=64)
    async with open_pair(spec) as (s, r):
        for seq in range(2 * spec.slots + 1):  # across wraps of the ring
            woke = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_set_after, r.wait_readable, woke)
                await _parked("wait_readable() on an empty ring", timeout / 2)
                assert not woke.is_set(), "wait_readable() returned with nothing posted"
                assert r.poll() is None and not r.ready(), "poll() returned a buffer nobody posted"
                await _send_bytes(s, np.full(3, seq, np.uint8))
                await woke.wait()  # a lost wakeup hangs here until the kit's timeout
            assert r.ready(), "wait_readable() returned but ready() is False"
            # Already readable: a second wait must not park.
            again = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_set_after, r.wait_readable, again)
                await _parked("wait_readable() with data ready", timeout / 2)
                assert again.is_set(), "wait_readable() parked although the next buffer was ready"
            buf = r.poll()
            assert buf is not None, "poll() returned None right after wait_readable()"
            _expect_buffer(buf, seq, np.full(3, seq, np.uint8), count=0, epoch=0)
            r.release()


async def check_fifo(open_pair: OpenPair, timeout: float) -> None:
    """Buffers arrive in post order, seq numbers consecutive, footers and payload bytes exact."""
    for spec in (RingSpec(slots=1, slot_size=64), RingSpec(slots=3, slot_size=256)):
        payloads = _payloads(spec, n=20 * spec.slots + 1, seed=spec.slots)
        async with open_pair(spec) as (s, r):

            async def produce():
                for i, payload in enumerate(payloads):
                    await _send_bytes(s, payload, count=i, epoch=7 * i)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                for i, payload in enumerate(payloads):
                    buf = await _receive(r)
                    _expect_buffer(buf, i, payload, count=i, epoch=7 * i)
                    r.release()
                    _check_bound(s, released=i + 1)
            assert s.posted == len(payloads), f"sender posted {s.posted} of {len(payloads)} buffers"
            await wait_all_tasks_blocked()
            assert r.poll() is None and not r.ready(), "receiver offers a buffer that was never sent"


async def check_slow_consumer(open_pair: OpenPair, timeout: float) -> None:
    """A consumer that holds buffers before releasing loses nothing, sees no overwrite, bounds the producer."""
    spec = RingSpec(slots=4, slot_size=128)
    payloads = _payloads(spec, n=12 * spec.slots, seed=4)
    async with open_pair(spec) as (s, r):

        async def produce():
            for i, payload in enumerate(payloads):
                await _send_bytes(s, payload, count=i)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            received = 0
            batch_sizes = [spec.slots, 1, spec.slots - 1, 2]
            batch = 0
            while received < len(payloads):
                k = min(batch_sizes[batch % len(batch_sizes)], len(payloads) - received)
                batch += 1
                held = [await _receive(r) for _ in range(k)]
                # Give the producer every chance to run ahead and overwrite what is held.
                await _parked("a producer out of credit", timeout / 2)
                _check_bound(s, released=received)
                in_flight = s.posted - received
                assert in_flight <= spec.slots, f"{in_flight} buffers in flight in a {spec.slots}-slot ring"
                if k == spec.slots:
                    assert r.poll() is None, "receiver handed out more than `slots` unreleased buffers"
                for j, buf in enumerate(held):
                    seq = received + j
                    _expect_buffer(buf, seq, payloads[seq], count=seq, epoch=0)
                r.release(k)
                received += k
        assert s.posted == len(payloads), f"sender posted {s.posted} of {len(payloads)} buffers"


async def check_producer_parks(open_pair: OpenPair, timeout: float) -> None:
    """A producer that outruns its consumer parks after `slots` posts and resumes on each release."""
    spec = RingSpec(slots=2, slot_size=64)
    n = 5 * spec.slots
    async with open_pair(spec) as (s, r):

        async def produce():
            for i in range(n):
                await _send_bytes(s, np.full(2, i, np.uint8))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await _parked("a producer on a full ring", timeout / 2)
            # The initial credits are local to the sender: it must have used all and stopped.
            assert s.posted == spec.slots, f"producer posted {s.posted} before parking, expected {spec.slots}"
            for i in range(n):
                buf = await _receive(r)
                _expect_buffer(buf, i, np.full(2, i, np.uint8), count=0, epoch=0)
                r.release()
                await _parked("a producer waiting for credit", timeout / 2)
                _check_bound(s, released=i + 1)
        assert s.posted == n


async def check_control_messages(open_pair: OpenPair, timeout: float) -> None:
    """Control buffers keep their place among data; END_OF_STREAM finishes the receiver and closes the sender."""
    spec = RingSpec(slots=2, slot_size=128)
    script = [
        b"first",
        (Control.WATERMARK, 10, 0),
        b"",
        (Control.BARRIER, 3, 99),
        (Control.WATERMARK, -(2**62), 2**62),
        b"last" * 10,
    ]
    async with open_pair(spec) as (s, r):

        async def produce():
            for epoch, item in enumerate(script):
                if isinstance(item, bytes):
                    await _send_bytes(s, np.frombuffer(item, np.uint8), epoch=epoch)
                else:
                    await s.send_control(*item, epoch=epoch)
            await s.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            for seq, item in enumerate(script):
                buf = await _receive(r)
                assert buf.footer.seq == seq and buf.footer.epoch == seq, f"{buf.footer!r} at position {seq}"
                if isinstance(item, bytes):
                    assert not buf.is_control, f"buffer {seq}: control where data {item!r} was sent"
                    assert buf.payload.tobytes() == item, f"buffer {seq}: payload differs"
                else:
                    assert buf.is_control, f"buffer {seq}: data where control {item} was sent"
                    assert buf.control() == item, f"buffer {seq}: control {buf.control()}, expected {item}"
                assert not r.finished, f"receiver finished before END_OF_STREAM (at buffer {seq})"
                r.release()
            eos = await _receive(r)
            assert eos.is_control and eos.control()[0] is Control.END_OF_STREAM, f"expected END_OF_STREAM, got {eos}"
            assert eos.footer.seq == len(script), f"END_OF_STREAM has seq {eos.footer.seq}"
            assert r.finished, "receiver not finished after END_OF_STREAM"
            r.release()

        assert r.poll() is None and not r.ready(), "receiver offers a buffer after END_OF_STREAM"
        await r.wait_readable()  # must return at once: nothing more can come
        with _assert_raises(ChannelClosed, "reserve() after aclose()"):
            s.reserve()
        with _assert_raises(ChannelClosed, "send_control() after aclose()"):
            await s.send_control(Control.WATERMARK, 1)
        posted = s.posted
        await s.aclose()
        assert s.posted == posted, "a second aclose() sent another END_OF_STREAM"


RECORD = np.dtype([("key", "<u8"), ("ts", "<i8"), ("value", "<f4"), ("flag", "u1"), ("pad", "V3")])


async def check_send_records(open_pair: OpenPair, timeout: float) -> None:
    """send_records() splits a structured array over many slots; the receiver's views reassemble it."""
    spec = RingSpec(slots=3, slot_size=256, record_size=RECORD.itemsize)
    per_slot = spec.records_per_slot
    rng = np.random.default_rng(9)
    records = np.zeros(per_slot * spec.slots * 7 + 5, RECORD)
    records["key"] = rng.integers(0, 2**63, len(records))
    records["ts"] = np.arange(len(records)) * 1000
    records["value"] = rng.standard_normal(len(records))
    records["flag"] = rng.integers(0, 256, len(records))
    strided = records[::3]  # not contiguous: send_records must copy it right
    async with open_pair(spec) as (s, r):
        sent = []

        async def produce():
            sent.append(await s.send_records(records, epoch=4))
            sent.append(await s.send_records(strided, epoch=5))
            await s.aclose()

        chunks: dict[int, list[np.ndarray]] = {4: [], 5: []}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            while True:
                buf = await _receive(r)
                if buf.is_control:
                    assert buf.control()[0] is Control.END_OF_STREAM, f"unexpected control {buf.control()}"
                    r.release()
                    break
                view = buf.records(RECORD)
                assert len(view) == buf.footer.count, f"footer count {buf.footer.count}, {len(view)} records"
                chunks[buf.footer.epoch].append(view.copy())
                r.release()
        for epoch, original in ((4, records), (5, strided)):
            counts = [len(c) for c in chunks[epoch]]
            full, rest = divmod(len(original), per_slot)
            expected = [per_slot] * full + ([rest] if rest else [])
            assert counts == expected, f"epoch {epoch}: buffers of {counts} records, expected {expected}"
            got = np.concatenate(chunks[epoch])
            assert got.tobytes() == np.ascontiguousarray(original).tobytes(), f"epoch {epoch}: records differ"
        assert sent == [len(chunks[4]), len(chunks[5])], f"send_records() returned {sent}"


def _malformed_cases(spec: RingSpec) -> list[tuple[str, dict]]:
    control = np.zeros(1, CONTROL_DTYPE)
    control["type"] = 99
    return [
        ("bad magic", dict(count=1, nbytes=8, magic=0x1234)),
        ("a skipped sequence number", dict(count=1, nbytes=8, seq=2)),
        ("a repeated sequence number", dict(count=1, nbytes=8, seq=0)),
        ("nbytes not count * record_size", dict(count=3, nbytes=16)),
        ("an unknown kind", dict(count=1, nbytes=8, kind=7)),
        ("nbytes larger than the slot", dict(count=spec.slot_size // 8, nbytes=spec.slot_size)),
        ("a control buffer of the wrong size", dict(nbytes=8, kind=Kind.CONTROL)),
        ("an unknown control type", dict(nbytes=control.nbytes, kind=Kind.CONTROL, payload=control.tobytes())),
    ]


async def check_malformed_footers(open_pair: OpenPair, timeout: float) -> None:
    """A footer that breaks the format raises MalformedBuffer once, then the channel stays closed."""
    spec = RingSpec(slots=2, slot_size=128, record_size=8)
    for name, fields in _malformed_cases(spec):
        async with open_pair(spec) as (s, r):
            # One good buffer first, so the bad one is not at seq 0 or slot 0.
            await _send_bytes(s, np.arange(16, dtype=np.uint8), count=2)
            _expect_buffer(await _receive(r), 0, np.arange(16, dtype=np.uint8), count=2, epoch=0)
            r.release()
            _forge(s, **fields)
            await r.wait_readable()
            with _assert_raises(MalformedBuffer, f"poll() of a buffer with {name}"):
                r.poll()
            assert r.error is not None, f"receiver not marked failed after {name}"
            with _assert_raises(ChannelClosed, f"poll() after rejecting {name}"):
                r.poll()
            assert not r.ready(), f"a failed receiver reports ready() after {name}"
            await r.wait_readable()  # must return at once on a failed channel


CHECKS: tuple[Check, ...] = (
    check_credits,
    check_wait_credit_parks,
    check_wait_readable,
    check_fifo,
    check_slow_consumer,
    check_producer_parks,
    check_control_messages,
    check_send_records,
    check_malformed_footers,
)


async def check_channel(open_pair: OpenPair, *, timeout: float = 10.0) -> None:
    """Run every check on fresh pairs from `open_pair`; raise AssertionError on the first violation.

    `timeout` (seconds, real clock) bounds each check: a lost wakeup or a spinning end fails it.
    """
    for check in CHECKS:
        name = check.__name__
        try:
            with trio.fail_after(timeout):
                await check(open_pair, timeout)
        except trio.TooSlowError:
            raise AssertionError(
                f"{name}: did not finish within {timeout}s (an end that is never woken, or one that spins)"
            ) from None
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
        except BaseExceptionGroup as group:  # a nursery may wrap the failure (strict exception groups)
            failed, _ = group.split(AssertionError)
            if failed is None:
                raise
            first = failed
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise AssertionError(f"{name}: {first}") from group
