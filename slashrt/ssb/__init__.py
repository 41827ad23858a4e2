"""Slash State Backend: CRDT partial state and, later, partitions, log-structured fragments and
epoch synchronisation across executors."""

from slashrt.ssb.crdt import AggKind, finalize, join

__all__ = ["AggKind", "finalize", "join"]
