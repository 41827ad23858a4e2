"""Conformance of a medium for the distributed progress protocol: real executor processes, a
random workload, and the protocol's laws checked on the order things really happened.

``await check_progress_bus(transport, executors=3, seed=0)`` starts `executors` processes
(`_peers.run_peers`). Each opens its progress bus (`cluster._progress`) over rings of
`SLOTS` small slots, and data channels beside it, and runs a seeded random workload over the
seed's loop graph (source -> ingress -> body <- feedback, body -> egress -> sink) that keeps
the exchange's caller contract: its source instance holds a capability and emits records under
it to random executors (a +1 where the record waits, the record itself over a data channel),
advances and finally drops it; a received record is consumed (-1) in the same batch as the
records it produces (+1, through the loop up to `MAX_COUNTER` rounds); idle, it flushes. An
executor stops once its view of the global counts is idle; then its bus closes. Checked:

- liveness: every process finished (within the deadline) with an idle view, which by safety
  means the global counts are all zero and every notification could be delivered;
- FIFO and no loss: the replay below consumes every message each process applied, from its
  sender's channel, in the order that sender broadcast them;
- the real bus is the pure protocol: replaying each process's events through a pure
  `ProgressExchange` gives exactly the messages that process broadcast;
- safety: every process's history carries CLOCK_MONOTONIC times (one clock for every process
  of the machine; a message is logged by its sender before it leaves and by its receiver after
  it arrived), so merging them gives the real order of events; replayed in that order, no
  executor's view is ever ahead of the global frontier (the sum of every update recorded so
  far);
- many messages: every progress channel carried at least `WRAPS` rings' worth of buffers, so
  a lost credit or a ring that stops moving once full cannot pass.

With ``vanish=k``, executor k exits abruptly mid-run; every other one must fail with the bus's
one error naming the peer it lost ("executor k lost its progress channel to executor i: ..."),
the vanished one for at least one of them (others may first lose a peer that failed).
"""

from __future__ import annotations

import os
import random
import re
from collections import deque

import trio

from slashrt.cluster._progress import open_progress_bus
from slashrt.errors import ChannelClosed
from slashrt.progress.exchange import ProgressExchange
from slashrt.progress.reachability import Builder, Location, Reachability
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Tracker, move_capability
from slashrt.progress.wire import ProgressCodec
from slashrt.testing._peers import Peer, run_peers
from slashrt.transport._channel import RingSpec
from slashrt.transport._registry import open_channels

__all__ = ["check_progress_bus", "loop_graph", "SLOTS", "WRAPS"]

SLOTS = 4
RING = RingSpec(slots=SLOTS, slot_size=512)  # 15 updates of the loop's body per slot
DATA_RING = RingSpec(slots=SLOTS, slot_size=512)
WRAPS = 10
MAX_EPOCH = 40
MAX_COUNTER = 3


def loop_graph() -> tuple[Reachability, dict[str, int]]:
    """The seed's loop: source -> ingress -> body.in0; body -> feedback -> body.in1;
    body -> egress -> sink."""
    b = Builder()
    n = {"source": b.add_node("source", 0, 1), "ingress": b.add_ingress("ingress"), "body": b.add_node("body", 2, 1)}
    n.update(feedback=b.add_feedback("feedback"), egress=b.add_egress("egress"), sink=b.add_node("sink", 1, 0))
    b.connect(n["source"], 0, n["ingress"])
    b.connect(n["ingress"], 0, n["body"], 0)
    b.connect(n["body"], 0, n["feedback"])
    b.connect(n["feedback"], 0, n["body"], 1)
    b.connect(n["body"], 0, n["egress"])
    b.connect(n["egress"], 0, n["sink"])
    return b.build(), n


def _initial(graph_nodes, executors: int):
    return [((Location.output(graph_nodes["source"]), Timestamp(0)), executors)]  # one per instance


# --- one executor (runs in its own process) ----------------------------------------------------


async def workload(peer: Peer) -> dict:
    """One executor's share of the random workload (see the module docstring)."""
    graph, nodes = loop_graph()
    codec = ProgressCodec(graph)
    rng = random.Random(peer.args["seed"] * 1009 + peer.index)
    steps, vanish = peer.args["steps"], peer.args.get("vanish")
    source = Location.output(nodes["source"])
    work: deque = deque()  # records this executor must consume: (input location, timestamp)
    arrived = trio.lowlevel.ParkingLot()
    others = [p for p in range(peer.executors) if p != peer.index]

    async with open_channels() as channels:
        # data channels, one per ordered pair, beside the progress ones
        listeners = {p: await channels.listen(peer.transport, DATA_RING, peer.secret, **peer.where) for p in others}
        directory = await peer.swap({p: lst.address for p, lst in listeners.items()})
        data_in: dict = {}
        async with trio.open_nursery() as setup:

            async def accept():
                data_in.update(await channels.accept_each(listeners, timeout=60))

            setup.start_soon(accept)
            data_out = {p: await channels.connect(peer.transport, directory[p], DATA_RING, peer.secret) for p in others}

        async def take(receiver) -> None:
            while not receiver.finished:
                try:
                    await receiver.wait_readable()
                    buffer = receiver.poll()
                except ChannelClosed:
                    return  # a vanished peer: the progress bus reports it
                if buffer is not None and not buffer.is_control:
                    work.extend(pointstamp for pointstamp, _ in codec.decode(buffer.payload))
                    arrived.unpark_all()
                if buffer is not None:
                    receiver.release()

        async with trio.open_nursery() as nursery:
            for receiver in data_in.values():
                nursery.start_soon(take, receiver)
            async with open_progress_bus(
                peer.index, peer.executors, graph, transport=peer.transport, secret=peer.secret,
                swap_addresses=peer.swap, initial=_initial(nodes, peer.executors), spec=RING, history=True,
                **peer.where,
            ) as bus:

                def emit(location: Location, time: Timestamp, updates: list) -> None:
                    """A record at `location` (an output) goes along every edge, to random executors."""
                    for target, _ in graph.steps(location):
                        if rng.random() < 0.8:
                            updates.append(((target, time), 1))
                            to = rng.randrange(peer.executors)
                            outgoing.append((to, (((target, time), 1),)))

                async def ship() -> None:
                    while outgoing:
                        to, message = outgoing.popleft()
                        if to == peer.index:
                            work.append(message[0][0])
                        else:
                            try:
                                for frame in codec.encode(message):
                                    await data_out[to].wait_credit()
                                    payload = data_out[to].reserve()
                                    payload[: len(frame)] = memoryview(frame)
                                    data_out[to].post(nbytes=len(frame), count=0)
                            except ChannelClosed:
                                await trio.sleep_forever()  # a vanished peer: the progress bus reports it

                def consume(location: Location, time: Timestamp, updates: list) -> None:
                    for output, summaries in graph.steps(location):
                        for summary in summaries:
                            result = summary.apply(time)
                            if result is not None and all(c <= MAX_COUNTER for c in result.counters):
                                for target, _ in graph.steps(output):
                                    if rng.random() < 0.7:
                                        updates.append(((target, result), 1))
                                        outgoing.append((rng.randrange(peer.executors), (((target, result), 1),)))
                    updates.append(((location, time), -1))

                outgoing: deque = deque()
                epoch: int | None = 0
                for step in range(steps):
                    if peer.index == vanish and step == steps // 3:
                        os._exit(3)  # abruptly: no goodbye on any channel
                    roll, updates = rng.random(), []
                    if epoch is not None and roll < 0.3:
                        emit(source, Timestamp(epoch), updates)
                    elif epoch is not None and roll < 0.4 and epoch < MAX_EPOCH:
                        updates = move_capability(source, Timestamp(epoch), Timestamp(epoch + 1))
                        epoch += 1
                    elif work and roll < 0.9:
                        consume(*work.popleft(), updates)
                    elif roll < 0.95:
                        bus.flush()
                    if updates:
                        bus.record(updates)  # progress first, then the records it announced
                        await ship()
                    await trio.lowlevel.checkpoint()
                if epoch is not None:
                    bus.record([((source, Timestamp(epoch)), -1)])
                while True:
                    if work:
                        updates = []
                        consume(*work.popleft(), updates)
                        bus.record(updates)
                        await ship()
                        await trio.lowlevel.checkpoint()
                        continue
                    bus.flush()
                    if bus.exchange.view.is_idle():
                        break
                    seen = (len(work), bus.version)  # nothing may slip in before the waits start
                    async with trio.open_nursery() as race:  # a record arrives, or the view moves
                        race.start_soon(_then_cancel, lambda: _until(arrived, lambda: len(work) != seen[0]), race)
                        race.start_soon(_then_cancel, lambda: bus.wait_changed(seen[1]), race)
                for sender in data_out.values():
                    await sender.aclose()
            nursery.cancel_scope.cancel()
    return {
        "history": bus.history,
        "idle": bus.exchange.view.is_idle(),
        "posted": {p: s.posted for p, s in bus._senders.items()},
        "stats": bus.stats,
    }


async def _until(lot: trio.lowlevel.ParkingLot, condition) -> None:
    while not condition():
        await lot.park()


async def _then_cancel(wait, nursery) -> None:
    await wait()
    nursery.cancel_scope.cancel()


# --- the checks (in the test's process) ------------------------------------------------------


async def check_progress_bus(transport: str, *, executors: int = 3, seed: int = 0, steps: int = 1500,
                             deadline: float = 120.0, vanish: int | None = None) -> dict:
    """Run the workload on `executors` processes over `transport` and check the laws (module
    docstring); raise AssertionError naming the first that fails. Returns {"events",
    "messages", "rings"}: rings = the fewest rings' worth of buffers any progress channel
    carried."""
    args = {"seed": seed, "steps": steps, "vanish": vanish}
    results = await run_peers(f"{__name__}:workload", executors=executors, transport=transport, args=args, timeout=deadline)
    if vanish is not None:
        assert results[vanish].get("code") == 3, f"executor {vanish} was to vanish: {results[vanish]}"
        survivors = [result for i, result in enumerate(results) if i != vanish]
        for result in survivors:  # the first peer each one lost: the vanished one, or one that failed
            assert result.get("type") == "ChannelClosed", f"a survivor: {result.get('error', 'finished')}"
            assert re.match(r"executor \d+ lost its progress channel to executor \d+: ", result["error"]), result["error"]
        assert any(r["error"].startswith(f"executor {vanish} lost") for r in survivors), [r["error"] for r in survivors]
        return {}
    for i, result in enumerate(results):
        assert "error" not in result, f"executor {i} failed: {result['error']}"
        assert result["idle"], f"executor {i} ended with a view that is not idle"
    rings = min(n for result in results for n in result["posted"].values()) / SLOTS
    assert rings >= WRAPS, f"a progress channel carried only {rings:g} rings' worth of buffers"
    graph, nodes = loop_graph()
    events = replay(graph, _initial(nodes, executors), [result["history"] for result in results])
    return {"events": events, "messages": sum(r["stats"].messages for r in results), "rings": rings}


def replay(graph: Reachability, initial, histories: list[list]) -> int:
    """Merge the histories by time and replay them through pure exchanges, checking FIFO, that
    each real bus sent what the pure protocol sends, and safety after every event."""
    n = len(histories)
    merged = sorted((ts, w, kind, peer, updates, sent) for w, h in enumerate(histories) for ts, kind, peer, updates, sent in h)
    pure = [ProgressExchange(graph, initial) for _ in range(n)]
    truth = Tracker(graph)
    truth.update_iter(initial)
    channels = {(s, r): deque() for s in range(n) for r in range(n) if s != r}
    for count, (ts, w, kind, peer, updates, sent) in enumerate(merged):
        if kind == "record":
            truth.update_iter(updates)
            out = pure[w].record(updates)
        elif kind == "flush":
            out = pure[w].flush()
        else:
            queue = channels[(peer, w)]
            assert queue, f"event {count}: executor {w} applied a message executor {peer} had not sent yet"
            message = queue.popleft()
            assert message == updates, f"event {count}: executor {w} applied {updates}, executor {peer} sent {message} next"
            out = pure[w].receive(message)
        assert tuple(out) == sent, f"event {count}: executor {w} broadcast {sent}, the pure protocol {out}"
        for message in out:
            for r in range(n):
                if r != w:
                    channels[(w, r)].append(message)
        for v, executor in enumerate(pure):
            for location in graph.locations:
                local, true = executor.view.frontier(location), truth.frontier(location)
                assert local.dominates(true), (
                    f"event {count} ({kind} on executor {w}): executor {v}'s frontier at "
                    f"{graph.name(location)} is {local}, ahead of the global {true}"
                )
    leftover = {pair: len(q) for pair, q in channels.items() if q}
    assert not leftover, f"messages sent but never applied: {leftover}"
    assert truth.is_idle() and all(e.view.is_idle() for e in pure)
    return len(merged)
