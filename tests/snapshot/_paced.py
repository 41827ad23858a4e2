"""A pass-through filter that slows a cluster's stream down, so that a stop asked early reaches
the sources in the middle of the stream however loaded the machine is (tests/snapshot/
test_cluster_stop.py, test_graph_cluster_stop.py)."""

import os
import time
from pathlib import Path

import numpy as np


class Paced:
    """A pass-through filter that slows each executor's stream down after its first `after`
    records (each of the next `batches` batches takes `seconds` more), so that a stop asked
    early reaches the sources in the middle of the stream however loaded the machine is. With
    `tally` (a directory), each executor process keeps there how many records it has seen."""

    def __init__(self, after: int = 0, seconds: float = 0.0, batches: int = 10**9, tally=None):
        self.after, self.seconds, self.batches, self.seen, self.tally = after, seconds, batches, 0, tally

    def __call__(self, batch):
        self.seen += len(batch)
        if self.tally is not None:
            (Path(self.tally) / f"seen-{os.getpid()}").write_text(str(self.seen))
        if self.seconds and self.seen > self.after and self.batches > 0:
            self.batches -= 1
            time.sleep(self.seconds)
        return np.ones(len(batch), bool)
