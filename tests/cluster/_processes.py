"""Which processes a test started are still there (zombies included): for tests asserting
that a cluster run, however it ended, left no executor process behind."""

import os


def children() -> set[int]:
    """This process's child processes, zombies included."""
    me, found = str(os.getpid()), set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        found.add(int(pid))
            except OSError:
                pass
    return found
