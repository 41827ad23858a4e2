"""Progress tracking: when can a window fire? (Slash's property P1.)

`Frontier` is the small interface the runtime asks; `VectorClock` is Slash's implementation
(the vector of every executor's low watermark, carried with epoch deltas). A Naiad-style
pointstamp tracker can implement the same interface later.
"""

from slashrt.progress.frontier import Frontier, VectorClock

__all__ = ["Frontier", "VectorClock"]
