"""End-to-end latency of a run's output rows, measured at its sinks.

A sink measures when every source upstream of it is `Paced` (`slashrt.Paced`: event time is
the wall-clock time a record was due at its source). A row's latency is the wall-clock time
it reached the sink minus its stream's event time: for a window's row, its `window_end`
(the event time that closes the window); on a stateless path, the record's own event time.
A source that falls behind its schedule (backpressure) has its records' event times in the
past, so the wait counts in their latency: no coordinated omission.

Latencies go into a `LatencyHistogram` per sink and executor: counts in logarithmic buckets
(HdrHistogram's layout: 32 per power of two of microseconds, about 3% wide; below 32 us one
per microsecond), merged across executors by adding counts, so quantiles of a whole cluster's
rows come out without keeping a value per row.
"""

from __future__ import annotations

import time

import attrs
import numpy as np

__all__ = ["LatencyHistogram", "measuring_sinks", "upstream_sources"]

SUB_BITS = 5
SUB = 1 << SUB_BITS  # buckets per power of two (and the exact ones below SUB microseconds)
MAX_EXP = 40  # 2**40 us: 12.7 days; longer latencies count in the last bucket
BUCKETS = SUB + (MAX_EXP - SUB_BITS + 1) * SUB


def _bucket(us: np.ndarray) -> np.ndarray:
    """Each latency's bucket (whole microseconds >= 0, int64)."""
    us = np.minimum(us, (1 << (MAX_EXP + 1)) - 1)
    exp = np.frexp(np.maximum(us, 1).astype(np.float64))[1].astype(np.int64) - 1  # floor(log2): exact below 2**53
    shift = np.maximum(exp - SUB_BITS, 0)
    return np.where(us < SUB, us, SUB + shift * SUB + ((us >> shift) - SUB))


def _bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high) in microseconds of bucket `index`."""
    if index < SUB:
        return index, index + 1
    shift, sub = divmod(index - SUB, SUB)
    return (SUB + sub) << shift, (SUB + sub + 1) << shift


@attrs.define(eq=False)
class LatencyHistogram:
    """Row latencies of one sink (on one executor, or merged): `record` them, `merge` another's,
    read `quantile(q)`, `p50_ms`, `p99_ms`, `max_ms`, `mean_ms`, `rows`."""

    counts: np.ndarray = attrs.Factory(lambda: np.zeros(BUCKETS, np.int64))
    rows: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0

    def record_times(self, times: np.ndarray, ms_per_unit: float, now_ms: float | None = None) -> None:
        """Count the rows whose event times (in a unit of `ms_per_unit` milliseconds) are
        `times`, reaching the sink now (`now_ms`: wall-clock milliseconds since the epoch)."""
        if not len(times):
            return
        now_ms = time.time_ns() / 1e6 if now_ms is None else now_ms
        self.record(now_ms - times.astype(np.float64) * ms_per_unit)

    def record(self, latencies_ms: np.ndarray) -> None:
        """Count these latencies (milliseconds; a negative one, of a row ahead of the clock, as 0)."""
        if not len(latencies_ms):
            return
        lat = np.maximum(latencies_ms, 0.0)
        self.counts += np.bincount(_bucket(np.rint(lat * 1000).astype(np.int64)), minlength=BUCKETS)
        self.rows += len(lat)
        self.total_ms += float(lat.sum())
        self.max_ms = max(self.max_ms, float(lat.max()))

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        """Add `other`'s rows to these (another executor's, say); returns self."""
        self.counts += other.counts
        self.rows += other.rows
        self.total_ms += other.total_ms
        self.max_ms = max(self.max_ms, other.max_ms)
        return self

    def quantile(self, q: float) -> float | None:
        """The latency (ms) that a fraction `q` of the rows did not exceed: the middle of its
        bucket (within 1.6% of the true value), never above the largest seen; None without rows."""
        if not 0 <= q <= 1:
            raise ValueError(f"a quantile is between 0 and 1, got {q!r}")
        if not self.rows:
            return None
        rank = max(1, int(np.ceil(q * self.rows)))
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        low, high = _bucket_bounds(index)
        return min((low + high - 1) / 2000, self.max_ms)

    @property
    def p50_ms(self) -> float | None:
        return self.quantile(0.5)

    @property
    def p99_ms(self) -> float | None:
        return self.quantile(0.99)

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.rows if self.rows else None

    def summary(self) -> dict:
        """JSON-able figures: rows, p50_ms, p99_ms, max_ms, mean_ms."""
        return {"rows": self.rows, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
                "max_ms": self.max_ms if self.rows else None, "mean_ms": self.mean_ms}


def upstream_sources(flow, step_id: str) -> set[str]:
    """The sources whose records can reach step `step_id` (through every input, loops included)."""
    from slashrt._dataflow import SourceSpec, inputs_of

    back = {}  # a loop's entry reads its feedback too
    for spec in flow.steps.values():
        into = getattr(spec, "into", None)
        if into is not None:
            back.setdefault(into, []).append(spec.step_id)
    found, seen, todo = set(), set(), [step_id]
    while todo:
        step = todo.pop()
        if step in seen:
            continue
        seen.add(step)
        spec = flow.steps[step]
        if isinstance(spec, SourceSpec):
            found.add(step)
        todo.extend(inputs_of(spec))
        todo.extend(back.get(step, ()))
    return found


def measuring_sinks(flow, paced: set[str]) -> dict[str, float]:
    """The sinks of `flow` that measure latency when the sources `paced` are paced: those with an
    event-time column whose every upstream source is paced, each with its milliseconds per time unit."""
    from slashrt._dataflow import SinkSpec, ms_per_unit

    return {
        spec.step_id: ms_per_unit(spec.time_unit)
        for spec in flow.steps.values()
        if isinstance(spec, SinkSpec) and spec.time is not None and paced
        and upstream_sources(flow, spec.step_id) <= paced
    }
