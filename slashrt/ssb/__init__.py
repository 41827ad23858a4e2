"""The Slash State Backend, in one place: CRDT partial state and its join (`crdt`), key
partitions and their owners (`partitions`), the keyed window on it (`graph_window`: fragments
shipped to their keys' owners at each epoch's end and when the pointstamp frontier passes their
first window), its epochs and routing (`epochs`), and its state cut by key partition when the
executor count changes (`partitioned`). Its tables are `slashrt._kernels.HashAgg`
(native/hashagg.c), which every window uses."""

from slashrt.ssb.crdt import AggKind, finalize, join

__all__ = ["AggKind", "finalize", "join"]
