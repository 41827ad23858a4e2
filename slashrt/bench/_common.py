"""Shared pieces of the benchmarks: peak memory, Zipf sampling, chunked generation, timing."""

from __future__ import annotations

import contextlib
import resource
import tempfile
import time

import attrs
import numpy as np

__all__ = ["peak_rss_bytes", "zipf_choice", "generate_chunked", "Timer", "sort_rows", "run_best", "Measured", "throughput_fields", "cpu_fields", "lazy",
           "checkpointing", "checkpoint_fields", "best_interleaved"]

GEN_CHUNK = 1 << 20


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def zipf_choice(rng: np.random.Generator, n_values: int, size: int, s: float) -> np.ndarray:
    """`size` draws from 0..n_values-1 with P(i) proportional to 1/(i+1)**s (s=0: uniform)."""
    if s <= 0:
        return rng.integers(0, n_values, size, dtype=np.int64)
    cdf = np.cumsum(1.0 / np.arange(1, n_values + 1, dtype=np.float64) ** s)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_values - 1).astype(np.int64)


def generate_chunked(dtype: np.dtype, n: int, fill, seed: int) -> np.ndarray:
    """Allocate `n` records once and let `fill(out_chunk, first_index, rng)` fill it chunk by chunk,
    so generation needs no temporaries of the whole input's size."""
    out = np.zeros(n, dtype=dtype)
    rng = np.random.default_rng(seed)
    for start in range(0, n, GEN_CHUNK):
        fill(out[start : start + GEN_CHUNK], start, rng)
    return out


def sort_rows(records: np.ndarray, *keys: str) -> np.ndarray:
    """Rows sorted by the given columns (first key most significant)."""
    order = np.lexsort(tuple(records[k] for k in reversed(keys)))
    return records[order]


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


@attrs.define
class Measured:
    """The best of repeated runs of one benchmark dataflow."""

    result: object  # the fastest run's RunResult
    correct: bool  # every run's output matched the reference
    output: np.ndarray  # the last run's output, as the benchmark's sorted result rows
    peak_rss_bytes: int


def run_best(make_flow, inputs: dict, *, repeat: int, to_result, check, show_progress: bool, **options) -> Measured:
    """Run `make_flow(sink)` `repeat` times on `inputs`; every run's output (turned into result
    rows by `to_result`) must pass `check`; keep the fastest run, as benchmarks do with
    warm-up effects such as a virtual machine faulting in fresh memory on first use.
    `check` should build its reference lazily (see `lazy`), so that the peak memory reported
    is the run's, not the reference's."""
    from slashrt._progress_bar import ProgressBar
    from slashrt._run import run
    from slashrt.ops.sinks import Collect

    total = sum(len(v) for v in inputs.values())
    best, correct, output, peak = None, True, None, None
    for _ in range(repeat):
        sink = Collect()
        bar = ProgressBar(total) if show_progress else None
        result = run(make_flow(sink), inputs, on_records=bar, **options)
        # the memory of a run: measured before `check` first builds the reference
        peak = peak_rss_bytes() if peak is None else peak
        output = to_result(sink.records)
        correct = correct and bool(check(output))
        if best is None or result.seconds < best.seconds:
            best = result
    return Measured(best, correct, output, peak)


def throughput_fields(query: str, events: int, result, **extra) -> dict:
    """The fields every benchmark's JSON object starts with."""
    return {
        "query": query,
        "events": events,
        "executors": 1,
        "transport": "inproc",
        "seconds": round(result.seconds, 6),
        "records_per_s": round(events / result.seconds, 1),
        **cpu_fields(events, result),
        **extra,
    }


def cpu_fields(events: int, result) -> dict:
    """The CPU seconds every executor used (`ExecutorStats.cpu_s`), and records per CPU second:
    a ratio of two runs' `records_per_cpu_s` holds on a loaded machine, where wall-clock
    throughput does not."""
    cpu = sum(s.cpu_s for s in result.stats)
    return {"cpu_s": round(cpu, 6), "records_per_cpu_s": round(events / cpu, 1) if cpu > 0 else None}


def best_interleaved(repeat: int, run_once, variants) -> dict:
    """The fastest result (`.seconds`) of `run_once(variant)` per variant, over `repeat` rounds
    in which the variants take turns (so a loaded machine weighs on each alike)."""
    best: dict = {}
    for _ in range(repeat):
        for variant in variants:
            result = run_once(variant)
            if variant not in best or result.seconds < best[variant].seconds:
                best[variant] = result
    return best


@contextlib.contextmanager
def checkpointing(interval: float | None):
    """`run` options for a run checkpointed every `interval` seconds into a temporary directory
    (removed after); {} without an interval."""
    if interval is None:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="slashrt-bench-chk-") as directory:
        yield {"checkpoint": interval, "checkpoint_dir": directory}


def checkpoint_fields(events: int, plain, checkpointed) -> dict:
    """What a benchmark reports of its query run with checkpoints (the fastest such run) beside
    the same query without (`plain`): throughput, their ratio, periodic checkpoints completed."""
    periodic = [c for c in checkpointed.checkpoints if c["status"] == "completed" and not c["savepoint"]]
    return {
        "records_per_s_checkpointed": round(events / checkpointed.seconds, 1),
        "checkpointed_over_plain": round(plain.seconds / checkpointed.seconds, 3),
        "checkpoints_completed": len(periodic),
    }


def lazy(compute):
    """A function that calls `compute()` once, on first use, and returns its result after."""
    cache = []

    def get():
        if not cache:
            cache.append(compute())
        return cache[0]

    return get
