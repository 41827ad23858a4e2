"""A pass-through filter that holds a fault trial's stream back until its fault was made.

Every `bench chaos --faults` trial must meet a running job: however fast the machine, the job
must not end before the trial killed its broker, filled its disk or cut its network. Each
executor process sees the same file, so a file is the signal."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

__all__ = ["HeldUntil"]


class HeldUntil:
    """Takes `seconds` more per batch (per record with `per_record`: whatever the batching)
    until the file `until` exists, then none. With `tally` (a directory), each executor process
    first notes there that it runs (a file `running-<pid>`)."""

    def __init__(self, until: str, seconds: float, *, per_record: bool = False, tally: str | None = None):
        self.until, self.seconds, self.per_record, self.tally = until, seconds, per_record, tally
        self.released = self.noted = False

    def __call__(self, batch):
        if self.tally is not None and not self.noted:
            Path(self.tally, f"running-{os.getpid()}").touch()
            self.noted = True
        if not self.released:
            self.released = os.path.exists(self.until)
            if not self.released:
                time.sleep(self.seconds * (len(batch) if self.per_record else 1))
        return np.ones(len(batch), bool)
