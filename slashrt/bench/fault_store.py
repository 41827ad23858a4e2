"""Store faults for `slashrt bench chaos --faults`: the newest checkpoint damaged after a run
published its output through a transactional CSV directory.

Each trial runs a real job (a tumbling-window sum per key, on `args.executors` executors, 1 to
run it in this process) three ways: failure-free into its own directory (the reference); with
checkpoints every `args.interval` seconds, each batch slowed a little so that it takes several,
to its end, whose final checkpoint publishes the windows the end fired (so the newest checkpoint
always published rows); then the newest checkpoint is damaged (`corrupt_newest`: one byte of one of its state parts flipped;
`lose_newest`: its directory removed) and the job resumed from "latest" into the same
directory. The sink had published the damaged checkpoint's rows, so an exact resume is not
possible (`slashrt.snapshot.published`): the resume must be refused with one sentence (`cause`)
and leave the published rows as they were. Counted against the reference: `duplicates` (rows
published more often), and `missing` (refused: rows published before the damage and gone
after; resumed: rows published less often than in the reference); `rewritten` lists the
published part files whose bytes changed (a lost checkpoint's number reused: the rows may even
come out right, but a reader saw the file change under it), which makes a resume not exact.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.bench.chaos import published
from slashrt.errors import SlashError
from slashrt.ops.sinks import CsvFile
from slashrt.snapshot import storage

__all__ = ["corrupt_newest", "lose_newest", "trial"]

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
RINGS = {"slots": 8, "slot_size": 1024}


class Slowed:
    """A pass-through filter taking `seconds` per batch: a run long enough for several checkpoints."""

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


def _parts(directory: str) -> dict:
    """The published part files' inode and bytes, by name: a published file must never change,
    nor be replaced (even by the same bytes: a reader may hold the old one)."""
    return {path.rsplit("/", 1)[1]: (os.stat(path).st_ino, open(path, "rb").read())
            for path in glob.glob(f"{directory}/part-*") if not path.endswith(".inprogress")}


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
        # to its end, slowed to take several checkpoints; its final one publishes the last windows
        first = _run(directory, "out", records, executors, transport, seconds=0.01, checkpoint_dir=f"{directory}/chk",
                     checkpoint={"interval": interval, "keep": 3})
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
        parts = _parts(f"{directory}/out")
        refused, cause = False, None
        try:
            _run(directory, "out", records, executors, transport, checkpoint_dir=f"{directory}/chk",
                 checkpoint={"interval": interval, "keep": 3}, resume_from="latest")
        except SlashError as exc:
            refused, cause = True, str(exc)
        got = published(f"{directory}/out")
        after = _parts(f"{directory}/out")
        rewritten = sorted(name for name, data in parts.items() if after.get(name) != data)
    duplicates = sum(((got - reference) & got).values())
    missing = sum((before - got).values()) if refused else sum((reference - got).values())
    return {
        "fault": fault, "refused": refused, "exact": not refused and got == reference and not rewritten,
        "rewritten": rewritten, "duplicates": duplicates,
        "missing": missing, "cause": cause, "seconds": round(time.perf_counter() - started, 3),
        "executors": executors, "events": events, "interval_s": interval, "damaged": newest,
        "checkpoints": sum(c["status"] == "completed" for c in first.checkpoints), "published_rows": sum(before.values()), "rows": sum(reference.values()),
        # the newest checkpoint whose rows the sink published: below `damaged`, the damage costs nothing
        "published_checkpoint": max((int(name.split("-")[1]) for name in parts), default=None),
    }


def corrupt_newest(args) -> dict:
    return trial(args, "corrupt-newest")


def lose_newest(args) -> dict:
    return trial(args, "lose-newest")


