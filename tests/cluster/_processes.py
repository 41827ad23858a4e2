"""Which processes a test started are still there (zombies included): for tests asserting
that a cluster run, however it ended, left no executor process behind; a process's parent."""

import os


def parent(pid: int | str) -> int | None:
    """Process `pid`'s parent (from /proc: its command may hold spaces and parentheses, so
    the fields are read after the last ")"), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children() -> set[int]:
    """This process's child processes, zombies included."""
    me = os.getpid()
    return {int(pid) for pid in os.listdir("/proc") if pid.isdigit() and parent(pid) == me}
