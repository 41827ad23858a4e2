"""A pass-through filter that slows a cluster's stream down, so that a stop asked early reaches
the sources in the middle of the stream however loaded the machine is (tests/snapshot/
test_cluster_stop.py, test_graph_cluster_stop.py), or so that the job cannot end before what its
test asserts on has happened however fast the machine is: the kills planned at chosen points
fired (test_recovery_collect.py, test_recovery.py, ...), or checkpoints completed in the middle of
the stream (test_cluster_sync.py, ...)."""

import functools
import glob
import os
import time
from pathlib import Path

import numpy as np


class Paced:
    """A pass-through filter that slows each executor's stream down after its first `after`
    records (each of the next `batches` batches takes `seconds` more), so that a stop asked
    early reaches the sources in the middle of the stream however loaded the machine is. With
    `tally` (a directory), each executor process keeps there how many records it has seen. With
    `until=(where, n)` it slows only while fewer than n paths are in `where`: a directory (its
    entries: e.g. the chaos kills' markers, so a job with kills still to fire cannot end however
    fast the machine is) or a glob pattern (e.g. `.../chk-*/_manifest.json`: the job cannot end
    before n checkpoints completed, whatever their fsyncs cost); once there, it stays at full
    speed (retention may remove checkpoints later). With `fresh`, only the paths that came after
    it began to slow count (n checkpoints taken after each executor's first `after` records).
    `until` may also be a callable without arguments: it slows while that returns False."""

    def __init__(self, after: int = 0, seconds: float = 0.0, batches: int = 10**9, tally=None, until=None,
                 fresh: bool = False):
        self.after, self.seconds, self.batches, self.seen, self.tally = after, seconds, batches, 0, tally
        self.until, self.fresh, self.arrived, self.base = until, fresh, False, None

    def _arrived(self) -> bool:
        if not self.arrived and callable(self.until):
            self.arrived = bool(self.until())
        elif not self.arrived:
            where, n = self.until
            found = len(glob.glob(str(where)) if glob.has_magic(str(where)) else os.listdir(where))
            if self.fresh:
                self.base = found if self.base is None else self.base
                found -= self.base
            self.arrived = found >= n
        return self.arrived

    def __call__(self, batch):
        self.seen += len(batch)
        if self.tally is not None:
            (Path(self.tally) / f"seen-{os.getpid()}").write_text(str(self.seen))
        self.hold()
        return np.ones(len(batch), bool)

    def hold(self) -> None:
        """Take `seconds` if the batch seen last is to be slowed. Also the pace of a step that is
        no filter (`tests.snapshot._children.pace_at`: each call of a method, e.g. a loop's
        delivery of a fed-back batch)."""
        if not self.seconds or self.seen < self.after or self.batches <= 0:
            return
        if self.until is not None and self._arrived():
            return
        self.batches -= 1
        time.sleep(self.seconds)


def behind(stream, pace):
    """`stream` itself, or with `pace` (a `Paced`) the pass-through filter "paced" behind it."""
    return stream if pace is None else stream.filter(pace, name="paced")


def until_fired(marks, kills: str) -> Paced:
    """Each batch 4 ms slower until every kill of `kills` (a `SLASHRT_CHAOS_KILLS` spec) fired,
    its marker in `marks` (`SLASHRT_CHAOS_DIR`): the job cannot end before its planned kills."""
    return Paced(seconds=0.004, until=(marks, len(kills.split(";"))))


def paced_chunks(make, pace: Paced, records: int, last_after=None):
    """A `PerExecutor` maker whose executor input is `make`'s in chunks of `records`, each after
    the first taking the time `pace` says: the pace of a flow whose steps the test cannot add a
    filter to (an example's). With `last_after=(directory, n)` the last chunk waits until the
    directory holds n entries (e.g. the chaos kills' markers): the job cannot end before them,
    however slowly its checkpoints come (the chunks are made in the feed's worker thread, so
    barriers flow meanwhile)."""
    return functools.partial(_chunks, make, pace, records, last_after)


def _chunks(make, pace: Paced, records: int, last_after, index: int, executors: int):
    whole = make(index, executors)
    for start in range(0, len(whole), records):
        if last_after is not None and start + records >= len(whole):
            _wait_for_entries(*last_after)
        yield whole[start:start + records].copy()
        pace.seen += min(records, len(whole) - start)
        pace.hold()


def _wait_for_entries(directory, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{directory} did not get {n} entries in {timeout} s")
        time.sleep(0.005)
