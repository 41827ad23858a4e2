"""Committed records of in-memory sinks (`Collect`, `Callback`) in a checkpointed cluster run:
an executor's commits must outlive it, so they live with the coordinator.

    agent i                                               coordinator
      "commit" n: the sink publishes pending <= n,
      hands each checkpoint c's batches to the Outbox
      before its next message (an ack, a decline,
      "drained"), or at once: "committed"  ───────────>   Committed: kept by (sink, i, c); a key
                                                          already kept is a re-send, dropped

A kill at any moment is covered by two facts. Records are committed only for a complete
checkpoint c (pending output of c is in c's snapshot, since the sink pre-commits before the
state copy). And the control link is FIFO, with committed records sent before any later ack:
if the coordinator completed checkpoint r, it has every record each executor committed before
its snapshot r; the rest of what is committed up to r is pending in snapshot r, which the
next attempt restores and commits again (`commit.recover`), sending it once more. So after a
recovery from r the coordinator holds, per executor, exactly the records of checkpoints <= r,
each once; an attempt resuming from an older checkpoint than what was kept (the newest did
not verify) drops what is newer (`restored`), which the rewound sources produce again.

The result (`parts`): per executor, its checkpoints in order, each checkpoint's batches in
the order its sink received them; executors in index order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Committed", "Outbox", "COMMITTED"]

COMMITTED = "committed"  # the control message: [(sink step id, checkpoint, records), ...]


class Outbox:
    """An agent's committed records not yet sent: filled by its in-memory sinks' commits
    (`Collect.hand_commits_to`), emptied into one "committed" message by `take`."""

    def __init__(self, plan):
        self._items: list[tuple[str, int, np.ndarray]] = []
        for node in plan.sinks:
            if node._pending_records() is not None:  # a transactional Collect (also a Callback's)
                node.sink.hand_commits_to(lambda n, batches, step=node.step_id: self._put(step, n, batches))

    def _put(self, step_id: str, checkpoint: int, batches: list[np.ndarray]) -> None:
        if batches:
            self._items.append((step_id, checkpoint, batches[0] if len(batches) == 1 else np.concatenate(batches)))

    def __len__(self) -> int:
        return len(self._items)

    def take(self) -> list[tuple[str, int, np.ndarray]]:
        items, self._items = self._items, []
        return items


class Committed:
    """The coordinator's committed records of a run, across its attempts."""

    def __init__(self):
        self._kept: dict[tuple[str, int, int], np.ndarray] = {}  # (sink step, executor, checkpoint) -> records
        self.resent = 0  # records received again after a recovery (and dropped)

    async def receive(self, executor: int, items) -> None:
        """The "committed" message of `executor`."""
        for step_id, checkpoint, records in items:
            key = (step_id, executor, checkpoint)
            if key in self._kept:
                self.resent += len(records)
            else:
                self._kept[key] = records

    def restored(self, checkpoint: int | None, executors=None) -> None:
        """An attempt resumes from `checkpoint` (None: from the start): what is newer goes (of
        `executors` only, where they restart alone)."""
        for key in [k for k in self._kept if (checkpoint is None or k[2] > checkpoint)
                    and (executors is None or k[1] in executors)]:
            del self._kept[key]

    def parts(self, step_id: str, executors: int) -> list[np.ndarray | None]:
        """Per executor, its committed records of sink `step_id` in checkpoint order (None: none)."""
        out = []
        for executor in range(executors):
            mine = [self._kept[k] for k in sorted(k for k in self._kept if k[:2] == (step_id, executor))]
            out.append(np.concatenate(mine) if len(mine) > 1 else (mine[0] if mine else None))
        return out
