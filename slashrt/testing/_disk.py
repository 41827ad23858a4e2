"""A real full disk for checkpoint tests: a small tmpfs mounted (as root) and filled with a
ballast file until a write fails with ENOSPC, then freed (tests/snapshot/test_disk_full.py,
`slashrt bench chaos --faults disk-full`)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

CHUNK = 64 * 1024


class Disk:
    """A tmpfs of `size` bytes at `path` (mounted by `mounted`)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ballast = self.path / "ballast"

    def fill(self) -> None:
        """Write the ballast until the disk is full (again: what a discarded checkpoint freed)."""
        zeros = bytes(CHUNK)
        with open(self.ballast, "ab", buffering=0) as out:
            for size in (CHUNK, 4096, 1):  # the last pages too
                try:
                    while True:
                        out.write(zeros[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()


@contextlib.contextmanager
def mounted(path: Path, size: str = "8m"):
    """A tmpfs of `size` mounted at `path` for the block, unmounted after it, whatever happens."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True, capture_output=True)
    try:
        yield Disk(path)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)  # a process still holds a file in it
        with contextlib.suppress(OSError):
            os.rmdir(path)


def can_mount() -> bool:
    """Root, and mount(8) there: the tests that need a real full disk are skipped elsewhere."""
    import shutil

    return os.geteuid() == 0 and shutil.which("mount") is not None
