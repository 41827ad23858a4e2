"""The rescaling tests' job: a late-heavy input into a tumbling and a sliding window sum per key,
each with its late records, into transactional CSV sinks under a directory (out_t, late_t,
out_s, late_s). `job()` is the same for `slashrt run _rescale_job.py:job`, writing under
$SLASHRT_TEST_OUT. `expected()` is what every run must publish, computed with numpy alone."""

import os

import numpy as np

from slashrt import Dataflow, Sliding, Tumbling
from slashrt.ops.sinks import CsvFile

from tests.snapshot import _cluster_child
from tests.snapshot._paced import behind

SCHEMA = _cluster_child.SCHEMA
N = 30_000
MAX_DELAY = 20
WINDOWS = {"t": (100, 100), "s": (200, 50)}  # sink suffix -> (size, slide)
OUTPUTS = tuple(f"{kind}_{w}" for w in WINDOWS for kind in ("out", "late"))


def records() -> np.ndarray:
    """Out of order far beyond MAX_DELAY: a large part of it is late for some window."""
    return _cluster_child.records(N, seed=11, span=3_000, disorder=160, keys=2003)


def flow(directory, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind the source (`tests.snapshot._paced.Paced`), or none."""
    job = Dataflow("rescale")
    source = behind(job.source("r", SCHEMA, time="t", max_delay=MAX_DELAY), pace)
    for w, (size, slide) in WINDOWS.items():
        windows = Tumbling(ms=size) if size == slide else Sliding(size, slide)
        late = CsvFile(f"{directory}/late_{w}", transactional=True)
        out = CsvFile(f"{directory}/out_{w}", transactional=True)
        source.window(windows, late=late).sum("v", key="k", output="total").sink(out, name=f"out_{w}")
    return job


def job():
    return flow(os.environ["SLASHRT_TEST_OUT"]), {"r": records()}


def per_executor_job():
    """The job with its input made by each executor (`PerExecutor`): not rescalable."""
    from slashrt.cluster import PerExecutor

    return flow(os.environ["SLASHRT_TEST_OUT"]), {"r": PerExecutor(lambda i, n: records()[i::n], deterministic=True)}


def expected() -> dict[str, list[str]]:
    """The published rows of every sink (as `published` reads them), by numpy: a record is late
    for a window ending at or before the end of the last window complete at its watermark
    (the largest event time before it, less MAX_DELAY); late for its first window, it goes to
    the late sink; it adds to every window of it not closed for it."""
    a = records()
    t, k, v = (a[c].astype(np.int64) for c in ("t", "k", "v"))
    watermark = np.maximum.accumulate(t) - MAX_DELAY
    rows = {}
    for w, (size, slide) in WINDOWS.items():
        closed = (watermark - size) // slide * slide + size  # every window ending by this fired
        last = t // slide * slide  # the last window start holding t
        starts = np.concatenate([last - j * slide for j in range(size // slide)])
        keep = np.tile(t, size // slide) < starts + size  # (every start holds t: slide divides size)
        keep &= starts + size > np.tile(closed, size // slide)
        first = last - (size // slide - 1) * slide
        late = first + size <= closed
        rows[f"late_{w}"] = sorted(f"{x},{y},{z}" for x, y, z in zip(t[late], k[late], v[late]))
        s, kk, vv = starts[keep], np.tile(k, size // slide)[keep], np.tile(v, size // slide)[keep]
        groups, inverse = np.unique(np.stack([s, kk]), axis=1, return_inverse=True)
        totals = np.bincount(inverse.ravel(), weights=vv, minlength=groups.shape[1]).astype(np.int64)
        rows[f"out_{w}"] = sorted(f"{x},{x + size},{y},{z}" for x, y, z in zip(groups[0], groups[1], totals))
    return rows
