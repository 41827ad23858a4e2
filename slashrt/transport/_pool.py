"""A receiver's slots shared by its channels: exclusive credits per channel and a floating pool.

Flink's credit-based network stack gives each input channel a few exclusive buffers and lets the
channels of one input gate draw more from a floating pool when their sender has a backlog, so
that memory per task stays bounded however many channels it has, and a busy channel still gets
enough buffers to keep its link full. `SlotPool` is that, for the channels one executor receives
of one exchange (one per peer): `exclusive` slots that each channel always holds, and `floating`
slots lent to whichever channel is backlogged, at most `max_lent` to one.

A pooled channel's slots are not a ring: its receiver *grants* each credit as a slot, in order,
and buffer `seq` goes to the slot of the seq-th grant (`Grants`, a table of the last `window`
grants that both ends see, and the grant counter, which is the sender's limit: it may post the
buffers below it). When the receiver releases buffers, their slots are granted again:

- an exclusive slot, always to its channel (so every channel can always post `exclusive`
  buffers, and no channel can starve another: the floating slots only add to that);
- a floating slot, to its channel again while the channel is backlogged, else back to the pool;
- and a backlogged channel takes free floating slots from the pool, up to `max_lent` held.

A channel is backlogged when its sender has used every credit granted (the buffer of the last
grant has landed when the receiver releases): then more slots would have carried more buffers.
The slots of one release are granted in ascending order, and the pool lends its lowest free
slots, so a channel's grants come in runs of consecutive slots (its own, then what it borrowed)
and native runs of posts, polls and releases stay long. A floating slot comes back to the
pool only from a released buffer, so it is never lent while a sender may still write it; the
slots a finished channel still held (granted, never posted: its END_OF_STREAM was its last)
return when its receiver closes.
"""

from __future__ import annotations

import bisect

import numpy as np

__all__ = ["SlotPool", "GrantTable", "Grants", "MediumPool", "SlotViews"]


class SlotPool:
    """The slots of `channels` channels (see the module doc): slot i lives at
    ``memory[i * slot_size : (i + 1) * slot_size]``; channel c's exclusive slots are
    c * exclusive .. (c + 1) * exclusive - 1, the floating ones follow."""

    def __init__(self, *, channels: int, exclusive: int, floating: int, slot_size: int, max_lent: int | None = None,
                 memory: np.ndarray | None = None, tables: np.ndarray | None = None):
        if channels < 1 or exclusive < 1 or floating < 0:
            raise ValueError(f"a slot pool needs channels >= 1, exclusive >= 1 and floating >= 0, got {channels}, "
                             f"{exclusive} and {floating}")
        self.channels, self.exclusive, self.floating, self.slot_size = channels, exclusive, floating, slot_size
        self.slots = channels * exclusive + floating
        self.max_lent = floating if max_lent is None else min(max_lent, floating)
        self.window = exclusive + self.max_lent  # the most slots one channel holds: its grant table's length
        if memory is None:
            memory = np.zeros(self.slots * slot_size, np.uint8)
        if memory.nbytes < self.slots * slot_size:
            raise ValueError(f"a pool of {self.slots} slots of {slot_size} bytes needs {self.slots * slot_size} bytes")
        self.memory = memory
        # channel c's grant table: tables[c] (u32 x window; where its sender reads it, e.g. shared memory)
        self.tables = np.zeros((channels, self.window), np.uint32) if tables is None else tables
        self._free = list(range(channels * exclusive, self.slots))  # sorted: loans of neighbours make runs
        self._joined = 0
        self.peak = 0  # the most floating slots lent at once

    @property
    def nbytes(self) -> int:
        return self.slots * self.slot_size

    @property
    def free(self) -> int:
        """Floating slots not lent."""
        return len(self._free)

    def join(self) -> int:
        """A new channel's index (its exclusive slots)."""
        if self._joined >= self.channels:
            raise ValueError(f"the slot pool has room for {self.channels} channels, all joined")
        self._joined += 1
        return self._joined - 1

    def close(self) -> None:
        """(Its memory is this process's: nothing to release.)"""

    def is_floating(self, slot: int) -> bool:
        return slot >= self.channels * self.exclusive

    def lend(self, k: int) -> list[int]:
        """Up to k free floating slots, lent."""
        k = min(k, len(self._free))
        lent, self._free = self._free[:k], self._free[k:]
        self.peak = max(self.peak, self.floating - len(self._free))
        return lent

    def give_back(self, slots) -> None:
        for slot in slots:
            bisect.insort(self._free, slot)


class SlotViews:
    """Slot i of `memory` as a uint8 view, made when asked: a pool's channel ends do not slice
    the pool's thousands of slots up front (at 32 executors that was a million views)."""

    __slots__ = ("memory", "size")

    def __init__(self, memory: np.ndarray, size: int):
        self.memory, self.size = memory, size

    def __getitem__(self, index: int) -> np.ndarray:
        return self.memory[index * self.size : (index + 1) * self.size]

    def __len__(self) -> int:
        return len(self.memory) // self.size


class MediumPool:
    """A medium's slot pool: its `slots` (a `SlotPool`) in memory the medium shares (shm) or
    registers (verbs)."""

    slots: SlotPool

    @property
    def nbytes(self) -> int:
        """The pool's slots' bytes."""
        return self.slots.nbytes

    @property
    def peak(self) -> int:
        """The most floating slots lent at once."""
        return self.slots.peak


class GrantTable:
    """The slots granted to a pooled channel's last `window` buffers, as either end sees them:
    `table[seq % window]` is buffer seq's slot (u32; in shared memory where the sender reads it)."""

    def __init__(self, table: np.ndarray):
        self.table = table
        self.window = len(table)

    def slot_of(self, seq: int) -> int:
        return int(self.table[seq % self.window])

    def consecutive(self, seq: int, n: int) -> int:
        """How many of the slots of buffers seq .. seq + n - 1 (all granted) are consecutive."""
        if n <= 1:
            return max(n, 0)
        at = seq % self.window
        slots = self.table[at : at + n] if at + n <= self.window else self.table[(seq + np.arange(n)) % self.window]
        steps = np.flatnonzero(np.diff(slots.astype(np.int64)) != 1)
        return int(steps[0]) + 1 if len(steps) else n


class Grants(GrantTable):
    """A pooled channel's grants at its receiver (the module doc): `table[seq % window]` is
    buffer seq's slot for every seq below `granted`, and nothing else writes them. `table` and
    the published counter may live where the sender reads them (shared memory); the backend
    publishes `granted` after the table (`_return_credits`)."""

    def __init__(self, pool: SlotPool):
        channel = pool.join()
        super().__init__(pool.tables[channel])
        self.pool = pool
        self.channel = channel
        base = self.channel * pool.exclusive
        self.table[: pool.exclusive] = np.arange(base, base + pool.exclusive, dtype=np.uint32)
        self.granted = pool.exclusive
        self.lent = 0  # floating slots this channel holds (granted, whether posted or not)
        self.closed = False

    def regrant(self, first: int, n: int, backlogged: bool) -> None:
        """Buffers first .. first + n - 1 were released: grant their slots (and, backlogged,
        floating ones from the pool) anew, in order."""
        if self.closed:
            return
        released = self.table[(first + np.arange(n)) % self.window]  # (a copy: granting overwrites entries)
        pool = self.pool
        floating = released >= pool.channels * pool.exclusive
        if not backlogged and floating.any():
            pool.give_back(released[floating].tolist())
            self.lent -= int(floating.sum())
            released = released[~floating]
        if backlogged and self.lent < pool.max_lent:
            extra = pool.lend(pool.max_lent - self.lent)
            self.lent += len(extra)
            if extra:
                released = np.concatenate([released, np.array(extra, np.uint32)])
        k = len(released)
        if k:
            released = np.sort(released)  # a channel's slots in runs (its own ones, then the borrowed)
            at = (self.granted + np.arange(k)) % self.window
            self.table[at] = released
            self.granted += k

    def close(self, released: int) -> None:
        """The channel ended (its END_OF_STREAM polled, so its sender posts nothing more): the
        floating slots it was still granted, buffers `released` .. granted - 1, go back."""
        if self.closed:
            return
        self.closed = True
        held = self.table[(released + np.arange(self.granted - released)) % self.window]
        floating = held[held >= self.pool.channels * self.pool.exclusive]
        self.pool.give_back(floating.tolist())
        self.lent -= len(floating)
