"""A process that writes a transactional file sink up to a crash window, then waits to be killed.

    python _sink_child.py <csv|parquet> <directory> <open|pre_committed|committed>

Checkpoint 1 is written, pre-committed and committed; checkpoint 2's records are written and,
by the window, left open, pre-committed, or committed. Then it prints "ready" and blocks."""

import sys

import numpy as np

DTYPE = np.dtype([("key", "<i8"), ("name", "S6"), ("value", "<f8")])


def batch(checkpoint: int) -> np.ndarray:
    """The records a source emits before barrier `checkpoint` (the same in every run)."""
    records = np.zeros(50, DTYPE)
    records["key"] = np.arange(50) + 100 * checkpoint
    records["name"] = [f"k{k}".encode() for k in records["key"]]
    records["value"] = records["key"] * 0.5
    return records


def sink_class(kind: str):
    from slashrt.sinks import CsvFile, ParquetFile

    return {"csv": CsvFile, "parquet": ParquetFile}[kind]


def main(kind: str, directory: str, window: str) -> None:
    sink = sink_class(kind)(directory, transactional=True).for_executor(0)
    sink.open()
    sink.write(batch(1))
    sink.pre_commit(1)
    sink.commit(1)
    sink.write(batch(2))
    if window in ("pre_committed", "committed"):
        sink.pre_commit(2)
    if window == "committed":
        sink.commit(2)
    print("ready", flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main(*sys.argv[1:4])
