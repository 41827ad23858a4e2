"""Liveness of a control connection: heartbeats both ways, and a peer silent too long is gone.

Both ends of a control connection (the coordinator and an agent) wrap it in a `Link`, which
sends a small "heartbeat" message every `interval` seconds from its own task and reads every
message from another, so a peer that stops answering (a frozen process: SIGSTOP, a stuck
host, a partition that keeps the TCP connection open) is noticed after `timeout` seconds
without a byte from it. Any bytes count as a sign of life, so a long message in flight is not
silence. The defaults are Flink's (heartbeat.interval 10 s, heartbeat.timeout 50 s).

A heartbeat goes out when the event loop turns: an executor's compute loop yields every
`yield_every` pipeline calls and, inside one, after any user operator call once the loop has
not turned for a few ms (`slashrt.scheduler._budget.pace`), so heartbeats keep their period
however the operators split their work. An agent's loop that does not turn (one user call
running long) is watched from a thread (`slashrt.cluster._stall`), which sends heartbeats of
its own naming the call and how long the loop has been stuck (`send_from_thread`): the peer
ends the link with `PeerStalled` (naming the step) once that reaches the timeout. A process
that is stopped sends nothing at all and is `PeerSilent` after the timeout, as before.

A process that judges its peers' silence must not blame them for its own: the coordinator's
`OwnStalls` ticks every half heartbeat interval, and a tick that comes more than an interval
late means the coordinator itself did not run (SIGSTOP, swap, an overloaded machine). Its
links then do not count the stall as the agents' silence: each agent gets a fresh timeout
from the moment the coordinator resumed (Flink users expect a JobManager's own pause not to
kill a job whose TaskManagers are fine). A stall long enough for the agents to give up on the
coordinator (they stop their jobs) fails the job naming the stall (`OwnStalls.explain`).

Data channels between executors have their own liveness (`transport._channel.Liveness`, with
the same interval and timeout): a partition between two hosts that both still answer the
coordinator is noticed by the channel's sender and reported as `PeersUnreachable`.
"""

from __future__ import annotations

import math
import os
import select
import threading

import cloudpickle
import structlog
import trio

from slashrt.cluster._control import _LENGTH, check_expected, receive_message, send_message
from slashrt.errors import ChannelClosed, DataflowError, SlashError

__all__ = ["Link", "OwnStalls", "PeerSilent", "PeerStalled", "PeersUnreachable", "HEARTBEAT", "DEFAULT_HEARTBEAT_INTERVAL",
           "DEFAULT_HEARTBEAT_TIMEOUT", "check_heartbeat"]

log = structlog.get_logger("slashrt.cluster")

HEARTBEAT = "heartbeat"  # the control message kind; a Link never hands it to its reader
DEFAULT_HEARTBEAT_INTERVAL = 10.0
DEFAULT_HEARTBEAT_TIMEOUT = 50.0


class PeerSilent(ChannelClosed):
    """The peer sent nothing, not even a heartbeat, for the heartbeat timeout."""

    def __init__(self, seconds: float):
        super().__init__(f"stopped answering for {seconds:g} s")
        self.seconds = seconds


class PeersUnreachable(SlashError):
    """Two executors' data channel carried nothing, not even a keepalive, for the heartbeat
    timeout while both may still answer the coordinator (`transport._channel.Liveness`), or
    one could not connect its channel to the other: a network partition between them. `reason`
    says which. Retryable: the job itself is fine."""

    PHRASE = "cannot reach each other"  # how the coordinator recognises the report

    def __init__(self, a: int, b: int, reason: str):
        a, b = sorted((a, b))  # the same sentence from both sides
        super().__init__(f"executors {a} and {b} {self.PHRASE}: {reason}")


class PeerStalled(PeerSilent):
    """The peer's process is alive but its event loop has not turned for the heartbeat
    timeout: one call (named by the peer's stall watch) runs that long."""

    def __init__(self, seconds: float, step: str | None, what: str, timeout: float):
        if step is None:
            cause = f"its event loop has not turned for {seconds:.1f} s"
        else:
            cause = f"one {what}() call of step {step!r} has run for {seconds:.1f} s"
        ChannelClosed.__init__(
            self,
            f"{cause}, longer than the heartbeat timeout of {timeout:g} s: split that work into shorter calls, or "
            "raise heartbeat_timeout",
        )
        self.seconds, self.step = seconds, step


def check_heartbeat(interval: float, timeout: float) -> None:
    """Refuse liveness settings that cannot work: a timeout must leave room for heartbeats."""
    for name, value in (("heartbeat_interval", interval), ("heartbeat_timeout", timeout)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DataflowError(f"{name} must be a positive number of seconds, got {value!r}")
    if timeout <= interval:
        raise DataflowError(
            f"heartbeat_timeout ({timeout:g} s) must be longer than heartbeat_interval ({interval:g} s)"
        )


class OwnStalls:
    """This process's own stalls, seen by a task that ticks every `interval / 2` seconds: a
    tick (or a `check`) more than `interval` late means the whole process did not run
    meanwhile. `resumed_at` is when the last stall ended (trio time), `last` how long it
    lasted, `longest` the longest."""

    def __init__(self, interval: float, timeout: float):
        self.period = interval / 2
        self.interval = interval
        self.timeout = timeout
        self.last_tick = trio.current_time()
        self.resumed_at = -math.inf
        self.last = self.longest = 0.0

    async def run(self) -> None:
        while True:
            await trio.sleep(self.period)
            self.check()

    def check(self) -> None:
        """Note a stall that ended now, if the time since the last tick says there was one."""
        now = trio.current_time()
        stalled = now - self.last_tick - self.period
        self.last_tick = now
        if stalled > self.interval:
            self.resumed_at, self.last = now, stalled
            self.longest = max(self.longest, stalled)
            log.warning("the driver itself was stalled; its executors get a fresh heartbeat timeout",
                        seconds=round(stalled, 1))

    def explain(self) -> str | None:
        """The sentence naming the last stall, if it was long enough for the agents to give up
        on this coordinator (they heard nothing for the timeout: the stall and up to an
        interval before it) and recent enough to be why the job fails now (the agents that gave
        up closed their connections during it), else None."""
        self.check()
        if self.last + self.interval < self.timeout or trio.current_time() - self.resumed_at > self.timeout:
            return None
        return (f"the driver itself was stalled for {self.last:.0f} s (SIGSTOP, swap, an overloaded machine): its "
                f"executors heard no heartbeat for their timeout ({self.timeout:g} s) and stopped their jobs")


class Link:
    """A control connection with heartbeats. `start(nursery)` starts its tasks (they end with
    the nursery, or when the connection ends); `send` may be called from any task; `receive`
    returns the peer's messages in order, heartbeats left out, then raises how the connection
    ended: `ChannelClosed` (closed or broken) or `PeerSilent`."""

    def __init__(self, stream: trio.SocketStream, *, interval: float, timeout: float, stalls: OwnStalls | None = None):
        self.stream = stream
        self.stalls = stalls  # this process's own stalls: not the peer's silence
        self.interval = interval
        self.timeout = timeout
        self.last_heard = trio.current_time()
        self.ended: ChannelClosed | None = None
        self._send_lock = trio.Lock()  # messages are written whole, one at a time
        self._wire = threading.Lock()  # ... also against the stall watch's thread (`send_from_thread`)
        self._sending: set[trio.CancelScope] = set()
        self._inbox_in, self._inbox = trio.open_memory_channel(math.inf)
        self._tasks = trio.CancelScope()

    def start(self, nursery) -> None:
        nursery.start_soon(self._run)

    async def _run(self) -> None:
        with self._tasks:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read)
                nursery.start_soon(self._watch)
                nursery.start_soon(self._beat)

    def end(self, reason: str) -> None:
        """Stop the link (its agent was replaced): its tasks end, a send to it fails."""
        self._end(ChannelClosed(reason))

    def _end(self, reason: ChannelClosed) -> None:
        """The connection is over: deliver why after the messages before it, fail any send
        blocked on a peer that no longer reads, and stop the link's tasks."""
        if self.ended is None:
            self.ended = reason
            self._inbox_in.send_nowait(reason)
            for scope in self._sending:
                scope.cancel()
            self._tasks.cancel()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The stream's receive_some, noting that the peer is alive (receive_message reads
        through this)."""
        chunk = await self.stream.receive_some(max_bytes)
        self.last_heard = trio.current_time()
        return chunk

    async def _read(self) -> None:
        try:
            while True:
                kind, payload = await receive_message(self)
                if kind != HEARTBEAT:
                    self._inbox_in.send_nowait((kind, payload))
                elif payload and payload["stalled_s"] >= self.timeout:  # the peer's stall watch
                    self._end(PeerStalled(payload["stalled_s"], payload["step"], payload["what"], self.timeout))
                    return
        except ChannelClosed as exc:
            self._end(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(ChannelClosed(f"the control connection broke: {exc or type(exc).__name__}"))

    def _deadline(self) -> float:
        """When the peer's silence reaches the timeout, counted from the last byte heard or,
        if later, from the moment this process resumed after a stall of its own."""
        since = self.last_heard
        if self.stalls is not None:
            self.stalls.check()  # (this task may run before the ticker after a stall)
            since = max(since, self.stalls.resumed_at)
        return since + self.timeout

    async def _watch(self) -> None:
        while True:
            await trio.sleep_until(self._deadline())
            # a reader woken in the same scheduler batch (after this loop was busy) gets to
            # count what arrived before the silence is judged
            await trio.lowlevel.checkpoint()
            if trio.current_time() >= self._deadline():
                self._end(PeerSilent(self.timeout))
                return

    async def _beat(self) -> None:
        while True:
            await trio.sleep(self.interval)
            try:
                await self.send(HEARTBEAT)
            except ChannelClosed:
                return  # the reader reports why

    async def send(self, kind: str, payload=None) -> None:
        """Send one message; raises ChannelClosed if the connection is (or becomes) unusable."""
        if self.ended is not None:
            raise self.ended
        with trio.CancelScope() as scope:
            self._sending.add(scope)
            try:
                async with self._send_lock:
                    with self._wire:  # (held at most for the thread's few bytes)
                        await send_message(self.stream, kind, payload)
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(f"the control connection broke: {exc or type(exc).__name__}") from None
            finally:
                self._sending.discard(scope)
        raise self.ended  # cancelled by _end: the peer is gone

    def send_from_thread(self, kind: str, payload=None) -> bool:
        """Send one small message from another thread while the event loop does not turn:
        between the loop's own messages, never inside one; False if it could not go now (a
        message of the loop's in the middle of being written, a full socket buffer)."""
        sock = getattr(self.stream, "socket", None)
        if sock is None or self.ended is not None or not self._wire.acquire(timeout=0.05):
            return False
        try:
            data = cloudpickle.dumps((kind, payload), protocol=5)
            data = _LENGTH.pack(len(data)) + data
            fd, sent = sock.fileno(), 0
            while sent < len(data):
                try:
                    sent += os.write(fd, data[sent:])
                except BlockingIOError:
                    if not sent:
                        return False  # nothing written: skip this one
                    select.select([], [fd], [], 1.0)  # a part is out: the rest must follow
                except OSError:
                    return False
            return True
        finally:
            self._wire.release()

    async def receive(self, expect: str | None = None):
        """The peer's next message as (kind, payload); with `expect`, any other kind is an
        error (a "failed" message raises with its text)."""
        if self.ended is not None and self._inbox.statistics().current_buffer_used == 0:
            raise self.ended
        item = await self._inbox.receive()
        if isinstance(item, ChannelClosed):
            raise item
        kind, payload = item
        if expect is not None:
            check_expected(kind, payload, expect)
        return kind, payload
