"""The cost of two-input graph steps on one executor: `connect(...).apply` beside `union`.

    python -m slashrt.bench.graph_ops [--records N] [--same-time K] [--json]

Two sources of N records each (k, t), a new event time every K records, meet in one step and
go to a sink: `a.union(b)` (no user code) and `a.connect(b).apply(fn)` (fn returns its batch).
Both run in the same process, taking turns, best of 5 runs each (the first runs warm the
process up); the JSON gives the seconds of each, their ratio and whether both sinks got every
record (`correct`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import slashrt
from slashrt import Dataflow, sinks

__all__ = ["bench"]

REC = np.dtype([("k", "<i8"), ("t", "<i8")])
RUNS = 5


def _inputs(records: int, same_time: int) -> dict[str, np.ndarray]:
    out = {}
    for name, offset in (("a", 0), ("b", 1)):
        a = np.zeros(records, REC)
        a["k"] = np.arange(records) * 2 + offset
        a["t"] = np.arange(records) // same_time
        out[name] = a
    return out


def _flow(kind: str) -> tuple[Dataflow, sinks.Collect]:
    flow = Dataflow(kind)
    a, b = flow.source("a", REC, time="t"), flow.source("b", REC, time="t")
    out = sinks.Collect()
    both = a.union(b) if kind == "union" else a.connect(b).apply(lambda batch, port: batch, name="same")
    both.sink(out)
    return flow, out


def _run(kind: str, inputs: dict[str, np.ndarray], want: np.ndarray) -> tuple[float, bool]:
    flow, out = _flow(kind)
    started = time.perf_counter()
    slashrt.run(flow, inputs)
    seconds = time.perf_counter() - started
    return seconds, bool(np.array_equal(np.sort(out.records["k"]), want))


def bench(records: int = 65_536, same_time: int = 10) -> dict:
    inputs = _inputs(records, same_time)
    want = np.sort(np.concatenate([inputs["a"]["k"], inputs["b"]["k"]]))
    best = {"union": float("inf"), "connect_apply": float("inf")}
    correct = True
    for _ in range(RUNS):
        for kind in best:
            seconds, ok = _run(kind, inputs, want)
            best[kind], correct = min(best[kind], seconds), correct and ok
    return {
        "records_per_source": records,
        "records_per_event_time": same_time,
        "union_seconds": round(best["union"], 4),
        "connect_apply_seconds": round(best["connect_apply"], 4),
        "connect_over_union": round(best["connect_apply"] / best["union"], 2),
        "correct": correct,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slashrt.bench.graph_ops", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=65_536, help="records per source")
    parser.add_argument("--same-time", type=int, default=10, help="records per event-time value")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.records < 1 or args.same_time < 1:
        parser.error("--records and --same-time must be at least 1")
    result = bench(args.records, args.same_time)
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in result.items():
            print(f"{name:>24}: {value}")
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
