"""The cost of the pure progress modules (slashrt/progress/), one operation at a time.

    python -m slashrt.bench.progress_ops [--repeat N] [--json]

Microseconds per operation, in this process, best of 7 runs of N operations each:

- `chain_move_<n>`: a depth-0 graph, a source and a chain of operators with `n` locations in
  all; the source moves its capability from k to k + 1 (`move_capability`, `update_iter`) and
  the frontier at the chain's last input is queried (`is_complete`): one propagation through
  every location, and the frontier changes it made are collected (`propagate`), as the
  progress bus does after every event.
- `loop_iteration`: the seed's loop graph (one feedback); a record at the body's second input
  goes around once (+1 at the feedback's input at (e, <c + 1>), -1 where it was), then the
  frontiers at the body's second input and at the sink are queried, and the changes collected.
- `exchange_record_2` / `exchange_receive_4`: `ProgressExchange.record` of one capability move
  (2 updates, sent at once) and `receive` of a 4-update message (two sources' moves), each with
  the view's `propagate` after it, as the progress bus calls them.
- `codec_round_trip_4`: `ProgressCodec.encode` then `decode` of a 4-update message.

Every case checks its own result (the frontier it must reach) once per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from slashrt.bench.progress_bus import pingpong_graph
from slashrt.progress.exchange import ProgressExchange
from slashrt.progress.reachability import Builder, Location
from slashrt.progress.timestamp import Timestamp
from slashrt.progress.tracker import Tracker, move_capability
from slashrt.progress.wire import ProgressCodec

__all__ = ["bench", "CASES"]


RUNS = 7  # timed runs per case; the best one counts (the cores are shared: the others wait)


def _best(run, repeat: int) -> float:
    """Microseconds per operation of `run(repeat)`, the best of `RUNS` runs."""
    best = float("inf")
    for _ in range(RUNS):
        started = time.perf_counter()
        run(repeat)
        best = min(best, time.perf_counter() - started)
    return round(best / repeat * 1e6, 2)


def _chain(locations: int):
    """source.out -> op1.in, op1.out -> op2.in, ... : `locations` ports in all (even)."""
    b = Builder()
    nodes = [b.add_node("source", 0, 1)]
    for i in range(locations // 2 - 1):
        nodes.append(b.add_node(f"op{i}"))
        b.connect(nodes[-2], 0, nodes[-1])
    nodes.append(b.add_node("sink", 1, 0))
    b.connect(nodes[-2], 0, nodes[-1])
    graph = b.build()
    assert len(graph.locations) == locations
    return graph, Location.output(nodes[0]), Location.input(nodes[-1])


def chain_move(repeat: int, locations: int = 10) -> float:
    graph, source, sink = _chain(locations)
    stamps = [Timestamp(k) for k in range(repeat + 1)]

    def run(n):
        tracker = Tracker(graph)
        tracker.update(source, stamps[0], 1)
        tracker.propagate()
        for k in range(n):
            tracker.update_iter(move_capability(source, stamps[k], stamps[k + 1]))
            tracker.is_complete(sink, stamps[k])
            tracker.propagate()
        assert tracker.is_complete(sink, stamps[n - 1]) and not tracker.is_complete(sink, stamps[n])

    return _best(run, repeat)


def _loop():
    b = Builder()
    source, ingress, body = b.add_node("source", 0, 1), b.add_ingress("ingress"), b.add_node("body", 2, 1)
    fb, egress, sink = b.add_feedback("feedback"), b.add_egress("egress"), b.add_node("sink", 1, 0)
    b.connect(source, 0, ingress)
    b.connect(ingress, 0, body, 0)
    b.connect(body, 0, fb)
    b.connect(fb, 0, body, 1)
    b.connect(body, 0, egress)
    b.connect(egress, 0, sink)
    return b.build(), Location.output(source), Location.input(body, 0), Location.input(body, 1), Location.input(sink)


def loop_iteration(repeat: int) -> float:
    graph, source, body0, body1, sink = _loop()
    stamps = [Timestamp(0, (c,)) for c in range(repeat + 1)]

    def run(n):
        tracker = Tracker(graph)
        tracker.update_iter([((source, Timestamp(1)), 1), ((body1, stamps[0]), 1)])
        tracker.propagate()
        for c in range(n):
            tracker.update_iter([((body1, stamps[c + 1]), 1), ((body1, stamps[c]), -1)])
            tracker.is_complete(body1, stamps[c])
            tracker.is_complete(sink, Timestamp(0))
            tracker.propagate()
        assert tracker.is_complete(body1, stamps[n - 1]) and not tracker.is_complete(body1, stamps[n])
        assert not tracker.is_complete(sink, Timestamp(0))

    return _best(run, repeat)


def _two_sources():
    graph, sources, sinks = pingpong_graph()  # the progress bus benchmark's graph
    return graph, [Location.output(s) for s in sources], [Location.input(t) for t in sinks]


def exchange_record(repeat: int) -> float:
    graph, (a, b), (a_sink, _) = _two_sources()
    stamps = [Timestamp(k) for k in range(repeat + 1)]

    def run(n):
        exchange = ProgressExchange(graph, [((a, stamps[0]), 1), ((b, stamps[0]), 1)])
        for k in range(n):
            (message,) = exchange.record(move_capability(a, stamps[k], stamps[k + 1]))
            exchange.view.propagate()
        assert exchange.view.is_complete(a_sink, stamps[n - 1]) and not exchange.view.is_complete(a_sink, stamps[n])

    return _best(run, repeat)


def exchange_receive(repeat: int) -> float:
    graph, (a, b), (a_sink, b_sink) = _two_sources()
    stamps = [Timestamp(k) for k in range(repeat + 1)]
    messages = [
        (((a, stamps[k + 1]), 1), ((b, stamps[k + 1]), 1), ((a, stamps[k]), -1), ((b, stamps[k]), -1))
        for k in range(repeat)
    ]

    def run(n):
        exchange = ProgressExchange(graph, [((a, stamps[0]), 1), ((b, stamps[0]), 1)])
        for message in messages[:n]:
            exchange.receive(message)
            exchange.view.propagate()
        assert exchange.view.is_complete(b_sink, stamps[n - 1]) and not exchange.view.is_complete(a_sink, stamps[n])

    return _best(run, repeat)


def codec_round_trip(repeat: int) -> float:
    graph, (a, b), _ = _two_sources()
    codec = ProgressCodec(graph)
    message = (((a, Timestamp(8)), 1), ((b, Timestamp(8)), 1), ((a, Timestamp(7)), -1), ((b, Timestamp(7)), -1))

    def run(n):
        encode, decode = codec.encode, codec.decode
        for _ in range(n):
            (frame,) = encode(message)
            decoded = decode(frame)
        assert decoded == message

    return _best(run, repeat)


CASES = {
    "chain_move_6": lambda repeat: chain_move(repeat, 6),
    "chain_move_10": lambda repeat: chain_move(repeat, 10),
    "chain_move_20": lambda repeat: chain_move(repeat, 20),
    "loop_iteration": loop_iteration,
    "exchange_record_2": exchange_record,
    "exchange_receive_4": exchange_receive,
    "codec_round_trip_4": codec_round_trip,
}


def bench(repeat: int = 5000) -> dict:
    """Microseconds per operation of every case (`CASES`)."""
    return {"repeat": repeat, "us_per_op": {name: case(repeat) for name, case in CASES.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slashrt.bench.progress_ops", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5000, help=f"operations per timed run (best of {RUNS} runs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.repeat < 4:
        parser.error("--repeat must be at least 4")
    result = bench(args.repeat)
    if args.json:
        print(json.dumps(result))
    else:
        for name, us in result["us_per_op"].items():
            print(f"{name:>22}: {us:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
