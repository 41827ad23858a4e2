"""The read-only benchmark (RO) of the Slash paper: 16-byte records (key, timestamp), count the
occurrences of each key per tumbling window. Keys are uniform over a large range (default 100
million), so the state is as large as the distinct keys and every update is a random access."""

from __future__ import annotations

import numpy as np

from slashrt._dataflow import Dataflow
from slashrt._schema import Schema
from slashrt.bench._common import generate_chunked, lazy, run_best, sort_rows, throughput_fields, zipf_choice
from slashrt.ops.window import Tumbling

__all__ = ["RO_SCHEMA", "generate", "dataflow", "reference", "bench"]

RO_SCHEMA = Schema([("key", "<i8"), ("ts", "<i8")])
RESULT_DTYPE = np.dtype([("window_start", "<i8"), ("key", "<i8"), ("count", "<i8")])


def generate(
    events: int, key_range: int = 100_000_000, *, zipf: float = 0.0, events_per_ms: int = 1000, seed: int = 7
) -> np.ndarray:
    def fill(out, first, rng):
        out["key"] = zipf_choice(rng, key_range, len(out), zipf)
        out["ts"] = np.arange(first, first + len(out), dtype=np.int64) // events_per_ms

    return generate_chunked(RO_SCHEMA.dtype, events, fill, seed)


def dataflow(sink, *, window_ms: int) -> Dataflow:
    flow = Dataflow("ro")
    records = flow.source("records", RO_SCHEMA, time="ts")
    records.window(Tumbling(ms=window_ms)).count(key="key").sink(sink, name="counts")
    return flow


def to_result(records) -> np.ndarray:
    if records is None:
        return np.empty(0, RESULT_DTYPE)
    out = np.empty(len(records), RESULT_DTYPE)
    out["window_start"], out["key"], out["count"] = records["window_start"], records["key"], records["count"]
    return sort_rows(out, "window_start", "key")


def reference(records: np.ndarray, window_ms: int) -> np.ndarray:
    window = records["ts"] // window_ms
    pairs = np.stack([window, records["key"]], axis=1)
    uniq, counts = np.unique(pairs, axis=0, return_counts=True)
    out = np.empty(len(uniq), RESULT_DTYPE)
    out["window_start"], out["key"], out["count"] = uniq[:, 0] * window_ms, uniq[:, 1], counts
    return out


def bench(
    *, events: int, key_range: int, window_ms: int, zipf: float = 0.0, repeat: int = 1, show_progress: bool = False, **options
) -> dict:
    records = generate(events, key_range, zipf=zipf)
    expected = lazy(lambda: reference(records, window_ms))
    m = run_best(
        lambda sink: dataflow(sink, window_ms=window_ms),
        {"records": records},
        repeat=repeat,
        to_result=to_result,
        check=lambda got: np.array_equal(got, expected()),
        show_progress=show_progress,
        **options,
    )
    return throughput_fields(
        "ro", events, m.result, correct=m.correct, key_range=key_range, window_ms=window_ms,
        distinct_key_windows=len(m.output), repeat=repeat, peak_rss_bytes=m.peak_rss_bytes, input_bytes=records.nbytes,
    )
