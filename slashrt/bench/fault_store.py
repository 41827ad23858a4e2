"""Store faults for `slashrt bench chaos --faults`: the newest checkpoint damaged after a run
published its output through a transactional CSV directory.

Each trial runs a real job (a tumbling-window sum per key, on `args.executors` executors, 1 to
run it in this process) three ways: failure-free into its own directory (the reference); with
checkpoints every `args.interval` seconds, each batch slowed a little so that it is stopped with
a savepoint in the middle of the stream, once 3 checkpoints completed; then the newest
checkpoint is damaged (`corrupt_newest`: one byte of one of its state parts flipped;
`lose_newest`: its directory removed) and the job resumed from "latest" into the same
directory. The sink had published the damaged checkpoint's rows, so an exact resume is not
possible (`slashrt.snapshot.published`): the resume must be refused with one sentence (`cause`)
and leave the published rows as they were. Counted against the reference: `duplicates` (rows
published more often), and `missing` (refused: rows published before the damage and gone
after; resumed: rows published less often than in the reference).
"""

from __future__ import annotations

import glob
import shutil
import tempfile
import time

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, StopHandle, Tumbling
from slashrt.bench.chaos import published
from slashrt.errors import SlashError
from slashrt.ops.sinks import CsvFile
from slashrt.snapshot import storage

__all__ = ["corrupt_newest", "lose_newest", "trial"]

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
RINGS = {"slots": 8, "slot_size": 1024}


class Slowed:
    """A pass-through filter taking `seconds` per batch: the stop lands mid-stream."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return np.ones(len(batch), bool)


def _records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 10_000 // n - rng.integers(0, 40, n)
    out["k"] = rng.integers(0, 3000, n)
    out["v"] = rng.integers(-1000, 1000, n)
    return out


def _run(directory: str, name: str, records, executors: int, transport: str, seconds: float = 0.0, **options):
    flow = Dataflow("faults")
    source = flow.source("r", SCHEMA, time="t", max_delay=20)
    if seconds:
        source = source.filter(Slowed(seconds), name="slowed")
    source.window(Tumbling(ms=100)).sum("v", key="k", output="total").sink(
        CsvFile(f"{directory}/{name}", transactional=True), name="out")
    more = {"executors": executors, "transport": transport} if executors > 1 else {}
    return slashrt.run(flow, {"r": records}, **RINGS, **more, **options)


def _stopped_after(stop: StopHandle, k: int):
    """`SnapshotStore.acomplete` asking `stop` after the k-th manifest (the coordinator, in this process)."""
    original, written = storage.SnapshotStore.acomplete, [0]

    async def acomplete(self, *args, **kwargs):
        result = await original(self, *args, **kwargs)
        written[0] += 1
        if written[0] == k:
            stop.request()
        return result

    return original, acomplete


def trial(args, fault: str) -> dict:
    """One store fault's trial (see the module doc): "corrupt-newest" or "lose-newest"."""
    executors = int(getattr(args, "executors", 1) or 1)
    transport = getattr(args, "transport", "shm") or "shm"
    events = int(getattr(args, "fault_events", None) or 100_000)
    interval = float(getattr(args, "interval", None) or 0.2)
    records = _records(events, int(getattr(args, "seed", 0) or 0))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="slashrt-faults-") as directory:
        _run(directory, "ref", records, executors, transport, checkpoint_dir=f"{directory}/ref-chk")
        reference = published(f"{directory}/ref")
        stop = StopHandle()
        original, stopping = _stopped_after(stop, 3)
        storage.SnapshotStore.acomplete = stopping
        try:
            first = _run(directory, "out", records, executors, transport, seconds=0.01, checkpoint_dir=f"{directory}/chk",
                         checkpoint={"interval": interval, "keep": 3}, stop=stop)
        finally:
            storage.SnapshotStore.acomplete = original
        store = storage.SnapshotStore(f"{directory}/chk", job="faults", readonly=True)
        newest = store.checkpoints()[-1]
        damaged = store.checkpoint_dir(newest)
        if fault == "corrupt-newest":
            part = sorted(glob.glob(f"{damaged}/*.state"))[0]
            with open(part, "r+b") as f:
                f.seek(f.seek(0, 2) // 2)
                byte = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([byte[0] ^ 1]))
        else:
            shutil.rmtree(damaged)
        before = published(f"{directory}/out")
        refused, cause = False, None
        try:
            _run(directory, "out", records, executors, transport, checkpoint_dir=f"{directory}/chk",
                 checkpoint={"interval": interval, "keep": 3}, resume_from="latest")
        except SlashError as exc:
            refused, cause = True, str(exc)
        got = published(f"{directory}/out")
    duplicates = sum(((got - reference) & got).values())
    missing = sum((before - got).values()) if refused else sum((reference - got).values())
    return {
        "fault": fault, "refused": refused, "exact": not refused and got == reference, "duplicates": duplicates,
        "missing": missing, "cause": cause, "seconds": round(time.perf_counter() - started, 3),
        "executors": executors, "events": events, "interval_s": interval, "damaged": newest,
        "savepoint": first.savepoint, "published_rows": sum(before.values()), "rows": sum(reference.values()),
    }


def corrupt_newest(args) -> dict:
    return trial(args, "corrupt-newest")


def lose_newest(args) -> dict:
    return trial(args, "lose-newest")


