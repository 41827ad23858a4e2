"""A pass-through filter that slows a cluster's stream down, so that a stop asked early reaches
the sources in the middle of the stream however loaded the machine is (tests/snapshot/
test_cluster_stop.py, test_graph_cluster_stop.py), or so that the job cannot end before the
kills planned at chosen points have fired (test_recovery_collect.py)."""

import os
import time
from pathlib import Path

import numpy as np


class Paced:
    """A pass-through filter that slows each executor's stream down after its first `after`
    records (each of the next `batches` batches takes `seconds` more), so that a stop asked
    early reaches the sources in the middle of the stream however loaded the machine is. With
    `tally` (a directory), each executor process keeps there how many records it has seen. With
    `until=(directory, n)` it slows only while fewer than n files are in `directory` (the chaos
    kills' markers: a job with kills still to fire cannot end however fast the machine is)."""

    def __init__(self, after: int = 0, seconds: float = 0.0, batches: int = 10**9, tally=None, until=None):
        self.after, self.seconds, self.batches, self.seen, self.tally = after, seconds, batches, 0, tally
        self.until = until

    def __call__(self, batch):
        self.seen += len(batch)
        if self.tally is not None:
            (Path(self.tally) / f"seen-{os.getpid()}").write_text(str(self.seen))
        if self.until is not None and len(os.listdir(self.until[0])) >= self.until[1]:
            return np.ones(len(batch), bool)
        if self.seconds and self.seen > self.after and self.batches > 0:
            self.batches -= 1
            time.sleep(self.seconds)
        return np.ones(len(batch), bool)
