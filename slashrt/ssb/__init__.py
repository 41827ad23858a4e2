"""The Slash State Backend, in one place: CRDT partial state and its join (`crdt`), key
partitions and their leaders (`partitions`), the keyed window of a tree flow on it (`window`:
fragments per slice, epochs, leaders merging deltas behind a vector-clock gate) and of a graph
flow (`graph_window`: fragments shipped to their keys' owners at each epoch's end and when the
pointstamp frontier passes their first window; the same epochs and routing). Its tables are
`slashrt._kernels.HashAgg` (native/hashagg.c), which every window uses."""

from slashrt.ssb.crdt import AggKind, finalize, join

__all__ = ["AggKind", "finalize", "join"]
