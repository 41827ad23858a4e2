"""The `disk-full` fault of `slashrt bench chaos --faults`: the checkpoint directory is a small
tmpfs (a real disk, mounted here: needs root) that fills up mid-run, until writes fail with
ENOSPC, and is freed a few checkpoint intervals later.

The job, a keyed window sum on `executors` executors into a transactional Collect, checkpoints
every `interval` with `tolerable_failures` high enough to outlast the full spell: each checkpoint
taken meanwhile is declined (its partial directory removed) and the stream goes on; once the disk
is freed, checkpoints complete again. Its stream is paced (each buffer a little slower) until the
disk was freed and one more checkpoint completed, so the run cannot end before, however fast the
machine. The output must equal a failure-free run's: `duplicates` and `missing` 0, `declined` >= 1,
`cause` the sentence the declined checkpoints were logged with.
"""

from __future__ import annotations

import glob
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from slashrt.bench._held import HeldUntil

__all__ = ["trial"]

FULL_INTERVALS = 4  # checkpoint intervals the disk stays full
SIZE = "64m"  # the tmpfs
WAIT_S = 300.0  # a safety net: each wait ends on the event it waits for


def _records(events: int) -> np.ndarray:
    from slashrt import Schema

    out = np.zeros(events, Schema({"t": "i8", "k": "i8", "v": "i8"}).dtype)
    out["t"] = np.arange(events) // 10
    out["k"] = np.arange(events) % 500
    out["v"] = np.arange(events) % 7
    return out


def _flow(pace=None, transactional: bool = True):
    from slashrt import Dataflow, Schema, Tumbling, sinks

    flow = Dataflow("disk_full")
    stream = flow.source("s", Schema({"t": "i8", "k": "i8", "v": "i8"}), time="t", max_delay=0)
    if pace is not None:
        stream = stream.filter(pace, name="paced")
    stream.window(Tumbling(ms=100)).sum("v", key="k").sink(sinks.Collect(transactional=transactional), name="out")
    return flow


def _compare(got: np.ndarray, expected: np.ndarray) -> tuple[int, int]:
    """(duplicates, missing): rows committed more often than in the reference, and less often."""
    rows = np.unique(np.concatenate([got, expected]))
    counts = []
    for side in (got, expected):
        values, n = np.unique(side, return_counts=True)
        count = np.zeros(len(rows), np.int64)
        count[np.searchsorted(rows, values)] = n
        counts.append(count)
    return int(np.maximum(counts[0] - counts[1], 0).sum()), int(np.maximum(counts[1] - counts[0], 0).sum())


def trial(args) -> dict:
    """Run the disk-full fault once (see the module doc); `args`: `events`, `executors`,
    `interval` (the chaos bench's options; defaults if absent)."""
    import slashrt
    from slashrt.testing._disk import can_mount, mounted

    events = min(int(getattr(args, "events", 400_000) or 400_000), 2_000_000)
    executors = max(int(getattr(args, "executors", 2) or 2), 1)
    interval = float(getattr(args, "interval", 0.05) or 0.05)
    fields = {"fault": "disk-full", "refused": False, "exact": False, "duplicates": 0, "missing": 0, "cause": None,
              "seconds": 0.0, "executors": executors, "events": events, "interval_s": interval}
    if not can_mount():
        fields.update(refused=True, cause="the disk-full fault mounts a tmpfs as the checkpoint directory: run it as root")
        return fields
    records = _records(events)
    expected = np.sort(slashrt.run(_flow(transactional=False), {"s": records})["disk_full.out"])
    # 64 MB: the job's own checkpoints (a transactional Collect's pending output) must fit when freed
    with tempfile.TemporaryDirectory(prefix="slashrt-disk-full-") as scratch, mounted(Path(scratch) / "disk", SIZE) as disk:
        go = Path(scratch) / "go"
        manifests = str(disk.path / "disk_full" / "chk-*" / "_manifest.json")
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = slashrt.run(
                    _flow(HeldUntil(str(go), 0.005)), {"s": records}, executors=executors, slots=8, slot_size=2048,
                    checkpoint_dir=str(disk.path), checkpoint={"interval": interval, "tolerable_failures": 1_000},
                )
            except Exception as exc:  # noqa: BLE001 (reported as the trial's cause)
                outcome["error"] = exc

        started = time.perf_counter()
        job = threading.Thread(target=run, daemon=True)
        job.start()

        def until(condition) -> bool:
            deadline = time.monotonic() + WAIT_S
            while not condition():
                if not job.is_alive() or time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
            return True

        until(lambda: glob.glob(manifests))
        disk.fill()
        full_until = time.monotonic() + FULL_INTERVALS * interval
        until(lambda: (disk.fill(), time.monotonic() > full_until)[1])  # kept full: what a declined one freed too
        disk.free()
        written = set(glob.glob(manifests))
        until(lambda: set(glob.glob(manifests)) - written)
        go.touch()
        job.join(WAIT_S)
        fields["seconds"] = round(time.perf_counter() - started, 3)
    if "error" in outcome:
        fields["cause"] = str(outcome["error"])
        return fields
    result = outcome["result"]
    declined = [c for c in result.checkpoints if c["status"] == "aborted" and "No space left" in (c["reason"] or "")]
    fields["declined"] = len(declined)
    fields["completed"] = sum(c["status"] == "completed" for c in result.checkpoints)
    if declined:
        reason = declined[0]["reason"]
        fields["cause"] = reason[reason.find("checkpoint "):]
    got = np.sort(result["disk_full.out"])
    fields["duplicates"], fields["missing"] = _compare(got, expected)
    fields["exact"] = bool(np.array_equal(got, expected)) and bool(declined)
    return fields
