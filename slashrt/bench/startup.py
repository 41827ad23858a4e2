"""How long local executors take to start processing, with and without a `Session`::

    python -m slashrt.bench.startup [--executors 2] [--runs 5] [--events 100000] [--json]

The same job (`slashrt bench ysb`'s flow over `--events` generated records each executor
makes itself) runs `--runs` times on its own, each run starting its executors' zygote, and then
`--runs` times in one `slashrt.cluster.Session`, whose zygote outlives the runs (the first run
of the session waits for its import; the others do not). Reported: `startup_s` of every run
(`RunResult.startup_s`: from the call until every executor was told to process), the medians
of the runs on their own (`alone_s`) and of the session's runs after its first (`session_s`),
and whether every run's result was correct.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys

import numpy as np

__all__ = ["bench"]

CAMPAIGNS = 1000  # (`slashrt bench ysb`'s default)


def bench(executors: int = 2, runs: int = 5, events: int = 100_000) -> dict:
    import slashrt
    from slashrt.bench import scaling
    from slashrt.cluster import PerExecutor, Session
    from slashrt.ops.sinks import Collect

    q = scaling.QUERIES["ysb"]
    params = {"campaigns": CAMPAIGNS}
    make = PerExecutor(functools.partial(scaling._make, "ysb", events, 0.0, params))
    expected = q.reference(np.concatenate([make.make(i, executors) for i in range(executors)]), **params)
    correct = True

    def once(**options) -> float:
        nonlocal correct
        sink = Collect()
        result = slashrt.run(q.flow(sink, **params), {q.source: make}, executors=executors, **options)
        correct = correct and bool(q.matches(q.to_result(sink.records), expected))
        return round(result.startup_s, 4)

    alone = [once() for _ in range(runs)]
    with Session() as session:
        in_session = [once(session=session) for _ in range(runs)]
    return {
        "query": "startup",
        "executors": executors,
        "events": events * executors,
        "runs": runs,
        "alone_startup_s": alone,
        "session_startup_s": in_session,
        "alone_s": round(statistics.median(alone), 4),
        "session_s": round(statistics.median(in_session[1:]), 4) if runs > 1 else None,
        "correct": correct,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slashrt.bench.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", type=int, default=2, help="local executors (at least 2)")
    parser.add_argument("--runs", type=int, default=5, help="runs alone and in the session (at least 2)")
    parser.add_argument("--events", type=int, default=100_000, help="records each executor generates")
    parser.add_argument("--json", action="store_true", help="one JSON object (default: one line per field)")
    args = parser.parse_args(argv)
    if args.executors < 2 or args.runs < 2 or args.events < 1:
        parser.error("--executors and --runs must be at least 2, --events positive")
    result = bench(args.executors, args.runs, args.events)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:20} {value}")
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
