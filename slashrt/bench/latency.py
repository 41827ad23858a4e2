"""End-to-end latency of YSB at a steady input rate: ``slashrt bench latency --json``.

YSB's query (`slashrt.bench.ysb`, windows of `--window-ms`) over a `slashrt.Paced` input of
`--rate` events per second in all for `--seconds`, on each executor count of `--executors`
(1 and 2 by default, over `--transport`): each executor generates its share in chunks as the
run goes and releases it on one schedule that starts `START_AFTER_S` after the call (so the
executors' start-up is not counted as latency, and a numpy reference of the schedule's event
times can check every window's count). Per executor count: the events, the seconds
(`span_s`) and records per second from the schedule's start to the run's end (the rate, unless the dataflow
falls behind it), and the latency of the
window rows at the sink (`RunResult.latency`: emission minus the window's end, p50, p99 and
max), and `correct`.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["bench"]

START_AFTER_S = 2.0  # the schedule starts this long after the call: the executors are up by then
CHUNK = 50_000  # records an executor generates at a time


class YsbChunks:
    """Executor `index`'s `events` YSB records in chunks made on demand (a sequence: a resume,
    or the reference, makes chunk c without the ones before it)."""

    def __init__(self, index: int, events: int, campaigns: int):
        self.index, self.events, self.campaigns = index, events, campaigns

    def __len__(self) -> int:
        return -(-self.events // CHUNK)

    def __getitem__(self, c: int) -> np.ndarray:
        from slashrt.bench import ysb

        if not 0 <= c < len(self):
            raise IndexError(c)
        n = min(CHUNK, self.events - c * CHUNK)
        return ysb.generate(n, self.campaigns, seed=(self.index << 20) + c)


def _make(events: int, campaigns: int, index: int, executors: int) -> YsbChunks:
    return YsbChunks(index, events // executors + (index < events % executors), campaigns)


def reference(events: int, campaigns: int, executors: int, *, rate: float, start_ms: int, window_ms: int) -> np.ndarray:
    """Counts per (window start, campaign) of views, sorted, with the schedule's event times."""
    from slashrt.bench import ysb
    from slashrt.ops.paced import schedule

    mapping = ysb.campaign_map(campaigns)
    counts: dict[tuple[int, int], int] = {}
    for i in range(executors):
        chunks, first = _make(events, campaigns, i, executors), 0
        for c in range(len(chunks)):
            chunk = chunks[c]
            times = schedule(first, len(chunk), rate=rate / executors, start_ms=start_ms)
            first += len(chunk)
            views = chunk["event_type"] == ysb.VIEW
            pairs = np.stack([times[views] // window_ms * window_ms, mapping[chunk["ad_id"][views]]], 1)
            keys, n = np.unique(pairs, axis=0, return_counts=True)
            for (w, k), m in zip(keys.tolist(), n.tolist()):
                counts[(w, k)] = counts.get((w, k), 0) + m
    out = np.array([(w, k, m) for (w, k), m in sorted(counts.items())], dtype=ysb.RESULT_DTYPE)
    return out


def bench(rate: float = 1_000_000, seconds: float = 10.0, executors=(1, 2), window_ms: int = 1000,
          transport: str = "shm", campaigns: int = 1000) -> dict:
    import functools

    import slashrt
    from slashrt.bench import ysb
    from slashrt.ops.sinks import Collect

    events = int(rate * seconds)
    out = {"query": "latency", "rate": rate, "seconds": seconds, "window_ms": window_ms, "events": events,
           "transport": transport}
    correct = True
    for k in executors:
        sink = Collect()
        flow = ysb.dataflow(ysb.campaign_map(campaigns), sink, window_ms=window_ms)
        start_ms = time.time_ns() // 1_000_000 + int(START_AFTER_S * 1000)
        paced = slashrt.Paced(functools.partial(_make, events, campaigns), rate=rate, start_ms=start_ms,
                              deterministic=True)
        options = {} if k == 1 else {"executors": k, "transport": transport}
        result = slashrt.run(flow, {"events": paced}, **options)
        span = time.time() - start_ms / 1000  # from the schedule's start to the run's end
        expected = reference(events, campaigns, k, rate=rate, start_ms=start_ms, window_ms=window_ms)
        ok = bool(np.array_equal(ysb.to_result(sink.records), expected))
        correct = correct and ok
        latency = result.latency["ysb.counts"]
        out[f"at_{k}"] = {
            "executors": k,
            "span_s": round(span, 3),
            "records_per_s": round(events / span),
            "rows": latency.rows,
            "latency_p50_ms": round(latency.p50_ms, 3),
            "latency_p99_ms": round(latency.p99_ms, 3),
            "latency_max_ms": round(latency.max_ms, 3),
            "correct": ok,
        }
    out["correct"] = correct
    return out
