"""Cluster monitoring (CM) of the Slash paper: 64-byte task-usage records shaped like the public
Google cluster trace; mean CPU usage per job over 2-second tumbling windows.

The synthetic trace keeps the trace's shape, not its data: job popularity is Zipf-like (a few
jobs own most tasks), CPU and memory usage are log-normal fractions of a machine."""

from __future__ import annotations

import numpy as np

from slashrt._dataflow import Dataflow
from slashrt._schema import Schema
from slashrt.bench._common import generate_chunked, lazy, run_best, sort_rows, throughput_fields, zipf_choice
from slashrt.ops.window import Tumbling

__all__ = ["CM_SCHEMA", "generate", "dataflow", "reference", "bench"]

CM_SCHEMA = Schema(
    [
        ("event_time", "<i8"),
        ("job_id", "<i8"),
        ("task_id", "<i8"),
        ("machine_id", "<i8"),
        ("cpu", "<f8"),
        ("memory", "<f8"),
        ("disk", "<f8"),
        ("priority", "<i4"),
        ("event_type", "<i4"),
    ]
)
assert CM_SCHEMA.record_size == 64
WINDOW_MS = 2000
RESULT_DTYPE = np.dtype([("window_start", "<i8"), ("job_id", "<i8"), ("mean_cpu", "<f8")])


def generate(events: int, jobs: int = 10_000, *, zipf: float = 1.1, events_per_ms: int = 100, seed: int = 11) -> np.ndarray:
    def fill(out, first, rng):
        n = len(out)
        out["event_time"] = np.arange(first, first + n, dtype=np.int64) // events_per_ms
        out["job_id"] = zipf_choice(rng, jobs, n, zipf) + 6_000_000_000  # trace job ids are large
        out["task_id"] = rng.integers(0, 2000, n)
        out["machine_id"] = rng.integers(0, 12_500, n)
        out["cpu"] = np.minimum(rng.lognormal(-4.0, 1.0, n), 1.0)
        out["memory"] = np.minimum(rng.lognormal(-4.5, 1.0, n), 1.0)
        out["disk"] = np.minimum(rng.lognormal(-7.0, 1.5, n), 1.0)
        out["priority"] = rng.integers(0, 12, n, dtype=np.int32)
        out["event_type"] = rng.integers(0, 9, n, dtype=np.int32)

    return generate_chunked(CM_SCHEMA.dtype, events, fill, seed)


def dataflow(sink) -> Dataflow:
    flow = Dataflow("cm")
    usage = flow.source("usage", CM_SCHEMA, time="event_time")
    usage.window(Tumbling(ms=WINDOW_MS)).mean("cpu", key="job_id", output="mean_cpu").sink(sink, name="mean_cpu")
    return flow


def to_result(records) -> np.ndarray:
    if records is None:
        return np.empty(0, RESULT_DTYPE)
    out = np.empty(len(records), RESULT_DTYPE)
    out["window_start"], out["job_id"], out["mean_cpu"] = records["window_start"], records["job_id"], records["mean_cpu"]
    return sort_rows(out, "window_start", "job_id")


def reference(records: np.ndarray) -> np.ndarray:
    window = records["event_time"] // WINDOW_MS
    pairs = np.stack([window, records["job_id"]], axis=1)
    uniq, inverse, counts = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse.reshape(-1), weights=records["cpu"], minlength=len(uniq))
    out = np.empty(len(uniq), RESULT_DTYPE)
    out["window_start"], out["job_id"], out["mean_cpu"] = uniq[:, 0] * WINDOW_MS, uniq[:, 1], sums / counts
    return out


def matches(got: np.ndarray, ref: np.ndarray) -> bool:
    """Same rows; means equal up to floating-point summation order."""
    return (
        len(got) == len(ref)
        and np.array_equal(got["window_start"], ref["window_start"])
        and np.array_equal(got["job_id"], ref["job_id"])
        and bool(np.allclose(got["mean_cpu"], ref["mean_cpu"], rtol=1e-9, atol=0))
    )


def bench(*, events: int, jobs: int, zipf: float = 1.1, repeat: int = 1, show_progress: bool = False, **options) -> dict:
    records = generate(events, jobs, zipf=zipf)
    expected = lazy(lambda: reference(records))
    m = run_best(
        dataflow,
        {"usage": records},
        repeat=repeat,
        to_result=to_result,
        check=lambda got: matches(got, expected()),
        show_progress=show_progress,
        **options,
    )
    return throughput_fields(
        "cm", events, m.result, correct=m.correct, jobs=jobs, job_windows=len(m.output), repeat=repeat,
        peak_rss_bytes=m.peak_rss_bytes, input_bytes=records.nbytes,
    )
