"""The numpy kernels of connected components: min-label hooking plus pointer jumping.

`Components` holds the labels of a growing undirected graph: ``label[v]`` is the least node id
of v's component (canonical, so labels compare across algorithms after relabelling). Node ids
are non-negative int64s; the arrays grow as larger ids appear, and ids never seen are
isolated nodes labelled by themselves.

Edges are added an epoch at a time (`ComponentsEpoch`), in rounds:

    propose()   among the edges whose endpoints still have different labels (both labels are
                roots), hook each larger root onto the least root it is joined to and follow
                those hooks by pointer jumping (p = best[p], doubling): the changed labels of
                this round, (roots, new roots), without touching the state
    apply()     write the changed labels into the state, move the edges onto the new roots
                and drop the edges inside one component

until propose() has nothing left (O(log n) rounds in practice); `finish()` then refreshes the
non-root labels once and returns every label the epoch changed. A round touches only the
epoch's edges and the roots they hook; finishing is one vectorised gather over the labels.
Every pointer goes from a larger id to a smaller one, so there are no cycles and each root is
the least id of its tree.
"""

from __future__ import annotations

import numpy as np

from slashrt.errors import SchemaError

__all__ = ["Components", "ComponentsEpoch", "canonical"]

_NONE = np.iinfo(np.int64).max  # "not hooked this round" in the scratch array


class Components:
    """Labels of the connected components of an undirected graph that grows by epochs."""

    def __init__(self, nodes: int = 0):
        self.label = np.arange(nodes, dtype=np.int64)
        self._best = np.full(nodes, _NONE, dtype=np.int64)  # scratch of propose(), reset after use
        self._mark = np.zeros(nodes, dtype=bool)  # scratch of the de-duplication of large hook sets

    @classmethod
    def from_labels(cls, label: np.ndarray) -> Components:
        """The state whose labels are `label` (a restored checkpoint's, say)."""
        state = cls(0)
        state.grow(len(label))
        state.label = np.array(label, dtype=np.int64)
        return state

    def __len__(self) -> int:
        return len(self.label)

    def grow(self, nodes: int) -> None:
        """Make room for node ids below `nodes` (new ones are isolated: their own labels)."""
        have = len(self.label)
        if nodes <= have:
            return
        size = max(nodes, have + have // 2)  # amortised growth: ids appear a few at a time
        self.label = np.concatenate([self.label, np.arange(have, size, dtype=np.int64)])
        self._best = np.concatenate([self._best, np.full(size - have, _NONE, dtype=np.int64)])
        self._mark = np.concatenate([self._mark, np.zeros(size - have, dtype=bool)])

    def labels(self, nodes: int | None = None) -> np.ndarray:
        """A copy of the labels of nodes 0..nodes-1 (default: every node with room)."""
        nodes = len(self.label) if nodes is None else nodes
        self.grow(nodes)
        return self.label[:nodes].copy()

    def add_edges(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        """Add one epoch of edges, every round at once; returns the labels it changed
        (nodes, labels)."""
        epoch = ComponentsEpoch(self, src, dst)
        while (changes := epoch.propose()) is not None:
            epoch.apply(*changes)
        return epoch.finish()


def _node_ids(values, what: str) -> np.ndarray:
    ids = np.asarray(values)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise SchemaError(f"connected components: {what} must be a 1-d array of integer node ids, got {ids.dtype} "
                          f"of shape {ids.shape}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and ids.min() < 0:
        raise SchemaError(f"connected components: {what} holds negative node id {int(ids.min())}; node ids are >= 0")
    return ids


class ComponentsEpoch:
    """The rounds of one epoch of new edges on a `Components` state."""

    def __init__(self, state: Components, src, dst):
        src, dst = _node_ids(src, "src"), _node_ids(dst, "dst")
        if len(src) != len(dst):
            raise SchemaError(f"connected components: {len(src)} sources but {len(dst)} destinations")
        if len(src):
            state.grow(int(max(src.max(), dst.max())) + 1)
        self.state = state
        # both endpoints as roots (the state is compressed between epochs)
        self.a, self.b = state.label[src], state.label[dst]
        self.hooked: list[np.ndarray] = []  # the roots hooked so far this epoch
        self.rounds = 0

    @classmethod
    def resume(cls, state: Components, a: np.ndarray, b: np.ndarray, hooked: np.ndarray | None, rounds: int):
        """An epoch between two rounds, as `snapshot` gave it (`hooked`: None if nothing was yet)."""
        epoch = cls.__new__(cls)
        epoch.state, epoch.a, epoch.b, epoch.rounds = state, np.array(a, np.int64), np.array(b, np.int64), rounds
        epoch.hooked = [] if hooked is None else [np.array(hooked, np.int64)]
        return epoch

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """What `resume` needs: the edges' roots, the roots hooked so far (or None), rounds."""
        hooked = None
        if self.hooked:
            hooked = np.concatenate(self.hooked) if len(self.hooked) > 1 else self.hooked[0]
        return self.a, self.b, hooked, self.rounds

    def propose(self) -> tuple[np.ndarray, np.ndarray] | None:
        """One round's changed labels (roots, their new roots), or None when every edge of the
        epoch lies inside one component."""
        keep = self.a != self.b
        if not keep.all():
            self.a, self.b = self.a[keep], self.b[keep]
        if not len(self.a):
            return None
        hi, lo = np.maximum(self.a, self.b), np.minimum(self.a, self.b)
        best = self.state._best
        np.minimum.at(best, hi, lo)  # each root hooks onto the least root it is joined to
        roots = self._unique(hi)
        parent = best[roots]
        while True:  # pointer jumping: a hook's target may be hooked this round too
            up = best[parent]
            hooked = up != _NONE
            if not hooked.any():
                break
            parent = np.where(hooked, up, parent)
            best[roots] = parent
        best[roots] = _NONE
        self.rounds += 1
        return roots, parent

    def apply(self, roots: np.ndarray, parents: np.ndarray) -> None:
        """Write one round's changed labels into the state."""
        label = self.state.label
        label[roots] = parents
        if self.hooked:  # roots hooked in earlier rounds point to this round's roots: one jump
            earlier = np.concatenate(self.hooked) if len(self.hooked) > 1 else self.hooked[0]
            label[earlier] = label[label[earlier]]
            self.hooked = [earlier]
        self.hooked.append(roots)
        self.a, self.b = label[self.a], label[self.b]

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """Refresh every label; returns the labels this epoch changed (nodes, labels)."""
        label = self.state.label
        if not self.hooked:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        hooked = np.concatenate(self.hooked)
        fresh = label[label]  # non-roots point to roots or to roots hooked this epoch
        nodes = np.flatnonzero(fresh != label)
        label[nodes] = fresh[nodes]
        nodes = self._unique(np.concatenate([nodes, hooked]))  # hooked roots keep their (new) labels
        self.hooked = []
        return nodes, label[nodes]

    def _unique(self, ids: np.ndarray) -> np.ndarray:
        """The distinct ids, sorted: by sorting when few, by marking when many."""
        mark = self.state._mark
        if len(ids) * 16 < len(mark):
            return np.unique(ids)
        mark[ids] = True
        out = np.flatnonzero(mark)
        mark[out] = False
        return out


def canonical(labels: np.ndarray) -> np.ndarray:
    """Any component labelling (scipy's 0..k-1, say) as the least node id of each component."""
    labels = np.asarray(labels, dtype=np.int64)
    least = np.full(int(labels.max()) + 1 if len(labels) else 0, len(labels), dtype=np.int64)
    np.minimum.at(least, labels, np.arange(len(labels), dtype=np.int64))
    return least[labels]
