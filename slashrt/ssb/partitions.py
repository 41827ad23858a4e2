"""SSB partitions: the key space of a stateful operator cut into P shards, each led by one executor.

A key's partition is a 64-bit multiplicative hash of the key, so neighbouring keys spread over
all partitions; partition p is led by executor ``p % N``. Every executor may hold a fragment
of any partition (whatever keys its own streams carried); only the leader merges them and
fires their windows. The same map routes records in the UpPar baseline, so both modes split
the work identically.
"""

from __future__ import annotations

import attrs
import numpy as np

__all__ = ["Partitioning", "DEFAULT_PARTITIONS"]

DEFAULT_PARTITIONS = 256
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / phi: Fibonacci hashing


@attrs.frozen
class Partitioning:
    partitions: int
    executors: int

    def __attrs_post_init__(self):
        if self.partitions < 1:
            raise ValueError(f"need at least one partition, got {self.partitions}")
        if self.executors < 1:
            raise ValueError(f"need at least one executor, got {self.executors}")

    def partition_of(self, keys: np.ndarray) -> np.ndarray:
        """The partition of each int64 key (vectorised)."""
        mixed = np.asarray(keys).astype(np.uint64, copy=False) * _GOLDEN
        return ((mixed >> np.uint64(32)) % np.uint64(self.partitions)).astype(np.int64)

    def leader_of(self, partitions: np.ndarray) -> np.ndarray:
        return partitions % self.executors

    def owner_of(self, keys: np.ndarray) -> np.ndarray:
        """The executor leading each key's partition."""
        return self.leader_of(self.partition_of(keys))

    def led_by(self, executor: int) -> np.ndarray:
        """The partitions `executor` leads."""
        return np.arange(executor, self.partitions, self.executors, dtype=np.int64)
