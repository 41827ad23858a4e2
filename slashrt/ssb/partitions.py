"""SSB partitions: the key space of a stateful operator cut into P shards, each led by one executor.

A key's partition is a 64-bit multiplicative hash of the key (its high 32 bits scaled to
[0, P) by a multiply and a shift: no division on the hot path), so neighbouring keys spread
over all partitions; partition p is led by executor ``p % N``. Every executor may hold a fragment
of any partition (whatever keys its own streams carried); only the leader merges them and
fires their windows. The same map routes records in the UpPar baseline, so both modes split
the work identically.
"""

from __future__ import annotations

import attrs
import numpy as np

from slashrt import _kernels as kernels

__all__ = ["Partitioning", "DEFAULT_PARTITIONS"]

DEFAULT_PARTITIONS = 256


@attrs.frozen
class Partitioning:
    partitions: int
    executors: int
    _leaders: np.ndarray = attrs.field(init=False, eq=False, repr=False)  # partition -> its leader

    def __attrs_post_init__(self):
        if self.partitions < 1 or self.partitions >= 2**31:
            raise ValueError(f"need at least one partition (and fewer than 2**31), got {self.partitions}")
        if self.executors < 1:
            raise ValueError(f"need at least one executor, got {self.executors}")
        object.__setattr__(self, "_leaders", np.arange(self.partitions, dtype=np.int64) % self.executors)

    def partition_of(self, keys: np.ndarray) -> np.ndarray:
        """The partition of each int64 key (vectorised)."""
        return kernels.partition_of(keys, self.partitions)

    def route(self, keys: np.ndarray, counts: np.ndarray, vals: np.ndarray, out) -> list[slice]:
        """Rows (key, count, value) grouped by owner, in order, written into `out`: three
        columns as long as `keys` (usually the fields of the structured rows about to be
        shipped, so that routing fills them in place). Entry o is the slice of owner o's rows."""
        bounds = kernels.route(keys, counts, vals, self._leaders, self.executors, out)[0].tolist()
        return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def leader_of(self, partitions: np.ndarray) -> np.ndarray:
        return self._leaders[partitions]

    def owner_of(self, keys: np.ndarray) -> np.ndarray:
        """The executor leading each key's partition."""
        if self.executors == 1:
            return np.zeros(len(keys), np.int64)
        return self.leader_of(self.partition_of(keys))

    def led_by(self, executor: int) -> np.ndarray:
        """The partitions `executor` leads."""
        return np.arange(executor, self.partitions, self.executors, dtype=np.int64)
