"""Making local writes durable: fsync a file or a directory (after a rename in it), by path."""

import os

__all__ = ["fsync_path"]


def fsync_path(path) -> None:
    """fsync a file or, after a rename in it, a directory (POSIX: both through a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
