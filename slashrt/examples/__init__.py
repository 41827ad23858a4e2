"""Examples: graph algorithms written as loops of user operators, to read as well as run.

- `slashrt.examples.cc`: connected components of a graph whose edges arrive in epochs
- `slashrt.examples.pagerank`: PageRank for k iterations

Both read edges as `EDGES` records: int64 `src`, `dst` and `epoch` (the event time).
"""

import numpy as np

__all__ = ["EDGES"]

EDGES = np.dtype([("src", "<i8"), ("dst", "<i8"), ("epoch", "<i8")])
