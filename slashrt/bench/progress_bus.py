"""The progress layer alone: how fast a frontier move crosses executors, and how much progress
traffic accumulation leaves (not yet end-to-end notification latency: no executor, no operators).

    python -m slashrt.bench.progress_bus [--transport shm|tcp] [--rounds N] [--json]

Two executor processes (`slashrt.testing._peers`), each with a progress bus
(`slashrt.cluster._progress`), run two programs:

- latency, ping-pong: two sources, each feeding a sink; executor 0 owns source a, executor 1
  source b, one capability each. In round k executor 0 moves a's capability from k to k + 1 (the
  retirement of k empties that pointstamp, so the exchange sends it at once) and waits until
  its view says b-sink is complete at k; executor 1 waits until a-sink is complete at k, then
  moves b's capability likewise. Executor 0 times each round (CLOCK_MONOTONIC): one frontier
  move crossing each way, so a one-way latency is half a round (p50, p99 in microseconds).
- accumulation, a YSB-like pattern: source -> window -> sink on every executor; per watermark
  each executor records `batches` batches its source hands its own window instance (a +1 where
  the batch waits, then the window's -1 when it consumed it, as Slash keeps records local),
  then moves its source's capability to the next watermark and goes idle (flush). Reported:
  updates recorded, messages broadcast and bytes posted per update and per watermark, with the
  exchange's accumulation and without it (a flush after every record: one message per event).

Beside them, in this process: encode and decode of a 4-update message (`codec_us`), and the
protocol's steps of one frontier move without the channels (`protocol_us`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit

import numpy as np
import trio

from slashrt.cluster._progress import open_progress_bus
from slashrt.progress.exchange import ProgressExchange
from slashrt.progress.reachability import Builder, Location
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import move_capability
from slashrt.progress.wire import ProgressCodec
from slashrt.testing._peers import Peer, run_peers

__all__ = ["bench", "codec_us", "protocol_us", "pingpong", "accumulation"]

WARMUP = 200
MODULE = "slashrt.bench.progress_bus"  # not __name__: that is "__main__" under python -m


def _bus(peer: Peer, graph, initial):
    return open_progress_bus(
        peer.index, peer.executors, graph, transport=peer.transport, secret=peer.secret,
        swap_addresses=peer.swap, initial=initial, **peer.where,
    )


async def pingpong(peer: Peer) -> dict:
    """One side of the ping-pong (module docstring); executor 0 returns the round times (ns)."""
    graph, sources, sinks = pingpong_graph()
    mine, theirs = Location.output(sources[peer.index]), Location.input(sinks[1 - peer.index])
    initial = [((Location.output(s), Timestamp(0)), 1) for s in sources]
    rounds = peer.args["rounds"] + WARMUP
    times = []
    async with _bus(peer, graph, initial) as bus:
        for k in range(rounds):
            if peer.index == 0:
                started = time.perf_counter_ns()
                bus.record(move_capability(mine, Timestamp(k), Timestamp(k + 1)))
                await bus.wait_complete(theirs, Timestamp(k))
                times.append(time.perf_counter_ns() - started)
            else:
                await bus.wait_complete(theirs, Timestamp(k))
                bus.record(move_capability(mine, Timestamp(k), Timestamp(k + 1)))
        bus.record([((mine, Timestamp(rounds)), -1)])
    return {"round_ns": times[WARMUP:]}


async def accumulation(peer: Peer) -> dict:
    """One executor of the YSB-like pattern (module docstring); returns its bus's counts."""
    b = Builder()
    source, window, sink = b.add_node("source", 0, 1), b.add_node("window"), b.add_node("sink", 1, 0)
    b.connect(source, 0, window)
    b.connect(window, 0, sink)
    graph = b.build()
    cap, window_in = Location.output(source), Location.input(window)
    watermarks, batches, accumulate = peer.args["watermarks"], peer.args["batches"], peer.args["accumulate"]
    async with _bus(peer, graph, [((cap, Timestamp(0)), peer.executors)]) as bus:
        for w in range(watermarks):
            t = Timestamp(w)
            for _ in range(batches):
                for updates in ([((window_in, t), 1)], [((window_in, t), -1)]):
                    bus.record(updates)
                    if not accumulate:
                        bus.flush()
                await trio.lowlevel.checkpoint()
            bus.record(move_capability(cap, t, Timestamp(w + 1)))
            bus.flush()  # idle until the next watermark's records
            await trio.lowlevel.checkpoint()
        bus.record([((cap, Timestamp(watermarks)), -1)])
        bus.flush()
        await bus.wait_complete(window_in, Timestamp(watermarks))
    s = bus.stats
    return {"updates": s.updates, "messages": s.messages, "bytes": s.bytes, "peers": peer.executors - 1}


def codec_us(updates: int = 4, repeat: int = 20000) -> dict:
    """Encode and decode of a message of `updates` updates outside loops (one frame), in this
    process: microseconds per message, best of three runs (decoding checks every rule)."""
    b = Builder()
    source, sink = b.add_node("source", 0, 1), b.add_node("sink", 1, 0)
    b.connect(source, 0, sink)
    graph = b.build()
    codec = ProgressCodec(graph)
    cap, sink_in = Location.output(source), Location.input(sink)
    message = tuple(((cap if i % 2 else sink_in, Timestamp(i)), 1 if i < updates // 2 else -1) for i in range(updates))
    (frame,) = codec.encode(message)
    assert codec.decode(frame) == message
    encode = min(timeit.repeat(lambda: codec.encode(message), number=repeat, repeat=3)) / repeat
    decode = min(timeit.repeat(lambda: codec.decode(frame), number=repeat, repeat=3)) / repeat
    return {"updates": updates, "bytes": len(frame), "encode_us": round(encode * 1e6, 2), "decode_us": round(decode * 1e6, 2)}


def pingpong_graph():
    b = Builder()
    sources = [b.add_node("a", 0, 1), b.add_node("b", 0, 1)]
    sinks = [b.add_node("a_sink", 1, 0), b.add_node("b_sink", 1, 0)]
    for source, sink in zip(sources, sinks):
        b.connect(source, 0, sink)
    return b.build(), sources, sinks


def protocol_us(moves: int = 5000) -> dict:
    """Where a frontier move's time goes without the channels: the steps of one ping-pong move
    called in this process, microseconds each (mean over `moves`)."""
    graph, sources, sinks = pingpong_graph()
    initial = [((Location.output(s), Timestamp(0)), 1) for s in sources]
    a, b, codec = ProgressExchange(graph, initial), ProgressExchange(graph, initial), ProgressCodec(graph)
    cap, sink_in = Location.output(sources[0]), Location.input(sinks[0])
    totals = np.zeros(5)
    for k in range(moves):
        t0 = time.perf_counter_ns()
        (message,) = a.record(move_capability(cap, Timestamp(k), Timestamp(k + 1)))
        a.view.propagate()
        t1 = time.perf_counter_ns()
        (frame,) = codec.encode(message)
        t2 = time.perf_counter_ns()
        received = codec.decode(frame)
        t3 = time.perf_counter_ns()
        b.receive(received)
        b.view.propagate()
        t4 = time.perf_counter_ns()
        assert b.view.is_complete(sink_in, Timestamp(k))
        totals += np.diff([t0, t1, t2, t3, t4, time.perf_counter_ns()])
    steps = ("record", "encode", "decode", "receive", "is_complete")
    return {step: round(float(t) / moves / 1e3, 1) for step, t in zip(steps, totals)}


async def bench(transport: str = "shm", *, rounds: int = 2000, watermarks: int = 200, batches: int = 10) -> dict:
    """Every measurement on 2 executors over `transport`; a dict of the figures."""
    (ping, _) = await run_peers(f"{MODULE}:pingpong", executors=2, transport=transport, args={"rounds": rounds})
    if "error" in ping:
        raise RuntimeError(f"ping-pong failed: {ping['error']}")
    one_way_us = np.asarray(ping["round_ns"]) / 2 / 1e3
    out = {
        "transport": transport,
        "executors": 2,
        "rounds": rounds,
        "frontier_latency_us_p50": round(float(np.percentile(one_way_us, 50)), 1),
        "frontier_latency_us_p99": round(float(np.percentile(one_way_us, 99)), 1),
        "codec_4_updates": codec_us(4),
        "protocol_us": protocol_us(),
    }
    for accumulate in (True, False):
        args = {"watermarks": watermarks, "batches": batches, "accumulate": accumulate}
        results = await run_peers(f"{MODULE}:accumulation", executors=2, transport=transport, args=args)
        for r in results:
            if "error" in r:
                raise RuntimeError(f"accumulation failed: {r['error']}")
        updates, messages = sum(r["updates"] for r in results), sum(r["messages"] for r in results)
        sent = sum(r["bytes"] for r in results)  # posted to every peer: what crossed the channels
        key = "accumulated" if accumulate else "unaccumulated"
        out[key] = {
            "updates": updates,
            "messages": messages,
            "bytes": sent,
            "messages_per_update": round(messages / updates, 4),
            "bytes_per_update": round(sent / updates, 2),
            "messages_per_watermark": round(messages / watermarks, 2),
            "bytes_per_watermark": round(sent / watermarks, 1),
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slashrt.bench.progress_bus", description=__doc__.split("\n")[0])
    parser.add_argument("--transport", choices=["shm", "tcp"], default="shm")
    parser.add_argument("--rounds", type=int, default=2000, help="ping-pong rounds measured (after 200 of warm-up)")
    parser.add_argument("--watermarks", type=int, default=200)
    parser.add_argument("--batches", type=int, default=10, help="batches per watermark and executor")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = trio.run(lambda: bench(args.transport, rounds=args.rounds, watermarks=args.watermarks, batches=args.batches))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
