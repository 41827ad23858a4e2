"""Checkpoints: snapshot storage and the sinks' two-phase commit (Asynchronous Barrier Snapshots).

One concept a module, each usable on its own and called by the checkpoint runtime:

    state_format   one operator instance's state as a versioned, checksummed file (no pickle)
    operators      the one shape of every stateful operator's state; a plan's walk; SSB partitions
    storage        SnapshotStore: a directory per job, a file per part, a manifest written last
    commit         the two-phase-commit contract of exactly-once sinks, and its recovery rule
    alignment      barrier alignment per operator instance, the loop head's back-edge log
    coordinator    the checkpoint coordinator's decisions, and the stop-the-world baseline's phases
    restart        restart strategies: none, fixed delay, failure rate
    loops          the back-edge log of loops on one executor (the loop head's side, algorithm 2)
    runtime        the checkpoints of a run on one executor: barriers, alignment, writes, recovery
    stop           StopHandle: how a user asks a run to stop with a savepoint
    listing        what a checkpoint directory holds (`slashrt checkpoints`)
"""

from slashrt.snapshot.commit import TwoPhaseCommit, recover
from slashrt.snapshot.state_format import State, decode_state, encode_state, write_state
from slashrt.snapshot.stop import StopHandle
from slashrt.snapshot.storage import Checkpoint, Part, Skipped, SnapshotStore

__all__ = [
    "Checkpoint",
    "Part",
    "Skipped",
    "SnapshotStore",
    "State",
    "StopHandle",
    "TwoPhaseCommit",
    "decode_state",
    "encode_state",
    "recover",
    "write_state",
]
