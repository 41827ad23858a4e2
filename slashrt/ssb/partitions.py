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

    def __attrs_post_init__(self):
        if self.partitions < 1 or self.partitions >= 2**31:
            raise ValueError(f"need at least one partition (and fewer than 2**31), got {self.partitions}")
        if self.executors < 1:
            raise ValueError(f"need at least one executor, got {self.executors}")

    def partition_of(self, keys: np.ndarray) -> np.ndarray:
        """The partition of each int64 key (vectorised)."""
        return kernels.partition_of(keys, self.partitions)

    def route(self, keys: np.ndarray, counts: np.ndarray, vals: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        """Rows (key, count, value) grouped by owner: entry o holds owner o's rows, in order."""
        offsets, keys, counts, vals = kernels.route(keys, counts, vals, self._leaders, self.executors)
        bounds = offsets.tolist()
        return [(keys[a:b], counts[a:b], vals[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def leader_of(self, partitions: np.ndarray) -> np.ndarray:
        return self._leaders[partitions]

    @property
    def _leaders(self) -> np.ndarray:
        return np.arange(self.partitions, dtype=np.int64) % self.executors

    def owner_of(self, keys: np.ndarray) -> np.ndarray:
        """The executor leading each key's partition."""
        if self.executors == 1:
            return np.zeros(len(keys), np.int64)
        return self.leader_of(self.partition_of(keys))

    def led_by(self, executor: int) -> np.ndarray:
        """The partitions `executor` leads."""
        return np.arange(executor, self.partitions, self.executors, dtype=np.int64)
